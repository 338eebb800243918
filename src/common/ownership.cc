#include "hyrec/common/ownership.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The epoch in `path` (0 when there is no file).
absl::StatusOr<uint64_t> ReadEpoch(Env* env, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(env, path, 64);
  if (absl::IsNotFound(text.status())) return 0;
  HYREC_RETURN_IF_ERROR(text.status());
  uint64_t epoch = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &epoch)) {
    return absl::DataLossError(absl::StrCat(path, " does not hold an epoch"));
  }
  return epoch;
}

}  // namespace

OwnershipEpoch::OwnershipEpoch(const OwnershipOptions& options)
    : options_(options), env_(options.env != nullptr ? options.env : Env::Default()) {}

absl::StatusOr<std::unique_ptr<OwnershipEpoch>> OwnershipEpoch::Take(const OwnershipOptions& options) {
  std::unique_ptr<OwnershipEpoch> claim(new OwnershipEpoch(options));
  HYREC_ASSIGN_OR_RETURN(const uint64_t epoch, ReadEpoch(claim->env_, options.path));
  claim->epoch_ = epoch + 1;
  HYREC_RETURN_IF_ERROR(WriteFileAtomically(claim->env_, options.path, absl::StrCat(claim->epoch_, "\n")));
  claim->raised_at_ = std::chrono::steady_clock::now();
  claim->owned_as_of_ns_.store(SteadyNanos(), std::memory_order_release);
  return claim;
}

absl::Status OwnershipEpoch::Check() const {
  absl::MutexLock lock(&mu_);
  if (!lost_.ok()) return lost_;
  const int64_t began = SteadyNanos();
  const absl::StatusOr<uint64_t> epoch = ReadEpoch(env_, options_.path);
  if (epoch.ok() && *epoch == epoch_) {
    owned_as_of_ns_.store(began, std::memory_order_release);
    return absl::OkStatus();
  }
  if (!epoch.ok() && !absl::IsDataLoss(epoch.status())) {
    return epoch.status();  // The volume did not answer: not a loss yet, but no answer either.
  }
  owned_as_of_ns_.store(0, std::memory_order_release);  // CheckLease reads lost_ from now on.
  lost_ = absl::FailedPreconditionError(absl::StrCat(
      options_.what, " was taken over by another process (its epoch is ",
      epoch.ok() ? absl::StrCat(*epoch) : std::string(epoch.status().message()), ", this process's ", epoch_, ")"));
  if (options_.on_lost) options_.on_lost(lost_);
  return lost_;
}

bool OwnershipEpoch::LeaseHeld() const {
  const int64_t as_of = owned_as_of_ns_.load(std::memory_order_acquire);
  return as_of != 0 && SteadyNanos() - as_of < absl::ToInt64Nanoseconds(options_.lease);
}

absl::Duration OwnershipEpoch::UntilServeable() const {
  const auto left = raised_at_ + absl::ToChronoNanoseconds(options_.lease) - std::chrono::steady_clock::now();
  return std::max(absl::ZeroDuration(), absl::FromChrono(left));
}

}  // namespace hyrec
