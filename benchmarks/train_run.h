// One `hyrec train --processes` run timed from outside, for the benchmarks that compare two
// settings of the same job (tls_benchmark, update_log_benchmark).
#ifndef HYREC_BENCHMARKS_TRAIN_RUN_H_
#define HYREC_BENCHMARKS_TRAIN_RUN_H_

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "hyrec/common/subprocess.h"

namespace hyrec::bench {

// The samples_per_second of one `binary --processes --config=job` run (read from its --report
// file), with `extra` flags after those; an error when it does not exit 0.
inline absl::StatusOr<double> TrainSamplesPerSecond(const std::string& binary, const std::string& job,
                                                    const std::string& report,
                                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {binary,    "--processes",     "--config=" + job, "--report=" + report,
                                   "--plot=", "--progress=lines"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto p = Subprocess::Spawn(argv);
  if (!p.ok()) return p.status();
  while ((*p)->ReadLine(absl::Hours(1)).ok()) {
  }
  auto code = (*p)->Wait(absl::Minutes(10));
  if (!code.ok()) return code.status();
  if (*code != 0) return absl::InternalError(absl::StrCat(binary, " train exited with ", *code, " on ", job));
  std::ifstream in(report);
  for (std::string line; std::getline(in, line);) {
    double value = 0;
    if (line.rfind("samples_per_second: ", 0) == 0 && absl::SimpleAtod(line.substr(20), &value)) return value;
  }
  return absl::InternalError(absl::StrCat(report, " has no samples_per_second"));
}

}  // namespace hyrec::bench

#endif  // HYREC_BENCHMARKS_TRAIN_RUN_H_
