// Deduplication of updates (UpdateId): which sequences of one (worker, table) were applied.
//
// SequenceWindow remembers the highest sequence applied and a bitmap of the kDedupWindow
// sequences below it. DedupWindows holds one window per table for each worker id that sent an
// update, at most kMaxDedupWorkers of them.
//
// Not thread-safe: the store's dedup lock guards them.
#ifndef HYREC_EMBEDDING_PS_SEQUENCE_WINDOW_H_
#define HYREC_EMBEDDING_PS_SEQUENCE_WINDOW_H_

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace hyrec::embedding_ps {

inline constexpr size_t kDedupWindow = 1024;
inline constexpr size_t kMaxDedupWorkers = 1 << 16;

class SequenceWindow {
 public:
  enum Verdict { kNew, kRepeat, kTooOld };
  // kNew (and marks it) when `sequence` was not applied yet; kRepeat when it was; kTooOld when it
  // is kDedupWindow or more below the highest, where the window cannot tell.
  Verdict Mark(uint64_t sequence) {
    if (sequence > highest_) {
      const uint64_t shift = sequence - highest_;
      if (shift >= kDedupWindow) {
        seen_.reset();
      } else {
        seen_ <<= shift;
      }
      seen_.set(0);
      highest_ = sequence;
      ++applied_;
      return kNew;
    }
    const uint64_t distance = highest_ - sequence;
    if (distance >= kDedupWindow) return kTooOld;
    if (seen_.test(distance)) return kRepeat;
    seen_.set(distance);
    ++applied_;
    return kNew;
  }
  // What Mark would answer, marking nothing.
  Verdict Peek(uint64_t sequence) const {
    if (sequence > highest_) return kNew;
    const uint64_t distance = highest_ - sequence;
    if (distance >= kDedupWindow) return kTooOld;
    return seen_.test(distance) ? kRepeat : kNew;
  }
  uint64_t highest() const { return highest_; }
  // Updates marked new since the job began (what checkpoints kept, and replays, included).
  uint64_t applied() const { return applied_; }
  // The window as 16 words (bit k of word k / 64: sequence highest - k was applied).
  std::vector<uint64_t> Words() const {
    std::vector<uint64_t> words(kDedupWindow / 64, 0);
    for (size_t k = 0; k < kDedupWindow; ++k) {
      if (seen_.test(k)) words[k / 64] |= 1ull << (k % 64);
    }
    return words;
  }
  // Adds what another window holds (the union of the applied sequences both can tell) and the
  // updates it counted.
  void Merge(uint64_t highest, const std::vector<uint64_t>& words, uint64_t applied) {
    const uint64_t before = applied_;
    for (size_t k = kDedupWindow; k-- > 0;) {
      if ((words[k / 64] >> (k % 64) & 1) != 0 && highest >= k) (void)Mark(highest - k);
    }
    applied_ = before + applied;
  }

 private:
  uint64_t highest_ = 0;
  uint64_t applied_ = 0;
  std::bitset<kDedupWindow> seen_;
};

class DedupWindows {
 public:
  explicit DedupWindows(size_t num_tables) : num_tables_(num_tables) {}

  // The window of (worker, table), made empty for a worker not seen before; ResourceExhausted
  // when that worker would be one more than kMaxDedupWorkers.
  absl::StatusOr<SequenceWindow*> Window(uint32_t worker, size_t table) {
    auto it = windows_.find(worker);
    if (it == windows_.end()) {
      if (windows_.size() >= kMaxDedupWorkers) return TooManyWorkers();
      it = windows_.emplace(worker, std::vector<SequenceWindow>(num_tables_)).first;
    }
    return &it->second[table];
  }
  // The window of (worker, table), or nullptr when the worker has none; with `refusal`, what
  // Window would answer for a new worker.
  const SequenceWindow* Find(uint32_t worker, size_t table, absl::Status* refusal = nullptr) const {
    auto it = windows_.find(worker);
    if (it != windows_.end()) return &it->second[table];
    if (refusal != nullptr && windows_.size() >= kMaxDedupWorkers) *refusal = TooManyWorkers();
    return nullptr;
  }
  // Calls fn(worker, table, window) for every window that has applied a sequence.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [worker, windows] : windows_) {
      for (size_t t = 0; t < windows.size(); ++t) {
        if (windows[t].highest() != 0) fn(worker, t, windows[t]);
      }
    }
  }

 private:
  static absl::Status TooManyWorkers() {
    return absl::ResourceExhaustedError(
        absl::StrCat("more than ", kMaxDedupWorkers, " distinct worker ids sent updates"));
  }

  size_t num_tables_;
  absl::flat_hash_map<uint32_t, std::vector<SequenceWindow>> windows_;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_SEQUENCE_WINDOW_H_
