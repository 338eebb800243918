// Helpers shared by the benchmarks: a Google Benchmark reporter that keeps every run so that the
// binary can print its figures beside their floors, and the ratio, at the end.
#ifndef HYREC_BENCHMARKS_BENCH_UTIL_H_
#define HYREC_BENCHMARKS_BENCH_UTIL_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

// `floats` floats backed by transparent huge pages where the kernel allows, as the store's rows
// are: a floor array then pays the same address translation as the store.
class HugeFloats {
 public:
  explicit HugeFloats(size_t floats, float value = 0.0f)
      : floats_(floats), bytes_(((floats * sizeof(float)) | ((2u << 20) - 1)) + 1) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    madvise(p, bytes_, MADV_HUGEPAGE);
    data_ = static_cast<float*>(p);
    std::fill(data_, data_ + floats, value);
  }
  ~HugeFloats() { munmap(data_, bytes_); }
  HugeFloats(const HugeFloats&) = delete;
  HugeFloats& operator=(const HugeFloats&) = delete;
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return floats_; }

 private:
  size_t floats_;
  size_t bytes_;
  float* data_;
};

}  // namespace hyrec::bench

#endif  // HYREC_BENCHMARKS_BENCH_UTIL_H_
