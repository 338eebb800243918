#include "hyrec/common/program.h"

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace hyrec {
namespace {

absl::Mutex name_mu;
std::string& Name() ABSL_EXCLUSIVE_LOCKS_REQUIRED(name_mu) {
  static std::string* name = new std::string("hyrec");
  return *name;
}

}  // namespace

std::string ProgramName() {
  absl::MutexLock lock(&name_mu);
  return Name();
}

void SetProgramName(absl::string_view argv0) {
  const size_t slash = argv0.rfind('/');
  if (slash != absl::string_view::npos) argv0.remove_prefix(slash + 1);
  if (argv0.empty()) return;
  absl::MutexLock lock(&name_mu);
  Name() = std::string(argv0);
}

}  // namespace hyrec
