#include "hyrec/embedding_ps/shard_checkpoint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::embedding_ps {
namespace {

// Block types of shard files.
constexpr uint32_t kStoreBlock = 10;   // u32 shard, u32 num_shards, u32 num_stripes, u32 tables, u64 delta seq
constexpr uint32_t kTableBlock = 11;   // bytes name, u32 dim, u32 state floats, bytes optimizer, u64 rows
constexpr uint32_t kRowsBlock = 12;    // u32 table, u32 n, n x u64 id, n x floats
constexpr uint32_t kSketchBlock = 13;  // u32 stripe, u32 table, u64 increments, bytes counters
constexpr uint32_t kRngBlock = 14;     // u32 n, n x u64
constexpr uint32_t kDedupBlock = 15;   // u32 worker, u32 table, u64 highest, 16 x u64
constexpr uint32_t kTombBlock = 16;    // u32 table, u32 n, n x u64 id
constexpr uint32_t kPolicyBlock = 17;  // u32 table, bytes eviction policy, u64 data time, u32 n, n x u64 lfu uses
constexpr uint32_t kScoredBlock = 18;  // u32 table, u32 n, n x u64 id, n x u64 score, n x floats

constexpr size_t kRowsPerBlock = 1 << 16;
constexpr uint32_t kMaxTables = 256;
constexpr uint32_t kMaxDim = 1 << 16;

struct TableHeader {
  std::string name;
  uint32_t dim = 0;
  uint32_t state_floats = 0;
  std::string optimizer;
  uint64_t rows = 0;
};

std::string EncodeTable(const TableHeader& t) {
  Encoder e;
  e.Bytes(t.name);
  e.U32(t.dim);
  e.U32(t.state_floats);
  e.Bytes(t.optimizer);
  e.U64(t.rows);
  return std::move(e.str());
}

// Appends ids of one table in blocks of at most kRowsPerBlock rows, each id followed in its block
// by `floats_per_row` values (rows blocks) or by none (tombstone blocks: values null, 0 floats);
// in scored blocks, the ids' `scores` come between the ids and the values.
absl::Status AddIdBlocks(BlockWriter* w, uint32_t type, uint32_t table, const std::vector<uint64_t>& ids,
                         const float* values, size_t floats_per_row, const uint64_t* scores = nullptr) {
  for (size_t begin = 0; begin < ids.size(); begin += kRowsPerBlock) {
    const size_t n = std::min(kRowsPerBlock, ids.size() - begin);
    Encoder head;
    head.U32(table);
    head.U32(static_cast<uint32_t>(n));
    // The ids and values go to the file straight from the caller's arrays.
    HYREC_RETURN_IF_ERROR(w->AddParts(
        type, {head.str(), absl::string_view(reinterpret_cast<const char*>(ids.data() + begin), n * sizeof(uint64_t)),
               scores != nullptr ? absl::string_view(reinterpret_cast<const char*>(scores + begin), n * 8)
                                 : absl::string_view(),
               absl::string_view(reinterpret_cast<const char*>(values + begin * floats_per_row),
                                 floats_per_row > 0 ? n * floats_per_row * sizeof(float) : 0)}));
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
    std::vector<TableHeader>* tables = &header->tables;
    bool has_store = false;
    bool tables_done = false;
    uint32_t declared_tables = 0;
    std::vector<uint64_t> ids;
    std::vector<uint64_t> scores;
    std::vector<float> values;
    auto end_of_tables = [&]() -> absl::Status {
      if (tables_done) return absl::OkStatus();
      tables_done = true;
      if (tables->size() != declared_tables) return absl::DataLossError(absl::StrCat(path, ": missing table blocks"));
      return h.tables ? Annotate(h.tables(*header), path) : absl::OkStatus();
    };
    Block b;
    for (;;) {
      HYREC_ASSIGN_OR_RETURN(const bool more, r->Next(&b));
      if (!more) break;
      Decoder d(b.payload);
      auto bad = [&](absl::string_view what) {
        return absl::DataLossError(absl::StrCat(path, ": offset ", b.offset, ": ", what));
      };
      if (!has_store && b.type != kStoreBlock) return bad("the first block is not the store block");
      if (b.type != kStoreBlock && b.type != kTableBlock) HYREC_RETURN_IF_ERROR(end_of_tables());
      switch (b.type) {
        case kStoreBlock: {
          if (has_store) return bad("a second store block");
          has_store = true;
          d.U32();
          d.U32();
          header->num_stripes = d.U32();
          declared_tables = d.U32();
          header->delta_sequence = d.U64();
          if (!d.done() || declared_tables > kMaxTables) return bad("malformed store block");
          break;
        }
        case kTableBlock: {
          TableHeader t;
          t.name = d.Bytes();
          t.dim = d.U32();
          t.state_floats = d.U32();
          t.optimizer = d.Bytes();
          t.rows = d.U64();
          if (!d.done() || t.dim == 0 || t.dim > kMaxDim || t.state_floats > 2 * kMaxDim + 1 || t.name.size() > 4096) {
            return bad("malformed table block");
          }
          if (tables_done || tables->size() >= declared_tables) {
            return bad("a table block beyond those the store block declares");
          }
          tables->push_back(std::move(t));
          break;
        }
        case kPolicyBlock: {
          const uint32_t table = d.U32();
          const std::string policy = d.Bytes();
          const uint64_t data_time = d.U64();
          const uint32_t n = d.U32();
          if (!d.ok() || table >= tables->size() || policy.size() > 16 || d.remaining() != n * 8ull) {
            return bad("malformed policy block");
          }
          std::vector<uint64_t> uses(n);
          d.Raw(uses.data(), n * 8ull);
          if (h.policy) HYREC_RETURN_IF_ERROR(Annotate(h.policy(table, policy, data_time, std::move(uses)), path));
          break;
        }
        case kRowsBlock:
        case kScoredBlock:
        case kTombBlock: {
          const uint32_t table = d.U32();
          const uint32_t n = d.U32();
          if (!d.ok() || table >= tables->size()) return bad("rows of an undeclared table");
          const TableHeader& t = (*tables)[table];
          const uint64_t floats = b.type != kTombBlock ? static_cast<uint64_t>(t.dim) + t.state_floats : 0;
          const uint64_t score_bytes = b.type == kScoredBlock ? 8 : 0;
          if (d.remaining() != n * (8 + score_bytes + 4 * floats)) {
            return bad("rows block length does not match its row count");
          }
          ids.resize(n);  // Reused from block to block: no allocation per block.
          d.Raw(ids.data(), n * 8ull);
          scores.resize(b.type == kScoredBlock ? n : 0);
          d.Raw(scores.data(), scores.size() * 8);
          values.resize(n * floats);
          d.Raw(values.data(), values.size() * 4);
          if (b.type == kScoredBlock && h.scored_rows) {
            HYREC_RETURN_IF_ERROR(Annotate(h.scored_rows(table, ids, values, scores), path));
          } else if (b.type != kTombBlock) {
            if (h.rows) HYREC_RETURN_IF_ERROR(Annotate(h.rows(table, ids, values), path));
          } else if (h.tombstones) {
            HYREC_RETURN_IF_ERROR(Annotate(h.tombstones(table, ids), path));
          }
          break;
        }
        case kSketchBlock: {
          StoreSnapshot::Sketch k;
          k.stripe = d.U32();
          k.table = d.U32();
          k.increments = d.U64();
          const std::string counters = d.Bytes();
          if (!d.done() || k.table >= tables->size()) return bad("malformed sketch block");
          k.counters.assign(counters.begin(), counters.end());
          if (h.sketch) h.sketch(std::move(k));
          break;
        }
        case kRngBlock: {
          const uint32_t n = d.U32();
          if (!d.ok() || d.remaining() != n * 8ull) return bad("malformed stripe block");
          std::vector<uint64_t> rng(n);
          d.Raw(rng.data(), n * 8ull);
          if (h.rng) h.rng(std::move(rng));
          break;
        }
        case kDedupBlock: {
          StoreSnapshot::Dedup x;
          x.worker = d.U32();
          x.table = d.U32();
          x.highest = d.U64();
          x.seen.resize(16);
          d.Raw(x.seen.data(), 16 * 8);
          if (d.remaining() == 8) x.applied = d.U64();  // Absent from checkpoints written before the count.
          if (!d.done() || x.table >= tables->size()) return bad("malformed dedup block");
          if (h.dedup) h.dedup(std::move(x));
          break;
        }
        default:
          return bad(absl::StrCat("unknown block type ", b.type));
      }
    }
    if (!has_store) return absl::DataLossError(absl::StrCat(path, ": no store block"));
    return end_of_tables();
  }
};

}  // namespace

std::string ShardFileName(CutKind kind, int shard, int num_shards) {
  return absl::StrFormat("%s-%d-of-%d.blk", kind == CutKind::kCheckpoint ? "ps" : "delta", shard, num_shards);
}

std::string ExportFileName(int shard, int num_shards) {
  return absl::StrFormat("rows-%d-of-%d.blk", shard, num_shards);
}

absl::StatusOr<ShardFileInfo> WriteShardFile(Env* env, const std::string& dir, int shard, int num_shards,
                                             const std::vector<TableConfig>& tables, const StoreSnapshot& snap) {
  HYREC_ASSIGN_OR_RETURN(auto w,
                         BlockWriter::Create(env, JoinPath(dir, ShardFileName(CutKind::kCheckpoint, shard, num_shards)),
                                             FileKind::kPsShard));
  HYREC_RETURN_IF_ERROR(
      AddStoreBlock(w.get(), shard, num_shards, snap.num_stripes, tables.size(), snap.delta_sequence));
  ShardFileInfo info;
  for (size_t t = 0; t < tables.size(); ++t) {
    TableHeader h{tables[t].name, static_cast<uint32_t>(tables[t].dim),
                  static_cast<uint32_t>(OptimizerStateFloats(tables[t].optimizer.kind, tables[t].dim)),
                  std::string(OptimizerName(tables[t].optimizer.kind)), snap.tables[t].ids.size()};
    HYREC_RETURN_IF_ERROR(w->Add(kTableBlock, EncodeTable(h)));
    info.table_rows.push_back(h.rows);
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].eviction.policy == EvictionPolicy::kLru && snap.tables[t].data_time == 0) continue;
    Encoder e;
    e.U32(static_cast<uint32_t>(t));
    e.Bytes(EvictionPolicyName(tables[t].eviction.policy));
    e.U64(snap.tables[t].data_time);
    e.U32(static_cast<uint32_t>(snap.tables[t].lfu_uses.size()));
    e.Raw(snap.tables[t].lfu_uses.data(), snap.tables[t].lfu_uses.size() * 8);
    HYREC_RETURN_IF_ERROR(w->Add(kPolicyBlock, e.str()));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const StoreSnapshot::Table& table = snap.tables[t];
    const size_t floats = tables[t].dim + OptimizerStateFloats(tables[t].optimizer.kind, tables[t].dim);
    const bool scored = table.scores.size() == table.ids.size() && !table.ids.empty() &&
                        tables[t].eviction.policy != EvictionPolicy::kLru;
    HYREC_RETURN_IF_ERROR(AddIdBlocks(w.get(), scored ? kScoredBlock : kRowsBlock, static_cast<uint32_t>(t), table.ids,
                                      table.values.data(), floats, scored ? table.scores.data() : nullptr));
  }
  for (const StoreSnapshot::Sketch& k : snap.sketches) {
    Encoder e;
    e.U32(k.stripe);
    e.U32(k.table);
    e.U64(k.increments);
    e.Bytes(absl::string_view(reinterpret_cast<const char*>(k.counters.data()), k.counters.size()));
    HYREC_RETURN_IF_ERROR(w->Add(kSketchBlock, e.str()));
  }
  {
    Encoder e;
    e.U32(static_cast<uint32_t>(snap.stripe_rng.size()));
    e.Raw(snap.stripe_rng.data(), snap.stripe_rng.size() * 8);
    HYREC_RETURN_IF_ERROR(w->Add(kRngBlock, e.str()));
  }
  for (const StoreSnapshot::Dedup& x : snap.dedup) {
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

absl::StatusOr<ShardFileInfo> WriteDeltaFile(Env* env, const std::string& dir, int shard, int num_shards,
                                             const std::vector<TableConfig>& tables, const StoreDelta& delta) {
  HYREC_ASSIGN_OR_RETURN(
      auto w,
      BlockWriter::Create(env, JoinPath(dir, ShardFileName(CutKind::kDelta, shard, num_shards)), FileKind::kDeltaRows));
  HYREC_RETURN_IF_ERROR(AddStoreBlock(w.get(), shard, num_shards, 0, tables.size(), delta.sequence));
  ShardFileInfo info;
  for (size_t t = 0; t < tables.size(); ++t) {
    TableHeader h{tables[t].name, static_cast<uint32_t>(tables[t].dim), 0,
                  std::string(OptimizerName(tables[t].optimizer.kind)), delta.tables[t].ids.size()};
    HYREC_RETURN_IF_ERROR(w->Add(kTableBlock, EncodeTable(h)));
    info.table_rows.push_back(h.rows);
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    HYREC_RETURN_IF_ERROR(
        AddIdBlocks(w.get(), kTombBlock, static_cast<uint32_t>(t), delta.tables[t].tombstones, nullptr, 0));
    HYREC_RETURN_IF_ERROR(AddIdBlocks(w.get(), kRowsBlock, static_cast<uint32_t>(t), delta.tables[t].ids,
                                      delta.tables[t].weights.data(), tables[t].dim));
  }
  HYREC_ASSIGN_OR_RETURN(info.file, w->Finish());
  return info;
}

absl::Status RestoreShard(Env* env, const std::string& dir, const CheckpointManifest& manifest, int shard,
                          int num_shards, EmbeddingShardStore* store) {
  const int saved_shards = static_cast<int>(manifest.num_shards);
  if (saved_shards < 1) return absl::DataLossError(absl::StrCat(dir, ": the manifest names no PS shards"));
  const bool same_layout = saved_shards == num_shards;
  for (int old = 0; old < saved_shards; ++old) {
    if (same_layout && old != shard) continue;  // Only its own file holds its rows.
    const std::string name = ShardFileName(CutKind::kCheckpoint, old, saved_shards);
    const FileEntry* entry = manifest.Find(name);
    if (entry == nullptr) return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no ", name));
    // The whole file first: a corrupt checkpoint restores nothing of it.
    HYREC_RETURN_IF_ERROR(VerifyFileEntry(env, dir, *entry));
    std::vector<int> target;  // Per checkpoint table: the store's index, or -1 (not in the job).
    std::vector<size_t> floats_of;
    StoreSnapshot counters;
    std::vector<uint64_t> keep_ids;
    std::vector<float> keep_values;
    std::vector<uint64_t> keep_scores;
    std::vector<uint8_t> same_policy;  // Per checkpoint table: saved with the job's eviction policy.
    ShardFileReader::Handlers h;
    h.tables = [&](const ShardFileHeader& header) -> absl::Status {
      for (const TableHeader& saved : header.tables) {
        floats_of.push_back(saved.dim + saved.state_floats);
        absl::StatusOr<int> index = store->TableIndex(saved.name);
        if (!index.ok()) {
          target.push_back(-1);
          continue;
        }
        const TableConfig& c = store->table(*index);
        if (static_cast<uint32_t>(c.dim) != saved.dim ||
            static_cast<uint32_t>(OptimizerStateFloats(c.optimizer.kind, c.dim)) != saved.state_floats ||
            OptimizerName(c.optimizer.kind) != saved.optimizer) {
          return absl::InvalidArgumentError(absl::StrCat("table '", saved.name, "' was saved with dim ", saved.dim,
                                                         " and optimizer ", saved.optimizer, "; the job has dim ",
                                                         c.dim, " and ", OptimizerName(c.optimizer.kind)));
        }
        target.push_back(*index);
      }
      same_policy.assign(header.tables.size(), 0);
      for (size_t t = 0; t < target.size(); ++t) {
        same_policy[t] = target[t] >= 0 && store->table(target[t]).eviction.policy == EvictionPolicy::kLru;
      }
      counters.num_stripes = header.num_stripes;
      counters.delta_sequence = header.delta_sequence;
      return absl::OkStatus();
    };
    h.policy = [&](uint32_t t, const std::string& policy, uint64_t data_time,
                   std::vector<uint64_t>&& lfu_uses) -> absl::Status {
      if (target[t] < 0) return absl::OkStatus();
      store->AdvanceDataTime(target[t], data_time);
      same_policy[t] = policy == EvictionPolicyName(store->table(target[t]).eviction.policy);
      if (same_policy[t]) {
        counters.tables.resize(store->num_tables());
        counters.tables[target[t]].lfu_uses = std::move(lfu_uses);
      }
      return absl::OkStatus();
    };
    // Scores are kept only where the table's eviction policy is the one they were saved under.
    h.scored_rows = [&](uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values,
                        absl::Span<const uint64_t> scores) -> absl::Status {
      if (target[t] < 0) return absl::OkStatus();
      if (!same_policy[t]) scores = {};
      if (same_layout) return store->RestoreRows(target[t], ids, values, scores);
      const size_t floats = floats_of[t];
      keep_ids.clear();
      keep_values.clear();
      keep_scores.clear();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ShardForId(ids[i], num_shards) != shard) continue;
        keep_ids.push_back(ids[i]);
        keep_values.insert(keep_values.end(), values.begin() + i * floats, values.begin() + (i + 1) * floats);
        if (!scores.empty()) keep_scores.push_back(scores[i]);
      }
      return store->RestoreRows(target[t], keep_ids, keep_values, keep_scores);
    };
    h.rows = [&](uint32_t t, absl::Span<const uint64_t> ids, absl::Span<const float> values) -> absl::Status {
      return h.scored_rows(t, ids, values, {});
    };
    // Counters name tables by the checkpoint's index: kept under the store's, dropped when the job
    // no longer has the table.
    h.sketch = [&](StoreSnapshot::Sketch&& k) {
      if (target[k.table] < 0) return;
      k.table = static_cast<uint32_t>(target[k.table]);
      counters.sketches.push_back(std::move(k));
    };
    h.rng = [&](std::vector<uint64_t>&& rng) { counters.stripe_rng = std::move(rng); };
    h.dedup = [&](StoreSnapshot::Dedup&& x) {
      if (target[x.table] < 0) return;
      x.table = static_cast<uint32_t>(target[x.table]);
      counters.dedup.push_back(std::move(x));
    };
    ShardFileHeader header;
    HYREC_RETURN_IF_ERROR(ShardFileReader::Read(env, JoinPath(dir, name), FileKind::kPsShard, nullptr, h, &header));
    HYREC_RETURN_IF_ERROR(store->RestoreCounters(counters, /*exact=*/same_layout));
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
  std::vector<TableHeader> tables;
  std::vector<float> weights;
  ShardFileReader::Handlers h;
  h.tables = [&](const ShardFileHeader& header) -> absl::Status {
    tables = header.tables;
    HYREC_RETURN_IF_ERROR(AddStoreBlock(w.get(), 0, 1, 0, tables.size(), header.delta_sequence));
    for (TableHeader t : tables) {
      t.state_floats = 0;
      HYREC_RETURN_IF_ERROR(w->Add(kTableBlock, EncodeTable(t)));
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
    return AddIdBlocks(w.get(), kRowsBlock, t, std::vector<uint64_t>(ids.begin(), ids.end()), weights.data(), dim);
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

ShardCheckpointer::ShardCheckpointer(std::shared_ptr<EmbeddingShardStore> store, int shard, int num_shards, Env* env)
    : store_(std::move(store)), shard_(shard), num_shards_(num_shards), env_(env) {}

ShardCheckpointer::~ShardCheckpointer() { Join(); }

void ShardCheckpointer::Join() {
  if (writer_.joinable()) writer_.join();
}

absl::Status ShardCheckpointer::Begin(const std::string& dir, uint64_t id, CutKind kind) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id == id_ && id != 0) return absl::OkStatus();  // A retried Begin of this cut.
    if (running_) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", shard_, " is still writing cut ", id_, "; await it before cut ", id));
    }
  }
  Join();
  HYREC_RETURN_IF_ERROR(env_->CreateDirs(dir));
  // The cut itself, on the caller's thread: what the store holds now.
  std::shared_ptr<StoreSnapshot> snapshot;
  std::shared_ptr<StoreDelta> delta;
  if (kind == CutKind::kCheckpoint) {
    snapshot = std::make_shared<StoreSnapshot>(store_->Snapshot());
  } else {
    HYREC_ASSIGN_OR_RETURN(StoreDelta d, store_->TakeDelta());
    delta = std::make_shared<StoreDelta>(std::move(d));
  }
  std::lock_guard<std::mutex> lock(mu_);
  id_ = id;
  running_ = true;
  result_ = absl::UnavailableError("being written");
  writer_ = std::thread([this, dir, id, snapshot, delta] {
    absl::StatusOr<ShardFileInfo> r = snapshot != nullptr
                                          ? WriteShardFile(env_, dir, shard_, num_shards_, store_->tables(), *snapshot)
                                          : WriteDeltaFile(env_, dir, shard_, num_shards_, store_->tables(), *delta);
    std::lock_guard<std::mutex> lock(mu_);
    if (id_ == id) result_ = std::move(r);
    running_ = false;
    done_cv_.notify_all();
  });
  return absl::OkStatus();
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
