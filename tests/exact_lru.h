// ExactLru: exact least-recently-used eviction over ids, the reference the store's per-bucket
// scores are measured against (tests/eviction_policy_test.cc, benchmarks/eviction_benchmark.cc).
// Test and benchmark code only: the store never keeps an exact order.
#ifndef HYREC_TESTS_EXACT_LRU_H_
#define HYREC_TESTS_EXACT_LRU_H_

#include <cstddef>
#include <cstdint>
#include <list>

#include "absl/container/flat_hash_map.h"

namespace hyrec::testing {

class ExactLru {
 public:
  // Holds at most `capacity` ids (at least 1).
  explicit ExactLru(size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}

  // Uses `id`: true when it was held (it becomes the most recent); otherwise it is added,
  // evicting the least recent when full.
  bool Use(uint64_t id) {
    auto it = where_.find(id);
    if (it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    if (where_.size() == capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(id);
    where_[id] = order_.begin();
    return false;
  }

 private:
  size_t capacity_;
  std::list<uint64_t> order_;  // Most recent first.
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_EXACT_LRU_H_
