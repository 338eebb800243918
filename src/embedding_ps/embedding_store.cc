#include "hyrec/embedding_ps/embedding_store.h"

#include <unistd.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/finite.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/embedding_ps/optimizer.h"
#include "src/embedding_ps/huge_page_arena.h"
#include "src/embedding_ps/row_index.h"

namespace hyrec::embedding_ps {
namespace {

constexpr int kSlotBits = 24;
constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
constexpr uint32_t kMaxSlots = kSlotMask;  // Slot kSlotMask is never used.
static_assert(kMaxSlots == kMaxRowsPerStripeAndTable, "the header says what a stripe holds");
constexpr int kMaxTables = 256;
constexpr uint64_t kIndexChargePerRow = 8;  // Index bytes charged per row against capacity_bytes.
constexpr size_t kDedupWindow = 1024;
constexpr size_t kMaxDedupWorkers = 1 << 16;

// Returns InvalidArgument for a table index out of range.
#define HYREC_CHECK_TABLE(t)                                                                                       \
  if ((t) < 0 || (t) >= num_tables()) {                                                                            \
    return absl::InvalidArgumentError(absl::StrCat("table index ", (t), " out of range [0, ", num_tables(), ")")); \
  }

inline uint32_t MakeHandle(int table, uint32_t slot) { return (static_cast<uint32_t>(table) << kSlotBits) | slot; }
inline int HandleTable(uint32_t handle) { return static_cast<int>(handle >> kSlotBits); }
inline uint32_t HandleSlot(uint32_t handle) { return handle & kSlotMask; }

// Copies n floats; inlined 16-byte moves beat a libc memcpy call for embedding-sized rows.
inline void CopyFloats(const float* __restrict src, float* __restrict dst, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) std::memcpy(dst + i, src + i, 4 * sizeof(float));
  for (; i < n; ++i) dst[i] = src[i];
}

// A link of a table's list: a slot of the same table's slab, or none.
constexpr uint32_t kNoLink = kSlotMask;

// Every slot starts with this header; the row's floats follow. The list links name slots of
// the row's own table (24 bits each), which leaves 16 bits for the eviction policy's score.
// Each field is written with stores of its own bytes alone: relinking a neighbour then never
// waits to read the neighbour's line first (a store does not stall on a cache miss; a
// read-modify-write of a shared word would).
struct SlotHeader {
  uint64_t id;
  // The previous slot, toward the end kept longest (kNoLink at the head), then the next slot,
  // toward the end evicted first (kNoLink at the tail; also the free-list link): 3 bytes each,
  // little-endian.
  uint8_t links[6];
  // kLfu: the use count; kTtl: the data time of the last use, in granules modulo 2^16; kLru:
  // unused.
  uint16_t score_bits;

  uint32_t prev_slot() const { return Read24(links); }
  uint32_t next_slot() const { return Read24(links + 3); }
  uint16_t score() const { return score_bits; }
  void set_prev_slot(uint32_t slot) { Write24(links, slot); }
  void set_next_slot(uint32_t slot) { Write24(links + 3, slot); }
  void set_score(uint16_t score) { score_bits = score; }

 private:
  static uint32_t Read24(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16;
  }
  static void Write24(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
    p[2] = static_cast<uint8_t>(v >> 16);
  }
};
static_assert(sizeof(SlotHeader) == 16, "slot header is 16 bytes");

// The slots of one table within one stripe, in fixed-size chunks from the store's huge-page
// arena; chunks never move and are never freed before the store.
class Slab {
 public:
  Slab(HugePageArena* arena, uint32_t slot_bytes, int chunk_shift)
      : arena_(arena), slot_bytes_(slot_bytes), chunk_shift_(chunk_shift) {}

  char* Slot(uint32_t slot) const {
    return chunks_[slot >> chunk_shift_] + static_cast<size_t>(slot & ((1u << chunk_shift_) - 1)) * slot_bytes_;
  }

  // A free slot, or kNoHandle when the slab holds kMaxSlots already.
  uint32_t Allocate() {
    if (free_head_ != kNoHandle) {
      const uint32_t slot = free_head_;
      const uint32_t next = reinterpret_cast<SlotHeader*>(Slot(slot))->next_slot();
      free_head_ = next == kNoLink ? kNoHandle : next;
      return slot;
    }
    if (used_ >= kMaxSlots) return kNoHandle;
    if ((used_ >> chunk_shift_) >= chunks_.size()) {
      chunks_.push_back(arena_->Allocate(static_cast<size_t>(slot_bytes_) << chunk_shift_));
    }
    return used_++;
  }

  void Free(uint32_t slot) {
    reinterpret_cast<SlotHeader*>(Slot(slot))->set_next_slot(free_head_ == kNoHandle ? kNoLink : free_head_);
    free_head_ = slot;
  }

  uint64_t bytes() const {
    return static_cast<uint64_t>(chunks_.size()) * (static_cast<uint64_t>(slot_bytes_) << chunk_shift_);
  }

 private:
  HugePageArena* arena_;
  uint32_t slot_bytes_;
  int chunk_shift_;
  std::vector<char*> chunks_;
  uint32_t used_ = 0;
  uint32_t free_head_ = kNoHandle;
};

// Count-min sketch with conservative update and periodic halving (aging), 8-bit counters.
class CountMinSketch {
 public:
  static constexpr int kDepth = 4;
  explicit CountMinSketch(uint32_t width)
      : width_(width), counters_(static_cast<size_t>(kDepth) * width) {}  // width 0: unused.

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

// Remembers which update sequences of one (worker, table) were applied: the highest, and a bitmap
// of the kDedupWindow sequences below it.
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

struct TableCounters {
  uint64_t rows = 0;
  uint64_t lookups = 0;
  uint64_t updates = 0;
  uint64_t evictions = 0;
  uint64_t expirations = 0;
  uint64_t admission_rejections = 0;
  uint64_t dropped_updates = 0;
};

struct TableLayout {
  int dim = 0;
  int state_floats = 0;
  uint32_t slot_bytes = 0;
  uint64_t charge = 0;  // Bytes charged against capacity_bytes per row.
  uint64_t salt = 0;
  EvictionPolicy policy = EvictionPolicy::kLru;
  uint64_t ttl_granule = 1;   // kTtl: seconds of data time per score step.
  uint32_t ttl_granules = 0;  // kTtl: the TTL in granules (at most 1024).
  uint32_t lfu_aging = 0;     // kLfu: uses per row between halvings.
};

// A TTL of `ttl` seconds kept in steps of ttl / 1024 (rounded up, at least a second): the 16-bit
// score spans 64 TTLs or more, and expiry sweeps keep every row younger than that.
void SetTtlLayout(uint64_t ttl, TableLayout* layout) {
  layout->ttl_granule = std::max<uint64_t>(1, (ttl + 1023) / 1024);
  layout->ttl_granules = static_cast<uint32_t>((ttl + layout->ttl_granule - 1) / layout->ttl_granule);
}

int ChunkShiftFor(uint64_t expected_rows_per_stripe) {
  // About 1/1024 of a stripe's expected rows per chunk: under 0.1% waste, few allocations.
  const uint64_t target = std::clamp<uint64_t>(expected_rows_per_stripe / 1024, 16, 4096);
  int shift = 4;
  while ((1ull << (shift + 1)) <= target) ++shift;
  return shift;
}

// The stripe lock: a plain std::mutex (Debian's absl::Mutex runs deadlock detection on every
// acquisition, which costs more than the row work it guards), annotated for thread-safety analysis.
class ABSL_LOCKABLE StripeMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE StripeLock {
 public:
  explicit StripeLock(StripeMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~StripeLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  StripeLock(const StripeLock&) = delete;
  StripeLock& operator=(const StripeLock&) = delete;

 private:
  StripeMutex* mu_;
};

struct alignas(64) Stripe {
  Stripe(HugePageArena* arena, const std::vector<TableLayout>& layouts, const std::vector<TableConfig>& configs,
         uint64_t expected_rows, uint32_t sketch_width, uint64_t seed)
      : index(expected_rows),
        counters(layouts.size()),
        lru_head(layouts.size(), kNoHandle),
        lru_tail(layouts.size(), kNoHandle),
        rng_state(seed) {
    const int chunk_shift = ChunkShiftFor(expected_rows);
    for (size_t t = 0; t < layouts.size(); ++t) {
      slabs.emplace_back(arena, layouts[t].slot_bytes, chunk_shift);
      sketches.emplace_back(configs[t].admission.min_count > 1 ? sketch_width : 0);
    }
  }

  mutable StripeMutex mu;
  RowIndex index ABSL_GUARDED_BY(mu);
  std::vector<Slab> slabs ABSL_GUARDED_BY(mu);
  std::vector<CountMinSketch> sketches ABSL_GUARDED_BY(mu);
  std::vector<TableCounters> counters ABSL_GUARDED_BY(mu);
  // Per table: its rows in this stripe from the most (head) to the least (tail) recently used.
  std::vector<uint32_t> lru_head ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> lru_tail ABSL_GUARDED_BY(mu);
  // Per table: whether restored rows may stand out of their policy's order (sorted before the
  // list is next used); for kLfu, the head-most row of each count present and the uses since
  // the counts were last halved.
  std::vector<uint8_t> unsorted ABSL_GUARDED_BY(mu) = std::vector<uint8_t>(lru_head.size(), 0);
  std::vector<absl::flat_hash_map<uint16_t, uint32_t>> lfu_first ABSL_GUARDED_BY(mu) =
      std::vector<absl::flat_hash_map<uint16_t, uint32_t>>(lru_head.size());
  std::vector<uint64_t> lfu_uses ABSL_GUARDED_BY(mu) = std::vector<uint64_t>(lru_head.size(), 0);
  uint64_t rows ABSL_GUARDED_BY(mu) = 0;
  uint64_t rng_state ABSL_GUARDED_BY(mu);
  // With track_changes, per table: a flag per slot, set when the row is created or written since
  // the last delta, and the ids evicted since then.
  std::vector<std::vector<uint8_t>> dirty ABSL_GUARDED_BY(mu);
  std::vector<std::vector<uint64_t>> tombstones ABSL_GUARDED_BY(mu);
};

// Each id of `ids` once (first-seen order) in `unique_ids`, with its gradients added up in
// `summed`. For the rare call that repeats ids (GroupsRepeatIds).
void SumRepeatedIds(absl::Span<const uint64_t> ids, absl::Span<const float> grads, int dim,
                    std::vector<uint64_t>* unique_ids, std::vector<float>* summed) {
  absl::flat_hash_map<uint64_t, uint32_t> first;
  first.reserve(ids.size());
  unique_ids->clear();
  summed->clear();
  for (size_t k = 0; k < ids.size(); ++k) {
    auto [it, fresh] = first.try_emplace(ids[k], static_cast<uint32_t>(unique_ids->size()));
    const float* g = grads.data() + k * dim;
    if (fresh) {
      unique_ids->push_back(ids[k]);
      summed->insert(summed->end(), g, g + dim);
    } else {
      float* into = summed->data() + static_cast<size_t>(it->second) * dim;
      for (int j = 0; j < dim; ++j) into[j] += g[j];
    }
  }
}

// The rows a stripe is sized for: its share of the store's bound, with a margin of three
// standard deviations for the hash's uneven spread (0 for an unbounded store).
uint64_t ExpectedRowsPerStripe(const StoreOptions& options, const std::vector<TableLayout>& layouts) {
  uint64_t expected = 0;
  if (options.capacity_rows > 0) {
    expected = options.capacity_rows;
  } else if (options.capacity_bytes > 0 && !layouts.empty()) {
    uint64_t min_charge = UINT64_MAX;
    for (const TableLayout& l : layouts) min_charge = std::min(min_charge, l.charge);
    expected = options.capacity_bytes / min_charge;
  }
  uint64_t per_stripe = expected / options.num_stripes;
  if (per_stripe > 0) per_stripe += static_cast<uint64_t>(3.0 * std::sqrt(static_cast<double>(per_stripe))) + 8;
  return per_stripe;
}

uint32_t SketchWidth(const StoreOptions& options) {
  return std::max<uint32_t>(
      64, options.admission_sketch_counters / (CountMinSketch::kDepth * static_cast<uint32_t>(options.num_stripes)));
}

TableLayout MakeLayout(const TableConfig& config, size_t t) {
  TableLayout layout;
  layout.dim = config.dim;
  layout.state_floats = OptimizerStateFloats(config.optimizer.kind, config.dim);
  layout.slot_bytes = static_cast<uint32_t>(sizeof(SlotHeader) + sizeof(float) * (layout.dim + layout.state_floats));
  layout.charge = layout.slot_bytes + kIndexChargePerRow;
  layout.salt = Mix64(0xa0761d6478bd642fULL * (t + 1));
  layout.policy = config.eviction.policy;
  if (layout.policy == EvictionPolicy::kTtl) SetTtlLayout(config.eviction.ttl_seconds, &layout);
  layout.lfu_aging = config.eviction.lfu_aging_touches;
  return layout;
}

class StripedStore final : public EmbeddingShardStore {
 public:
  StripedStore(const StoreOptions& options, std::vector<TableLayout> layouts)
      : EmbeddingShardStore(options.tables),
        capacity_rows_(options.capacity_rows),
        capacity_bytes_(options.capacity_bytes),
        num_stripes_(options.num_stripes),
        track_changes_(options.track_changes),
        layouts_(std::move(layouts)),
        rejected_nonfinite_(layouts_.size()),
        duplicates_(layouts_.size()),
        nonfinite_results_(layouts_.size()),
        table_rows_(layouts_.size()),
        data_time_(layouts_.size()),
        swept_time_(layouts_.size(), 0) {
    for (const TableLayout& l : layouts_) keeps_order_.push_back(evicts_ || l.policy != EvictionPolicy::kLru);
    const uint64_t per_stripe = ExpectedRowsPerStripe(options, layouts_);
    const uint32_t sketch_width = SketchWidth(options);
    stripes_.reserve(num_stripes_);
    for (int s = 0; s < num_stripes_; ++s) {
      stripes_.push_back(
          std::make_unique<Stripe>(&arena_, layouts_, options.tables, per_stripe, sketch_width, Mix64(s + 1)));
      if (track_changes_) {
        StripeLock lock(&stripes_.back()->mu);
        stripes_.back()->dirty.resize(layouts_.size());
        stripes_.back()->tombstones.resize(layouts_.size());
      }
    }
  }

  absl::Status Lookup(int t, absl::Span<const uint64_t> ids, absl::Span<float> out, LookupResult* result) override {
    HYREC_CHECK_TABLE(t);
    const TableLayout& layout = layouts_[t];
    if (out.size() != ids.size() * static_cast<size_t>(layout.dim)) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table(t).name, "': output holds ", out.size(),
                                                     " floats, expected ", ids.size(), " ids x dim ", layout.dim));
    }
    uint64_t not_admitted = 0;
    const size_t row_bytes = sizeof(float) * layout.dim;
    ForEachStripeGroup(t, ids,
                       [&](Stripe& stripe, absl::Span<const uint32_t> positions,
                           const uint64_t* hashes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
                         stripe.counters[t].lookups += positions.size();
                         if (layout.policy == EvictionPolicy::kTtl) ExpireLocked(stripe, t, /*all=*/false);
                         VisitRows(stripe, t, ids, positions, hashes, /*create=*/true,
                                   static_cast<uint32_t>(sizeof(SlotHeader) + row_bytes),
                                   [&](uint32_t position, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
                                     float* dst = out.data() + static_cast<size_t>(position) * layout.dim;
                                     if (handle == kNoHandle) {
                                       std::memset(dst, 0, row_bytes);
                                       ++not_admitted;
                                     } else {
                                       CopyFloats(Weights(stripe, handle), dst, layout.dim);
                                     }
                                   });
                       });
    if (result != nullptr) result->not_admitted = not_admitted;
    return absl::OkStatus();
  }

  absl::Status CheckUpdate(int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                           UpdateId update_id) override {
    HYREC_CHECK_TABLE(t);
    HYREC_RETURN_IF_ERROR(CheckGradientLength(t, ids, grads));
    if (const size_t k = FirstNonFinite(grads.data(), grads.size()); k < grads.size()) {
      return NonFiniteGradient(t, ids, grads, k);
    }
    if (update_id.sequence == 0) return absl::OkStatus();
    absl::MutexLock lock(&dedup_mu_);
    auto it = dedup_.find(update_id.worker_id);
    if (it == dedup_.end()) return dedup_.size() >= kMaxDedupWorkers ? TooManyWorkers() : absl::OkStatus();
    const SequenceWindow& window = it->second[t];
    if (window.Peek(update_id.sequence) == SequenceWindow::kTooOld) return TooOld(t, update_id, window);
    return absl::OkStatus();
  }

  absl::Status Update(int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads, UpdateId update_id,
                      UpdateResult* result) override {
    HYREC_CHECK_TABLE(t);
    const TableLayout& layout = layouts_[t];
    const TableConfig& config = table(t);
    HYREC_RETURN_IF_ERROR(CheckGradientLength(t, ids, grads));
    std::vector<uint64_t> unique_ids;
    std::vector<float> summed;
    GroupByStripe(t, ids);
    if (GroupsRepeatIds(ids)) {
      SumRepeatedIds(ids, grads, layout.dim, &unique_ids, &summed);
      ids = unique_ids;
      grads = summed;
      GroupByStripe(t, ids);
    }
    if (const size_t k = FirstNonFinite(grads.data(), grads.size()); k < grads.size()) {
      return NonFiniteGradient(t, ids, grads, k);
    }
    UpdateResult local;
    if (update_id.sequence != 0) {
      absl::MutexLock lock(&dedup_mu_);
      auto it = dedup_.find(update_id.worker_id);
      if (it == dedup_.end()) {
        if (dedup_.size() >= kMaxDedupWorkers) return TooManyWorkers();
        it = dedup_.emplace(update_id.worker_id, std::vector<SequenceWindow>(layouts_.size())).first;
      }
      SequenceWindow& window = it->second[t];
      const SequenceWindow::Verdict verdict = window.Mark(update_id.sequence);
      if (verdict == SequenceWindow::kTooOld) return TooOld(t, update_id, window);
      if (verdict == SequenceWindow::kRepeat) {
        duplicates_[t].fetch_add(1, std::memory_order_relaxed);
        local.duplicate = true;
        if (result != nullptr) *result = local;
        return absl::OkStatus();
      }
    }
    // Updates never admit: an id without a row gets one only when the table admits everything.
    const bool create_absent = config.admission.AdmitsEverything();
    VisitGroups([&](Stripe& stripe, absl::Span<const uint32_t> positions, const uint64_t* hashes)
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
                      if (layout.policy == EvictionPolicy::kTtl) ExpireLocked(stripe, t, /*all=*/false);
                      VisitRows(stripe, t, ids, positions, hashes, create_absent, layout.slot_bytes,
                                [&](uint32_t position, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
                                  if (handle == kNoHandle) {
                                    ++stripe.counters[t].dropped_updates;
                                    ++local.dropped;
                                    return;
                                  }
                                  if (!StepRowLocked(stripe, handle, layout, config,
                                                     grads.data() + static_cast<size_t>(position) * layout.dim)) {
                                    ++local.nonfinite;
                                    return;
                                  }
                                  if (track_changes_) MarkChangedLocked(stripe, handle);
                                  ++stripe.counters[t].updates;
                                  ++local.applied;
                                });
                    });
    if (local.nonfinite > 0) nonfinite_results_[t].fetch_add(local.nonfinite, std::memory_order_relaxed);
    if (result != nullptr) *result = local;
    return absl::OkStatus();
  }

  // Update's refusals, shared with CheckUpdate.
  absl::Status CheckGradientLength(int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads) const {
    const int dim = layouts_[t].dim;
    if (grads.size() == ids.size() * static_cast<size_t>(dim)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("table '", table(t).name, "': gradient holds ", grads.size(),
                                                   " floats, expected ", ids.size(), " ids x dim ", dim));
  }
  absl::Status NonFiniteGradient(int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads, size_t k) {
    rejected_nonfinite_[t].fetch_add(1, std::memory_order_relaxed);
    const int dim = layouts_[t].dim;
    const size_t row = k / dim;
    return absl::InvalidArgumentError(absl::StrCat("table '", table(t).name, "': gradient of id ", ids[row], " (row ",
                                                   row, ", element ", k % dim, ") is ", grads[k],
                                                   "; the update was rejected and nothing written"));
  }
  absl::Status TooOld(int t, UpdateId update_id, const SequenceWindow& window) const {
    return absl::FailedPreconditionError(absl::StrCat("table '", table(t).name, "': update sequence ",
                                                      update_id.sequence, " of worker ", update_id.worker_id, " is ",
                                                      kDedupWindow, " or more below its newest (", window.highest(),
                                                      "), too old to tell whether it was applied; nothing written"));
  }
  static absl::Status TooManyWorkers() {
    return absl::ResourceExhaustedError(
        absl::StrCat("more than ", kMaxDedupWorkers, " distinct worker ids sent updates"));
  }

  void AdvanceDataTime(int t, uint64_t seconds) override {
    if (t < 0 || t >= num_tables()) return;
    uint64_t old = data_time_[t].load(std::memory_order_relaxed);
    while (seconds > old && !data_time_[t].compare_exchange_weak(old, seconds, std::memory_order_relaxed)) {
    }
    if (seconds <= old || layouts_[t].policy != EvictionPolicy::kTtl) return;
    const uint64_t ttl = table(t).eviction.ttl_seconds;
    if (old == 0) {
      // The table's first data time: rows used before it (restored from a checkpoint without
      // their times, or looked up without a time) count as used now, not at time 0.
      for (const auto& stripe_ptr : stripes_) {
        Stripe& stripe = *stripe_ptr;
        StripeLock lock(&stripe.mu);
        const uint16_t now = TtlNow(t);
        for (uint32_t h = stripe.lru_head[t]; h != kNoHandle; h = NextLocked(stripe, h)) {
          Header(stripe, h)->set_score(now);
        }
      }
      absl::MutexLock lock(&sweep_mu_);
      swept_time_[t] = std::max(swept_time_[t], seconds);
      return;
    }
    // Sweep every stripe once per TTL of data time, so that no row outlives what its 16-bit
    // score can tell (64 TTLs); a jump past half of that expires every row outright.
    {
      absl::MutexLock lock(&sweep_mu_);
      if (seconds < swept_time_[t] + ttl) return;
      swept_time_[t] = seconds;
    }
    const bool all = seconds - old >= 32 * ttl;
    for (const auto& stripe_ptr : stripes_) {
      Stripe& stripe = *stripe_ptr;
      StripeLock lock(&stripe.mu);
      ExpireLocked(stripe, t, all);
    }
  }

  uint64_t data_time(int t) const override {
    return t < 0 || t >= num_tables() ? 0 : data_time_[t].load(std::memory_order_relaxed);
  }

  void CountRejectedRequest() override { rejected_requests_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t rejected_requests() const override { return rejected_requests_.load(std::memory_order_relaxed); }

  StoreStats Stats() const override {
    StoreStats stats;
    stats.capacity_rows = capacity_rows_;
    stats.capacity_bytes = capacity_bytes_;
    stats.tables.resize(num_tables());
    stats.bytes = sizeof(*this) + num_stripes_ * sizeof(Stripe);
    for (int t = 0; t < num_tables(); ++t) {
      TableStats& ts = stats.tables[t];
      ts.name = table(t).name;
      ts.dim = layouts_[t].dim;
      ts.optimizer = std::string(OptimizerName(table(t).optimizer.kind));
      ts.eviction_policy = std::string(EvictionPolicyName(layouts_[t].policy));
      ts.data_time = data_time_[t].load(std::memory_order_relaxed);
      ts.row_bytes = layouts_[t].slot_bytes;
      ts.capacity_rows = table(t).capacity_rows;
      ts.rejected_nonfinite = rejected_nonfinite_[t].load(std::memory_order_relaxed);
      ts.duplicate_updates = duplicates_[t].load(std::memory_order_relaxed);
      ts.nonfinite_results = nonfinite_results_[t].load(std::memory_order_relaxed);
    }
    for (const auto& stripe_ptr : stripes_) {
      const Stripe& stripe = *stripe_ptr;
      StripeLock lock(&stripe.mu);
      stats.bytes += stripe.index.bytes();
      for (int t = 0; t < num_tables(); ++t) {
        TableStats& ts = stats.tables[t];
        const TableCounters& c = stripe.counters[t];
        ts.rows += c.rows;
        ts.lookups += c.lookups;
        ts.updates += c.updates;
        ts.evictions += c.evictions;
        ts.expirations += c.expirations;
        ts.admission_rejections += c.admission_rejections;
        ts.dropped_updates += c.dropped_updates;
        ts.bytes += stripe.slabs[t].bytes();
        stats.bytes += stripe.slabs[t].bytes() + stripe.sketches[t].bytes();
      }
    }
    for (int t = 0; t < num_tables(); ++t) {
      stats.rows += stats.tables[t].rows;
      stats.payload_bytes += stats.tables[t].rows * sizeof(float) * (layouts_[t].dim + layouts_[t].state_floats);
    }
    return stats;
  }

  StoreSnapshot Snapshot() const override {
    StoreSnapshot snap;
    SnapshotInto(&snap);
    return snap;
  }

  void SnapshotInto(StoreSnapshot* snap) const override {
    SnapshotHead(snap);
    for (int t = 0; t < num_tables(); ++t) {  // Once: rows created meanwhile only grow the vectors.
      const uint64_t rows = table_rows_[t].load(std::memory_order_relaxed);
      snap->tables[t].ids.reserve(rows);
      snap->tables[t].values.reserve(rows * (layouts_[t].dim + layouts_[t].state_floats));
    }
    {
      absl::MutexLock lock(&dedup_mu_);
      SnapshotDedupLocked(snap);
    }
    for (int s = 0; s < num_stripes_; ++s) {
      const Stripe& stripe = *stripes_[s];
      StripeLock lock(&stripe.mu);
      SnapshotStripeStateLocked(stripe, s, snap);
      for (int t = 0; t < num_tables(); ++t) {
        StoreSnapshot::Table& out = snap->tables[t];
        ForEachRowLocked(stripe, t, [&](uint64_t id, const float* w, int floats, std::optional<uint64_t> score) {
          out.ids.push_back(id);
          out.values.insert(out.values.end(), w, w + floats);
          if (score.has_value()) out.scores.push_back(*score);
        });
      }
    }
  }

  void RunFrozen(const std::function<void()>& fn) override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::MutexLock dedup(&dedup_mu_);
    for (const auto& stripe : stripes_) stripe->mu.Lock();
    fn();
    for (const auto& stripe : stripes_) stripe->mu.Unlock();
  }

  // The locks are held by RunFrozen's caller, whose forked child calls these.
  void FrozenHead(StoreSnapshot* head,
                  std::vector<uint64_t>* rows_per_table) const override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    SnapshotHead(head);
    SnapshotDedupLocked(head);
    rows_per_table->assign(num_tables(), 0);
    for (int s = 0; s < num_stripes_; ++s) {
      const Stripe& stripe = *stripes_[s];
      SnapshotStripeStateLocked(stripe, s, head);
      for (int t = 0; t < num_tables(); ++t) (*rows_per_table)[t] += stripe.counters[t].rows;
    }
  }

  absl::Status FrozenRows(size_t piece_rows, const RowPieceFn& rows) const override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    piece_rows = std::max<size_t>(piece_rows, 1);
    StoreSnapshot::Table piece;
    for (int t = 0; t < num_tables(); ++t) {
      const size_t floats = static_cast<size_t>(layouts_[t].dim + layouts_[t].state_floats);
      piece.ids.clear();
      piece.ids.reserve(piece_rows);
      piece.values.clear();
      piece.values.reserve(piece_rows * floats);
      piece.scores.clear();
      absl::Status status;
      for (int s = 0; s < num_stripes_ && status.ok(); ++s) {
        ForEachRowLocked(*stripes_[s], t, [&](uint64_t id, const float* w, int n, std::optional<uint64_t> score) {
          if (!status.ok()) return;
          piece.ids.push_back(id);
          piece.values.insert(piece.values.end(), w, w + n);
          if (score.has_value()) piece.scores.push_back(*score);
          if (piece.ids.size() < piece_rows) return;
          status = rows(t, piece);
          piece.ids.clear();
          piece.values.clear();
          piece.scores.clear();
        });
      }
      if (status.ok() && !piece.ids.empty()) status = rows(t, piece);
      HYREC_RETURN_IF_ERROR(status);
    }
    return absl::OkStatus();
  }

  absl::Status RestoreRows(int t, absl::Span<const uint64_t> ids, absl::Span<const float> values,
                           absl::Span<const uint64_t> scores) override {
    HYREC_CHECK_TABLE(t);
    const TableLayout& layout = layouts_[t];
    const size_t floats = static_cast<size_t>(layout.dim + layout.state_floats);
    if (values.size() != ids.size() * floats) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table(t).name, "': ", values.size(),
                                                     " floats restored for ", ids.size(), " rows of ", floats));
    }
    if (!scores.empty() && scores.size() != ids.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table(t).name, "': ", scores.size(), " scores restored for ", ids.size(), " rows"));
    }
    if (const size_t k = FirstNonFinite(values.data(), values.size()); k < values.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table(t).name, "': restored row of id ", ids[k / floats], " holds ", values[k]));
    }
    absl::Status status;
    ForEachStripeGroup(
        t, ids,
        [&](Stripe& stripe, absl::Span<const uint32_t> positions, const uint64_t* hashes)
            ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
              for (const uint32_t p : positions) {
                uint32_t handle = FindLocked(stripe, t, ids[p], hashes[p]);
                if (handle == kNoHandle) {
                  handle = InsertLocked(stripe, t, ids[p], hashes[p], /*restore=*/true);
                } else {
                  MoveToFrontLocked(stripe, handle);
                }
                if (handle == kNoHandle) {
                  status = absl::ResourceExhaustedError(
                      absl::StrCat("table '", table(t).name, "': a stripe is full while restoring"));
                  continue;
                }
                CopyFloats(values.data() + p * floats, Weights(stripe, handle), static_cast<int>(floats));
                SetRestoredScoreLocked(stripe, handle,
                                       scores.empty() ? std::optional<uint64_t>() : std::optional<uint64_t>(scores[p]));
                if (track_changes_) MarkChangedLocked(stripe, handle);
              }
              if (layout.policy != EvictionPolicy::kLru) stripe.unsorted[t] = 1;
            });
    return status;
  }

  absl::Status RestoreCounters(const StoreSnapshot& snap, bool exact) override {
    if (exact && snap.num_stripes != static_cast<uint32_t>(num_stripes_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("an exact restore needs ", num_stripes_, " stripes; the snapshot has ", snap.num_stripes));
    }
    // A sketch's positions depend on the id's hash alone, and so does its stripe: with the same
    // stripes, old stripe s's counts belong in new stripe s. With other stripes they are dropped
    // (admission counts start again).
    const bool same_stripes = snap.num_stripes == static_cast<uint32_t>(num_stripes_);
    for (const StoreSnapshot::Sketch& k : snap.sketches) {
      if (k.table >= layouts_.size()) return absl::InvalidArgumentError(absl::StrCat("sketch of table ", k.table));
      if (!same_stripes || k.stripe >= static_cast<uint32_t>(num_stripes_)) continue;
      Stripe& stripe = *stripes_[k.stripe];
      StripeLock lock(&stripe.mu);
      CountMinSketch& sketch = stripe.sketches[k.table];
      if (!sketch.used() || sketch.counters().size() != k.counters.size()) continue;
      sketch.Restore(k.counters, k.increments, exact);
    }
    if (exact) {
      for (size_t s = 0; s < snap.stripe_rng.size() && s < stripes_.size(); ++s) {
        StripeLock lock(&stripes_[s]->mu);
        stripes_[s]->rng_state = snap.stripe_rng[s];
      }
      for (size_t t = 0; t < snap.tables.size() && t < layouts_.size(); ++t) {
        const std::vector<uint64_t>& uses = snap.tables[t].lfu_uses;
        for (size_t s = 0; s < uses.size() && s < stripes_.size(); ++s) {
          StripeLock lock(&stripes_[s]->mu);
          stripes_[s]->lfu_uses[t] = uses[s];
        }
      }
    }
    absl::MutexLock lock(&dedup_mu_);
    for (const StoreSnapshot::Dedup& d : snap.dedup) {
      if (d.table >= layouts_.size() || d.seen.size() != kDedupWindow / 64) {
        return absl::InvalidArgumentError(absl::StrCat("dedup window of worker ", d.worker, ", table ", d.table));
      }
      auto it = dedup_.find(d.worker);
      if (it == dedup_.end()) {
        if (dedup_.size() >= kMaxDedupWorkers) continue;
        it = dedup_.emplace(d.worker, std::vector<SequenceWindow>(layouts_.size())).first;
      }
      it->second[d.table].Merge(d.highest, d.seen, d.applied);
    }
    delta_sequence_ = std::max(delta_sequence_, snap.delta_sequence);
    return absl::OkStatus();
  }

  absl::StatusOr<StoreDelta> TakeDelta() override {
    if (!track_changes_) return absl::FailedPreconditionError("the store does not track changes (track_changes)");
    StoreDelta delta;
    delta.tables.resize(num_tables());
    {
      absl::MutexLock lock(&dedup_mu_);
      delta.sequence = ++delta_sequence_;
    }
    for (const auto& stripe_ptr : stripes_) {
      Stripe& stripe = *stripe_ptr;
      StripeLock lock(&stripe.mu);
      for (int t = 0; t < num_tables(); ++t) {
        StoreDelta::Table& out = delta.tables[t];
        std::vector<uint8_t>& dirty = stripe.dirty[t];
        const int dim = layouts_[t].dim;
        for (uint32_t h = stripe.lru_tail[t]; h != kNoHandle; h = PrevLocked(stripe, h)) {
          const uint32_t slot = HandleSlot(h);
          if (slot >= dirty.size() || dirty[slot] == 0) continue;
          dirty[slot] = 0;
          out.ids.push_back(Header(stripe, h)->id);
          const float* w = Weights(stripe, h);
          out.weights.insert(out.weights.end(), w, w + dim);
        }
        out.tombstones.insert(out.tombstones.end(), stripe.tombstones[t].begin(), stripe.tombstones[t].end());
        stripe.tombstones[t].clear();
      }
    }
    return delta;
  }

 private:
  // A snapshot's tables with their data times, and nothing else: the start of every snapshot.
  void SnapshotHead(StoreSnapshot* snap) const {
    snap->tables.resize(num_tables());
    for (int t = 0; t < num_tables(); ++t) {
      StoreSnapshot::Table& table = snap->tables[t];
      table.ids.clear();
      table.values.clear();
      table.scores.clear();
      table.lfu_uses.clear();
      table.data_time = data_time_[t].load(std::memory_order_relaxed);
    }
    snap->sketches.clear();
    snap->stripe_rng.clear();
    snap->dedup.clear();
    snap->num_stripes = static_cast<uint32_t>(num_stripes_);
  }

  void SnapshotDedupLocked(StoreSnapshot* snap) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(dedup_mu_) {
    snap->delta_sequence = delta_sequence_;
    for (const auto& [worker, windows] : dedup_) {
      for (size_t t = 0; t < windows.size(); ++t) {
        if (windows[t].highest() == 0) continue;
        snap->dedup.push_back(
            {worker, static_cast<uint32_t>(t), windows[t].highest(), windows[t].Words(), windows[t].applied()});
      }
    }
  }

  // Stripe s's admission coin, lfu aging clocks and sketches.
  void SnapshotStripeStateLocked(const Stripe& stripe, int s, StoreSnapshot* snap) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    snap->stripe_rng.push_back(stripe.rng_state);
    for (int t = 0; t < num_tables(); ++t) {
      if (layouts_[t].policy == EvictionPolicy::kLfu) snap->tables[t].lfu_uses.push_back(stripe.lfu_uses[t]);
      const CountMinSketch& sketch = stripe.sketches[t];
      if (sketch.used()) {
        snap->sketches.push_back(
            {static_cast<uint32_t>(s), static_cast<uint32_t>(t), sketch.increments(), sketch.counters()});
      }
    }
  }

  // Calls fn(id, values, floats, score) for each of the stripe's rows of table t, least recently
  // used first; the score as StoreSnapshot::Table::scores holds it (none under lru).
  template <typename Fn>
  void ForEachRowLocked(const Stripe& stripe, int t, Fn&& fn) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int floats = layouts_[t].dim + layouts_[t].state_floats;
    const EvictionPolicy policy = layouts_[t].policy;
    const uint64_t now = data_time_[t].load(std::memory_order_relaxed);
    for (uint32_t h = stripe.lru_tail[t]; h != kNoHandle; h = PrevLocked(stripe, h)) {
      const SlotHeader* header = Header(stripe, h);
      std::optional<uint64_t> score;
      if (policy == EvictionPolicy::kLfu) {
        score = header->score();
      } else if (policy == EvictionPolicy::kTtl) {
        const uint64_t age = static_cast<uint64_t>(TtlAge(t, header->score())) * layouts_[t].ttl_granule;
        score = now > age ? now - age : 0;
      }
      fn(header->id, Weights(stripe, h), floats, score);
    }
  }

  // A restored row's score from its snapshot's (StoreSnapshot::Table::scores), or as for a new
  // row when there is none.
  void SetRestoredScoreLocked(Stripe& stripe, uint32_t handle, std::optional<uint64_t> score)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    SlotHeader* h = Header(stripe, handle);
    switch (layouts_[t].policy) {
      case EvictionPolicy::kLru:
        return;
      case EvictionPolicy::kLfu:
        h->set_score(static_cast<uint16_t>(std::min<uint64_t>(score.value_or(1), UINT16_MAX)));
        return;
      case EvictionPolicy::kTtl:
        h->set_score(score.has_value() ? static_cast<uint16_t>(*score / layouts_[t].ttl_granule) : TtlNow(t));
        return;
    }
  }

  void MarkChangedLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    std::vector<uint8_t>& dirty = stripe.dirty[HandleTable(handle)];
    const uint32_t slot = HandleSlot(handle);
    if (slot >= dirty.size()) dirty.resize(std::max<size_t>(slot + 1, dirty.size() * 2), 0);
    dirty[slot] = 1;
  }

  // One optimizer step of a row, kept only when the weights and the optimizer's moments stay
  // finite; otherwise the row is put back as it was and false returned.
  bool StepRowLocked(Stripe& stripe, uint32_t handle, const TableLayout& layout, const TableConfig& config,
                     const float* grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    float* weights = Weights(stripe, handle);
    const size_t floats = static_cast<size_t>(layout.dim + layout.state_floats);
    thread_local std::vector<float> before;
    before.assign(weights, weights + floats);
    ApplyOptimizer(config.optimizer, layout.dim, grad, weights, weights + layout.dim);
    // Adam's last state float holds its step count, not a float.
    const size_t checked = static_cast<size_t>(layout.dim + std::min(layout.state_floats, 2 * layout.dim));
    if (FirstNonFinite(weights, checked) == checked) return true;
    std::memcpy(weights, before.data(), floats * sizeof(float));
    return false;
  }

  // The positions of one call's ids grouped by stripe (GroupByStripe), reused by the thread.
  struct GroupScratch {
    std::vector<uint64_t> hashes;
    std::vector<uint32_t> stripe_of;
    std::vector<uint32_t> order;
    std::vector<uint32_t> starts;  // starts[s] .. starts[s + 1]: stripe s's run in order.
    std::vector<uint32_t> fill;
    std::vector<std::pair<uint64_t, uint32_t>> sorted;  // GroupsRepeatIds' large groups.
  };
  static GroupScratch& Scratch() {
    thread_local GroupScratch scratch;
    return scratch;
  }

  // Hashes `ids` and groups their positions by stripe (counting sort) into Scratch().
  void GroupByStripe(int t, absl::Span<const uint64_t> ids) {
    GroupScratch& scratch = Scratch();
    const size_t n = ids.size();
    scratch.hashes.resize(n);
    scratch.stripe_of.resize(n);
    scratch.order.resize(n);
    scratch.starts.assign(num_stripes_ + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t hash = Hash(t, ids[i]);
      scratch.hashes[i] = hash;
      const uint32_t s = StripeIndex(hash);
      scratch.stripe_of[i] = s;
      ++scratch.starts[s + 1];
    }
    for (int s = 0; s < num_stripes_; ++s) scratch.starts[s + 1] += scratch.starts[s];
    scratch.fill.assign(scratch.starts.begin(), scratch.starts.end() - 1);
    for (size_t i = 0; i < n; ++i) {
      scratch.order[scratch.fill[scratch.stripe_of[i]]++] = static_cast<uint32_t>(i);
    }
  }

  // Whether the grouped ids repeat one: a repeat falls in the same stripe with the same hash, so
  // each group is compared within itself while its hashes are in cache (pairwise when small,
  // sorted when large).
  bool GroupsRepeatIds(absl::Span<const uint64_t> ids) const {
    GroupScratch& scratch = Scratch();
    constexpr uint32_t kPairwise = 32;
    for (int s = 0; s < num_stripes_; ++s) {
      const uint32_t begin = scratch.starts[s];
      const uint32_t end = scratch.starts[s + 1];
      if (end - begin <= kPairwise) {
        for (uint32_t a = begin; a < end; ++a) {
          const uint32_t pa = scratch.order[a];
          for (uint32_t b = a + 1; b < end; ++b) {
            const uint32_t pb = scratch.order[b];
            if (scratch.hashes[pa] == scratch.hashes[pb] && ids[pa] == ids[pb]) return true;
          }
        }
        continue;
      }
      scratch.sorted.clear();
      for (uint32_t a = begin; a < end; ++a) {
        scratch.sorted.emplace_back(scratch.hashes[scratch.order[a]], scratch.order[a]);
      }
      std::sort(scratch.sorted.begin(), scratch.sorted.end());
      for (size_t k = 1; k < scratch.sorted.size(); ++k) {
        if (scratch.sorted[k].first == scratch.sorted[k - 1].first &&
            ids[scratch.sorted[k].second] == ids[scratch.sorted[k - 1].second]) {
          return true;
        }
      }
    }
    return false;
  }

  // Calls visit(stripe, positions, hashes) once per stripe group of the last GroupByStripe that
  // has any, holding that stripe's lock: one lock per stripe per batch instead of one per id.
  template <typename Visit>
  void VisitGroups(Visit&& visit) {
    GroupScratch& scratch = Scratch();
    for (int s = 0; s < num_stripes_; ++s) {
      const uint32_t begin = scratch.starts[s];
      const uint32_t end = scratch.starts[s + 1];
      if (begin == end) continue;
      Stripe& stripe = *stripes_[s];
      StripeLock lock(&stripe.mu);
      visit(stripe, absl::Span<const uint32_t>(scratch.order.data() + begin, end - begin), scratch.hashes.data());
    }
  }

  template <typename Visit>
  void ForEachStripeGroup(int t, absl::Span<const uint64_t> ids, Visit&& visit) {
    GroupByStripe(t, ids);
    VisitGroups(std::forward<Visit>(visit));
  }

  // Calls row(position, handle) for each position of one stripe's group, with the row's handle
  // (kNoHandle when the id has no row and none is created). The group is walked in chunks, as a
  // pipeline of prefetches that lets the cache misses of many ids overlap: the index buckets of
  // chunk i + 2, then the slots their tags point at for chunk i + 1 (the first `touch_bytes` of
  // each), then, for chunk i in a bounded store, the LRU neighbours that moving its rows to the
  // front writes.
  // Within a chunk, existing rows are found and moved to the LRU front first; absent ids are then
  // created (when `create` allows and admission agrees), so that creating one can never evict a
  // row found earlier in the chunk before it was used.
  template <typename RowFn>
  void VisitRows(Stripe& stripe, int t, absl::Span<const uint64_t> ids, absl::Span<const uint32_t> positions,
                 const uint64_t* hashes, bool create, uint32_t touch_bytes, RowFn&& row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    constexpr size_t kChunk = 16;
    const size_t n = positions.size();
    auto prefetch_buckets = [&](size_t begin) {
      for (size_t k = begin; k < std::min(begin + kChunk, n); ++k) {
        stripe.index.Prefetch(hashes[positions[k]]);
      }
    };
    // A hint only: the candidate may be another key's slot (a tag collision), or none.
    auto prefetch_slots = [&](size_t begin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
      for (size_t k = begin; k < std::min(begin + kChunk, n); ++k) {
        const uint32_t candidate = stripe.index.Candidate(hashes[positions[k]]);
        if (candidate == kNoHandle) continue;
        const char* slot = reinterpret_cast<const char*>(Header(stripe, candidate));
        PrefetchLine(slot);
        for (uint32_t line = 64 - (reinterpret_cast<uintptr_t>(slot) & 63); line < touch_bytes; line += 64) {
          PrefetchLine(slot + line);
        }
      }
    };
    uint32_t handles[kChunk];
    const bool keeps_order = keeps_order_[t];
    const bool lru = layouts_[t].policy == EvictionPolicy::kLru;
    // A use of a found row; kLru's, the move to the front, without the policy switch.
    auto touch = [&](uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
      if (lru) {
        MoveToFrontLocked(stripe, handle);
      } else {
        TouchLocked(stripe, handle);
      }
    };
    prefetch_buckets(0);
    prefetch_buckets(kChunk);
    prefetch_slots(0);
    for (size_t base = 0; base < n; base += kChunk) {
      const size_t count = std::min(kChunk, n - base);
      const uint32_t* chunk = positions.data() + base;
      prefetch_buckets(base + 2 * kChunk);
      prefetch_slots(base + kChunk);
      for (size_t k = 0; k < count; ++k) {
        const uint32_t p = chunk[k];
        handles[k] = FindLocked(stripe, t, ids[p], hashes[p]);
        if (handles[k] != kNoHandle && keeps_order) {
          // The list neighbours are written by the move to the front: fetch them for writing now.
          const uint32_t prev = PrevLocked(stripe, handles[k]);
          const uint32_t next = NextLocked(stripe, handles[k]);
          if (prev != kNoHandle) PrefetchLine(Header(stripe, prev));
          if (next != kNoHandle) PrefetchLine(Header(stripe, next));
        }
      }
      for (size_t k = 0; k < count; ++k) {
        if (handles[k] == kNoHandle) continue;
        touch(handles[k]);
        row(chunk[k], handles[k]);
      }
      for (size_t k = 0; k < count; ++k) {
        if (handles[k] != kNoHandle) continue;
        const uint32_t p = chunk[k];
        uint32_t handle = FindLocked(stripe, t, ids[p], hashes[p]);  // A duplicate may have made it.
        if (handle != kNoHandle) {
          touch(handle);
        } else if (create && AdmitLocked(stripe, t, hashes[p])) {
          handle = InsertLocked(stripe, t, ids[p], hashes[p]);
        }
        row(p, handle);
      }
    }
  }

  uint64_t Hash(int t, uint64_t id) const { return Mix64(id ^ layouts_[t].salt); }
  // The low 32 bits of the hash, mapped onto [0, num_stripes) by multiply-shift (no division);
  // the index uses the high bits, so the two choices are independent.
  uint32_t StripeIndex(uint64_t hash) const {
    return static_cast<uint32_t>(
        (static_cast<uint64_t>(static_cast<uint32_t>(hash)) * static_cast<uint64_t>(num_stripes_)) >> 32);
  }
  Stripe& StripeFor(uint64_t hash) const { return *stripes_[StripeIndex(hash)]; }

  static SlotHeader* Header(const Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    return reinterpret_cast<SlotHeader*>(stripe.slabs[HandleTable(handle)].Slot(HandleSlot(handle)));
  }
  static float* Weights(const Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    return reinterpret_cast<float*>(Header(stripe, handle) + 1);
  }

  uint32_t FindLocked(const Stripe& stripe, int t, uint64_t id, uint64_t hash) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    return stripe.index.Find(
        hash, [&](uint32_t handle) { return HandleTable(handle) == t && Header(stripe, handle)->id == id; });
  }

  bool AdmitLocked(Stripe& stripe, int t, uint64_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const AdmissionConfig& admission = table(t).admission;
    if (admission.AdmitsEverything()) return true;
    if (admission.min_count > 1 && stripe.sketches[t].Increment(hash) < admission.min_count) {
      ++stripe.counters[t].admission_rejections;
      return false;
    }
    if (admission.probability < 1.0) {
      stripe.rng_state += 0x9e3779b97f4a7c15ULL;
      const double coin = static_cast<double>(Mix64(stripe.rng_state) >> 11) * 0x1.0p-53;
      if (coin >= admission.probability) {
        ++stripe.counters[t].admission_rejections;
        return false;
      }
    }
    return true;
  }

  // The list neighbours of a row, as handles (kNoHandle at either end).
  static uint32_t PrevLocked(const Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const uint32_t slot = Header(stripe, handle)->prev_slot();
    return slot == kNoLink ? kNoHandle : MakeHandle(HandleTable(handle), slot);
  }
  static uint32_t NextLocked(const Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const uint32_t slot = Header(stripe, handle)->next_slot();
    return slot == kNoLink ? kNoHandle : MakeHandle(HandleTable(handle), slot);
  }
  static uint32_t LinkOf(uint32_t handle) { return handle == kNoHandle ? kNoLink : HandleSlot(handle); }

  // The links of a row stay within its table's list.
  void UnlinkLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    const uint32_t prev = PrevLocked(stripe, handle);
    const uint32_t next = NextLocked(stripe, handle);
    if (prev != kNoHandle) {
      Header(stripe, prev)->set_next_slot(LinkOf(next));
    } else {
      stripe.lru_head[t] = next;
    }
    if (next != kNoHandle) {
      Header(stripe, next)->set_prev_slot(LinkOf(prev));
    } else {
      stripe.lru_tail[t] = prev;
    }
  }

  // Links an unlinked row just before `before` (toward the head), or at the tail when
  // `before` is kNoHandle.
  void LinkBeforeLocked(Stripe& stripe, uint32_t handle, uint32_t before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    SlotHeader* h = Header(stripe, handle);
    const uint32_t prev = before == kNoHandle ? stripe.lru_tail[t] : PrevLocked(stripe, before);
    h->set_prev_slot(LinkOf(prev));
    h->set_next_slot(LinkOf(before));
    if (prev != kNoHandle) {
      Header(stripe, prev)->set_next_slot(HandleSlot(handle));
    } else {
      stripe.lru_head[t] = handle;
    }
    if (before != kNoHandle) {
      Header(stripe, before)->set_prev_slot(HandleSlot(handle));
    } else {
      stripe.lru_tail[t] = handle;
    }
  }

  void PushFrontLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    SlotHeader* h = Header(stripe, handle);
    const uint32_t head = stripe.lru_head[t];
    h->set_prev_slot(kNoLink);
    h->set_next_slot(LinkOf(head));
    if (head != kNoHandle) Header(stripe, head)->set_prev_slot(HandleSlot(handle));
    stripe.lru_head[t] = handle;
    if (stripe.lru_tail[t] == kNoHandle) stripe.lru_tail[t] = handle;
  }

  // A no-op for a table whose order nothing reads (kLru in an unbounded store, which never
  // evicts; its lists stay in insertion order): the move writes two more random lines per row.
  void MoveToFrontLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    if (!keeps_order_[t] || stripe.lru_head[t] == handle) return;
    UnlinkLocked(stripe, handle);
    PushFrontLocked(stripe, handle);
  }

  // The score of a kTtl row used now: the table's data time in granules, modulo 2^16.
  uint16_t TtlNow(int t) const {
    return static_cast<uint16_t>(data_time_[t].load(std::memory_order_relaxed) / layouts_[t].ttl_granule);
  }
  // Granules of data time since a kTtl row's last use.
  uint32_t TtlAge(int t, uint16_t score) const { return static_cast<uint16_t>(TtlNow(t) - score); }

  // A use of an existing row (a lookup, an update, a restore that overwrites it).
  void TouchLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    switch (layouts_[t].policy) {
      case EvictionPolicy::kLru:
        MoveToFrontLocked(stripe, handle);
        return;
      case EvictionPolicy::kTtl:
        EnsureOrderLocked(stripe, t);
        Header(stripe, handle)->set_score(TtlNow(t));
        MoveToFrontLocked(stripe, handle);
        return;
      case EvictionPolicy::kLfu:
        EnsureOrderLocked(stripe, t);
        LfuUseLocked(stripe, handle);
        return;
    }
  }

  // kLfu: the row leaves its count's group; the group's head passes to the next row when that
  // one has the same count.
  void LfuLeaveGroupLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    auto& first = stripe.lfu_first[HandleTable(handle)];
    const uint16_t count = Header(stripe, handle)->score();
    auto it = first.find(count);
    if (it == first.end() || it->second != handle) return;
    const uint32_t next = NextLocked(stripe, handle);
    if (next != kNoHandle && Header(stripe, next)->score() == count) {
      it->second = next;
    } else {
      first.erase(it);
    }
  }

  // kLfu: one more use of a row: its count grows and it moves to the front of its new group.
  void LfuUseLocked(Stripe& stripe, uint32_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const int t = HandleTable(handle);
    SlotHeader* h = Header(stripe, handle);
    const uint16_t count = h->score();
    const uint16_t grown = count == UINT16_MAX ? count : static_cast<uint16_t>(count + 1);
    auto& first = stripe.lfu_first[t];
    LfuLeaveGroupLocked(stripe, handle);
    auto up = first.find(grown);
    uint32_t before = kNoHandle;
    if (up != first.end()) {
      before = up->second;
    } else {
      // Above the rest of its old group, or where it stands when it was the group.
      auto same = first.find(count);
      before = same != first.end() ? same->second : handle;
    }
    h->set_score(grown);
    if (before != handle) {
      UnlinkLocked(stripe, handle);
      LinkBeforeLocked(stripe, handle, before);
    }
    first[grown] = handle;
    if (++stripe.lfu_uses[t] >=
        static_cast<uint64_t>(layouts_[t].lfu_aging) * std::max<uint64_t>(1, stripe.counters[t].rows)) {
      HalveCountsLocked(stripe, t);
    }
  }

  // kLfu aging: halves every count of the table in this stripe. Halving keeps the order, so
  // the list stays; only the groups' heads are found again.
  void HalveCountsLocked(Stripe& stripe, int t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    auto& first = stripe.lfu_first[t];
    first.clear();
    for (uint32_t h = stripe.lru_head[t]; h != kNoHandle; h = NextLocked(stripe, h)) {
      SlotHeader* header = Header(stripe, h);
      header->set_score(static_cast<uint16_t>(header->score() >> 1));
      first.try_emplace(header->score(), h);
    }
    stripe.lfu_uses[t] = 0;
  }

  // Puts restored rows in their policy's order: by count (kLfu) or last use (kTtl), the list's
  // order kept among equals, and finds the kLfu groups' heads.
  void EnsureOrderLocked(Stripe& stripe, int t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    if (ABSL_PREDICT_FALSE(stripe.unsorted[t])) SortListLocked(stripe, t);
  }
  ABSL_ATTRIBUTE_NOINLINE void SortListLocked(Stripe& stripe, int t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    stripe.unsorted[t] = 0;
    std::vector<std::pair<uint32_t, uint32_t>> rows;  // (rank, handle); lower ranks first.
    const bool lfu = layouts_[t].policy == EvictionPolicy::kLfu;
    for (uint32_t h = stripe.lru_head[t]; h != kNoHandle; h = NextLocked(stripe, h)) {
      const uint16_t score = Header(stripe, h)->score();
      rows.emplace_back(lfu ? UINT16_MAX - score : TtlAge(t, score), h);
    }
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    stripe.lru_head[t] = kNoHandle;
    stripe.lru_tail[t] = kNoHandle;
    stripe.lfu_first[t].clear();
    for (const auto& [rank, h] : rows) {
      LinkBeforeLocked(stripe, h, kNoHandle);
      if (lfu) stripe.lfu_first[t].try_emplace(Header(stripe, h)->score(), h);
    }
  }

  // kTtl: evicts the rows of table t in this stripe unused for more than the TTL (`all`: every
  // row, when data time has jumped past what the scores can tell).
  void ExpireLocked(Stripe& stripe, int t, bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    EnsureOrderLocked(stripe, t);
    const uint32_t ttl = layouts_[t].ttl_granules;
    for (uint32_t h = stripe.lru_tail[t]; h != kNoHandle; h = stripe.lru_tail[t]) {
      if (!all && TtlAge(t, Header(stripe, h)->score()) <= ttl) break;
      EvictOneLocked(stripe, t, /*expired=*/true);
    }
  }

  bool OverCapacity() const {
    return (capacity_rows_ > 0 && total_rows_.load(std::memory_order_relaxed) > capacity_rows_) ||
           (capacity_bytes_ > 0 && total_charged_.load(std::memory_order_relaxed) > capacity_bytes_);
  }

  bool TableOverCapacity(int t) const {
    const uint64_t capacity = table(t).capacity_rows;
    return capacity > 0 && table_rows_[t].load(std::memory_order_relaxed) > capacity;
  }

  // The table whose row the store's capacity evicts for a new row of table t: t itself when it
  // has rows in this stripe, else the table with the most rows there; -1 when the stripe is empty.
  int VictimTableLocked(const Stripe& stripe, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    if (stripe.lru_tail[t] != kNoHandle) return t;
    int victim = -1;
    for (int u = 0; u < num_tables(); ++u) {
      if (stripe.lru_tail[u] != kNoHandle && (victim < 0 || stripe.counters[u].rows > stripe.counters[victim].rows)) {
        victim = u;
      }
    }
    return victim;
  }

  // Evicts the row at the tail of table t's list in this stripe (which must have one): the
  // least recently used (kLru, kTtl) or least frequently used (kLfu). `expired`: a kTtl expiry
  // rather than an eviction for capacity.
  void EvictOneLocked(Stripe& stripe, int t, bool expired = false, bool ordered = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    if (ordered) EnsureOrderLocked(stripe, t);
    const uint32_t victim = stripe.lru_tail[t];
    const int vt = HandleTable(victim);
    SlotHeader* h = Header(stripe, victim);
    if (layouts_[vt].policy == EvictionPolicy::kLfu) LfuLeaveGroupLocked(stripe, victim);
    stripe.index.Erase(Hash(vt, h->id), victim);
    if (track_changes_) {
      stripe.tombstones[vt].push_back(h->id);
      std::vector<uint8_t>& dirty = stripe.dirty[vt];
      if (HandleSlot(victim) < dirty.size()) dirty[HandleSlot(victim)] = 0;
    }
    UnlinkLocked(stripe, victim);
    stripe.slabs[vt].Free(HandleSlot(victim));
    --stripe.rows;
    --stripe.counters[vt].rows;
    ++(expired ? stripe.counters[vt].expirations : stripe.counters[vt].evictions);
    total_rows_.fetch_sub(1, std::memory_order_relaxed);
    table_rows_[vt].fetch_sub(1, std::memory_order_relaxed);
    total_charged_.fetch_sub(layouts_[vt].charge, std::memory_order_relaxed);
  }

  // Creates the row of (t, id), evicting least recently used rows of this stripe to stay within
  // the table's capacity (its own rows) and the store's (the table's own rows first; see
  // StoreOptions). Returns kNoHandle when the stripe's slab for t is full. `restore`: for
  // RestoreRows, which writes the row's values and score itself: no initial values, the row goes
  // to the front, and lists are not sorted first (evictions while restoring take the tails as
  // they stand).
  uint32_t InsertLocked(Stripe& stripe, int t, uint64_t id, uint64_t hash, bool restore = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const TableLayout& layout = layouts_[t];
    if (!restore) EnsureOrderLocked(stripe, t);
    total_rows_.fetch_add(1, std::memory_order_relaxed);
    table_rows_[t].fetch_add(1, std::memory_order_relaxed);
    total_charged_.fetch_add(layout.charge, std::memory_order_relaxed);
    while (TableOverCapacity(t) && stripe.lru_tail[t] != kNoHandle) EvictOneLocked(stripe, t, false, !restore);
    for (int victim = 0; OverCapacity() && (victim = VictimTableLocked(stripe, t)) >= 0;) {
      EvictOneLocked(stripe, victim, false, !restore);
    }
    const uint32_t slot = stripe.slabs[t].Allocate();
    if (slot == kNoHandle) {
      total_rows_.fetch_sub(1, std::memory_order_relaxed);
      table_rows_[t].fetch_sub(1, std::memory_order_relaxed);
      total_charged_.fetch_sub(layout.charge, std::memory_order_relaxed);
      ++stripe.counters[t].admission_rejections;
      return kNoHandle;
    }
    const uint32_t handle = MakeHandle(t, slot);
    SlotHeader* h = Header(stripe, handle);
    h->id = id;
    if (!restore) {
      float* weights = reinterpret_cast<float*>(h + 1);
      InitialRow(table(t), id, weights);
      InitOptimizerState(table(t).optimizer, layout.dim, weights + layout.dim);
    }
    stripe.index.Insert(
        hash, handle,
        [&](uint32_t other)
            ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) { return Hash(HandleTable(other), Header(stripe, other)->id); },
        [&](uint32_t other) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) { PrefetchLine(Header(stripe, other)); });
    switch (restore ? EvictionPolicy::kLru : layout.policy) {
      case EvictionPolicy::kLru:
        PushFrontLocked(stripe, handle);
        break;
      case EvictionPolicy::kTtl:
        h->set_score(TtlNow(t));
        PushFrontLocked(stripe, handle);
        break;
      case EvictionPolicy::kLfu: {
        // Count 1: below every row used more, above those whose counts aging halved to 0.
        auto& first = stripe.lfu_first[t];
        auto ones = first.find(1);
        auto zeros = first.find(0);
        h->set_score(1);
        LinkBeforeLocked(stripe, handle,
                         ones != first.end()    ? ones->second
                         : zeros != first.end() ? zeros->second
                                                : kNoHandle);
        first[1] = handle;
        break;
      }
    }
    if (track_changes_) MarkChangedLocked(stripe, handle);
    ++stripe.rows;
    ++stripe.counters[t].rows;
    return handle;
  }

  const uint64_t capacity_rows_;
  const uint64_t capacity_bytes_;
  // Bounded (the store or any table): keeps LRU order.
  const bool evicts_ = capacity_rows_ > 0 || capacity_bytes_ > 0 ||
                       std::any_of(tables().begin(), tables().end(),
                                   [](const TableConfig& c) { return c.capacity_rows > 0; });
  // Per table: whether its lists' order is read (the store may evict, or a policy other than
  // kLru orders them).
  std::vector<uint8_t> keeps_order_;
  const int num_stripes_;
  const bool track_changes_;
  const std::vector<TableLayout> layouts_;
  HugePageArena arena_;  // Before stripes_: outlives every slab.

  std::vector<std::unique_ptr<Stripe>> stripes_;
  std::atomic<uint64_t> total_rows_{0};
  std::atomic<uint64_t> total_charged_{0};
  std::atomic<uint64_t> rejected_requests_{0};
  std::vector<std::atomic<uint64_t>> rejected_nonfinite_;
  std::vector<std::atomic<uint64_t>> duplicates_;
  std::vector<std::atomic<uint64_t>> nonfinite_results_;
  std::vector<std::atomic<uint64_t>> table_rows_;  // Per table, over all stripes.
  std::vector<std::atomic<uint64_t>> data_time_;   // Per table: the newest data time seen.
  absl::Mutex sweep_mu_;
  std::vector<uint64_t> swept_time_ ABSL_GUARDED_BY(sweep_mu_);  // Per kTtl table: its last sweep's.
  mutable absl::Mutex dedup_mu_;
  uint64_t delta_sequence_ ABSL_GUARDED_BY(dedup_mu_) = 0;
  // Per worker id, one window per table: a worker's update of one batch carries the same
  // sequence to every table, and its tables' updates may arrive in any order.
  absl::flat_hash_map<uint32_t, std::vector<SequenceWindow>> dedup_ ABSL_GUARDED_BY(dedup_mu_);
};

}  // namespace

StoreMemoryPlan PlanStoreMemory(const StoreOptions& options, const std::vector<uint64_t>& rows_per_table) {
  StoreMemoryPlan plan;
  const uint64_t stripes = static_cast<uint64_t>(std::max(options.num_stripes, 1));
  std::vector<TableLayout> layouts;
  for (size_t t = 0; t < options.tables.size(); ++t) layouts.push_back(MakeLayout(options.tables[t], t));
  StoreOptions sized = options;
  sized.num_stripes = static_cast<int>(stripes);
  const uint64_t expected = ExpectedRowsPerStripe(sized, layouts);
  const int chunk_shift = ChunkShiftFor(expected);
  uint64_t stripe_rows = 0;  // Every table's rows in one stripe.
  for (size_t t = 0; t < layouts.size(); ++t) {
    StoreMemoryPlan::Table table;
    table.rows = t < rows_per_table.size() ? rows_per_table[t] : 0;
    table.slot_bytes = layouts[t].slot_bytes;
    table.value_bytes = static_cast<uint32_t>(4 * layouts[t].dim);
    table.state_bytes = static_cast<uint32_t>(4 * layouts[t].state_floats);
    const uint64_t per_stripe = (table.rows + stripes - 1) / stripes;
    const uint64_t chunk_rows = uint64_t{1} << chunk_shift;
    table.slab_bytes = stripes * ((per_stripe + chunk_rows - 1) / chunk_rows) * (table.slot_bytes * chunk_rows);
    stripe_rows += per_stripe;
    plan.rows += table.rows;
    plan.payload_bytes += table.rows * (table.value_bytes + table.state_bytes);
    if (options.tables[t].admission.min_count > 1) {
      plan.sketch_bytes += stripes * CountMinSketch::kDepth * SketchWidth(sized);
    }
    plan.tables.push_back(table);
  }
  plan.index_bytes = stripes * RowIndex::BytesHolding(expected, stripe_rows);
  plan.fixed_bytes = sizeof(StripedStore) + stripes * sizeof(Stripe);
  plan.bytes = plan.index_bytes + plan.sketch_bytes + plan.fixed_bytes;
  for (const StoreMemoryPlan::Table& t : plan.tables) plan.bytes += t.slab_bytes;
  return plan;
}

double StoreStats::OverheadBytesPerRow() const {
  if (rows == 0) return 0.0;
  return static_cast<double>(bytes - payload_bytes) / static_cast<double>(rows);
}

void PublishStoreMetrics(const StoreStats& stats, const MetricLabels& labels, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_ps_rows", MetricType::kGauge, "Rows held by a PS shard, per table.");
  m->Describe("hyrec_ps_evictions_total", MetricType::kCounter,
              "Rows evicted to stay within a capacity, by the table's eviction policy (lru, lfu, ttl).");
  m->Describe("hyrec_ps_expirations_total", MetricType::kCounter,
              "Rows of a ttl table evicted for going unused longer than the TTL of data time.");
  m->Describe("hyrec_ps_data_time_seconds", MetricType::kGauge, "The newest data time a table has seen.");
  m->Describe("hyrec_ps_lookups_total", MetricType::kCounter, "Ids looked up.");
  m->Describe("hyrec_ps_updates_total", MetricType::kCounter, "Rows updated.");
  m->Describe("hyrec_ps_admission_rejections_total", MetricType::kCounter, "New ids not admitted (yet).");
  m->Describe("hyrec_ps_rejected_nonfinite_total", MetricType::kCounter, "Updates refused for a NaN/Inf gradient.");
  m->Describe("hyrec_ps_nonfinite_results_total", MetricType::kCounter,
              "Rows an update left unchanged because the step would have made them non-finite.");
  m->Describe("hyrec_ps_duplicate_updates_total", MetricType::kCounter,
              "Update requests acknowledged without applying: a repeat of an applied (worker, table, sequence).");
  m->Describe("hyrec_ps_dropped_updates_total", MetricType::kCounter, "Row updates dropped: the id has no row.");
  m->Describe("hyrec_ps_bytes", MetricType::kGauge, "Bytes allocated by a PS shard's store.");
  m->Describe("hyrec_ps_capacity_rows", MetricType::kGauge, "Most rows a PS shard holds (0: unbounded).");
  m->Describe("hyrec_ps_table_capacity_rows", MetricType::kGauge,
              "Most rows a PS shard holds of one table (0: bounded by the shard's capacity only).");
  for (const TableStats& t : stats.tables) {
    MetricLabels table_labels = labels;
    table_labels.emplace_back("table", t.name);
    m->Set("hyrec_ps_rows", table_labels, static_cast<double>(t.rows));
    MetricLabels policy_labels = table_labels;
    policy_labels.emplace_back("policy", t.eviction_policy);
    m->Set("hyrec_ps_evictions_total", policy_labels, static_cast<double>(t.evictions));
    m->Set("hyrec_ps_expirations_total", table_labels, static_cast<double>(t.expirations));
    m->Set("hyrec_ps_data_time_seconds", table_labels, static_cast<double>(t.data_time));
    m->Set("hyrec_ps_lookups_total", table_labels, static_cast<double>(t.lookups));
    m->Set("hyrec_ps_updates_total", table_labels, static_cast<double>(t.updates));
    m->Set("hyrec_ps_admission_rejections_total", table_labels, static_cast<double>(t.admission_rejections));
    m->Set("hyrec_ps_rejected_nonfinite_total", table_labels, static_cast<double>(t.rejected_nonfinite));
    m->Set("hyrec_ps_nonfinite_results_total", table_labels, static_cast<double>(t.nonfinite_results));
    m->Set("hyrec_ps_duplicate_updates_total", table_labels, static_cast<double>(t.duplicate_updates));
    m->Set("hyrec_ps_dropped_updates_total", table_labels, static_cast<double>(t.dropped_updates));
    m->Set("hyrec_ps_table_capacity_rows", table_labels, static_cast<double>(t.capacity_rows));
  }
  m->Set("hyrec_ps_bytes", labels, static_cast<double>(stats.bytes));
  m->Set("hyrec_ps_capacity_rows", labels, static_cast<double>(stats.capacity_rows));
}

void InitialRow(const TableConfig& config, uint64_t id, float* out) {
  const InitializerConfig& init = config.initializer;
  const uint64_t base = HashCombine(config.seed, id);
  const int dim = config.dim;
  switch (init.kind) {
    case InitializerKind::kZeros:
      std::fill(out, out + dim, 0.0f);
      return;
    case InitializerKind::kUniform: {
      const double span = static_cast<double>(init.high) - init.low;
      for (int j = 0; j < dim; ++j) {
        const double u = static_cast<double>(Mix64(base + j) >> 11) * 0x1.0p-53;  // [0, 1)
        out[j] = static_cast<float>(init.low + span * u);
      }
      return;
    }
    case InitializerKind::kNormal: {
      // Box-Muller on counter-based uniforms: pair k gives elements 2k and 2k+1.
      for (int j = 0; j < dim; j += 2) {
        const uint64_t r1 = Mix64(base + j);
        const uint64_t r2 = Mix64(base + j + 1);
        const double u1 = (static_cast<double>(r1 >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
        const double u2 = static_cast<double>(r2 >> 11) * 0x1.0p-53;
        const double radius = std::sqrt(-2.0 * std::log(u1));
        const double angle = 2.0 * M_PI * u2;
        out[j] = static_cast<float>(init.mean + init.stddev * radius * std::cos(angle));
        if (j + 1 < dim) {
          out[j + 1] = static_cast<float>(init.mean + init.stddev * radius * std::sin(angle));
        }
      }
      return;
    }
  }
}

absl::StatusOr<int> EmbeddingShardStore::TableIndex(absl::string_view name) const {
  for (int t = 0; t < num_tables(); ++t) {
    if (tables_[t].name == name) return t;
  }
  return absl::NotFoundError(absl::StrCat("unknown table '", name, "'"));
}

namespace {

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingShardStore>> EmbeddingShardStore::Create(const StoreOptions& options) {
  if (options.tables.size() > kMaxTables) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.tables.size(), " tables given; a store holds at most ", kMaxTables));
  }
  if (options.num_stripes < 1 || options.num_stripes > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat("num_stripes must be in [1, 65536], got ", options.num_stripes));
  }
  std::vector<TableLayout> layouts;
  for (size_t t = 0; t < options.tables.size(); ++t) {
    const TableConfig& config = options.tables[t];
    absl::Status valid = config.Validate();
    if (!valid.ok()) return valid;
    for (size_t u = 0; u < t; ++u) {
      if (options.tables[u].name == config.name) {
        return absl::InvalidArgumentError(absl::StrCat("table '", config.name, "' is defined twice"));
      }
    }
    layouts.push_back(MakeLayout(config, t));
  }
  // A shard holds its rows in memory: a capacity past the machine's is a mistake that would
  // otherwise surface as an allocation failure, at start-up or much later.
  const uint64_t memory = PhysicalMemoryBytes();
  if (memory > 0 && options.capacity_bytes > memory) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_bytes ", options.capacity_bytes,
                                                   " is more than this machine's memory (", memory, " bytes)"));
  }
  uint64_t min_charge = UINT64_MAX;
  for (const TableLayout& l : layouts) min_charge = std::min(min_charge, l.charge);
  uint64_t rows = options.capacity_rows;
  if (rows == 0 && options.capacity_bytes > 0 && !layouts.empty()) rows = options.capacity_bytes / min_charge;
  // Each stripe holds at most kMaxSlots rows per table; keep a 2x margin for uneven spreading.
  if (rows / options.num_stripes * 2 > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.capacity_rows > 0 ? "capacity_rows " : "capacity_bytes ",
                     options.capacity_rows > 0 ? options.capacity_rows : options.capacity_bytes, " over ",
                     options.num_stripes, " stripes exceeds ", kMaxSlots / 2, " rows per stripe; raise num_stripes"));
  }
  if (memory > 0 && options.capacity_rows > 0 && !layouts.empty() && options.capacity_rows > memory / min_charge) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_rows ", options.capacity_rows, " at ", min_charge,
                                                   " bytes or more each is more than this machine's memory (", memory,
                                                   " bytes)"));
  }
  try {
    return std::unique_ptr<EmbeddingShardStore>(new StripedStore(options, std::move(layouts)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the store's index for ", rows,
                                                     " rows (capacity) in ", options.num_stripes, " stripes"));
  }
}

}  // namespace hyrec::embedding_ps
