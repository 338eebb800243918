// Helpers shared by the benchmarks: a Google Benchmark reporter that keeps every run so that the
// binary can print its figures beside their floors, and the ratio, at the end.
#ifndef HYREC_BENCHMARKS_BENCH_UTIL_H_
#define HYREC_BENCHMARKS_BENCH_UTIL_H_

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace hyrec::bench {

// Prints runs as the console reporter does and remembers items/s by run name.
class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      auto it = run.counters.find("items_per_second");
      if (it != run.counters.end()) items_per_second_[run.benchmark_name()] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  double ItemsPerSecond(const std::string& name) const {
    auto it = items_per_second_.find(name);
    return it == items_per_second_.end() ? 0.0 : it->second;
  }
  const std::map<std::string, double>& all() const { return items_per_second_; }

 private:
  std::map<std::string, double> items_per_second_;
};

inline std::string Millions(double per_second) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2fM", per_second / 1e6);
  return buffer;
}

}  // namespace hyrec::bench

#endif  // HYREC_BENCHMARKS_BENCH_UTIL_H_
