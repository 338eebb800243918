#include "hyrec/embedding_ps/shard_checkpoint.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "src/embedding_ps/frozen_store.h"
#include "src/embedding_ps/row_codec.h"

namespace hyrec::embedding_ps {
namespace {

// Block types of shard files.
constexpr uint32_t kStoreBlock = 10;  // u32 shard, u32 num_shards, u32 num_stripes, u32 tables, u64 delta seq
// A table block ends with `bytes precision` when the table's weights are not fp32; its rows then
// carry each row's weights in that precision (row_codec.h's PackedWeightBytes: fp16, dim halves;
// int8, the row's min and max as floats, then dim bytes) before the row's state floats.
constexpr uint32_t kTableBlock =
    11;  // bytes name, u32 dim, u32 state floats, bytes optimizer, u64 rows[, bytes precision]
constexpr uint32_t kRowsBlock = 12;    // u32 table, u32 n, n x u64 id, n x row values
constexpr uint32_t kSketchBlock = 13;  // u32 stripe, u32 table, u64 increments, bytes counters
constexpr uint32_t kRngBlock = 14;     // u32 n, n x u64
constexpr uint32_t kDedupBlock = 15;   // u32 worker, u32 table, u64 highest, 16 x u64
constexpr uint32_t kTombBlock = 16;    // u32 table, u32 n, n x u64 id
constexpr uint32_t kPolicyBlock = 17;  // u32 table, bytes eviction policy, u64 data time, u32 n, n x u64 lfu uses
constexpr uint32_t kScoredBlock = 18;  // u32 table, u32 n, n x u64 id, n x u64 score, n x row values

constexpr size_t kRowsPerBlock = 1 << 16;
constexpr uint32_t kMaxTables = 256;
constexpr uint32_t kMaxDim = 1 << 16;

struct TableHeader {
  std::string name;
  uint32_t dim = 0;
  uint32_t state_floats = 0;
  std::string optimizer;
  uint64_t rows = 0;
  RowPrecision precision = RowPrecision::kFp32;  // Of the weights in the rows blocks.

  // Bytes of one row's values in a rows block: its weights in `precision`, then its state.
  uint64_t row_bytes() const { return PackedWeightBytes(precision, dim) + 4ull * state_floats; }
};

std::string EncodeTable(const TableHeader& t) {
  Encoder e;
  e.Bytes(t.name);
  e.U32(t.dim);
  e.U32(t.state_floats);
  e.Bytes(t.optimizer);
  e.U64(t.rows);
  if (t.precision != RowPrecision::kFp32) e.Bytes(RowPrecisionName(t.precision));
  return std::move(e.str());
}

// Appends ids of one table in blocks of at most kRowsPerBlock rows, each id followed in its block
// by its row of `table`'s values, `values` holding `table.dim + table.state_floats` floats a row
// (rows blocks), or by none (tombstone blocks: values null); in scored blocks, the ids' `scores`
// come between the ids and the values. A table's weights are written in its precision, rounded
// to nearest: the store's rows of that precision give values it holds.
absl::Status AddIdBlocks(BlockWriter* w, uint32_t type, uint32_t table_index, const TableHeader& table,
                         const std::vector<uint64_t>& ids, const float* values, const uint64_t* scores = nullptr) {
  const size_t floats = values != nullptr ? table.dim + table.state_floats : 0;
  std::string packed;
  std::vector<char> weights(WeightBytes(table.precision, table.dim));
  const uint32_t weight_bytes = PackedWeightBytes(table.precision, table.dim);
  for (size_t begin = 0; begin < ids.size(); begin += kRowsPerBlock) {
    const size_t n = std::min(kRowsPerBlock, ids.size() - begin);
    Encoder head;
    head.U32(table_index);
    head.U32(static_cast<uint32_t>(n));
    absl::string_view rows(reinterpret_cast<const char*>(values + begin * floats), n * floats * sizeof(float));
    if (floats > 0 && table.precision != RowPrecision::kFp32) {
      packed.resize(n * table.row_bytes());
      char* out = packed.data();
      for (size_t i = 0; i < n; ++i) {
        const float* row = values + (begin + i) * floats;
        if (!EncodeWeights(table.precision, row, table.dim, /*seed=*/0, weights.data())) {
          return absl::InvalidArgumentError(absl::StrCat("row ", ids[begin + i], " of table ", table.name,
                                                         " does not fit ", RowPrecisionName(table.precision)));
        }
        std::memcpy(out, weights.data(), weight_bytes);
        std::memcpy(out + weight_bytes, row + table.dim, 4ull * table.state_floats);
        out += table.row_bytes();
      }
      rows = packed;
    }
    // The ids (and fp32 values) go to the file straight from the caller's arrays.
    HYREC_RETURN_IF_ERROR(w->AddParts(
        type, {head.str(), absl::string_view(reinterpret_cast<const char*>(ids.data() + begin), n * sizeof(uint64_t)),
               scores != nullptr ? absl::string_view(reinterpret_cast<const char*>(scores + begin), n * 8)
                                 : absl::string_view(),
               rows}));
  }
  return absl::OkStatus();
}

absl::Status AddStoreBlock(BlockWriter* w, int shard, int num_shards, uint32_t stripes, size_t tables,
                           uint64_t delta_sequence) {
  Encoder e;
  e.U32(static_cast<uint32_t>(shard));
  e.U32(static_cast<uint32_t>(num_shards));
  e.U32(stripes);
  e.U32(static_cast<uint32_t>(tables));
  e.U64(delta_sequence);
  return w->Add(kStoreBlock, e.str());
}

// What the store and table blocks of a shard-like file declare.
struct ShardFileHeader {
  uint32_t num_stripes = 0;
  uint64_t delta_sequence = 0;
  std::vector<TableHeader> tables;
};

// Reads one shard-like file block by block: its tables, rows and the rest, checked (against its
// manifest entry too, when given).
class ShardFileReader {
 public:
  struct Handlers {
    // Once, when every table is declared: before the first block of another kind.
    std::function<absl::Status(const ShardFileHeader&)> tables;
    std::function<absl::Status(uint32_t table, absl::Span<const uint64_t> ids, absl::Span<const float> values)> rows;
    // Rows with their eviction scores; without this handler, `rows` gets them without.
    std::function<absl::Status(uint32_t table, absl::Span<const uint64_t> ids, absl::Span<const float> values,
                               absl::Span<const uint64_t> scores)>
        scored_rows;
    // A table's eviction policy and data time, before its rows.
    std::function<absl::Status(uint32_t table, const std::string& policy, uint64_t data_time,
                               std::vector<uint64_t>&& lfu_uses)>
        policy;
    std::function<absl::Status(uint32_t table, absl::Span<const uint64_t> ids)> tombstones;
    std::function<void(StoreSnapshot::Sketch&&)> sketch;
    std::function<void(std::vector<uint64_t>&&)> rng;
    std::function<void(StoreSnapshot::Dedup&&)> dedup;
  };

  static absl::Status Read(Env* env, const std::string& path, FileKind kind, const FileEntry* expect, const Handlers& h,
                           ShardFileHeader* header) {
    HYREC_ASSIGN_OR_RETURN(auto r, BlockReader::Open(env, path, kind, expect));
    ShardFileReader reader(path, h, header);
    BlockPrefetcher blocks(std::move(r));
    for (;;) {
      const Block* block = nullptr;
      HYREC_ASSIGN_OR_RETURN(const bool more, blocks.Next(&block));
      if (!more) break;
      HYREC_RETURN_IF_ERROR(reader.Take(*block));
    }
    if (!reader.has_store_) return absl::DataLossError(absl::StrCat(path, ": no store block"));
    return reader.EndOfTables();
  }

 private:
  ShardFileReader(const std::string& path, const Handlers& h, ShardFileHeader* header)
      : path_(path), h_(h), header_(header), tables_(&header->tables) {}

  // One block, in file order.
  absl::Status Take(const Block& b) {
    Decoder d(b.payload);
    if (!has_store_ && b.type != kStoreBlock) return Bad(b, "the first block is not the store block");
    if (b.type != kStoreBlock && b.type != kTableBlock) HYREC_RETURN_IF_ERROR(EndOfTables());
    switch (b.type) {
      case kStoreBlock:
        return StoreBlock(b, d);
      case kTableBlock:
        return TableBlock(b, d);
      case kPolicyBlock:
        return PolicyBlock(b, d);
      case kRowsBlock:
      case kScoredBlock:
      case kTombBlock:
        return RowsBlock(b, d);
      case kSketchBlock:
        return SketchBlock(b, d);
      case kRngBlock:
        return RngBlock(b, d);
      case kDedupBlock:
        return DedupBlock(b, d);
      default:
        return Bad(b, absl::StrCat("unknown block type ", b.type));
    }
  }

  absl::Status Bad(const Block& b, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(path_, ": offset ", b.offset, ": ", what));
  }

  // Once every table is declared (before the first block of another kind): the tables handler.
  absl::Status EndOfTables() {
    if (tables_done_) return absl::OkStatus();
    tables_done_ = true;
    if (tables_->size() != declared_tables_) return absl::DataLossError(absl::StrCat(path_, ": missing table blocks"));
    return h_.tables ? Annotate(h_.tables(*header_), path_) : absl::OkStatus();
  }

  absl::Status StoreBlock(const Block& b, Decoder& d) {
    if (has_store_) return Bad(b, "a second store block");
    has_store_ = true;
    d.U32();
    d.U32();
    header_->num_stripes = d.U32();
    declared_tables_ = d.U32();
    header_->delta_sequence = d.U64();
    if (!d.done() || declared_tables_ > kMaxTables) return Bad(b, "malformed store block");
    return absl::OkStatus();
  }

  absl::Status TableBlock(const Block& b, Decoder& d) {
    TableHeader t;
    t.name = d.Bytes();
    t.dim = d.U32();
    t.state_floats = d.U32();
    t.optimizer = d.Bytes();
    t.rows = d.U64();
    if (d.ok() && !d.done()) {
      auto precision = ParseRowPrecision(d.Bytes());
      if (!precision.ok()) return Bad(b, "a table block of an unknown row precision");
      t.precision = *precision;
    }
    if (!d.done() || t.dim == 0 || t.dim > kMaxDim || t.state_floats > 2 * kMaxDim + 1 || t.name.size() > 4096) {
      return Bad(b, "malformed table block");
    }
    if (tables_done_ || tables_->size() >= declared_tables_) {
      return Bad(b, "a table block beyond those the store block declares");
    }
    tables_->push_back(std::move(t));
    return absl::OkStatus();
  }

  absl::Status PolicyBlock(const Block& b, Decoder& d) {
    const uint32_t table = d.U32();
    const std::string policy = d.Bytes();
    const uint64_t data_time = d.U64();
    const uint32_t n = d.U32();
    if (!d.ok() || table >= tables_->size() || policy.size() > 16 || d.remaining() != n * 8ull) {
      return Bad(b, "malformed policy block");
    }
    std::vector<uint64_t> uses(n);
    d.Raw(uses.data(), n * 8ull);
    if (h_.policy) HYREC_RETURN_IF_ERROR(Annotate(h_.policy(table, policy, data_time, std::move(uses)), path_));
    return absl::OkStatus();
  }

  // Rows, rows with scores, or tombstones of one table.
  absl::Status RowsBlock(const Block& b, Decoder& d) {
    const uint32_t table = d.U32();
    const uint32_t n = d.U32();
    if (!d.ok() || table >= tables_->size()) return Bad(b, "rows of an undeclared table");
    const TableHeader& t = (*tables_)[table];
    const uint64_t floats = b.type != kTombBlock ? static_cast<uint64_t>(t.dim) + t.state_floats : 0;
    const uint64_t row_bytes = b.type != kTombBlock ? t.row_bytes() : 0;
    const uint64_t score_bytes = b.type == kScoredBlock ? 8 : 0;
    if (d.remaining() != n * (8 + score_bytes + row_bytes)) {
      return Bad(b, "rows block length does not match its row count");
    }
    ids_.resize(n);  // Reused from block to block: no allocation per block.
    d.Raw(ids_.data(), n * 8ull);
    scores_.resize(b.type == kScoredBlock ? n : 0);
    d.Raw(scores_.data(), scores_.size() * 8);
    values_.resize(n * floats);
    if (t.precision == RowPrecision::kFp32) {
      d.Raw(values_.data(), values_.size() * 4);
    } else {
      weights_.resize(WeightBytes(t.precision, t.dim));
      for (uint64_t i = 0; i < n && floats > 0; ++i) {
        float* row = values_.data() + i * floats;
        d.Raw(weights_.data(), PackedWeightBytes(t.precision, t.dim));
        DecodeWeights(t.precision, weights_.data(), t.dim, row);
        d.Raw(row + t.dim, 4ull * t.state_floats);
      }
    }
    if (b.type == kScoredBlock && h_.scored_rows) return Annotate(h_.scored_rows(table, ids_, values_, scores_), path_);
    if (b.type != kTombBlock) return h_.rows ? Annotate(h_.rows(table, ids_, values_), path_) : absl::OkStatus();
    return h_.tombstones ? Annotate(h_.tombstones(table, ids_), path_) : absl::OkStatus();
  }

  absl::Status SketchBlock(const Block& b, Decoder& d) {
    StoreSnapshot::Sketch k;
    k.stripe = d.U32();
    k.table = d.U32();
    k.increments = d.U64();
    const std::string counters = d.Bytes();
    if (!d.done() || k.table >= tables_->size()) return Bad(b, "malformed sketch block");
    k.counters.assign(counters.begin(), counters.end());
    if (h_.sketch) h_.sketch(std::move(k));
    return absl::OkStatus();
  }

  absl::Status RngBlock(const Block& b, Decoder& d) {
    const uint32_t n = d.U32();
    if (!d.ok() || d.remaining() != n * 8ull) return Bad(b, "malformed stripe block");
    std::vector<uint64_t> rng(n);
    d.Raw(rng.data(), n * 8ull);
    if (h_.rng) h_.rng(std::move(rng));
    return absl::OkStatus();
  }

  absl::Status DedupBlock(const Block& b, Decoder& d) {
    StoreSnapshot::Dedup x;
    x.worker = d.U32();
    x.table = d.U32();
    x.highest = d.U64();
    x.seen.resize(16);
    d.Raw(x.seen.data(), 16 * 8);
    if (d.remaining() == 8) x.applied = d.U64();  // Absent from checkpoints written before the count.
    if (!d.done() || x.table >= tables_->size()) return Bad(b, "malformed dedup block");
    if (h_.dedup) h_.dedup(std::move(x));
    return absl::OkStatus();
  }

  const std::string& path_;
  const Handlers& h_;
  ShardFileHeader* header_;
  std::vector<TableHeader>* tables_;
  bool has_store_ = false;
  bool tables_done_ = false;
  uint32_t declared_tables_ = 0;
  std::vector<uint64_t> ids_;
  std::vector<uint64_t> scores_;
  std::vector<float> values_;
  std::vector<char> weights_;  // One row's weights, of a table whose rows are not fp32.
};

}  // namespace

std::string ShardFileName(CutKind kind, int shard, int num_shards) {
  return absl::StrFormat("%s-%d-of-%d.blk", kind == CutKind::kCheckpoint ? "ps" : "delta", shard, num_shards);
}

std::string ExportFileName(int shard, int num_shards) {
  return absl::StrFormat("rows-%d-of-%d.blk", shard, num_shards);
}

namespace {

// Writes a shard file: `head` as StoreSnapshot::head of SnapshotFrozen (everything but the rows)
// with `rows_per_table`, and the rows that `rows` hands to the function it is given, each call
// one block (at most kRowsPerBlock rows of one table, tables in order).
absl::StatusOr<ShardFileInfo> WriteShardFileFrom(
    Env* env, const std::string& dir, int shard, int num_shards, const std::vector<TableConfig>& tables,
    const StoreSnapshot& head, const std::vector<uint64_t>& rows_per_table,
    const std::function<absl::Status(const FrozenStore::RowPieceFn&)>& rows) {
  HYREC_ASSIGN_OR_RETURN(auto w,
                         BlockWriter::Create(env, JoinPath(dir, ShardFileName(CutKind::kCheckpoint, shard, num_shards)),
                                             FileKind::kPsShard));
  HYREC_RETURN_IF_ERROR(
      AddStoreBlock(w.get(), shard, num_shards, head.num_stripes, tables.size(), head.delta_sequence));
  ShardFileInfo info;
  std::vector<TableHeader> headers;
  for (size_t t = 0; t < tables.size(); ++t) {
    TableHeader h{tables[t].name,
                  static_cast<uint32_t>(tables[t].dim),
                  static_cast<uint32_t>(OptimizerStateFloats(tables[t].optimizer.kind, tables[t].dim)),
                  std::string(OptimizerName(tables[t].optimizer.kind)),
                  rows_per_table[t],
                  tables[t].precision};
    HYREC_RETURN_IF_ERROR(w->Add(kTableBlock, EncodeTable(h)));
    info.table_rows.push_back(h.rows);
    headers.push_back(std::move(h));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].eviction.policy == EvictionPolicy::kLru && head.tables[t].data_time == 0) continue;
    Encoder e;
    e.U32(static_cast<uint32_t>(t));
    e.Bytes(EvictionPolicyName(tables[t].eviction.policy));
    e.U64(head.tables[t].data_time);
    e.U32(static_cast<uint32_t>(head.tables[t].lfu_uses.size()));
    e.Raw(head.tables[t].lfu_uses.data(), head.tables[t].lfu_uses.size() * 8);
    HYREC_RETURN_IF_ERROR(w->Add(kPolicyBlock, e.str()));
  }
  std::vector<uint64_t> written(tables.size(), 0);
  HYREC_RETURN_IF_ERROR(rows([&](int t, const StoreSnapshot::Table& piece) -> absl::Status {
    const bool scored = piece.scores.size() == piece.ids.size() && tables[t].eviction.policy != EvictionPolicy::kLru;
    written[t] += piece.ids.size();
    return AddIdBlocks(w.get(), scored ? kScoredBlock : kRowsBlock, static_cast<uint32_t>(t), headers[t], piece.ids,
                       piece.values.data(), scored ? piece.scores.data() : nullptr);
  }));
  for (size_t t = 0; t < tables.size(); ++t) {
    if (written[t] != rows_per_table[t]) {
      return absl::InternalError(absl::StrCat("table '", tables[t].name, "': ", written[t], " rows written of ",
                                              rows_per_table[t], " declared"));
    }
  }
  for (const StoreSnapshot::Sketch& k : head.sketches) {
    Encoder e;
    e.U32(k.stripe);
    e.U32(k.table);
    e.U64(k.increments);
    e.Bytes(absl::string_view(reinterpret_cast<const char*>(k.counters.data()), k.counters.size()));
    HYREC_RETURN_IF_ERROR(w->Add(kSketchBlock, e.str()));
  }
  {
    Encoder e;
    e.U32(static_cast<uint32_t>(head.stripe_rng.size()));
    e.Raw(head.stripe_rng.data(), head.stripe_rng.size() * 8);
    HYREC_RETURN_IF_ERROR(w->Add(kRngBlock, e.str()));
  }
  for (const StoreSnapshot::Dedup& x : head.dedup) {
    Encoder e;
    e.U32(x.worker);
    e.U32(x.table);
    e.U64(x.highest);
    e.Raw(x.seen.data(), 16 * 8);
    e.U64(x.applied);
    HYREC_RETURN_IF_ERROR(w->Add(kDedupBlock, e.str()));
  }
  HYREC_ASSIGN_OR_RETURN(info.file, w->Finish());
  return info;
}

}  // namespace

absl::StatusOr<ShardFileInfo> WriteShardFile(Env* env, const std::string& dir, int shard, int num_shards,
                                             const std::vector<TableConfig>& tables, const StoreSnapshot& snap) {
  std::vector<uint64_t> rows_per_table;
  for (size_t t = 0; t < tables.size(); ++t) rows_per_table.push_back(snap.tables[t].ids.size());
  return WriteShardFileFrom(env, dir, shard, num_shards, tables, snap, rows_per_table,
                            [&](const FrozenStore::RowPieceFn& piece) -> absl::Status {
                              for (size_t t = 0; t < tables.size(); ++t) {
                                if (!snap.tables[t].ids.empty()) HYREC_RETURN_IF_ERROR(piece(t, snap.tables[t]));
                              }
                              return absl::OkStatus();
                            });
}

namespace {

// Writes the shard file of a store frozen by RunFrozen, from a child forked there: the same file
// as WriteShardFile of a Snapshot() taken then.
absl::StatusOr<ShardFileInfo> WriteFrozenShardFile(Env* env, const std::string& dir, int shard, int num_shards,
                                                   const std::vector<TableConfig>& tables, const FrozenStore& store) {
  StoreSnapshot head;
  std::vector<uint64_t> rows_per_table;
  store.FrozenHead(&head, &rows_per_table);
  return WriteShardFileFrom(
      env, dir, shard, num_shards, tables, head, rows_per_table,
      [&](const FrozenStore::RowPieceFn& piece) { return store.FrozenRows(kRowsPerBlock, piece); });
}

}  // namespace

absl::StatusOr<ShardFileInfo> WriteDeltaFile(Env* env, const std::string& dir, int shard, int num_shards,
                                             const std::vector<TableConfig>& tables, const StoreDelta& delta) {
  HYREC_ASSIGN_OR_RETURN(
      auto w,
      BlockWriter::Create(env, JoinPath(dir, ShardFileName(CutKind::kDelta, shard, num_shards)), FileKind::kDeltaRows));
  HYREC_RETURN_IF_ERROR(AddStoreBlock(w.get(), shard, num_shards, 0, tables.size(), delta.sequence));
  ShardFileInfo info;
  std::vector<TableHeader> headers;
  for (size_t t = 0; t < tables.size(); ++t) {
    TableHeader h{tables[t].name,
                  static_cast<uint32_t>(tables[t].dim),
                  0,
                  std::string(OptimizerName(tables[t].optimizer.kind)),
                  delta.tables[t].ids.size(),
                  tables[t].precision};
    HYREC_RETURN_IF_ERROR(w->Add(kTableBlock, EncodeTable(h)));
    info.table_rows.push_back(h.rows);
    headers.push_back(std::move(h));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const uint32_t index = static_cast<uint32_t>(t);
    HYREC_RETURN_IF_ERROR(AddIdBlocks(w.get(), kTombBlock, index, headers[t], delta.tables[t].tombstones, nullptr));
    HYREC_RETURN_IF_ERROR(
        AddIdBlocks(w.get(), kRowsBlock, index, headers[t], delta.tables[t].ids, delta.tables[t].weights.data()));
  }
  HYREC_ASSIGN_OR_RETURN(info.file, w->Finish());
  return info;
}

namespace {

// Restores one checkpoint shard file into `store`: the rows of the tables the job still has
// (each checked against its dim and optimizer), only those of shard `shard` of `num_shards` when
// the checkpoint had another layout, their scores where the table's eviction policy is the one
// they were saved under, and the counters under the store's table indexes.
class ShardFileRestore {
 public:
  ShardFileRestore(EmbeddingShardStore* store, bool same_layout, int shard, int num_shards)
      : store_(store), same_layout_(same_layout), shard_(shard), num_shards_(num_shards) {}

  absl::Status Run(Env* env, const std::string& path) {
    ShardFileReader::Handlers h;
    h.tables = [this](const ShardFileHeader& header) { return Tables(header); };
    h.policy = [this](uint32_t t, const std::string& policy, uint64_t data_time, std::vector<uint64_t>&& lfu_uses) {
      return Policy(t, policy, data_time, std::move(lfu_uses));
    };
    h.scored_rows = [this](uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values,
                           absl::Span<const uint64_t> scores) { return Rows(t, ids, values, scores); };
    h.rows = [this](uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values) {
      return Rows(t, ids, values, {});
    };
    // Counters name tables by the checkpoint's index: kept under the store's, dropped when the
    // job no longer has the table.
    h.sketch = [this](StoreSnapshot::Sketch&& k) {
      if (target_[k.table] < 0) return;
      k.table = static_cast<uint32_t>(target_[k.table]);
      counters_.sketches.push_back(std::move(k));
    };
    h.rng = [this](std::vector<uint64_t>&& rng) { counters_.stripe_rng = std::move(rng); };
    h.dedup = [this](StoreSnapshot::Dedup&& x) {
      if (target_[x.table] < 0) return;
      x.table = static_cast<uint32_t>(target_[x.table]);
      counters_.dedup.push_back(std::move(x));
    };
    ShardFileHeader header;
    HYREC_RETURN_IF_ERROR(ShardFileReader::Read(env, path, FileKind::kPsShard, nullptr, h, &header));
    return store_->RestoreCounters(counters_, /*exact=*/same_layout_);
  }

 private:
  absl::Status Tables(const ShardFileHeader& header) {
    for (const TableHeader& saved : header.tables) {
      floats_of_.push_back(saved.dim + saved.state_floats);
      absl::StatusOr<int> index = store_->TableIndex(saved.name);
      if (!index.ok()) {
        target_.push_back(-1);
        continue;
      }
      const TableConfig& c = store_->table(*index);
      if (static_cast<uint32_t>(c.dim) != saved.dim ||
          static_cast<uint32_t>(OptimizerStateFloats(c.optimizer.kind, c.dim)) != saved.state_floats ||
          OptimizerName(c.optimizer.kind) != saved.optimizer) {
        return absl::InvalidArgumentError(absl::StrCat("table '", saved.name, "' was saved with dim ", saved.dim,
                                                       " and optimizer ", saved.optimizer, "; the job has dim ", c.dim,
                                                       " and ", OptimizerName(c.optimizer.kind)));
      }
      target_.push_back(*index);
    }
    same_policy_.assign(header.tables.size(), 0);
    for (size_t t = 0; t < target_.size(); ++t) {
      same_policy_[t] = target_[t] >= 0 && store_->table(target_[t]).eviction.policy == EvictionPolicy::kLru;
    }
    counters_.num_stripes = header.num_stripes;
    counters_.delta_sequence = header.delta_sequence;
    return absl::OkStatus();
  }

  absl::Status Policy(uint32_t t, const std::string& policy, uint64_t data_time, std::vector<uint64_t>&& lfu_uses) {
    if (target_[t] < 0) return absl::OkStatus();
    store_->AdvanceDataTime(target_[t], data_time);
    same_policy_[t] = policy == EvictionPolicyName(store_->table(target_[t]).eviction.policy);
    if (same_policy_[t]) {
      counters_.tables.resize(store_->num_tables());
      counters_.tables[target_[t]].lfu_uses = std::move(lfu_uses);
    }
    return absl::OkStatus();
  }

  // Scores are kept only where the table's eviction policy is the one they were saved under.
  absl::Status Rows(uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values,
                    absl::Span<const uint64_t> scores) {
    if (target_[t] < 0) return absl::OkStatus();
    if (!same_policy_[t]) scores = {};
    if (same_layout_) return store_->RestoreRows(target_[t], ids, values, scores);
    const size_t floats = floats_of_[t];
    keep_ids_.clear();
    keep_values_.clear();
    keep_scores_.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ShardForId(ids[i], num_shards_) != shard_) continue;
      keep_ids_.push_back(ids[i]);
      keep_values_.insert(keep_values_.end(), values.begin() + i * floats, values.begin() + (i + 1) * floats);
      if (!scores.empty()) keep_scores_.push_back(scores[i]);
    }
    return store_->RestoreRows(target_[t], keep_ids_, keep_values_, keep_scores_);
  }

  EmbeddingShardStore* const store_;
  const bool same_layout_;
  const int shard_;
  const int num_shards_;
  std::vector<int> target_;  // Per checkpoint table: the store's index, or -1 (not in the job).
  std::vector<size_t> floats_of_;
  std::vector<uint8_t> same_policy_;  // Per checkpoint table: saved with the job's eviction policy.
  StoreSnapshot counters_;
  std::vector<uint64_t> keep_ids_;
  std::vector<float> keep_values_;
  std::vector<uint64_t> keep_scores_;
};

}  // namespace

absl::Status RestoreShard(Env* env, const std::string& dir, const CheckpointManifest& manifest, int shard,
                          int num_shards, EmbeddingShardStore* store) {
  const int saved_shards = static_cast<int>(manifest.num_shards);
  if (saved_shards < 1) return absl::DataLossError(absl::StrCat(dir, ": the manifest names no PS shards"));
  const bool same_layout = saved_shards == num_shards;
  std::vector<const FileEntry*> entries;
  for (int old = 0; old < saved_shards; ++old) {
    if (same_layout && old != shard) continue;  // Only its own file holds its rows.
    const std::string name = ShardFileName(CutKind::kCheckpoint, old, saved_shards);
    const FileEntry* entry = manifest.Find(name);
    if (entry == nullptr) return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no ", name));
    entries.push_back(entry);
  }
  // Each whole file is checked before any of it is restored (a corrupt checkpoint restores
  // nothing of it); the check of the next file runs while this one is restored.
  std::future<absl::Status> verified =
      std::async(std::launch::async, [env, &dir, entry = entries[0]] { return VerifyFileEntry(env, dir, *entry); });
  for (size_t i = 0; i < entries.size(); ++i) {
    HYREC_RETURN_IF_ERROR(verified.get());
    if (i + 1 < entries.size()) {
      verified = std::async(std::launch::async,
                            [env, &dir, entry = entries[i + 1]] { return VerifyFileEntry(env, dir, *entry); });
    }
    HYREC_RETURN_IF_ERROR(
        ShardFileRestore(store, same_layout, shard, num_shards).Run(env, JoinPath(dir, entries[i]->name)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<AppliedUpdates>> ReadAppliedUpdates(Env* env, const std::string& path,
                                                               const FileEntry* expect) {
  std::vector<std::string> names;
  std::vector<AppliedUpdates> out;
  ShardFileReader::Handlers h;
  h.tables = [&](const ShardFileHeader& header) -> absl::Status {
    for (const TableHeader& t : header.tables) names.push_back(t.name);
    return absl::OkStatus();
  };
  h.rows = [](uint32_t, absl::Span<const uint64_t>, absl::Span<const float>) { return absl::OkStatus(); };
  h.dedup = [&](StoreSnapshot::Dedup&& x) {
    out.push_back(AppliedUpdates{x.table < names.size() ? names[x.table] : std::to_string(x.table), x.worker, x.applied,
                                 x.highest});
  };
  ShardFileHeader header;
  HYREC_RETURN_IF_ERROR(ShardFileReader::Read(env, path, FileKind::kPsShard, expect, h, &header));
  return out;
}

absl::StatusOr<FileEntry> ExportShardFile(Env* env, const std::string& checkpoint_dir, const FileEntry& shard_file,
                                          const std::string& out_dir, const std::string& out_name) {
  HYREC_ASSIGN_OR_RETURN(auto w, BlockWriter::Create(env, JoinPath(out_dir, out_name), FileKind::kExportRows));
  std::vector<TableHeader> tables;    // The checkpoint's.
  std::vector<TableHeader> exported;  // The same, without optimizer state.
  std::vector<float> weights;
  ShardFileReader::Handlers h;
  h.tables = [&](const ShardFileHeader& header) -> absl::Status {
    tables = header.tables;
    HYREC_RETURN_IF_ERROR(AddStoreBlock(w.get(), 0, 1, 0, tables.size(), header.delta_sequence));
    for (TableHeader t : tables) {
      t.state_floats = 0;
      HYREC_RETURN_IF_ERROR(w->Add(kTableBlock, EncodeTable(t)));
      exported.push_back(std::move(t));
    }
    return absl::OkStatus();
  };
  h.rows = [&](uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values) -> absl::Status {
    const size_t dim = tables[t].dim;
    const size_t floats = dim + tables[t].state_floats;
    weights.resize(ids.size() * dim);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::copy_n(values.begin() + i * floats, dim, weights.begin() + i * dim);
    }
    return AddIdBlocks(w.get(), kRowsBlock, t, exported[t], std::vector<uint64_t>(ids.begin(), ids.end()),
                       weights.data());
  };
  ShardFileHeader header;
  HYREC_RETURN_IF_ERROR(ShardFileReader::Read(env, JoinPath(checkpoint_dir, shard_file.name), FileKind::kPsShard,
                                              &shard_file, h, &header));
  return w->Finish();
}

absl::Status ReadRowsFile(Env* env, const std::string& path, FileKind kind, const FileEntry* expect,
                          const std::function<absl::Status(ExportedTable&)>& table) {
  ShardFileHeader header;
  const std::vector<TableHeader>& tables = header.tables;
  ShardFileReader::Handlers h;
  ExportedTable current;
  auto emit = [&](uint32_t t) {
    current.name = tables[t].name;
    current.dim = static_cast<int>(tables[t].dim);
    return table(current);
  };
  h.rows = [&](uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values) -> absl::Status {
    if (tables[t].state_floats != 0) return absl::DataLossError("exported rows carry optimizer state");
    current = ExportedTable();
    current.ids.assign(ids.begin(), ids.end());
    current.weights.assign(values.begin(), values.end());
    return emit(t);
  };
  h.tombstones = [&](uint32_t t, absl::Span<const uint64_t> ids) -> absl::Status {
    current = ExportedTable();
    current.tombstones.assign(ids.begin(), ids.end());
    return emit(t);
  };
  return ShardFileReader::Read(env, path, kind, expect, h, &header);
}

// ---- ShardCheckpointer ----

namespace {

// Exit codes of a cut's child besides 0 (it wrote its result to the pipe, ok or not).
constexpr int kChildOrphaned = 3;
constexpr int kChildPipeFailed = 4;

// A child's result on its pipe: u32 status code; ok: bytes file name, u64 length, u32 crc32,
// u32 n, n x u64 rows; otherwise bytes message.
std::string EncodeChildResult(const absl::StatusOr<ShardFileInfo>& r) {
  Encoder e;
  e.U32(static_cast<uint32_t>(r.status().code()));
  if (!r.ok()) {
    e.Bytes(r.status().message());
    return std::move(e.str());
  }
  e.Bytes(r->file.name);
  e.U64(r->file.length);
  e.U32(r->file.crc32);
  e.U32(static_cast<uint32_t>(r->table_rows.size()));
  for (uint64_t rows : r->table_rows) e.U64(rows);
  return std::move(e.str());
}

absl::StatusOr<ShardFileInfo> DecodeChildResult(absl::string_view bytes) {
  Decoder d(bytes);
  const uint32_t code = d.U32();
  if (d.ok() && code != 0) {
    std::string message = d.Bytes();
    if (d.ok()) return absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  ShardFileInfo info;
  info.file.name = d.Bytes();
  info.file.length = d.U64();
  info.file.crc32 = d.U32();
  const uint32_t n = d.U32();
  for (uint32_t i = 0; d.ok() && i < n; ++i) info.table_rows.push_back(d.U64());
  if (!d.ok()) return absl::InternalError(absl::StrCat("malformed result (", bytes.size(), " bytes)"));
  return info;
}

// The child forked in RunFrozen: writes the shard file from the frozen store, its result to
// `fd`, and exits without returning (no destructor or atexit handler of the parent's runs).
[[noreturn]] void RunCutChild(int fd, pid_t parent, Env* env, const std::string& dir, int shard, int num_shards,
                              const std::vector<TableConfig>& tables, const FrozenStore& store) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // A child never outlives the shard it writes for.
  if (::getppid() != parent) ::_exit(kChildOrphaned);
  const std::string result = EncodeChildResult(WriteFrozenShardFile(env, dir, shard, num_shards, tables, store));
  for (size_t done = 0; done < result.size();) {
    const ssize_t n = ::write(fd, result.data() + done, result.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(kChildPipeFailed);
    done += static_cast<size_t>(n);
  }
  ::_exit(0);
}

// Reads a cut child's result from `fd` (to its end) and reaps the child.
absl::StatusOr<ShardFileInfo> AwaitCutChild(pid_t pid, int fd, int shard) {
  std::string bytes;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      bytes.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  int status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(pid, &status, 0);
  } while (reaped < 0 && errno == EINTR);
  const std::string who = absl::StrCat("the process writing shard ", shard, "'s checkpoint (pid ", pid, ")");
  if (reaped < 0) return absl::InternalError(absl::StrCat("waitpid of ", who, ": ", std::strerror(errno)));
  if (WIFSIGNALED(status)) {
    return absl::UnavailableError(
        absl::StrCat(who, " was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(who, " exited with status ", WEXITSTATUS(status)));
  }
  absl::StatusOr<ShardFileInfo> r = DecodeChildResult(bytes);
  if (!r.ok() && r.status().code() == absl::StatusCode::kInternal && bytes.size() < 4) {
    return absl::InternalError(absl::StrCat(who, " wrote no result"));
  }
  return r;
}

}  // namespace

ShardCheckpointer::ShardCheckpointer(std::shared_ptr<EmbeddingShardStore> store, int shard, int num_shards, Env* env,
                                     ShardCheckpointerOptions options)
    : store_(std::move(store)), shard_(shard), num_shards_(num_shards), env_(env), options_(options) {}

ShardCheckpointer::~ShardCheckpointer() { Join(); }

void ShardCheckpointer::Join() {
  if (writer_.joinable()) writer_.join();
}

absl::Status ShardCheckpointer::Begin(const std::string& dir, uint64_t id, CutKind kind) {
  std::shared_ptr<StoreSnapshot> spare;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id == id_ && id != 0) return absl::OkStatus();  // A retried Begin of this cut.
    if (running_) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", shard_, " is still writing cut ", id_, "; await it before cut ", id));
    }
    spare = std::move(spare_);
  }
  Join();
  HYREC_RETURN_IF_ERROR(env_->CreateDirs(dir));
  if (kind == CutKind::kCheckpoint) {
    const bool large = options_.fork_min_bytes == 0 || store_->Stats().bytes >= options_.fork_min_bytes;
    if (large && env_ == Env::Default() && FrozenAccess(store_.get()) != nullptr) return BeginForked(dir, id);
    // The cut itself, on the caller's thread: what the store holds now.
    std::shared_ptr<StoreSnapshot> snapshot = spare != nullptr ? std::move(spare) : std::make_shared<StoreSnapshot>();
    store_->SnapshotInto(snapshot.get());
    HYREC_RETURN_IF_ERROR(Annotate(snapshot->status, absl::StrCat("shard ", shard_, " cut ", id)));
    Started(id, /*forked=*/false, [this, dir, snapshot, large]() {
      absl::StatusOr<ShardFileInfo> r = WriteShardFile(env_, dir, shard_, num_shards_, store_->tables(), *snapshot);
      if (!large) {
        std::lock_guard<std::mutex> lock(mu_);
        spare_ = snapshot;
      }
      return r;
    });
    return absl::OkStatus();
  }
  HYREC_ASSIGN_OR_RETURN(StoreDelta d, store_->TakeDelta());
  auto delta = std::make_shared<StoreDelta>(std::move(d));
  Started(id, /*forked=*/false,
          [this, dir, delta]() { return WriteDeltaFile(env_, dir, shard_, num_shards_, store_->tables(), *delta); });
  return absl::OkStatus();
}

absl::Status ShardCheckpointer::BeginForked(const std::string& dir, uint64_t id) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("shard ", shard_, " cut ", id, ": pipe: ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  pid_t pid = -1;
  int fork_errno = 0;
  FrozenStore& frozen = *FrozenAccess(store_.get());
  frozen.RunFrozen([&] {
    pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      RunCutChild(fds[1], parent, env_, dir, shard_, num_shards_, store_->tables(), frozen);
    }
    fork_errno = errno;
  });
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return absl::UnavailableError(
        absl::StrCat("shard ", shard_, " cut ", id, ": fork: ", std::strerror(fork_errno), "; no cut taken"));
  }
  Started(id, /*forked=*/true, [this, pid, fd = fds[0], held = &frozen]() {
    absl::StatusOr<ShardFileInfo> info = AwaitCutChild(pid, fd, shard_);
    held->ChildDone();
    return info;
  });
  return absl::OkStatus();
}

void ShardCheckpointer::Started(uint64_t id, bool forked, std::function<absl::StatusOr<ShardFileInfo>()> write) {
  std::lock_guard<std::mutex> lock(mu_);
  id_ = id;
  running_ = true;
  forked_ = forked;
  result_ = absl::UnavailableError("being written");
  writer_ = std::thread([this, id, write = std::move(write)] {
    absl::StatusOr<ShardFileInfo> r = write();
    std::lock_guard<std::mutex> lock(mu_);
    if (id_ == id) result_ = std::move(r);
    running_ = false;
    done_cv_.notify_all();
  });
}

bool ShardCheckpointer::last_forked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return forked_;
}

absl::StatusOr<ShardFileInfo> ShardCheckpointer::Await(uint64_t id, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (id != id_)
    return absl::NotFoundError(absl::StrCat("shard ", shard_, " has no cut ", id, " (its last is ", id_, ")"));
  if (!done_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return !running_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", shard_, " still writing cut ", id, " after ", absl::FormatDuration(timeout)));
  }
  return result_;
}

}  // namespace hyrec::embedding_ps
