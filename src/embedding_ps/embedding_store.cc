#include "hyrec/embedding_ps/embedding_store.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <optional>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/finite.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/embedding_ps/optimizer.h"
#include "src/embedding_ps/disk_tier.h"
#include "src/embedding_ps/frozen_store.h"
#include "src/embedding_ps/row_codec.h"
#include "src/embedding_ps/row_index.h"
#include "src/embedding_ps/sequence_window.h"
#include "src/embedding_ps/store_layout.h"
#include "src/embedding_ps/stripe.h"

namespace hyrec::embedding_ps {
namespace {

constexpr int kMaxTables = 256;

// Returns InvalidArgument for a table index out of range.
#define HYREC_CHECK_TABLE(t)                                                                                       \
  if ((t) < 0 || (t) >= num_tables()) {                                                                            \
    return absl::InvalidArgumentError(absl::StrCat("table index ", (t), " out of range [0, ", num_tables(), ")")); \
  }

// Copies n floats; inlined 16-byte moves beat a libc memcpy call for embedding-sized rows.
inline void CopyFloats(const float* __restrict src, float* __restrict dst, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) std::memcpy(dst + i, src + i, 4 * sizeof(float));
  for (; i < n; ++i) dst[i] = src[i];
}

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

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// The address space a store reserves for its rows: twice what it may hold (its byte capacity,
// else the machine's memory), at least 256 MiB, at most what a handle names.
uint64_t ArenaBytes(const StoreOptions& options) {
  const uint64_t bound = options.capacity_bytes > 0 ? options.capacity_bytes : PhysicalMemoryBytes();
  return std::clamp<uint64_t>(2 * bound, uint64_t{256} << 20, RowArena::kMaxBytes);
}

class StripedStore final : public EmbeddingShardStore, public FrozenStore {
 public:
  StripedStore(const StoreOptions& options, std::vector<TableLayout> layouts, std::unique_ptr<DiskTier> tier)
      : EmbeddingShardStore(options.tables),
        capacity_rows_(options.capacity_rows),
        capacity_bytes_(options.capacity_bytes),
        num_stripes_(options.num_stripes),
        track_changes_(options.track_changes),
        layouts_(std::move(layouts)),
        arena_(ArenaBytes(options)),
        rejected_nonfinite_(layouts_.size()),
        duplicates_(layouts_.size()),
        nonfinite_results_(layouts_.size()),
        table_rows_(layouts_.size()),
        data_time_(layouts_.size()),
        tier_(std::move(tier)),
        disk_rows_(layouts_.size()),
        dedup_(layouts_.size()) {
    const uint32_t sketch_width = SketchWidth(options);
    stripes_.reserve(num_stripes_);
    for (int s = 0; s < num_stripes_; ++s) {
      stripes_.push_back(std::make_unique<Stripe>(s, layouts_, options.tables, sketch_width, Mix64(s + 1)));
    }
    const bool bounded = capacity_rows_ > 0 || capacity_bytes_ > 0;
    for (const TableConfig& config : options.tables) {
      scored_.push_back(bounded || config.capacity_rows > 0 || config.eviction.policy != EvictionPolicy::kLru);
    }
    indexes_.reserve(layouts_.size() * num_stripes_);
    for (const TableLayout& layout : layouts_) {
      for (int s = 0; s < num_stripes_; ++s) indexes_.emplace_back(layout.rows_per_stripe);
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
    GroupByStripe(t, ids);
    if (tier_ != nullptr) HYREC_RETURN_IF_ERROR(ReadBackFromDisk(t, ids));
    InsertError() = absl::OkStatus();
    VisitRows(t, ids, /*lookup=*/true, /*create=*/true, Slab::kHeaderBytes + layout.weight_bytes,
              [&](uint32_t position, const Rows& r, RowIndex::Position at) {
                float* dst = out.data() + static_cast<size_t>(position) * layout.dim;
                if (at == RowIndex::kNone) {
                  std::memset(dst, 0, sizeof(float) * layout.dim);
                  ++not_admitted;
                } else if (layout.precision == RowPrecision::kFp32) {
                  CopyFloats(r.floats(r.index.slot(at)), dst, layout.dim);
                } else {
                  DecodeWeights(layout.precision, r.weights(r.index.slot(at)), layout.dim, dst);
                }
              });
    if (result != nullptr) result->not_admitted = not_admitted;
    return InsertError();
  }

  bool has_disk_tier() const override { return tier_ != nullptr; }

  absl::Status ReadBack(absl::Span<const TableIds> calls) override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (tier_ == nullptr) return absl::OkStatus();
    for (const TableIds& call : calls) HYREC_CHECK_TABLE(call.table);
    // The ids of each call that DRAM lacks, with their hashes.
    thread_local std::vector<std::vector<uint64_t>> missing;
    thread_local std::vector<std::vector<uint64_t>> missing_hashes;
    missing.resize(calls.size());
    missing_hashes.resize(calls.size());
    std::vector<DiskTier::TakeCall> takes(calls.size());
    auto find_missing = [&] {
      for (size_t c = 0; c < calls.size(); ++c) {
        const int t = calls[c].table;
        missing[c].clear();
        missing_hashes[c].clear();
        takes[c].table = t;
        if (disk_rows_[t].load(std::memory_order_relaxed) > 0) {
          for (const uint64_t id : calls[c].ids) {
            const uint64_t hash = Hash(t, id);
            if (FindLocked(RowsOf(*stripes_[StripeIndex(hash)], t), id, hash) != RowIndex::kNone) continue;
            missing[c].push_back(id);
            missing_hashes[c].push_back(hash);
          }
        }
        takes[c].ids = missing[c];
      }
    };
    // The pages of the rows on disk are read with no stripe locked, so that other calls go on
    // meanwhile; then, every stripe locked, the rows still missing are taken from those pages
    // (or read again where they moved since).
    std::unique_ptr<DiskTier::PagesRead> ahead;
    {
      absl::MutexLock lock(&ahead_mu_);
      if (!ahead_.empty()) {
        ahead = std::move(ahead_.back());
        ahead_.pop_back();
      }
    }
    if (ahead == nullptr) ahead = std::make_unique<DiskTier::PagesRead>();
    absl::Cleanup keep = [&] {
      if (ahead->capacity() > kAheadPagesKept) return;  // A large request's pages are not kept.
      absl::MutexLock lock(&ahead_mu_);
      ahead_.push_back(std::move(ahead));
    };
    for (const auto& stripe : stripes_) stripe->mu.Lock();
    find_missing();
    for (const auto& stripe : stripes_) stripe->mu.Unlock();
    HYREC_RETURN_IF_ERROR(tier_->ReadAhead(takes, ahead.get()));
    for (const auto& stripe : stripes_) stripe->mu.Lock();
    find_missing();
    struct Taken {
      uint32_t call;
      uint32_t position;
      uint64_t score;
      size_t at;  // In payloads.
    };
    thread_local std::vector<Taken> taken;
    thread_local std::string payloads;
    taken.clear();
    payloads.clear();
    absl::Status status = tier_->TakeMany(
        takes,
        [&](size_t c, size_t i, uint64_t score, const char* payload) {
          const TableLayout& layout = layouts_[calls[c].table];
          taken.push_back({static_cast<uint32_t>(c), static_cast<uint32_t>(i), score, payloads.size()});
          payloads.append(payload, layout.weight_bytes + 4 * layout.state_floats);
        },
        ahead.get());
    for (const Taken& k : taken) {
      const int t = calls[k.call].table;
      const uint64_t hash = missing_hashes[k.call][k.position];
      absl::Status placed = PlaceLocked(*stripes_[StripeIndex(hash)], t, missing[k.call][k.position], hash, k.score,
                                        payloads.data() + k.at);
      if (status.ok()) status = placed;
    }
    for (const auto& stripe : stripes_) stripe->mu.Unlock();
    return status;
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
    absl::Status refusal;
    const SequenceWindow* window = dedup_.Find(update_id.worker_id, t, &refusal);
    if (window == nullptr) return refusal;
    if (window->Peek(update_id.sequence) == SequenceWindow::kTooOld) return TooOld(t, update_id, *window);
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
    if (tier_ != nullptr) HYREC_RETURN_IF_ERROR(ReadBackFromDisk(t, ids));
    UpdateResult local;
    if (update_id.sequence != 0) {
      absl::MutexLock lock(&dedup_mu_);
      HYREC_ASSIGN_OR_RETURN(SequenceWindow * window, dedup_.Window(update_id.worker_id, t));
      const SequenceWindow::Verdict verdict = window->Mark(update_id.sequence);
      if (verdict == SequenceWindow::kTooOld) return TooOld(t, update_id, *window);
      if (verdict == SequenceWindow::kRepeat) {
        duplicates_[t].fetch_add(1, std::memory_order_relaxed);
        local.duplicate = true;
        if (result != nullptr) *result = local;
        return absl::OkStatus();
      }
    }
    // Updates never admit: an id without a row gets one only when the table admits everything.
    InsertError() = absl::OkStatus();
    VisitRows(t, ids, /*lookup=*/false, /*create=*/config.admission.AdmitsEverything(), layout.slot_bytes,
              [&](uint32_t position, const Rows& r, RowIndex::Position at) {
                if (at == RowIndex::kNone) {
                  ++r.part.counters.dropped_updates;
                  ++local.dropped;
                  return;
                }
                const SlotHandle slot = r.index.slot(at);
                const uint64_t draw = RoundingDraw(r.id(slot), update_id, position);
                if (!StepRow(r.weights(slot), draw, layout, config,
                             grads.data() + static_cast<size_t>(position) * layout.dim)) {
                  ++local.nonfinite;
                  return;
                }
                if (track_changes_) r.index.set_mark(at, true);
                ++r.part.counters.updates;
                ++local.applied;
              });
    if (local.nonfinite > 0) nonfinite_results_[t].fetch_add(local.nonfinite, std::memory_order_relaxed);
    if (result != nullptr) *result = local;
    return InsertError();
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
      const uint16_t now = TtlNow(t);
      for (const auto& stripe_ptr : stripes_) {
        Stripe& stripe = *stripe_ptr;
        StripeLock lock(&stripe.mu);
        RowIndex& index = IndexOf(stripe, t);
        index.ForEach([&](RowIndex::Position p) { index.set_score(p, now); });
        stripe.parts[t].scores.Swept(index.size() > 0, now);
      }
      return;
    }
    // A stripe's expired rows go when a request next uses the stripe; a sweep of every stripe
    // each time data time passes a multiple of an eighth of the TTL takes the others, and keeps
    // every row younger than what its 16-bit score can tell (64 TTLs). The sweeps fall at the
    // same data times in every store, so a store restored from a checkpoint expires its rows
    // when the original would. A jump past half of that expires every row outright.
    const uint64_t period = std::max<uint64_t>(1, ttl / 8);
    if (seconds / period == old / period) return;
    const bool all = seconds - old >= 32 * ttl;
    for (const auto& stripe_ptr : stripes_) {
      Stripe& stripe = *stripe_ptr;
      StripeLock lock(&stripe.mu);
      SweepExpiredLocked(stripe, t, all);
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
    stats.bytes = FixedStoreBytes(num_stripes_, num_tables());
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
      for (int t = 0; t < num_tables(); ++t) {
        TableStats& ts = stats.tables[t];
        const Rows r = RowsOf(stripe, t);
        TablePart& part = r.part;
        const TableCounters& c = part.counters;
        ts.rows += r.rows();
        ts.lookups += c.lookups;
        ts.updates += c.updates;
        ts.evictions += c.evictions;
        ts.expirations += c.expirations;
        ts.admission_rejections += c.admission_rejections;
        ts.dropped_updates += c.dropped_updates;
        ts.dram_hits += c.dram_hits;
        ts.disk_writes += c.disk_writes;
        ts.disk_reads += c.disk_reads;
        ts.bytes += part.slab.bytes();
        stats.bytes += part.slab.bytes() + r.index.bytes() + part.sketch.bytes();
      }
    }
    if (tier_ != nullptr) {
      const DiskTierStats d = tier_->Stats();
      stats.disk = DiskStats{d.pages * DiskTier::kPageBytes,
                             d.pages,
                             d.used_pages,
                             d.page_reads,
                             d.page_writes,
                             d.bytes_read,
                             d.bytes_written,
                             d.cleaned_pages,
                             d.full_refusals,
                             d.checksum_failures,
                             d.index_bytes};
      stats.bytes += d.index_bytes;
      for (int t = 0; t < num_tables(); ++t) stats.tables[t].disk_rows = tier_->rows(t);
    }
    for (int t = 0; t < num_tables(); ++t) {
      stats.rows += stats.tables[t].rows;
      stats.payload_bytes +=
          stats.tables[t].rows * (layouts_[t].weight_bytes + sizeof(float) * layouts_[t].state_floats);
    }
    return stats;
  }

  StoreSnapshot Snapshot() const override {
    StoreSnapshot snap;
    SnapshotInto(&snap);
    return snap;
  }

  void SnapshotInto(StoreSnapshot* snap) const override {
    snap->status = absl::OkStatus();
    if (tier_ != nullptr) {
      // Rows move between the tiers as they are used: the cut holds every stripe meanwhile.
      const_cast<StripedStore*>(this)->RunLocked([&] {
        std::vector<uint64_t> rows;
        FrozenHead(snap, &rows);
        const absl::Status read = RowsWhileLocked(
            size_t{1} << 16,
            [&](int t, const StoreSnapshot::Table& piece) {
              StoreSnapshot::Table& out = snap->tables[t];
              out.ids.insert(out.ids.end(), piece.ids.begin(), piece.ids.end());
              out.values.insert(out.values.end(), piece.values.begin(), piece.values.end());
              out.scores.insert(out.scores.end(), piece.scores.begin(), piece.scores.end());
              return absl::OkStatus();
            },
            /*forked_child=*/false);
        snap->status = read;
      });
      return;
    }
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

  void RunFrozen(const std::function<void()>& fn) override {
    if (tier_ == nullptr) return RunLocked(fn);
    tier_->HoldPages();
    RunLocked([&] {
      tier_->LockForFork();
      fn();
      tier_->UnlockAfterFork();
    });
  }

  void ChildDone() override {
    if (tier_ != nullptr) tier_->ReleasePages();
  }

  // Runs fn with the deduplication state and every stripe locked.
  void RunLocked(const std::function<void()>& fn) ABSL_NO_THREAD_SAFETY_ANALYSIS {
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
      for (int t = 0; t < num_tables(); ++t) (*rows_per_table)[t] += IndexOf(stripe, t).size();
    }
    // With every stripe locked no row is on its way between the tiers: the count is the tier's.
    for (int t = 0; t < num_tables(); ++t) (*rows_per_table)[t] += disk_rows_[t].load(std::memory_order_relaxed);
  }

  absl::Status FrozenRows(size_t piece_rows, const RowPieceFn& rows) const override {
    return RowsWhileLocked(piece_rows, rows, /*forked_child=*/true);
  }

  // FrozenRows, with every stripe locked by this thread (RunLocked) or in a forked child. A
  // table's rows on disk come first: they are the coldest, and a restore into a store with a
  // tier then sends them back to disk first.
  absl::Status RowsWhileLocked(size_t piece_rows, const RowPieceFn& rows,
                               bool forked_child) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
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
      if (tier_ != nullptr) {
        const TableLayout& layout = layouts_[t];
        auto disk_row = [&](uint64_t id, uint64_t score, const char* payload) -> absl::Status {
          piece.ids.push_back(id);
          piece.values.resize(piece.values.size() + floats);
          ReadRow(layout, payload, piece.values.data() + piece.values.size() - floats);
          if (layout.policy != EvictionPolicy::kLru) piece.scores.push_back(score);
          if (piece.ids.size() < piece_rows) return absl::OkStatus();
          absl::Status s = rows(t, piece);
          piece.ids.clear();
          piece.values.clear();
          piece.scores.clear();
          return s;
        };
        status = forked_child ? tier_->ForEachInForkedChild(t, disk_row) : tier_->ForEach(t, disk_row);
      }
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
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!FitsPrecision(layout.precision, values.data() + i * floats, layout.dim)) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table(t).name, "': restored row of id ", ids[i],
                                                       " has a weight that ", RowPrecisionName(layout.precision),
                                                       " cannot hold"));
      }
    }
    absl::Status status;
    GroupByStripe(t, ids);
    const uint64_t* hashes = Scratch().hashes.data();
    InsertError() = absl::OkStatus();
    VisitGroups([&](Stripe& stripe, absl::Span<const uint32_t> positions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
      Rows r = RowsOf(stripe, t);
      TablePart& part = r.part;
      const uint16_t ttl_now = TtlNow(t);
      for (const uint32_t p : positions) {
        RowIndex::Position at = FindLocked(r, ids[p], hashes[p]);
        if (at == RowIndex::kNone && tier_ != nullptr && disk_rows_[t].load(std::memory_order_relaxed) > 0 &&
            tier_->Erase(t, ids[p])) {
          disk_rows_[t].fetch_sub(1, std::memory_order_relaxed);
        }
        if (at == RowIndex::kNone) at = InsertLocked(stripe, t, ids[p], hashes[p], /*init=*/false);
        if (at == RowIndex::kNone) {
          status = !InsertError().ok() ? InsertError()
                                       : absl::ResourceExhaustedError(absl::StrCat(
                                             "table '", table(t).name, "': a stripe is full while restoring"));
          continue;
        }
        const SlotHandle slot = r.index.slot(at);
        WriteRow(layout, values.data() + p * floats, /*seed=*/0, r.weights(slot));
        const uint16_t score = RestoredScoreLocked(
            stripe, t, scores.empty() ? std::optional<uint64_t>() : std::optional<uint64_t>(scores[p]), ttl_now);
        r.index.set_score(at, score);
        part.scores.Note(score, ttl_now);
        if (track_changes_) r.index.set_mark(at, true);
      }
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
      CountMinSketch& sketch = stripe.parts[k.table].sketch;
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
          stripes_[s]->parts[t].scores.set_uses(uses[s]);
        }
      }
    }
    absl::MutexLock lock(&dedup_mu_);
    for (const StoreSnapshot::Dedup& d : snap.dedup) {
      if (d.table >= layouts_.size() || d.seen.size() != kDedupWindow / 64) {
        return absl::InvalidArgumentError(absl::StrCat("dedup window of worker ", d.worker, ", table ", d.table));
      }
      HYREC_ASSIGN_OR_RETURN(SequenceWindow * window, dedup_.Window(d.worker, d.table));
      window->Merge(d.highest, d.seen, d.applied);
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
        Rows r = RowsOf(stripe, t);
        TablePart& part = r.part;
        const int dim = layouts_[t].dim;
        r.index.ForEach([&](RowIndex::Position p) {
          const SlotHandle slot = r.index.slot(p);
          if (!r.index.marked(p)) return;
          r.index.set_mark(p, false);
          out.ids.push_back(r.id(slot));
          const size_t at = out.weights.size();
          out.weights.resize(at + dim);
          DecodeWeights(layouts_[t].precision, r.weights(slot), dim, out.weights.data() + at);
        });
        out.tombstones.insert(out.tombstones.end(), part.tombstones.begin(), part.tombstones.end());
        part.tombstones.clear();
      }
    }
    return delta;
  }

 private:
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
    dedup_.ForEach([&](uint32_t worker, size_t t, const SequenceWindow& w) {
      snap->dedup.push_back({worker, static_cast<uint32_t>(t), w.highest(), w.Words(), w.applied()});
    });
  }

  // Stripe s's admission coin, lfu aging clocks and sketches.
  void SnapshotStripeStateLocked(const Stripe& stripe, int s, StoreSnapshot* snap) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    snap->stripe_rng.push_back(stripe.rng_state);
    for (int t = 0; t < num_tables(); ++t) {
      const Rows r = RowsOf(stripe, t);
      TablePart& part = r.part;
      if (layouts_[t].policy == EvictionPolicy::kLfu) snap->tables[t].lfu_uses.push_back(part.scores.uses());
      if (part.sketch.used()) {
        snap->sketches.push_back(
            {static_cast<uint32_t>(s), static_cast<uint32_t>(t), part.sketch.increments(), part.sketch.counters()});
      }
    }
  }

  // Calls fn(id, values, floats, score) for each of the stripe's rows of table t, the next to be
  // evicted first; the score as StoreSnapshot::Table::scores holds it (none under lru).
  template <typename Fn>
  void ForEachRowLocked(const Stripe& stripe, int t, Fn&& fn) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const TableLayout& layout = layouts_[t];
    const Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    const int floats = layout.dim + layout.state_floats;
    const uint64_t now = data_time_[t].load(std::memory_order_relaxed);
    const uint16_t ttl_now = TtlNow(t);
    thread_local std::vector<std::pair<uint32_t, RowIndex::Position>> order;  // (rank, position)
    order.clear();
    r.index.ForEach([&](RowIndex::Position p) { order.emplace_back(part.scores.Rank(r.index.score(p), ttl_now), p); });
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [rank, p] : order) {
      const SlotHandle slot = r.index.slot(p);
      std::optional<uint64_t> score;
      if (layout.policy == EvictionPolicy::kLfu) {
        score = r.index.score(p);
      } else if (layout.policy == EvictionPolicy::kTtl) {
        const uint64_t age = static_cast<uint64_t>(rank) * layout.ttl_granule;
        score = now > age ? now - age : 0;
      }
      if (layout.precision == RowPrecision::kFp32) {
        fn(r.id(slot), r.floats(slot), floats, score);
      } else {
        thread_local std::vector<float> row;
        row.resize(floats);
        ReadRow(layout, r.weights(slot), row.data());
        fn(r.id(slot), row.data(), floats, score);
      }
    }
  }

  // A restored row's score from its snapshot's (StoreSnapshot::Table::scores), or as for a new
  // row when there is none; under lru, as a row used now.
  uint16_t RestoredScoreLocked(Stripe& stripe, int t, std::optional<uint64_t> score, uint16_t ttl_now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    switch (layouts_[t].policy) {
      case EvictionPolicy::kLru: {
        RowScores::Upkeep upkeep = RowScores::Upkeep::kNone;
        const uint16_t now = part.scores.New(r.rows(), ttl_now, &upkeep);
        RunUpkeep(r, upkeep);
        return now;
      }
      case EvictionPolicy::kLfu:
        return static_cast<uint16_t>(std::min<uint64_t>(score.value_or(1), UINT16_MAX));
      case EvictionPolicy::kTtl:
        return score.has_value() ? static_cast<uint16_t>(*score / layouts_[t].ttl_granule) : ttl_now;
    }
    return 0;
  }

  // One optimizer step of a row, kept only when the weights and the optimizer's moments stay
  // finite; otherwise the row is put back as it was and false returned.
  // `row`: the slot's weights, then its state. A row of lower precision steps on fp32 copies and
  // is written back with stochastic rounding, seeded by `draw` (RoundingDraw) and the row's values
  // before the step, so that replaying the same updates rounds the same way while every update
  // (and every step of a row the last one left unchanged) draws anew.
  static bool StepRow(char* row, uint64_t draw, const TableLayout& layout, const TableConfig& config,
                      const float* grad) {
    const size_t floats = static_cast<size_t>(layout.dim + layout.state_floats);
    const size_t checked =
        static_cast<size_t>(layout.dim + OptimizerFloatStateFloats(config.optimizer.kind, layout.dim));
    if (layout.precision == RowPrecision::kFp32) {
      float* weights = reinterpret_cast<float*>(row);
      thread_local std::vector<float> before;
      before.assign(weights, weights + floats);
      ApplyOptimizer(config.optimizer, layout.dim, grad, weights, weights + layout.dim);
      if (FirstNonFinite(weights, checked) == checked) return true;
      std::memcpy(weights, before.data(), floats * sizeof(float));
      return false;
    }
    thread_local std::vector<float> work;
    work.resize(floats);
    ReadRow(layout, row, work.data());
    const uint64_t seed = RoundingSeed(draw, work.data(), floats);
    ApplyOptimizer(config.optimizer, layout.dim, grad, work.data(), work.data() + layout.dim);
    if (FirstNonFinite(work.data(), checked) != checked) return false;
    return WriteRow(layout, work.data(), seed, row);
  }

  // A row's weights (decoded) and state as floats, from its slot's `row`.
  static void ReadRow(const TableLayout& layout, const char* row, float* out) {
    DecodeWeights(layout.precision, row, layout.dim, out);
    std::memcpy(out + layout.dim, row + layout.weight_bytes, sizeof(float) * layout.state_floats);
  }

  // Writes weights and state (`values`, as ReadRow gives them) into a slot's `row`; `seed` as
  // EncodeWeights takes it. False, writing nothing, when a weight does not fit the precision.
  static bool WriteRow(const TableLayout& layout, const float* values, uint64_t seed, char* row) {
    if (!EncodeWeights(layout.precision, values, layout.dim, seed, row)) return false;
    std::memcpy(row + layout.weight_bytes, values + layout.dim, sizeof(float) * layout.state_floats);
    return true;
  }

  // What an update draws its rounding from: the row's id, the update's id and the row's place in
  // it, all of which a replay of the update log gives again. Of the sequence, its low 20 bits: a
  // worker's sequences are a clock-made origin, a multiple of 2^20, plus the step (wire.md), so
  // that two runs of the same job with the same seeds round alike.
  static uint64_t RoundingDraw(uint64_t id, UpdateId update, uint32_t position) {
    constexpr uint64_t kStepBits = (uint64_t{1} << 20) - 1;
    return Mix64(Mix64(Mix64(id ^ 0x6a09e667f3bcc909ULL) ^ (update.sequence & kStepBits)) ^
                 (uint64_t{update.worker_id} << 32 | position));
  }

  // A nonzero seed from a draw and a row's values (its decoded weights and state): values, not
  // slot bytes, so that a row restored from a checkpoint, whose bytes may differ where they
  // decode alike, rounds as the row it was taken from.
  static uint64_t RoundingSeed(uint64_t draw, const float* values, size_t floats) {
    uint64_t h = draw;
    for (size_t i = 0; i < floats; ++i) {
      uint32_t word;
      std::memcpy(&word, values + i, sizeof(word));
      h = Mix64(h ^ word);
    }
    return h | 1;
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

  // Calls visit(stripe, positions) once per stripe group of the last GroupByStripe that has any,
  // holding that stripe's lock.
  template <typename Visit>
  void VisitGroups(Visit&& visit) {
    GroupScratch& scratch = Scratch();
    for (int s = 0; s < num_stripes_; ++s) {
      const uint32_t begin = scratch.starts[s];
      const uint32_t end = scratch.starts[s + 1];
      if (begin == end) continue;
      Stripe& stripe = *stripes_[s];
      StripeLock lock(&stripe.mu);
      visit(stripe, absl::Span<const uint32_t>(scratch.order.data() + begin, end - begin));
    }
  }

  // Calls row(position, part, slot) for each id of the last GroupByStripe, in stripe order, with
  // table t's part of the id's stripe and the row's slot (kNoSlot when the id has no row and none
  // is created), holding that stripe's lock. A row found is used (its score renewed); an absent
  // id gets a row when `create` allows and admission agrees.
  //
  // The ids flow through one pipeline for the whole call, so that the cache misses of many
  // overlap: id i's index bucket is prefetched at step i, the slot its tag points at (the first
  // `touch_bytes`) at step i + kSlotLag, and the row is found and used at step i + kRowLag. The
  // stripes ahead of the row being used are locked in ascending order as the pipeline reaches
  // them (a window of a few stripes), and each is unlocked once its last row is used.
  // `lookup`: the ids count as looked up (TableStats::lookups).
  template <typename RowFn>
  void VisitRows(int t, absl::Span<const uint64_t> ids, bool lookup, bool create, uint32_t touch_bytes,
                 RowFn&& row) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    constexpr size_t kSlotLag = 8;
    constexpr size_t kRowLag = 16;
    constexpr size_t kRing = 16;  // Holds the candidates of rows i .. i + kRowLag - kSlotLag.
    static_assert(kRing >= kRowLag - kSlotLag + 1, "the ring holds every candidate in flight");
    RowIndex::Position candidates[kRing];
    GroupScratch& scratch = Scratch();
    const size_t n = ids.size();
    const uint32_t* order = scratch.order.data();
    const uint64_t* hashes = scratch.hashes.data();
    const uint32_t* stripe_of = scratch.stripe_of.data();
    const uint32_t* starts = scratch.starts.data();
    const TableLayout& layout = layouts_[t];
    const bool ttl = layout.policy == EvictionPolicy::kTtl;
    const bool scored = scored_[t];
    const uint16_t ttl_now = TtlNow(t);
    int locked_below = 0;  // Stripes below it with rows in this call are locked or done.
    auto lock_through = [&](uint32_t s) {
      for (; locked_below <= static_cast<int>(s); ++locked_below) {
        if (starts[locked_below] != starts[locked_below + 1]) stripes_[locked_below]->mu.Lock();
      }
    };
    const RowIndex* indexes = &indexes_[static_cast<size_t>(t) * num_stripes_];
    for (size_t step = 0; step < n + kRowLag; ++step) {
      if (step < n) {
        const uint32_t s = stripe_of[order[step]];
        lock_through(s);
        indexes[s].Prefetch(hashes[order[step]]);
      }
      if (step >= kSlotLag && step - kSlotLag < n) {
        const size_t i = step - kSlotLag;
        const uint32_t s = stripe_of[order[i]];
        const RowIndex::Position candidate = indexes[s].CandidatePosition(hashes[order[i]]);
        candidates[i % kRing] = candidate;
        if (candidate != RowIndex::kNone) {
          const char* slot = Slab::Slot(arena_.base(), indexes[s].slot(candidate));
          PrefetchLine(slot);
          for (uint32_t line = 64 - (reinterpret_cast<uintptr_t>(slot) & 63); line < touch_bytes; line += 64) {
            PrefetchLine(slot + line);
          }
        }
      }
      if (step < kRowLag) continue;
      const size_t i = step - kRowLag;
      const uint32_t p = order[i];
      const uint32_t s = stripe_of[p];
      Stripe& stripe = *stripes_[s];
      Rows r = RowsOf(stripe, t);
      if (lookup) ++r.part.counters.lookups;
      if (ttl && (i == 0 || stripe_of[order[i - 1]] != s) && r.part.scores.MayHaveExpired(ttl_now)) {
        SweepExpiredLocked(stripe, t, /*all=*/false);
      }
      // The candidate is the row when its entry still holds the id (an insert since may have
      // moved entries, an eviction freed its slot); otherwise a full Find.
      RowIndex::Position at = candidates[i % kRing];
      if (at == RowIndex::kNone || !r.index.Holds(at) || r.id(r.index.slot(at)) != ids[p]) {
        at = FindLocked(r, ids[p], hashes[p]);
      }
      if (ttl && at != RowIndex::kNone && r.part.scores.Expired(r.index.score(at), ttl_now)) {
        EvictLocked(stripe, t, at, hashes[p], /*expired=*/true);
        at = RowIndex::kNone;
      }
      if (at == RowIndex::kNone && tier_ != nullptr && disk_rows_[t].load(std::memory_order_relaxed) > 0) {
        // On disk after all: moved there since ReadBackFromDisk by this call's own inserts.
        at = TakeOneLocked(stripe, t, ids[p], hashes[p]);
        if (at != RowIndex::kNone) r.index.set_mark(at, false);
      } else if (at != RowIndex::kNone) {
        // A row read back from disk for this call (marked by PlaceLocked) is no DRAM hit.
        if (tier_ != nullptr && r.index.marked(at)) {
          r.index.set_mark(at, false);
        } else if (lookup) {
          ++r.part.counters.dram_hits;
        }
      }
      if (at != RowIndex::kNone) {
        if (scored) {
          RowScores::Upkeep upkeep = RowScores::Upkeep::kNone;
          r.index.set_score(at, r.part.scores.Use(r.index.score(at), r.rows(), ttl_now, &upkeep));
          RunUpkeep(r, upkeep);
        }
        row(p, r, at);
      } else {
        if (create && AdmitLocked(stripe, t, hashes[p])) at = InsertLocked(stripe, t, ids[p], hashes[p], /*init=*/true);
        row(p, r, at);
      }
      if (i + 1 == n || stripe_of[order[i + 1]] != s) stripe.mu.Unlock();
    }
  }

  // Table t's rows in one stripe: its part, its index and the arena's base. Valid while the
  // stripe's lock is held.
  struct Rows {
    TablePart& part;
    RowIndex& index;
    char* base;
    uint64_t rows() const { return index.size(); }
    uint64_t id(SlotHandle slot) const { return Slab::id(base, slot); }
    float* floats(SlotHandle slot) const { return Slab::floats(base, slot); }  // An fp32 row's.
    char* weights(SlotHandle slot) const { return Slab::Slot(base, slot) + Slab::kHeaderBytes; }
  };
  Rows RowsOf(Stripe& stripe, int t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    return Rows{stripe.parts[t], IndexOf(stripe, t), arena_.base()};
  }
  Rows RowsOf(const Stripe& stripe, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    return const_cast<StripedStore*>(this)->RowsOf(const_cast<Stripe&>(stripe), t);
  }
  // Table t's index in a stripe: the indexes of a table lie side by side, stripe after stripe.
  RowIndex& IndexOf(const Stripe& stripe, int t) const {
    return const_cast<RowIndex&>(indexes_[static_cast<size_t>(t) * num_stripes_ + stripe.number]);
  }

  // The passes over a part's scores that a use asked for.
  static void RunUpkeep(const Rows& r, RowScores::Upkeep upkeep) {
    if (ABSL_PREDICT_TRUE(upkeep == RowScores::Upkeep::kNone)) return;
    RowIndex& index = r.index;
    if (upkeep == RowScores::Upkeep::kHalve) {
      index.ForEach([&](RowIndex::Position p) { index.set_score(p, RowScores::Halved(index.score(p))); });
    } else {
      index.ForEach([&](RowIndex::Position p) { index.set_score(p, r.part.scores.ClampedAge(index.score(p))); });
    }
  }

  uint64_t Hash(int t, uint64_t id) const { return Mix64(id ^ layouts_[t].salt); }
  // The low 32 bits of the hash, mapped onto [0, num_stripes) by multiply-shift (no division);
  // the index uses the high bits, so the two choices are independent.
  uint32_t StripeIndex(uint64_t hash) const {
    return static_cast<uint32_t>(
        (static_cast<uint64_t>(static_cast<uint32_t>(hash)) * static_cast<uint64_t>(num_stripes_)) >> 32);
  }

  static RowIndex::Position FindLocked(const Rows& r, uint64_t id, uint64_t hash) {
    return r.index.Find(hash, [&](SlotHandle slot) { return r.id(slot) == id; });
  }

  bool AdmitLocked(Stripe& stripe, int t, uint64_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const AdmissionConfig& admission = table(t).admission;
    if (admission.AdmitsEverything()) return true;
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    if (admission.min_count > 1 && part.sketch.Increment(hash) < admission.min_count) {
      ++part.counters.admission_rejections;
      return false;
    }
    if (admission.probability < 1.0) {
      stripe.rng_state += 0x9e3779b97f4a7c15ULL;
      const double coin = static_cast<double>(Mix64(stripe.rng_state) >> 11) * 0x1.0p-53;
      if (coin >= admission.probability) {
        ++part.counters.admission_rejections;
        return false;
      }
    }
    return true;
  }

  // The score of a kTtl row used now: the table's data time in granules, modulo 2^16.
  uint16_t TtlNow(int t) const {
    return static_cast<uint16_t>(data_time_[t].load(std::memory_order_relaxed) / layouts_[t].ttl_granule);
  }

  // kTtl: evicts the rows of table t in this stripe unused for more than the TTL (`all`: every
  // row, when data time has jumped past what the scores can tell).
  void SweepExpiredLocked(Stripe& stripe, int t, bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    const uint16_t now = TtlNow(t);
    thread_local std::vector<uint64_t> expired;  // Ids: positions move as entries are erased.
    expired.clear();
    part.scores.Swept(false, now);
    r.index.ForEach([&](RowIndex::Position p) {
      const uint16_t score = r.index.score(p);
      if (all || part.scores.Expired(score, now)) {
        expired.push_back(r.id(r.index.slot(p)));
      } else {
        part.scores.Note(score, now);
      }
    });
    for (const uint64_t id : expired) {
      const uint64_t hash = Hash(t, id);
      const RowIndex::Position at = FindLocked(r, id, hash);
      if (at != RowIndex::kNone) EvictLocked(stripe, t, at, hash, /*expired=*/true);
    }
  }

  bool OverCapacity() const {
    return (capacity_rows_ > 0 && total_rows_.load(std::memory_order_relaxed) > capacity_rows_) ||
           (capacity_bytes_ > 0 && total_charged_.load(std::memory_order_relaxed) > capacity_bytes_);
  }

  bool TableOverCapacity(int t) const {
    const uint64_t capacity = table(t).capacity_rows;
    return capacity > 0 &&
           table_rows_[t].load(std::memory_order_relaxed) + disk_rows_[t].load(std::memory_order_relaxed) > capacity;
  }

  // The table whose row the store's capacity evicts for a new row of table t: t itself when it
  // has rows in this stripe, else the table with the most rows there; -1 when the stripe is empty.
  int VictimTableLocked(const Stripe& stripe, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    if (IndexOf(stripe, t).size() > 0) return t;
    int victim = -1;
    uint64_t most = 0;
    for (int u = 0; u < num_tables(); ++u) {
      const uint64_t rows = IndexOf(stripe, u).size();
      if (rows > most) {
        victim = u;
        most = rows;
      }
    }
    return victim;
  }

  // Evicts one row of table t in this stripe (which must have one) for a new row whose hash is
  // `hash`: the row of the highest rank in the new row's home bucket of t's index. `spill`: to
  // the disk tier, unless it has expired; the tier's refusal leaves the row where it was.
  absl::Status EvictForLocked(Stripe& stripe, int t, uint64_t hash, bool spill)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    const uint16_t ttl_now = TtlNow(t);
    const RowIndex::Position victim =
        r.index.Victim(hash, [&](uint16_t score) { return part.scores.Rank(score, ttl_now); });
    const SlotHandle slot = r.index.slot(victim);
    const uint64_t id = r.id(slot);
    const bool expired = part.scores.Expired(r.index.score(victim), ttl_now);
    if (spill && !expired) {
      const uint64_t score = SnapshotScoreLocked(r, t, victim).value_or(0);
      HYREC_RETURN_IF_ERROR(tier_->Put(t, id, score, r.weights(slot)));
      ++part.counters.disk_writes;
      disk_rows_[t].fetch_add(1, std::memory_order_relaxed);
      RemoveLocked(stripe, t, victim, Hash(t, id));
      return absl::OkStatus();
    }
    EvictLocked(stripe, t, victim, Hash(t, id), expired);
    return absl::OkStatus();
  }

  // The score of the row at `p` as StoreSnapshot::Table::scores holds it (none under lru).
  std::optional<uint64_t> SnapshotScoreLocked(const Rows& r, int t, RowIndex::Position p) const {
    const TableLayout& layout = layouts_[t];
    if (layout.policy == EvictionPolicy::kLfu) return r.index.score(p);
    if (layout.policy != EvictionPolicy::kTtl) return std::nullopt;
    const uint64_t now = data_time_[t].load(std::memory_order_relaxed);
    const uint64_t age = static_cast<uint64_t>(r.part.scores.Rank(r.index.score(p), TtlNow(t))) * layout.ttl_granule;
    return now > age ? now - age : 0;
  }

  // The status of the last insert on this thread that the disk tier refused room for.
  static absl::Status& InsertError() {
    thread_local absl::Status error;
    return error;
  }

  // Reads the rows of `ids` (grouped by GroupByStripe) that are on disk back into DRAM, all
  // together, every stripe of the call locked meanwhile (so that no other call moves them).
  // ResourceExhausted, nothing written, when the rows this call may create would not fit the
  // tier; DataLoss when a page fails its checksum (the rows of other pages are read back).
  absl::Status ReadBackFromDisk(int t, absl::Span<const uint64_t> ids) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    GroupScratch& scratch = Scratch();
    const uint64_t* hashes = scratch.hashes.data();
    for (int s = 0; s < num_stripes_; ++s) {
      if (scratch.starts[s] != scratch.starts[s + 1]) stripes_[s]->mu.Lock();
    }
    thread_local std::vector<uint64_t> missing;
    thread_local std::vector<uint32_t> missing_at;
    missing.clear();
    missing_at.clear();
    for (size_t k = 0; k < ids.size(); ++k) {
      const uint32_t p = scratch.order[k];
      const Rows r = RowsOf(*stripes_[scratch.stripe_of[p]], t);
      if (FindLocked(r, ids[p], hashes[p]) != RowIndex::kNone) continue;
      missing.push_back(ids[p]);
      missing_at.push_back(p);
    }
    absl::Status status;
    const size_t held = missing.empty() ? 0 : tier_->CountHeld(t, missing);
    if (missing.size() > held && !tier_->HasRoomFor(t, missing.size() - held)) {
      status = absl::ResourceExhaustedError(absl::StrCat("table '", table(t).name, "': ", missing.size() - held,
                                                         " new rows would not fit the disk tier ", tier_->path(),
                                                         " (ps.disk.capacity_bytes); nothing written"));
    } else if (held > 0) {
      const uint32_t bytes = layouts_[t].weight_bytes + 4 * layouts_[t].state_floats;
      thread_local std::vector<std::pair<size_t, uint64_t>> taken;  // (index in missing, score)
      thread_local std::string payloads;
      taken.clear();
      payloads.clear();
      status = tier_->Take(t, missing, [&](size_t i, uint64_t score, const char* payload) {
        taken.emplace_back(i, score);
        payloads.append(payload, bytes);
      });
      for (size_t k = 0; k < taken.size(); ++k) {
        const uint32_t p = missing_at[taken[k].first];
        absl::Status placed = PlaceLocked(*stripes_[scratch.stripe_of[p]], t, ids[p], hashes[p], taken[k].second,
                                          payloads.data() + k * bytes);
        if (status.ok()) status = placed;
      }
    }
    for (int s = 0; s < num_stripes_; ++s) {
      if (scratch.starts[s] != scratch.starts[s + 1]) stripes_[s]->mu.Unlock();
    }
    return status;
  }

  // Puts a row read back from disk into DRAM: its slot's weights and state (`payload`) and its
  // score. A row DRAM cannot take (the tier refusing the row that would make room) goes back
  // to disk; DataLoss when not even that is possible.
  absl::Status PlaceLocked(Stripe& stripe, int t, uint64_t id, uint64_t hash, uint64_t score, const char* payload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    disk_rows_[t].fetch_sub(1, std::memory_order_relaxed);
    Rows r = RowsOf(stripe, t);
    InsertError() = absl::OkStatus();
    const RowIndex::Position at = InsertLocked(stripe, t, id, hash, /*init=*/false);
    if (at == RowIndex::kNone) {
      absl::Status back = tier_->Put(t, id, score, payload);
      if (!back.ok()) {
        return absl::DataLossError(
            absl::StrCat("table '", table(t).name, "': row ", id,
                         " read back from disk has no room in DRAM or on disk: ", back.message()));
      }
      disk_rows_[t].fetch_add(1, std::memory_order_relaxed);
      return InsertError().ok() ? absl::ResourceExhaustedError("a stripe is full") : InsertError();
    }
    const TableLayout& layout = layouts_[t];
    std::memcpy(r.weights(r.index.slot(at)), payload, layout.weight_bytes + 4 * layout.state_floats);
    const uint16_t ttl_now = TtlNow(t);
    const uint16_t restored = RestoredScoreLocked(
        stripe, t, layout.policy == EvictionPolicy::kLru ? std::optional<uint64_t>() : std::optional<uint64_t>(score),
        ttl_now);
    r.index.set_score(at, restored);
    r.part.scores.Note(restored, ttl_now);
    // Marked until a lookup or update visits it, so that the visit is not counted a DRAM hit (a
    // store with a tier keeps no change marks: it refuses track_changes).
    r.index.set_mark(at, true);
    ++r.part.counters.disk_reads;
    return absl::OkStatus();
  }

  // The row of (t, id) read back from disk on its own, when the tier holds it; kNone otherwise.
  RowIndex::Position TakeOneLocked(Stripe& stripe, int t, uint64_t id, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const uint32_t bytes = layouts_[t].weight_bytes + 4 * layouts_[t].state_floats;
    std::string payload;
    uint64_t score = 0;
    const uint64_t one[1] = {id};
    absl::Status taken = tier_->Take(t, one, [&](size_t, uint64_t s, const char* p) {
      score = s;
      payload.assign(p, bytes);
    });
    if (!taken.ok()) {
      InsertError() = taken;
      return RowIndex::kNone;
    }
    if (payload.empty()) return RowIndex::kNone;
    absl::Status placed = PlaceLocked(stripe, t, id, hash, score, payload.data());
    if (!placed.ok()) {
      InsertError() = placed;
      return RowIndex::kNone;
    }
    return FindLocked(RowsOf(stripe, t), id, hash);
  }

  // Removes the row at `at` of table t's index in this stripe; `hash` is its id's. `expired`: a
  // kTtl expiry rather than an eviction for capacity.
  void EvictLocked(Stripe& stripe, int t, RowIndex::Position at, uint64_t hash, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    if (track_changes_) part.tombstones.push_back(r.id(r.index.slot(at)));
    ++(expired ? part.counters.expirations : part.counters.evictions);
    RemoveLocked(stripe, t, at, hash);
  }

  // Takes the row at `at` out of DRAM (evicted, or moved to disk).
  void RemoveLocked(Stripe& stripe, int t, RowIndex::Position at, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    const SlotHandle slot = r.index.slot(at);
    r.index.Erase(hash, at);
    part.slab.Free(r.base, slot);
    --stripe.rows;
    total_rows_.fetch_sub(1, std::memory_order_relaxed);
    table_rows_[t].fetch_sub(1, std::memory_order_relaxed);
    total_charged_.fetch_sub(layouts_[t].charge, std::memory_order_relaxed);
  }

  // Creates the row of (t, id), evicting rows of this stripe to stay within the table's capacity
  // (its own rows) and the store's (the table's own rows first; see StoreOptions), and returns
  // its index position; kNone when the stripe's slab for t is full. `init`: give the row its
  // initial values (RestoreRows writes them itself).
  RowIndex::Position InsertLocked(Stripe& stripe, int t, uint64_t id, uint64_t hash, bool init)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe.mu) {
    const TableLayout& layout = layouts_[t];
    Rows r = RowsOf(stripe, t);
    TablePart& part = r.part;
    total_rows_.fetch_add(1, std::memory_order_relaxed);
    table_rows_[t].fetch_add(1, std::memory_order_relaxed);
    total_charged_.fetch_add(layout.charge, std::memory_order_relaxed);
    while (TableOverCapacity(t) && r.rows() > 0) EvictForLocked(stripe, t, hash, /*spill=*/false).IgnoreError();
    for (int victim = 0; OverCapacity() && (victim = VictimTableLocked(stripe, t)) >= 0;) {
      absl::Status spilled = EvictForLocked(stripe, victim, victim == t ? hash : Hash(victim, id), tier_ != nullptr);
      if (!spilled.ok()) {  // The disk tier is full: the new row is refused, the victim stays.
        total_rows_.fetch_sub(1, std::memory_order_relaxed);
        table_rows_[t].fetch_sub(1, std::memory_order_relaxed);
        total_charged_.fetch_sub(layout.charge, std::memory_order_relaxed);
        InsertError() = spilled;
        return RowIndex::kNone;
      }
    }
    const SlotHandle slot = part.slab.Allocate(arena_, id);
    if (slot == kNoSlot) {
      total_rows_.fetch_sub(1, std::memory_order_relaxed);
      table_rows_[t].fetch_sub(1, std::memory_order_relaxed);
      total_charged_.fetch_sub(layout.charge, std::memory_order_relaxed);
      ++part.counters.admission_rejections;
      return RowIndex::kNone;
    }
    if (init && layout.precision == RowPrecision::kFp32) {
      float* weights = r.floats(slot);
      InitialRow(table(t), id, weights);
      InitOptimizerState(table(t).optimizer, layout.dim, weights + layout.dim);
    } else if (init) {
      thread_local std::vector<float> row;
      row.resize(layout.dim + layout.state_floats);
      InitialRow(table(t), id, row.data());
      InitOptimizerState(table(t).optimizer, layout.dim, row.data() + layout.dim);
      WriteRow(layout, row.data(), /*seed=*/0, r.weights(slot));  // Initial weights are small: they fit.
    }
    RowScores::Upkeep upkeep = RowScores::Upkeep::kNone;
    const uint16_t ttl_now = TtlNow(t);
    const uint16_t score = part.scores.New(r.rows(), ttl_now, &upkeep);
    part.scores.Note(score, ttl_now);
    const RowIndex::Position at = r.index.Insert(
        hash, slot, score, [&](SlotHandle other) { return Hash(t, r.id(other)); },
        [&](SlotHandle other) { PrefetchLine(Slab::Slot(r.base, other)); });
    RunUpkeep(r, upkeep);  // Scores only: `at` stays valid.
    if (track_changes_) r.index.set_mark(at, true);
    ++stripe.rows;
    return at;
  }

  const uint64_t capacity_rows_;
  const uint64_t capacity_bytes_;
  const int num_stripes_;
  const bool track_changes_;
  const std::vector<TableLayout> layouts_;
  RowArena arena_;  // Every stripe's rows.
  std::vector<std::unique_ptr<Stripe>> stripes_;
  // Per (table, stripe), at t * num_stripes_ + s; stripe s's lock guards its indexes.
  std::vector<RowIndex> indexes_;
  // Per table: whether a use renews its row's score. Not for an lru table that never evicts (no
  // capacity bounds it), where nothing reads the scores but a snapshot's order: a lookup then
  // writes nothing.
  std::vector<uint8_t> scored_;
  std::atomic<uint64_t> total_rows_{0};
  std::atomic<uint64_t> total_charged_{0};
  std::atomic<uint64_t> rejected_requests_{0};
  std::vector<std::atomic<uint64_t>> rejected_nonfinite_;
  std::vector<std::atomic<uint64_t>> duplicates_;
  std::vector<std::atomic<uint64_t>> nonfinite_results_;
  std::vector<std::atomic<uint64_t>> table_rows_;  // Per table, over all stripes.
  std::vector<std::atomic<uint64_t>> data_time_;   // Per table: the newest data time seen.
  const std::unique_ptr<DiskTier> tier_;           // StoreOptions::disk; null without.
  std::vector<std::atomic<uint64_t>> disk_rows_;   // Per table: rows in the tier.
  // Page buffers for ReadBack's reads ahead, one a concurrent ReadBack, kept for the next when
  // they hold at most kAheadPagesKept pages (4 MiB).
  static constexpr size_t kAheadPagesKept = 1024;
  absl::Mutex ahead_mu_;
  std::vector<std::unique_ptr<DiskTier::PagesRead>> ahead_ ABSL_GUARDED_BY(ahead_mu_);
  mutable absl::Mutex dedup_mu_;
  uint64_t delta_sequence_ ABSL_GUARDED_BY(dedup_mu_) = 0;
  // A worker's update of one batch carries the same sequence to every table, and its tables'
  // updates may arrive in any order: one window per (worker, table).
  DedupWindows dedup_ ABSL_GUARDED_BY(dedup_mu_);
};

}  // namespace

double StoreStats::OverheadBytesPerRow() const {
  if (rows == 0) return 0.0;
  return static_cast<double>(bytes - payload_bytes) / static_cast<double>(rows);
}

// The disk tier's families of PublishStoreMetrics.
void PublishDiskMetrics(const StoreStats& stats, const MetricLabels& labels, MetricsRegistry* m) {
  m->Describe("hyrec_ps_disk_rows", MetricType::kGauge, "Rows of a table in a PS shard's disk tier.");
  m->Describe("hyrec_ps_disk_writes_total", MetricType::kCounter, "Rows the shard's DRAM capacity moved to disk.");
  m->Describe("hyrec_ps_disk_reads_total", MetricType::kCounter, "Rows read back from disk into DRAM.");
  m->Describe("hyrec_ps_dram_hits_total", MetricType::kCounter,
              "Ids a lookup found in DRAM, not read back from disk for it (over hyrec_ps_lookups_total: "
              "DRAM's hit rate).");
  m->Describe("hyrec_ps_disk_pages", MetricType::kGauge, "4 KiB pages of the disk tier's file: used, and all.");
  m->Describe("hyrec_ps_disk_page_reads_total", MetricType::kCounter, "Pages the disk tier read.");
  m->Describe("hyrec_ps_disk_page_writes_total", MetricType::kCounter, "Pages the disk tier wrote.");
  m->Describe("hyrec_ps_disk_bytes_read_total", MetricType::kCounter, "Bytes the disk tier read.");
  m->Describe("hyrec_ps_disk_bytes_written_total", MetricType::kCounter, "Bytes the disk tier wrote.");
  m->Describe("hyrec_ps_disk_cleaned_pages_total", MetricType::kCounter,
              "Pages the disk tier freed by moving their live rows.");
  m->Describe("hyrec_ps_disk_full_refusals_total", MetricType::kCounter, "Rows refused: the disk tier was full.");
  m->Describe("hyrec_ps_disk_checksum_failures_total", MetricType::kCounter,
              "Disk tier pages read whose checksum failed.");
  for (const TableStats& t : stats.tables) {
    MetricLabels table_labels = labels;
    table_labels.emplace_back("table", t.name);
    m->Set("hyrec_ps_disk_rows", table_labels, static_cast<double>(t.disk_rows));
    m->Set("hyrec_ps_disk_writes_total", table_labels, static_cast<double>(t.disk_writes));
    m->Set("hyrec_ps_disk_reads_total", table_labels, static_cast<double>(t.disk_reads));
    m->Set("hyrec_ps_dram_hits_total", table_labels, static_cast<double>(t.dram_hits));
  }
  MetricLabels used = labels;
  used.emplace_back("state", "used");
  MetricLabels all = labels;
  all.emplace_back("state", "all");
  m->Set("hyrec_ps_disk_pages", used, static_cast<double>(stats.disk.used_pages));
  m->Set("hyrec_ps_disk_pages", all, static_cast<double>(stats.disk.pages));
  m->Set("hyrec_ps_disk_page_reads_total", labels, static_cast<double>(stats.disk.page_reads));
  m->Set("hyrec_ps_disk_page_writes_total", labels, static_cast<double>(stats.disk.page_writes));
  m->Set("hyrec_ps_disk_bytes_read_total", labels, static_cast<double>(stats.disk.bytes_read));
  m->Set("hyrec_ps_disk_bytes_written_total", labels, static_cast<double>(stats.disk.bytes_written));
  m->Set("hyrec_ps_disk_cleaned_pages_total", labels, static_cast<double>(stats.disk.cleaned_pages));
  m->Set("hyrec_ps_disk_full_refusals_total", labels, static_cast<double>(stats.disk.full_refusals));
  m->Set("hyrec_ps_disk_checksum_failures_total", labels, static_cast<double>(stats.disk.checksum_failures));
}

void PublishStoreMetrics(const StoreStats& stats, const MetricLabels& labels, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_ps_rows", MetricType::kGauge, "Rows held by a PS shard, per table.");
  m->Describe("hyrec_ps_evictions_total", MetricType::kCounter,
              "Rows evicted to stay within a capacity, by the table's eviction policy (lru, lfu, ttl).");
  m->Describe("hyrec_ps_expirations_total", MetricType::kCounter,
              "Rows of a ttl table evicted for going unused longer than the TTL of data time.");
  m->Describe("hyrec_ps_data_time_seconds", MetricType::kGauge, "The newest data time a table has seen.");
  m->Describe("hyrec_ps_lookups_total", MetricType::kCounter, "Ids looked up (not counting updates).");
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
  if (stats.disk.pages > 0) PublishDiskMetrics(stats, labels, m);
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

absl::StatusOr<std::unique_ptr<EmbeddingShardStore>> EmbeddingShardStore::Create(const StoreOptions& options) {
  if (options.tables.size() > kMaxTables) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.tables.size(), " tables given; a store holds at most ", kMaxTables));
  }
  if (options.num_stripes < 1 || options.num_stripes > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat("num_stripes must be in [1, 65536], got ", options.num_stripes));
  }
  for (size_t t = 0; t < options.tables.size(); ++t) {
    const TableConfig& config = options.tables[t];
    absl::Status valid = config.Validate();
    if (!valid.ok()) return valid;
    for (size_t u = 0; u < t; ++u) {
      if (options.tables[u].name == config.name) {
        return absl::InvalidArgumentError(absl::StrCat("table '", config.name, "' is defined twice"));
      }
    }
  }
  std::vector<TableLayout> layouts = MakeLayouts(options);
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
  if (!StripesHoldRows(rows, options.num_stripes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.capacity_rows > 0 ? "capacity_rows " : "capacity_bytes ",
        options.capacity_rows > 0 ? options.capacity_rows : options.capacity_bytes, " over ", options.num_stripes,
        " stripes exceeds ", kMaxRowsPerStripeAndTable / 2, " rows per stripe; raise num_stripes"));
  }
  if (memory > 0 && options.capacity_rows > 0 && !layouts.empty() && options.capacity_rows > memory / min_charge) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_rows ", options.capacity_rows, " at ", min_charge,
                                                   " bytes or more each is more than this machine's memory (", memory,
                                                   " bytes)"));
  }
  std::unique_ptr<DiskTier> tier;
  if (!options.disk.path.empty()) {
    if (options.track_changes) {
      return absl::InvalidArgumentError("a store with a disk tier does not track changes for deltas (track_changes)");
    }
    if (options.capacity_rows == 0 && options.capacity_bytes == 0) {
      return absl::InvalidArgumentError(
          "a disk tier needs the store's capacity (capacity_rows or capacity_bytes) to bound its rows in DRAM");
    }
    std::vector<uint32_t> payload;
    for (const TableLayout& l : layouts) payload.push_back(l.weight_bytes + 4 * l.state_floats);
    DiskTierOptions disk;
    disk.path = options.disk.path;
    disk.capacity_bytes = options.disk.capacity_bytes;
    disk.queue_depth = options.disk.queue_depth;
    HYREC_ASSIGN_OR_RETURN(tier, DiskTier::Open(disk, std::move(payload)));
  }
  try {
    return std::unique_ptr<EmbeddingShardStore>(new StripedStore(options, std::move(layouts), std::move(tier)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the store's index for ", rows,
                                                     " rows (capacity) in ", options.num_stripes, " stripes"));
  }
}

FrozenStore* FrozenAccess(EmbeddingShardStore* store) { return dynamic_cast<FrozenStore*>(store); }

}  // namespace hyrec::embedding_ps
