// What each kind of fault cost a chaos run, for the chaos tests (chaos_test, chaos_hosts_test):
// the training time lost to it, at the same job's training rate without faults, from the runs'
// progress lines.
#ifndef HYREC_TESTS_FAULT_COSTS_H_
#define HYREC_TESTS_FAULT_COSTS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace hyrec::testing {

// Of each progress line of a run: (seconds into the run, samples trained).
using Progress = std::vector<std::pair<double, uint64_t>>;

struct Fault {
  double at = 0;  // Seconds into the run.
  int kind = 0;   // An index into the test's kinds of fault.
};

// The samples of a progress line ("samples N[/M] ..."), or false when `line` is not one.
inline bool ProgressSamples(absl::string_view line, uint64_t* samples) {
  if (!absl::StartsWith(line, "samples ")) return false;
  const absl::string_view count = line.substr(8);
  return absl::SimpleAtoi(count.substr(0, count.find_first_of(" /")), samples);
}

// Samples trained `t` seconds into a run: interpolated between its progress lines.
inline double SamplesAt(const Progress& p, double t) {
  if (p.empty()) return 0;
  if (t <= p.front().first) return static_cast<double>(p.front().second);
  for (size_t i = 1; i < p.size(); ++i) {
    if (t <= p[i].first) {
      const double f = (t - p[i - 1].first) / std::max(1e-9, p[i].first - p[i - 1].first);
      return static_cast<double>(p[i - 1].second) + f * (static_cast<double>(p[i].second) - p[i - 1].second);
    }
  }
  return static_cast<double>(p.back().second);
}

// The training time each of `kinds` kinds of fault cost, in all: each fault is charged the
// interval from it to the next fault (or the run's last progress line), less what the calm run's
// training rate needs for the samples trained in that interval (fewer, or none, where a fault
// rolled the job back to a checkpoint).
inline std::vector<double> TimeLost(const Progress& calm, const Progress& chaos, const std::vector<Fault>& faults,
                                    int kinds) {
  std::vector<double> lost(kinds, 0.0);
  if (calm.size() < 2 || chaos.empty()) return lost;
  const double rate = static_cast<double>(calm.back().second - calm.front().second) /
                      std::max(1e-9, calm.back().first - calm.front().first);
  const double end = chaos.back().first;
  for (size_t i = 0; i < faults.size(); ++i) {
    const double from = faults[i].at;
    const double to = std::min(end, i + 1 < faults.size() ? faults[i + 1].at : end);
    if (to <= from) continue;
    lost[faults[i].kind] += (to - from) - (SamplesAt(chaos, to) - SamplesAt(chaos, from)) / rate;
  }
  return lost;
}

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_FAULT_COSTS_H_
