// StalenessWindow: the rule of hybrid training's bounded staleness, for the trainer that follows
// it and the simulator that predicts it.
//
// With staleness s (0: synchronous), a worker looks batch n up only once every update of the
// batches before n - s is acknowledged and batch n - s - 1 has trained, so at most s batches of
// updates are unapplied when a lookup is issued; it keeps depth() lookups issued ahead of the
// batch training, and up to s + 2 updates in flight (a lookup may wait on updates of batches two
// past the one training).
//
//   StalenessWindow window(4);
//   if (trained >= window.TrainedBefore(n) && acked_prefix >= window.AckedBefore(n)) LookUp(n);
#ifndef HYREC_COMMON_STALENESS_WINDOW_H_
#define HYREC_COMMON_STALENESS_WINDOW_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace hyrec {

class StalenessWindow {
 public:
  // A negative staleness is taken as 0.
  explicit constexpr StalenessWindow(int staleness) : s_(std::max(0, staleness)) {}

  constexpr int staleness() const { return s_; }
  // Lookups issued ahead of the batch training: (s + 1) / 2, at least 1.
  constexpr size_t depth() const { return static_cast<size_t>(std::max(1, (s_ + 1) / 2)); }
  // Updates in flight at once, at most.
  constexpr int max_updates_in_flight() const { return s_ + 2; }
  // Before batch n is looked up: the batches that must have trained (0 .. the result - 1), and
  // the batches whose updates must be acknowledged (those before the result).
  constexpr uint64_t TrainedBefore(uint64_t n) const { return Before(n); }
  constexpr uint64_t AckedBefore(uint64_t n) const { return Before(n); }

 private:
  constexpr uint64_t Before(uint64_t n) const {
    return n > static_cast<uint64_t>(s_) ? n - static_cast<uint64_t>(s_) : 0;
  }
  int s_;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_STALENESS_WINDOW_H_
