// EmbeddingShardStore: the rows one parameter server holds.
//
// The store maps (table, uint64 id) to a row of `dim` weights followed by the table's optimizer
// state, contiguous in memory. The id space is unbounded; memory is bounded by a capacity in rows
// and/or bytes for the whole store, and by a capacity in rows per table (TableConfig). Each row
// carries a score of its table's eviction policy (TableConfig::eviction: least recently used,
// least frequently used, or TTL by data time; a lookup or an update uses a row). When an insert
// would exceed its table's capacity, the row the policy ranks first among those of the new id's
// index bucket in its stripe is evicted (not exact LRU: its hit rate is within a point of exact
// LRU's, docs/architecture.md); when it would exceed the store's, such a row of the same table in
// that stripe (or, when the table has none there, of the stripe's largest table). Rows of a ttl
// table also expire once unused for the TTL of data time.
//
// New rows are initialized from (table seed, id) alone, so an id gets the same initial vector on
// any PS, in any run, for any number of PS shards.
//
//   TableConfig user_table;
//   user_table.name = "user";
//   user_table.dim = 16;
//   StoreOptions options;
//   options.tables = {user_table};
//   options.capacity_rows = 100'000'000;
//   HYREC_ASSIGN_OR_RETURN(auto store, EmbeddingShardStore::Create(options));
//   HYREC_ASSIGN_OR_RETURN(int user, store->TableIndex("user"));
//   const std::vector<uint64_t> ids = {17, 42};  // unique within a call
//   std::vector<float> rows(ids.size() * store->table(user).dim);
//   HYREC_RETURN_IF_ERROR(store->Lookup(user, ids, absl::MakeSpan(rows), nullptr));
//   const std::vector<float> grads(rows.size(), 0.01f);
//   HYREC_RETURN_IF_ERROR(store->Update(user, ids, grads, UpdateId{/*worker_id=*/0, /*sequence=*/1}, nullptr));
//
// Thread safety: all methods are safe for concurrent use. The store is split into
// `num_stripes` stripes by a hash of (table, id), each with its own lock and, per table, hash
// index, so lookups and updates from many RPC threads proceed in parallel.
//
// Memory layout (docs/architecture.md has the details): each row is a slot of
// 8 + 4 * (dim + state) bytes (the id, then the floats) in one huge-page arena per store, found
// through a per-(stripe, table) open-addressing index whose 64-byte buckets hold 7 entries of a
// 40-bit slot handle, a 16-bit policy score and a tag. Slots are never moved.
#ifndef HYREC_EMBEDDING_PS_EMBEDDING_STORE_H_
#define HYREC_EMBEDDING_PS_EMBEDDING_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "hyrec/common/metrics.h"
#include "hyrec/embedding_ps/table_config.h"

namespace hyrec::embedding_ps {

// Rows one stripe holds of one table; a store refuses a capacity that would need more than half
// of this a stripe, for the hash's uneven spread.
inline constexpr uint32_t kMaxRowsPerStripeAndTable = (1u << 24) - 1;
// Whether `num_stripes` stripes hold `rows` rows of one table within that half bound.
inline constexpr bool StripesHoldRows(uint64_t rows, uint64_t num_stripes) {
  return rows / num_stripes * 2 <= kMaxRowsPerStripeAndTable;
}
// The fewest stripes that hold `rows` rows of one table.
inline constexpr uint64_t StripesForRows(uint64_t rows) { return rows * 2 / kMaxRowsPerStripeAndTable + 1; }

struct StoreOptions {
  std::vector<TableConfig> tables;  // At most 256 tables, unique names; each may bound its rows.
  // Bounds of the whole store. Rows are counted as they are created, so a stripe whose table has
  // no row to evict may go one row over a bound until its next insert.
  uint64_t capacity_rows = 0;   // 0: no bound on rows.
  uint64_t capacity_bytes = 0;  // 0: no bound; each row is charged its slot bytes + 8 (index).
  int num_stripes = 64;         // Lock stripes; each holds at most 2^24 - 1 rows per table.
  // Count-min sketch counters per table (over all stripes) for tables with admission.min_count.
  uint32_t admission_sketch_counters = 1 << 20;
  // Track the rows changed (and evicted) since the last TakeDelta, for incremental exports. Costs
  // a byte per row slot and the evicted ids until the next delta. Not with a disk tier.
  bool track_changes = false;
  // A disk tier under DRAM (src/embedding_ps/disk_tier.h), when `path` is set. The store's own
  // capacity (capacity_rows, capacity_bytes) then bounds its rows in DRAM, and a row that capacity
  // evicts is written to the tier instead of dropped; a lookup or update of a row on disk reads it
  // back into DRAM (a request's rows on disk are read together, queue_depth in flight), evicting
  // others to disk. A table's capacity_rows bounds its rows in DRAM and on disk together; a row
  // it evicts is dropped. The tier's file is created empty (truncated) and removed with the
  // store: checkpoints and the update log make its rows durable, as they do DRAM's. When the
  // tier is full, a lookup or update that would create rows is refused whole (ResourceExhausted,
  // nothing written).
  struct Disk {
    std::string path;             // The tier's file.
    uint64_t capacity_bytes = 0;  // The file's bound, in 4 KiB pages.
    int queue_depth = 32;         // Page reads in flight.
  } disk;
};

// A store's state as a checkpoint holds it (shard_checkpoint.h writes and reads it). Rows are per
// table, within each stripe the next to be evicted first, each `dim` weights followed by the
// optimizer's state floats.
struct StoreSnapshot {
  struct Table {
    std::vector<uint64_t> ids;
    std::vector<float> values;  // ids.size() * (dim + state floats)
    // Per row, by the table's eviction policy: lfu, its use count; ttl, the data time of its
    // last use (seconds, to the policy's granularity); lru: empty.
    std::vector<uint64_t> scores;
    uint64_t data_time = 0;  // The newest data time the table had seen.
    // lfu: per stripe, the uses since its counts were last halved.
    std::vector<uint64_t> lfu_uses;
  };
  std::vector<Table> tables;
  // Admission: per (stripe, table) with a sketch, its counters and aging count.
  struct Sketch {
    uint32_t stripe = 0;
    uint32_t table = 0;
    uint64_t increments = 0;
    std::vector<uint8_t> counters;
  };
  std::vector<Sketch> sketches;
  std::vector<uint64_t> stripe_rng;  // Per stripe: the admission coin's state.
  // Deduplication: per (worker, table), the highest sequence applied and the bitmap below it.
  struct Dedup {
    uint32_t worker = 0;
    uint32_t table = 0;
    uint64_t highest = 0;
    std::vector<uint64_t> seen;  // 16 words: bit k set when sequence highest - k was applied.
    // Updates of this (worker, table) the shard applied since the job began (repeats not
    // counted), carried through checkpoints and update-log replays: what a client's
    // acknowledgements must add up to.
    uint64_t applied = 0;
  };
  std::vector<Dedup> dedup;
  uint64_t delta_sequence = 0;  // Deltas taken before the snapshot.
  uint32_t num_stripes = 0;
  // Not OK when a row could not be read (a disk tier's page failed its checksum): the snapshot
  // is incomplete and must not be written.
  absl::Status status;
};

// What changed since the previous delta: per table, the rows created or updated (weights only,
// their latest values) and the ids evicted (tombstones). A follower removes the tombstones first,
// then writes the rows.
struct StoreDelta {
  struct Table {
    std::vector<uint64_t> ids;
    std::vector<float> weights;  // ids.size() * dim
    std::vector<uint64_t> tombstones;
  };
  std::vector<Table> tables;
  uint64_t sequence = 0;  // 1 for the first delta.
};

// Identifies an update of one table for deduplication: a repeat of a (worker_id, sequence) pair
// that the store has already applied to that table is acknowledged (duplicate) but not applied
// again. A worker gives all the tables of one batch the same sequence. The store remembers, per
// (worker, table), the highest sequence and the 1024 sequences below it, so one worker's updates
// may arrive up to 1024 sequences out of order; an older sequence is FailedPrecondition and
// writes nothing (the store cannot tell whether it was applied). sequence 0 means "no identity":
// never deduplicated.
struct UpdateId {
  uint32_t worker_id = 0;
  uint64_t sequence = 0;
};

struct LookupResult {
  uint64_t not_admitted = 0;  // Ids read as zeros because admission did not let them in.
};

struct UpdateResult {
  bool duplicate = false;  // Already applied; nothing changed.
  uint64_t applied = 0;
  uint64_t dropped = 0;  // Ids without a row that admission did not let in.
  // Rows left as they were because the step would have made a weight or its optimizer state
  // non-finite (a finite but huge gradient).
  uint64_t nonfinite = 0;
};

struct TableStats {
  std::string name;
  int dim = 0;
  std::string optimizer;
  uint64_t rows = 0;
  uint64_t bytes = 0;          // Slot bytes held by this table's rows (allocated chunks).
  uint64_t row_bytes = 0;      // Bytes of one slot: 8 + 4 * (dim + state floats).
  uint64_t capacity_rows = 0;  // The table's own bound (TableConfig::capacity_rows).
  uint64_t lookups = 0;        // Ids looked up.
  uint64_t updates = 0;        // Rows updated.
  uint64_t evictions = 0;      // For capacity.
  uint64_t expirations = 0;    // ttl: unused longer than the TTL.
  std::string eviction_policy;
  uint64_t data_time = 0;
  uint64_t admission_rejections = 0;
  uint64_t dropped_updates = 0;
  uint64_t rejected_nonfinite = 0;  // Update requests refused for a NaN/Inf gradient.
  uint64_t nonfinite_results = 0;   // Rows an update left unchanged (UpdateResult::nonfinite).
  uint64_t duplicate_updates = 0;
  // With a disk tier: rows on disk, rows the store's capacity moved there, rows read back (for
  // lookups and updates), and ids a lookup found in DRAM, not read back from disk for it
  // (dram_hits / lookups is DRAM's hit rate; the other lookups read back or created their rows).
  uint64_t disk_rows = 0;
  uint64_t disk_writes = 0;
  uint64_t disk_reads = 0;
  uint64_t dram_hits = 0;
};

// A store's disk tier (StoreOptions::disk), all zero without one.
struct DiskStats {
  uint64_t capacity_bytes = 0;
  uint64_t pages = 0;       // 4 KiB pages of its file.
  uint64_t used_pages = 0;  // Holding rows.
  uint64_t page_reads = 0;
  uint64_t page_writes = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t cleaned_pages = 0;      // Pages freed by moving their live rows.
  uint64_t full_refusals = 0;      // Rows refused: the tier was full.
  uint64_t checksum_failures = 0;  // Pages read whose checksum failed.
  uint64_t index_bytes = 0;        // DRAM its index of rows and its pages' state take (in StoreStats::bytes).
};

struct StoreStats {
  uint64_t capacity_rows = 0;
  uint64_t capacity_bytes = 0;
  uint64_t rows = 0;
  uint64_t bytes = 0;          // Everything allocated: chunks, index, sketches, stripe headers.
  uint64_t payload_bytes = 0;  // rows * (weight bytes + 4 * state floats), summed over tables.
  std::vector<TableStats> tables;
  DiskStats disk;

  // (bytes - payload_bytes) / rows: what the store spends per row beyond its floats.
  double OverheadBytesPerRow() const;
};

// What a store of `options` takes when its tables hold `rows_per_table` rows, by the store's own
// accounting: StoreStats::bytes of such a store, with rows spread evenly over the stripes (as
// their hash spreads them). The planner sizes PS shards with it (hyrec plan, the Kubernetes PS
// pods' memory).
struct StoreMemoryPlan {
  struct Table {
    uint64_t rows = 0;
    uint32_t slot_bytes = 0;   // A row's slot: the id (8 bytes), then its floats.
    uint32_t value_bytes = 0;  // The weights in the table's precision (4 x dim for fp32).
    uint32_t state_bytes = 0;  // 4 x the optimizer's state floats.
    uint64_t slab_bytes = 0;   // Its slots, allocated in whole chunks, over every stripe.
  };
  std::vector<Table> tables;
  uint64_t index_bytes = 0;   // The hash indexes (64-byte buckets of 7, at most 90% full).
  uint64_t sketch_bytes = 0;  // Admission count-min sketches.
  uint64_t fixed_bytes = 0;   // The store and its stripes' headers.
  uint64_t bytes = 0;         // All of the above: StoreStats::bytes.
  uint64_t rows = 0;
  uint64_t payload_bytes = 0;  // Values and optimizer state alone.
};
StoreMemoryPlan PlanStoreMemory(const StoreOptions& options, const std::vector<uint64_t>& rows_per_table);

// What a disk tier (StoreOptions::disk) takes to hold `rows_per_table` rows on disk: its file
// (pages of the tables' records at the 90% the tier fills them to, with a page a table and the
// cleaner's) and the DRAM of its index of rows and of the state of every page of
// options.disk.capacity_bytes (in StoreStats::bytes of such a store).
struct DiskTierPlan {
  uint64_t file_bytes = 0;
  uint64_t index_bytes = 0;
  uint64_t rows = 0;
};
DiskTierPlan PlanDiskTier(const StoreOptions& options, const std::vector<uint64_t>& rows_per_table);
// The rows of each table a disk tier of `capacity_bytes` holds when its tables share it in
// proportion to `weights`: the most rows PlanDiskTier would fit in that file.
std::vector<uint64_t> DiskTierRows(const StoreOptions& options, const std::vector<double>& weights);

// What a store charges a row of `table` against StoreOptions::capacity_bytes: its slot (the id,
// the weights in the table's precision, the optimizer's state) and its share of the index.
uint64_t RowChargeBytes(const TableConfig& table);

// Publishes a store's statistics as Prometheus families, every sample labelled with `labels`
// (e.g. {{"shard", "0"}}) plus table="<name>" where per table: hyrec_ps_rows,
// hyrec_ps_evictions_total (also labelled policy="lru|lfu|ttl"), hyrec_ps_expirations_total,
// hyrec_ps_data_time_seconds, hyrec_ps_lookups_total, hyrec_ps_updates_total,
// hyrec_ps_admission_rejections_total, hyrec_ps_rejected_nonfinite_total,
// hyrec_ps_duplicate_updates_total, hyrec_ps_dropped_updates_total,
// hyrec_ps_table_capacity_rows; with a disk tier, per table hyrec_ps_disk_rows,
// hyrec_ps_disk_writes_total, hyrec_ps_disk_reads_total, hyrec_ps_dram_hits_total, and per store
// hyrec_ps_disk_pages (state="used|all"), hyrec_ps_disk_page_reads_total,
// hyrec_ps_disk_page_writes_total, hyrec_ps_disk_bytes_read_total,
// hyrec_ps_disk_bytes_written_total, hyrec_ps_disk_cleaned_pages_total,
// hyrec_ps_disk_full_refusals_total, hyrec_ps_disk_checksum_failures_total; and per store
// hyrec_ps_bytes and hyrec_ps_capacity_rows.
void PublishStoreMetrics(const StoreStats& stats, const MetricLabels& labels, MetricsRegistry* metrics);

class EmbeddingShardStore {
 public:
  // Validates the options (InvalidArgument naming the bad table or field) and builds the store.
  static absl::StatusOr<std::unique_ptr<EmbeddingShardStore>> Create(const StoreOptions& options);

  virtual ~EmbeddingShardStore() = default;
  EmbeddingShardStore(const EmbeddingShardStore&) = delete;
  EmbeddingShardStore& operator=(const EmbeddingShardStore&) = delete;

  int num_tables() const { return static_cast<int>(tables_.size()); }
  const std::vector<TableConfig>& tables() const { return tables_; }
  const TableConfig& table(int index) const { return tables_[index]; }
  // NotFound naming the table when there is none of that name.
  absl::StatusOr<int> TableIndex(absl::string_view name) const;

  // Copies the rows of `ids` into `out` (ids.size() * dim floats, row-major, in order). Absent
  // ids are admitted and initialized, or read as zeros when admission declines them.
  // InvalidArgument (and nothing read) for a bad table index or a wrong `out` size.
  virtual absl::Status Lookup(int table, absl::Span<const uint64_t> ids, absl::Span<float> out,
                              LookupResult* result) = 0;

  // Applies one optimizer step per id with `grads` (ids.size() * dim floats). An id repeated
  // within a call gets one step with its gradients summed, as the client sends them.
  // All-or-nothing validation first: a bad table, a wrong gradient length or any NaN/Inf
  // gradient (the sums included) is InvalidArgument and nothing is written. A row the step would
  // make non-finite is left as it was and counted (UpdateResult::nonfinite).
  virtual absl::Status Update(int table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                              UpdateId update_id, UpdateResult* result) = 0;
  // With a disk tier (StoreOptions::disk): reads the rows of several tables' ids that are on disk
  // back into DRAM, all together (many reads in flight), before a request's Lookup or Update of
  // each table, which otherwise read their own table's rows alone. Creates no row. A no-op
  // without a tier (has_disk_tier). DataLoss when a page fails its checksum.
  struct TableIds {
    int table = 0;
    absl::Span<const uint64_t> ids;
  };
  virtual absl::Status ReadBack(absl::Span<const TableIds> calls) { return absl::OkStatus(); }
  virtual bool has_disk_tier() const { return false; }

  // The refusals Update would answer for these arguments now (a bad table, a wrong gradient
  // length, a NaN/Inf gradient, a sequence too old for its window, one worker id too many),
  // writing nothing: a call of several updates checks them all before it applies or logs any,
  // so that a refused call changes no row, no dedup window and no log. A refusal is counted as
  // Update counts it. (A gradient that only its repeated id's sum makes infinite is left to
  // Update.)
  virtual absl::Status CheckUpdate(int table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                                   UpdateId update_id) = 0;

  // Raises table t's data time to `seconds` when that is newer (a time never goes back; a bad
  // index is ignored). Rows of a ttl table used before its first data time count as used at that
  // first data time.
  // Callers pass the newest sample time of the batch whose ids they look up.
  virtual void AdvanceDataTime(int table, uint64_t seconds) = 0;
  virtual uint64_t data_time(int table) const = 0;

  // Counts one request refused before it reached the store (e.g. malformed RPC).
  virtual void CountRejectedRequest() = 0;
  virtual uint64_t rejected_requests() const = 0;

  virtual StoreStats Stats() const = 0;

  // Checkpoints. The store's own consistency: each stripe is copied under its lock; the job makes
  // the cut consistent by taking the snapshot while no update is in flight (checkpoint.h).
  virtual StoreSnapshot Snapshot() const = 0;
  // Snapshot() into `snap`, reusing the memory its vectors already hold (a checkpointer keeps
  // one between cuts, so that a cut copies into pages already faulted in).
  virtual void SnapshotInto(StoreSnapshot* snap) const = 0;

  // Inserts rows, or overwrites them, in order (the last ends most recently used), evicting as
  // capacity requires. `values` holds ids.size() * (dim + state floats); `scores`, when not
  // empty, one per row as StoreSnapshot::Table::scores (without: lfu rows count one use, ttl
  // rows are used at the table's data time). Restore a ttl table's data time (AdvanceDataTime)
  // before its rows. InvalidArgument (nothing written) for a bad table, a wrong size or a
  // non-finite value.
  virtual absl::Status RestoreRows(int table, absl::Span<const uint64_t> ids, absl::Span<const float> values,
                                   absl::Span<const uint64_t> scores) = 0;
  absl::Status RestoreRows(int table, absl::Span<const uint64_t> ids, absl::Span<const float> values) {
    return RestoreRows(table, ids, values, {});
  }
  // Restores admission, deduplication and lfu aging state. `exact`: the snapshot is of this shard
  // with the same stripes and sketch sizes, and replaces the state (lfu aging restarts otherwise). Otherwise (a
  // reshard) it is merged: with the same stripes, sketches add up (saturating; counts may be overestimated, never
  // under), else they are dropped; dedup windows unite.
  virtual absl::Status RestoreCounters(const StoreSnapshot& snapshot, bool exact) = 0;
  // The rows changed since the previous delta (FailedPrecondition unless track_changes).
  virtual absl::StatusOr<StoreDelta> TakeDelta() = 0;

 protected:
  explicit EmbeddingShardStore(std::vector<TableConfig> tables) : tables_(std::move(tables)) {}

 private:
  const std::vector<TableConfig> tables_;
};

// The initial weights of `id` in a table: a pure function of (config.seed, id, initializer).
void InitialRow(const TableConfig& config, uint64_t id, float* out);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_EMBEDDING_STORE_H_
