// CountMinSketch: approximate counts of ids for admission (TableConfig::admission.min_count).
//
// Four rows of 8-bit counters with conservative update (only the counters at the minimum grow)
// and aging: after 10 x width increments every counter is halved, so an id seen often long ago
// does not stay admitted forever. Counts may be overestimated, never under (before aging).
//
// Not thread-safe: the owning stripe's lock guards it.
#ifndef HYREC_EMBEDDING_PS_COUNT_MIN_SKETCH_H_
#define HYREC_EMBEDDING_PS_COUNT_MIN_SKETCH_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hyrec/common/hash.h"

namespace hyrec::embedding_ps {

class CountMinSketch {
 public:
  static constexpr int kDepth = 4;
  // width 0: an unused sketch that holds nothing.
  explicit CountMinSketch(uint32_t width) : width_(width), counters_(static_cast<size_t>(kDepth) * width) {}

  // Counts one sighting of `hash` and returns the estimated count (saturates at 255).
  uint32_t Increment(uint64_t hash) {
    size_t pos[kDepth];
    uint32_t estimate = 255;
    for (int d = 0; d < kDepth; ++d) {
      pos[d] = d * static_cast<size_t>(width_) + FastRange64(Mix64(hash + d), width_);
      estimate = std::min<uint32_t>(estimate, counters_[pos[d]]);
    }
    if (estimate < 255) {
      ++estimate;
      for (int d = 0; d < kDepth; ++d) {
        if (counters_[pos[d]] < estimate) counters_[pos[d]] = static_cast<uint8_t>(estimate);
      }
    }
    if (++increments_ >= 10ull * width_) {
      for (uint8_t& c : counters_) c >>= 1;
      increments_ = 0;
    }
    return estimate;
  }

  uint64_t bytes() const { return counters_.size(); }
  bool used() const { return width_ > 0; }
  uint32_t width() const { return width_; }
  uint64_t increments() const { return increments_; }
  const std::vector<uint8_t>& counters() const { return counters_; }
  // Replaces (exact) or adds to (saturating) the counters; sizes must match.
  void Restore(const std::vector<uint8_t>& counters, uint64_t increments, bool exact) {
    for (size_t i = 0; i < counters_.size(); ++i) {
      counters_[i] = exact ? counters[i] : static_cast<uint8_t>(std::min<uint32_t>(255, counters_[i] + counters[i]));
    }
    increments_ = exact ? increments : std::max(increments_, increments);
  }

 private:
  const uint32_t width_;
  std::vector<uint8_t> counters_;
  uint64_t increments_ = 0;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_COUNT_MIN_SKETCH_H_
