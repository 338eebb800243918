// The two EmbeddingClient implementations share ShardedClient: deduplication, placement by
// ShardForId, reassembly. They differ only in how a set of per-shard requests is carried out.
#include "hyrec/embedding_ps/client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "embedding.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "hyrec/common/allocator.h"
#include "hyrec/common/finite.h"
#include "hyrec/common/fp16.h"
#include "hyrec/common/grpc_status.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "src/common/rpc.h"
#include "src/embedding_ps/wire.h"

namespace hyrec::embedding_ps {
namespace {

// The ids one shard must serve in one call, and where its rows go or its gradients come from
// (ids.size() * dim floats). For pre-grouped ids (the Sharded calls) these are ranges of the
// caller's own buffers, neither copied nor moved; for Lookup and Update, which deduplicate and
// place ids themselves, the part's own storage.
struct ShardPart {
  int shard = 0;
  absl::Span<const uint64_t> ids;
  absl::Span<float> out;          // Lookups: rows read.
  absl::Span<const float> grads;  // Updates: gradients to send.
  std::vector<uint64_t> own_ids;
  std::vector<float> own_values;
};

// One table's per-shard parts of a call.
struct TableCall {
  absl::string_view table;
  int dim = 0;
  std::vector<ShardPart> parts;
  uint64_t data_time = 0;  // Lookups: the batch's newest sample time (0: none).
};

class ShardedClient : public EmbeddingClient {
 public:
  ShardedClient(int num_shards, std::vector<std::pair<std::string, int>> tables)
      : num_shards_(num_shards), tables_(std::move(tables)) {}

  int num_shards() const override { return num_shards_; }

  absl::StatusOr<int> TableDim(absl::string_view table) const override {
    for (const auto& [name, dim] : tables_) {
      if (name == table) return dim;
    }
    return absl::NotFoundError(absl::StrCat("unknown table '", table, "'"));
  }

  absl::Status Lookup(absl::string_view table, absl::Span<const uint64_t> ids, absl::Span<float> out) override {
    absl::StatusOr<int> dim_or = TableDim(table);
    if (!dim_or.ok()) return dim_or.status();
    const size_t dim = static_cast<size_t>(*dim_or);
    if (out.size() != ids.size() * dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("output holds ", out.size(), " floats, expected ", ids.size(), " ids x dim ", dim));
    }
    if (ids.empty()) return absl::OkStatus();
    std::vector<ShardPart> parts;
    std::vector<std::pair<uint32_t, uint32_t>> where;
    Partition(ids, &parts, &where);
    for (ShardPart& part : parts) {
      part.own_values.resize(part.ids.size() * dim);
      part.out = absl::MakeSpan(part.own_values);
    }
    TableCall call{table, static_cast<int>(dim), std::move(parts)};
    absl::Status status = LookupParts(absl::MakeSpan(&call, 1));
    if (!status.ok()) return status;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto [p, row] = where[i];
      std::memcpy(out.data() + i * dim, call.parts[p].own_values.data() + row * dim, dim * sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status Update(absl::string_view table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                      UpdateId update_id) override {
    absl::StatusOr<int> dim_or = TableDim(table);
    if (!dim_or.ok()) return dim_or.status();
    const size_t dim = static_cast<size_t>(*dim_or);
    absl::Status valid = CheckGradients(table, ids, grads, dim);
    if (!valid.ok()) return valid;
    if (ids.empty()) return absl::OkStatus();
    std::vector<ShardPart> parts;
    std::vector<std::pair<uint32_t, uint32_t>> where;
    Partition(ids, &parts, &where);
    // Each part's gradients: the sum over the positions of its ids (duplicates summed).
    for (ShardPart& part : parts) part.own_values.assign(part.ids.size() * dim, 0.0f);
    for (size_t i = 0; i < ids.size(); ++i) {
      const float* g = grads.data() + i * dim;
      float* sum = parts[where[i].first].own_values.data() + where[i].second * dim;
      for (size_t j = 0; j < dim; ++j) sum[j] += g[j];
    }
    for (ShardPart& part : parts) part.grads = part.own_values;
    TableCall call{table, static_cast<int>(dim), std::move(parts)};
    return UpdateParts(absl::MakeSpan(&call, 1), update_id);
  }

  absl::Status LookupSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                             absl::Span<const uint32_t> shard_offsets, absl::Span<float> out) override {
    const ShardedLookup lookup{table, ids, shard_offsets, out};
    return LookupShardedTables(absl::MakeConstSpan(&lookup, 1));
  }

  absl::Status UpdateSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                             absl::Span<const uint32_t> shard_offsets, absl::Span<const float> grads,
                             UpdateId update_id) override {
    const ShardedUpdate update{table, ids, shard_offsets, grads};
    return UpdateShardedTables(absl::MakeConstSpan(&update, 1), update_id);
  }

  absl::Status LookupShardedTables(absl::Span<const ShardedLookup> lookups) override {
    std::vector<TableCall> calls;
    calls.reserve(lookups.size());
    for (const ShardedLookup& l : lookups) {
      absl::StatusOr<int> dim = TableDim(l.table);
      if (!dim.ok()) return dim.status();
      TableCall call{l.table, *dim, {}, l.data_time};
      absl::Status status = SplitSharded(l.table, l.ids, l.shard_offsets, *dim, l.out.size(), &call.parts);
      if (!status.ok()) return status;
      for (ShardPart& part : call.parts) {
        part.out = l.out.subspan(static_cast<size_t>(l.shard_offsets[part.shard]) * *dim, part.ids.size() * *dim);
      }
      if (!call.parts.empty()) calls.push_back(std::move(call));
    }
    if (calls.empty()) return absl::OkStatus();
    return LookupParts(absl::MakeSpan(calls));
  }

  absl::Status UpdateShardedTables(absl::Span<const ShardedUpdate> updates, UpdateId update_id) override {
    std::vector<TableCall> calls;
    calls.reserve(updates.size());
    for (const ShardedUpdate& u : updates) {  // Everything checked before anything is sent.
      absl::StatusOr<int> dim = TableDim(u.table);
      if (!dim.ok()) return dim.status();
      absl::Status status = CheckGradients(u.table, u.ids, u.grads, static_cast<size_t>(*dim));
      if (!status.ok()) return status;
      TableCall call{u.table, *dim, {}};
      status = SplitSharded(u.table, u.ids, u.shard_offsets, *dim, u.grads.size(), &call.parts);
      if (!status.ok()) return status;
      for (ShardPart& part : call.parts) {
        part.grads = u.grads.subspan(static_cast<size_t>(u.shard_offsets[part.shard]) * *dim, part.ids.size() * *dim);
      }
      if (!call.parts.empty()) calls.push_back(std::move(call));
    }
    if (calls.empty()) return absl::OkStatus();
    return UpdateParts(absl::MakeSpan(calls), update_id);
  }

 protected:
  // The gradient must hold ids.size() x dim finite floats; checked before anything is sent, so a
  // refused update reaches no shard.
  static absl::Status CheckGradients(absl::string_view table, absl::Span<const uint64_t> ids,
                                     absl::Span<const float> grads, size_t dim) {
    if (grads.size() != ids.size() * dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "': gradient holds ", grads.size(),
                                                     " floats, expected ", ids.size(), " ids x dim ", dim));
    }
    const size_t k = FirstNonFinite(grads.data(), grads.size());
    if (k < grads.size()) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "': gradient of id ", ids[k / dim], " (row ",
                                                     k / dim, ") is ", grads[k], "; nothing was sent"));
    }
    return absl::OkStatus();
  }

  // One part per non-empty shard range of pre-grouped ids, its ids a range of `ids`.
  absl::Status SplitSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                            absl::Span<const uint32_t> shard_offsets, int dim, size_t floats,
                            std::vector<ShardPart>* parts) const {
    if (shard_offsets.size() != static_cast<size_t>(num_shards_) + 1 || shard_offsets.front() != 0 ||
        shard_offsets.back() != ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "': shard_offsets of ", shard_offsets.size(),
                                                     " entries do not cover ", ids.size(), " ids over ", num_shards_,
                                                     " shards"));
    }
    if (floats != ids.size() * static_cast<size_t>(dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table, "': expected ", ids.size(), " x ", dim, " floats, got ", floats));
    }
    for (int s = 0; s < num_shards_; ++s) {
      if (shard_offsets[s] > shard_offsets[s + 1]) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table, "': shard_offsets decrease"));
      }
      if (shard_offsets[s] == shard_offsets[s + 1]) continue;
      ShardPart part;
      part.shard = s;
      part.ids = ids.subspan(shard_offsets[s], shard_offsets[s + 1] - shard_offsets[s]);
      parts->push_back(std::move(part));
    }
    return absl::OkStatus();
  }

  // Deduplicates `ids` and places each distinct id in its shard's part (own_ids, which `ids`
  // then spans), in first-seen order; where[i] = (part, row in part) of ids[i].
  void Partition(absl::Span<const uint64_t> ids, std::vector<ShardPart>* parts,
                 std::vector<std::pair<uint32_t, uint32_t>>* where) const {
    std::vector<int> part_of_shard(num_shards_, -1);
    where->resize(ids.size());
    absl::flat_hash_map<uint64_t, std::pair<uint32_t, uint32_t>> first;
    first.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      auto [it, inserted] = first.try_emplace(ids[i]);
      if (inserted) {
        const int shard = ShardForId(ids[i], num_shards_);
        if (part_of_shard[shard] < 0) {
          part_of_shard[shard] = static_cast<int>(parts->size());
          parts->push_back(ShardPart{});
          parts->back().shard = shard;
        }
        ShardPart& part = (*parts)[part_of_shard[shard]];
        it->second = {static_cast<uint32_t>(part_of_shard[shard]), static_cast<uint32_t>(part.own_ids.size())};
        part.own_ids.push_back(ids[i]);
      }
      (*where)[i] = it->second;
    }
    for (ShardPart& part : *parts) part.ids = part.own_ids;
  }

  // Reads part.ids into part.out for every part of every call; all must succeed.
  virtual absl::Status LookupParts(absl::Span<TableCall> calls) = 0;
  // Applies part.grads as gradients of part.ids for every part of every call.
  virtual absl::Status UpdateParts(absl::Span<TableCall> calls, UpdateId update_id) = 0;

  const int num_shards_;
  const std::vector<std::pair<std::string, int>> tables_;
};

// ---------------------------------------------------------------------------------------------
// In-process: each part goes straight to its store.

class InProcessClient final : public ShardedClient {
 public:
  // `fp16`: rows read and gradients applied are rounded to fp16, as on a remote client's wire.
  InProcessClient(std::vector<std::shared_ptr<EmbeddingShardStore>> stores,
                  std::vector<std::pair<std::string, int>> tables, CutRoots roots, bool fp16)
      : ShardedClient(static_cast<int>(stores.size()), std::move(tables)),
        stores_(std::move(stores)),
        roots_(std::move(roots)),
        fp16_(fp16) {
    for (size_t s = 0; s < stores_.size(); ++s) {
      cutters_.push_back(std::make_unique<ShardCheckpointer>(stores_[s], static_cast<int>(s), num_shards_,
                                                             roots_.env != nullptr ? roots_.env : Env::Default()));
    }
  }

  bool remote() const override { return false; }

  absl::Status BeginCut(CutKind kind, const std::string& name, uint64_t id, absl::Duration timeout) override {
    HYREC_ASSIGN_OR_RETURN(const std::string dir, CutDirectory(roots_, kind, name));
    for (size_t s = 0; s < cutters_.size(); ++s) {
      HYREC_RETURN_IF_ERROR(Annotate(cutters_[s]->Begin(dir, id, kind), absl::StrCat("shard ", s)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<ShardFileInfo>> AwaitCut(uint64_t id, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<ShardFileInfo> out;
    absl::Status first;  // Every shard is awaited, so that none still writes when this returns.
    for (size_t s = 0; s < cutters_.size(); ++s) {
      absl::StatusOr<ShardFileInfo> info =
          cutters_[s]->Await(id, std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (!info.ok()) {
        if (first.ok()) first = Annotate(info.status(), absl::StrCat("shard ", s));
        continue;
      }
      out.push_back(std::move(*info));
    }
    if (!first.ok()) return first;
    return out;
  }

  absl::StatusOr<std::vector<ShardStats>> Stats() override {
    std::vector<ShardStats> out;
    for (size_t s = 0; s < stores_.size(); ++s) {
      ShardStats stats;
      stats.shard_index = static_cast<int>(s);
      stats.num_shards = num_shards_;
      stats.rejected_requests = stores_[s]->rejected_requests();
      stats.store = stores_[s]->Stats();
      out.push_back(std::move(stats));
    }
    return out;
  }

 private:
  absl::Status LookupParts(absl::Span<TableCall> calls) override {
    for (const TableCall& call : calls) {
      if (call.data_time == 0) continue;
      for (const ShardPart& part : call.parts) {
        EmbeddingShardStore& store = *stores_[part.shard];
        if (absl::StatusOr<int> t = store.TableIndex(call.table); t.ok()) store.AdvanceDataTime(*t, call.data_time);
      }
    }
    HYREC_RETURN_IF_ERROR(ReadBackParts(calls));
    return ForEachPart(calls, [this](EmbeddingShardStore& store, int t, ShardPart& part) {
      HYREC_RETURN_IF_ERROR(store.Lookup(t, part.ids, part.out, nullptr));
      if (fp16_) RoundToFp16(part.out);
      return absl::OkStatus();
    });
  }

  absl::Status UpdateParts(absl::Span<TableCall> calls, UpdateId update_id) override {
    HYREC_RETURN_IF_ERROR(ReadBackParts(calls));
    return ForEachPart(calls, [this, update_id](EmbeddingShardStore& store, int t, ShardPart& part) {
      if (!fp16_) return store.Update(t, part.ids, part.grads, update_id, nullptr);
      std::vector<float> grads(part.grads.begin(), part.grads.end());
      RoundToFp16(absl::MakeSpan(grads));
      return store.Update(t, part.ids, grads, update_id, nullptr);
    });
  }

  // Each value to the fp16 nearest it, as wire::EncodeValues and DecodeValues give it.
  static void RoundToFp16(absl::Span<float> values) {
    for (float& v : values) v = HalfToFloat(FloatToHalf(v));
  }

  // Reads every table's rows of the calls that a shard's disk tier holds back into DRAM, the
  // shard's tables together (EmbeddingShardStore::ReadBack), the shards' reads at once (a thread
  // each beyond the first), as remote shards' would be.
  absl::Status ReadBackParts(absl::Span<TableCall> calls) {
    std::vector<std::vector<EmbeddingShardStore::TableIds>> reads(stores_.size());
    for (size_t shard = 0; shard < stores_.size(); ++shard) {
      EmbeddingShardStore& store = *stores_[shard];
      if (!store.has_disk_tier()) continue;
      for (const TableCall& call : calls) {
        absl::StatusOr<int> t = store.TableIndex(call.table);
        if (!t.ok()) return t.status();
        for (const ShardPart& part : call.parts) {
          if (part.shard == static_cast<int>(shard) && !part.ids.empty()) reads[shard].push_back({*t, part.ids});
        }
      }
    }
    std::vector<absl::Status> results(stores_.size());
    std::vector<std::thread> threads;
    for (size_t shard = 0; shard < stores_.size(); ++shard) {
      if (reads[shard].empty()) continue;
      auto read = [&, shard] { results[shard] = stores_[shard]->ReadBack(reads[shard]); };
      const bool more = std::any_of(reads.begin() + shard + 1, reads.end(), [](const auto& r) { return !r.empty(); });
      if (more) {
        threads.emplace_back(read);
      } else {
        read();
      }
    }
    for (std::thread& thread : threads) thread.join();
    for (size_t shard = 0; shard < stores_.size(); ++shard) {
      if (!results[shard].ok()) return Annotate(results[shard], absl::StrCat("shard ", shard));
    }
    return absl::OkStatus();
  }

  // Runs fn(store, table index, part) for every part of every call on its shard's store; the
  // first error stops it, annotated with the shard.
  template <typename Fn>
  absl::Status ForEachPart(absl::Span<TableCall> calls, Fn&& fn) {
    for (TableCall& call : calls) {
      for (ShardPart& part : call.parts) {
        EmbeddingShardStore& store = *stores_[part.shard];
        absl::StatusOr<int> t = store.TableIndex(call.table);
        if (!t.ok()) return t.status();
        absl::Status status = fn(store, *t, part);
        if (!status.ok()) return Annotate(status, absl::StrCat("shard ", part.shard));
      }
    }
    return absl::OkStatus();
  }

  static absl::Status Annotate(const absl::Status& status, absl::string_view context) {
    return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
  }

  const std::vector<std::shared_ptr<EmbeddingShardStore>> stores_;
  const CutRoots roots_;
  const bool fp16_;
  std::vector<std::unique_ptr<ShardCheckpointer>> cutters_;
};

// ---------------------------------------------------------------------------------------------
// gRPC: all parts of a call are in flight at once (callback API); failed parts are retried
// together after a jittered backoff, within the call's overall deadline.

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

class GrpcClient final : public ShardedClient {
 public:
  GrpcClient(std::vector<std::string> addresses, std::vector<std::unique_ptr<proto::EmbeddingService::Stub>> stubs,
             std::vector<std::pair<std::string, int>> tables, const std::vector<proto::HealthResponse>& health,
             const ClientOptions& options)
      : ShardedClient(static_cast<int>(stubs.size()), std::move(tables)),
        addresses_(std::move(addresses)),
        stubs_(std::move(stubs)),
        options_(options),
        precision_(options.precision == Precision::kFp16 ? proto::PRECISION_FP16 : proto::PRECISION_FP32),
        incarnations_(health.size()),
        log_bytes_(health.size()) {
    for (size_t s = 0; s < health.size(); ++s) {
      incarnations_[s].store(health[s].incarnation());
      lineages_.push_back(health[s].lineage());
    }
  }

  bool remote() const override { return true; }

  absl::StatusOr<std::vector<ShardStats>> Stats() override {
    std::vector<ShardStats> out(num_shards_);
    std::vector<proto::StatsResponse> responses(num_shards_);
    absl::Status status = RunOnShards(AllShards(), "Stats",
                                      [&](int k, grpc::ClientContext* context, std::function<void(grpc::Status)> done) {
                                        static const proto::StatsRequest request;
                                        responses[k] = proto::StatsResponse();
                                        stubs_[k]->async()->Stats(context, &request, &responses[k], std::move(done));
                                      });
    if (!status.ok()) return status;
    for (int s = 0; s < num_shards_; ++s) {
      const proto::StatsResponse& r = responses[s];
      ShardStats& stats = out[s];
      stats.shard_index = static_cast<int>(r.shard_index());
      stats.num_shards = static_cast<int>(r.num_shards());
      stats.rejected_requests = r.rejected_requests();
      stats.accept_errors = r.accept_errors();
      stats.refused_connections = r.refused_connections();
      stats.store.capacity_rows = r.capacity_rows();
      stats.store.capacity_bytes = r.capacity_bytes();
      stats.store.rows = r.rows();
      stats.store.bytes = r.bytes();
      stats.store.payload_bytes = r.payload_bytes();
      for (const proto::TableStats& p : r.tables()) {
        TableStats t;
        t.name = p.name();
        t.dim = static_cast<int>(p.dim());
        t.optimizer = p.optimizer();
        t.rows = p.rows();
        t.bytes = p.bytes();
        t.row_bytes = p.row_bytes();
        t.lookups = p.lookups();
        t.updates = p.updates();
        t.evictions = p.evictions();
        t.admission_rejections = p.admission_rejections();
        t.dropped_updates = p.dropped_updates();
        t.rejected_nonfinite = p.rejected_nonfinite();
        t.duplicate_updates = p.duplicate_updates();
        t.capacity_rows = p.capacity_rows();
        t.nonfinite_results = p.nonfinite_results();
        t.eviction_policy = p.eviction_policy();
        t.expirations = p.expirations();
        t.data_time = p.data_time();
        stats.store.tables.push_back(std::move(t));
      }
    }
    return out;
  }

  absl::Status BeginCut(CutKind kind, const std::string& name, uint64_t id, absl::Duration timeout) override {
    proto::BeginCutRequest request;
    request.set_kind(kind == CutKind::kCheckpoint ? proto::CUT_CHECKPOINT : proto::CUT_DELTA);
    if (kind == CutKind::kCheckpoint) {  // The logs start over at the cut.
      for (std::atomic<uint64_t>& b : log_bytes_) b.store(0, std::memory_order_relaxed);
    }
    request.set_name(name);
    request.set_id(id);
    std::vector<proto::BeginCutResponse> responses(num_shards_);
    return OnEveryShard("BeginCut", absl::Now() + timeout, [&](int s, grpc::ClientContext* context) {
      return stubs_[s]->BeginCut(context, request, &responses[s]);
    });
  }

  absl::StatusOr<std::vector<ShardFileInfo>> AwaitCut(uint64_t id, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<ShardFileInfo> out(num_shards_);
    absl::Status first;  // Every shard is awaited, so that none still writes when this returns.
    for (int s = 0; s < num_shards_; ++s) {
      absl::Status shard = AwaitShardCut(s, id, deadline, &out[s]);
      if (first.ok()) first = shard;
    }
    if (!first.ok()) return first;
    return out;
  }

  absl::Status AwaitShardCut(int s, uint64_t id, absl::Time deadline, ShardFileInfo* out) {
    for (;;) {  // Short waits on the shard, so that no RPC outlives a shard that died.
      proto::AwaitCutRequest request;
      request.set_id(id);
      const absl::Duration left = deadline - absl::Now();
      request.set_wait_ms(static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left), 0, 2000)));
      proto::AwaitCutResponse response;
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + absl::Milliseconds(request.wait_ms()) + options_.attempt_timeout));
      const grpc::Status status = stubs_[s]->AwaitCut(&context, request, &response);
      if (!status.ok()) return Annotated(status, s, "AwaitCut", 1);
      if (response.done()) {
        out->file = FileEntry{response.file(), response.length(), response.crc32()};
        out->table_rows.assign(response.table_rows().begin(), response.table_rows().end());
        return absl::OkStatus();
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("PS shard ", s, " (", addresses_[s], ") was still writing cut ", id, " at the deadline"));
      }
    }
  }

 private:
  // Runs call(shard, context) on every shard in parallel, each with `deadline`; the first error.
  absl::Status OnEveryShard(absl::string_view method, absl::Time deadline,
                            const std::function<grpc::Status(int, grpc::ClientContext*)>& call) {
    std::vector<grpc::Status> results(num_shards_);
    std::vector<std::thread> threads;
    for (int s = 0; s < num_shards_; ++s) {
      threads.emplace_back([&, s] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(deadline));
        results[s] = call(s, &context);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int s = 0; s < num_shards_; ++s) {
      if (!results[s].ok()) return Annotated(results[s], s, method, 1);
    }
    return absl::OkStatus();
  }

  using StartFn = std::function<void(int k, grpc::ClientContext*, std::function<void(grpc::Status)>)>;

  std::vector<int> AllShards() const {
    std::vector<int> shards(num_shards_);
    for (int s = 0; s < num_shards_; ++s) shards[s] = s;
    return shards;
  }

  // Runs start(k, ...) for every request k, all in flight at once, retrying the failed ones.
  // `shards[k]` is request k's shard and `(*tables)[k]`, when given, what it reads or writes
  // ("table 'user'"): for the error message and nothing else.
  absl::Status RunOnShards(const std::vector<int>& shards, absl::string_view method, const StartFn& start,
                           const std::vector<absl::string_view>* tables = nullptr) {
    const absl::Time deadline = absl::Now() + options_.call_timeout;
    std::vector<int> pending(shards.size());
    for (size_t k = 0; k < shards.size(); ++k) pending[k] = static_cast<int>(k);
    absl::Duration backoff = options_.initial_backoff;
    // Seeded without std::random_device, whose set-up is costly on threads that live for one call.
    thread_local std::minstd_rand jitter(
        static_cast<uint32_t>(Mix64(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^
                                    std::hash<std::thread::id>{}(std::this_thread::get_id()))));
    for (int attempt = 1;; ++attempt) {
      const absl::Time attempt_deadline = std::min(deadline, absl::Now() + options_.attempt_timeout);
      std::vector<grpc::ClientContext> contexts(pending.size());
      std::vector<grpc::Status> results(pending.size());
      absl::Mutex mu;
      size_t remaining = pending.size();
      for (size_t p = 0; p < pending.size(); ++p) {
        contexts[p].set_deadline(absl::ToChronoTime(attempt_deadline));
        start(pending[p], &contexts[p], [&, p](grpc::Status status) {
          absl::MutexLock lock(&mu);
          results[p] = std::move(status);
          --remaining;
        });
      }
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](size_t* left) { return *left == 0; }, &remaining));
      }
      std::vector<int> failed;
      size_t first_failed = 0;  // Position in `pending` of the first retryable failure.
      auto annotated = [&](size_t p) {
        return Annotated(results[p], shards[pending[p]], Label(method, tables, pending[p]), attempt);
      };
      for (size_t p = 0; p < pending.size(); ++p) {
        if (results[p].ok()) continue;
        if (!Retryable(results[p].error_code())) return annotated(p);
        if (failed.empty()) first_failed = p;
        failed.push_back(pending[p]);
      }
      if (failed.empty()) return absl::OkStatus();
      const absl::Duration sleep = backoff * (0.5 + std::uniform_real_distribution<double>(0.0, 1.0)(jitter));
      if (attempt >= options_.max_attempts || absl::Now() + sleep >= deadline) {
        return annotated(first_failed);
      }
      absl::SleepFor(sleep);
      backoff = std::min(backoff * 2, options_.max_backoff);
      pending = std::move(failed);
    }
  }

  // A shard that answered from another process than before restarted: it may go on only when it
  // recovered its state (the same lineage); one that started afresh is FAILED_PRECONDITION, since
  // its rows are not the ones trained.
  absl::Status CheckIncarnation(int shard, uint64_t incarnation) {
    if (incarnation == 0 || incarnation == incarnations_[shard].load()) return absl::OkStatus();
    proto::HealthResponse health;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.attempt_timeout));
    const grpc::Status status = stubs_[shard]->Health(&context, proto::HealthRequest(), &health);
    if (!status.ok()) return Annotated(status, shard, "Health after a restart", 1);
    if (health.lineage() != lineages_[shard]) {
      return absl::FailedPreconditionError(
          absl::StrCat("PS shard ", shard, " (", addresses_[shard],
                       ") restarted without recovering its rows (its state's lineage changed): its rows are not the "
                       "ones this job trained; give the job's PS an update log (ps.update_log) so that a restarted "
                       "shard recovers, or resume the whole job from a checkpoint"));
    }
    incarnations_[shard].store(incarnation);
    return absl::OkStatus();
  }

  // "Lookup", or "Lookup of table 'user'" when the request's tables are known.
  static std::string Label(absl::string_view method, const std::vector<absl::string_view>* tables, int k) {
    if (tables == nullptr) return std::string(method);
    return absl::StrCat(method, " of ", (*tables)[k]);
  }

  absl::Status Annotated(const grpc::Status& status, int shard, absl::string_view method, int attempts) const {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat(method, " on PS shard ", shard, " (", addresses_[shard], ") failed after ",
                                     attempts, " attempt(s): ", status.error_message()));
  }

  // Every (call, part) of `calls`, flattened: part f is calls[where[f].first].parts[where[f].second],
  // on shards[f].
  struct Flat {
    std::vector<int> shards;
    std::vector<std::pair<size_t, size_t>> where;
  };
  static Flat Flatten(absl::Span<TableCall> calls) {
    Flat flat;
    for (size_t c = 0; c < calls.size(); ++c) {
      for (size_t p = 0; p < calls[c].parts.size(); ++p) {
        flat.shards.push_back(calls[c].parts[p].shard);
        flat.where.emplace_back(c, p);
      }
    }
    return flat;
  }

  // The flat parts in requests of one shard each: a request per shard, and another whenever one
  // would pass half the message limit (`bytes` says what a part adds to its request and answer).
  struct Grouped {
    std::vector<std::vector<size_t>> parts;  // Request k's flat indices, in order.
    std::vector<int> shards;                 // Request k's shard.
    std::vector<std::string> names;          // Request k's tables, for errors: "tables 'a', 'b'".
  };
  Grouped GroupByShard(absl::Span<TableCall> calls, const Flat& flat,
                       const std::function<size_t(const TableCall&, const ShardPart&)>& bytes) const {
    const size_t max_bytes = static_cast<size_t>(options_.max_message_bytes) / 2;
    Grouped g;
    std::vector<size_t> size;
    std::vector<int> joining(num_shards_, -1);  // The request a shard's next part joins.
    for (size_t f = 0; f < flat.shards.size(); ++f) {
      const auto [c, p] = flat.where[f];
      const size_t part_bytes = bytes(calls[c], calls[c].parts[p]) + calls[c].table.size() + 32;
      int& k = joining[flat.shards[f]];
      if (k < 0 || size[k] + part_bytes > max_bytes) {
        k = static_cast<int>(g.parts.size());
        g.parts.emplace_back();
        g.shards.push_back(flat.shards[f]);
        g.names.emplace_back();
        size.push_back(0);
      }
      size[k] += part_bytes;
      g.parts[k].push_back(f);
      absl::StrAppend(&g.names[k], g.names[k].empty() ? "" : ", ", "'", calls[c].table, "'");
    }
    for (size_t k = 0; k < g.parts.size(); ++k) {
      g.names[k] = absl::StrCat(g.parts[k].size() == 1 ? "table " : "tables ", g.names[k]);
    }
    return g;
  }

  size_t ValueBytes() const { return precision_ == proto::PRECISION_FP16 ? 2 : 4; }

  // One LookupTables call per shard with every table's part for it (more when the answer would
  // pass half the message limit).
  absl::Status LookupParts(absl::Span<TableCall> calls) override {
    const Flat flat = Flatten(calls);
    const Grouped g = GroupByShard(calls, flat, [&](const TableCall& call, const ShardPart& part) {
      return part.ids.size() * (sizeof(uint64_t) + static_cast<size_t>(call.dim) * ValueBytes());
    });
    std::vector<proto::LookupTablesRequest> requests(g.parts.size());
    for (size_t k = 0; k < requests.size(); ++k) {
      for (size_t f : g.parts[k]) {
        const auto [c, p] = flat.where[f];
        proto::LookupRequest* l = requests[k].add_lookups();
        l->set_table(std::string(calls[c].table));
        l->set_precision(precision_);
        l->set_data_time(calls[c].data_time);
        wire::EncodeIds(calls[c].parts[p].ids, l->mutable_ids());
      }
    }
    std::vector<proto::LookupTablesResponse> responses(requests.size());
    const std::vector<absl::string_view> labels(g.names.begin(), g.names.end());
    HYREC_RETURN_IF_ERROR(RunOnShards(
        g.shards, "Lookup",
        [&](int k, grpc::ClientContext* context, std::function<void(grpc::Status)> done) {
          responses[k].Clear();
          stubs_[g.shards[k]]->async()->LookupTables(context, &requests[k], &responses[k], std::move(done));
        },
        &labels));
    for (size_t k = 0; k < responses.size(); ++k) {
      const int shard = g.shards[k];
      HYREC_RETURN_IF_ERROR(CheckIncarnation(shard, responses[k].incarnation()));
      if (static_cast<size_t>(responses[k].lookups_size()) != g.parts[k].size()) {
        return absl::InternalError(absl::StrCat("PS shard ", shard, " answered ", responses[k].lookups_size(),
                                                " lookups of ", g.parts[k].size()));
      }
      for (size_t i = 0; i < g.parts[k].size(); ++i) {
        const auto [c, p] = flat.where[g.parts[k][i]];
        const proto::LookupResponse& r = responses[k].lookups(static_cast<int>(i));
        if (static_cast<int>(r.dim()) != calls[c].dim || !wire::ValidPrecision(r.precision())) {
          return absl::InternalError(absl::StrCat("PS shard ", shard, " answered dim ", r.dim(), " for table '",
                                                  calls[c].table, "', expected ", calls[c].dim));
        }
        absl::Status decoded = wire::DecodeValues(r.values(), r.precision(), "values", calls[c].parts[p].out);
        if (!decoded.ok()) {
          return absl::InternalError(
              absl::StrCat("PS shard ", shard, ", table '", calls[c].table, "': ", decoded.message()));
        }
      }
    }
    return absl::OkStatus();
  }

  // One UpdateTables call per shard with every table's part for it (more when they would pass
  // half the message limit): one record in the shard's log, one acknowledgement.
  absl::Status UpdateParts(absl::Span<TableCall> calls, UpdateId update_id) override {
    const Flat flat = Flatten(calls);
    const Grouped g = GroupByShard(calls, flat, [&](const TableCall&, const ShardPart& part) {
      return part.ids.size() * sizeof(uint64_t) + part.grads.size() * ValueBytes();
    });
    std::vector<proto::UpdateTablesRequest> requests(g.parts.size());
    for (size_t k = 0; k < requests.size(); ++k) {
      for (size_t f : g.parts[k]) {
        const auto [c, p] = flat.where[f];
        proto::UpdateRequest* u = requests[k].add_updates();
        u->set_table(std::string(calls[c].table));
        u->set_precision(precision_);
        u->set_worker_id(update_id.worker_id);
        u->set_sequence(update_id.sequence);
        wire::EncodeIds(calls[c].parts[p].ids, u->mutable_ids());
        wire::EncodeValues(calls[c].parts[p].grads, precision_, u->mutable_grads());
      }
    }
    std::vector<proto::UpdateTablesResponse> responses(requests.size());
    const std::vector<absl::string_view> labels(g.names.begin(), g.names.end());
    HYREC_RETURN_IF_ERROR(RunOnShards(
        g.shards, "Update",
        [&](int k, grpc::ClientContext* context, std::function<void(grpc::Status)> done) {
          responses[k].Clear();
          stubs_[g.shards[k]]->async()->UpdateTables(context, &requests[k], &responses[k], std::move(done));
        },
        &labels));
    for (size_t k = 0; k < responses.size(); ++k) {
      HYREC_RETURN_IF_ERROR(CheckIncarnation(g.shards[k], responses[k].incarnation()));
      log_bytes_[g.shards[k]].store(responses[k].log_bytes(), std::memory_order_relaxed);
    }
    return absl::OkStatus();
  }

  uint64_t LargestLogBytes() const override {
    uint64_t largest = 0;
    for (const std::atomic<uint64_t>& b : log_bytes_) largest = std::max(largest, b.load(std::memory_order_relaxed));
    return largest;
  }

  const std::vector<std::string> addresses_;
  const std::vector<std::unique_ptr<proto::EmbeddingService::Stub>> stubs_;
  const ClientOptions options_;
  const proto::Precision precision_;
  // Per shard: the process last seen answering, and the lineage of its state at connect.
  std::vector<std::atomic<uint64_t>> incarnations_;
  std::vector<uint64_t> lineages_;
  std::vector<std::atomic<uint64_t>> log_bytes_;  // Per shard: its log's bytes since its last cut.
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingClient>> NewInProcessEmbeddingClient(
    std::vector<std::shared_ptr<EmbeddingShardStore>> stores, CutRoots roots, Precision wire) {
  if (stores.empty()) return absl::InvalidArgumentError("no stores given");
  std::vector<std::pair<std::string, int>> tables;
  for (int t = 0; t < stores[0]->num_tables(); ++t) {
    tables.emplace_back(stores[0]->table(t).name, stores[0]->table(t).dim);
  }
  for (size_t s = 0; s < stores.size(); ++s) {
    if (stores[s] == nullptr) return absl::InvalidArgumentError(absl::StrCat("store ", s, " is null"));
    bool same = stores[s]->num_tables() == static_cast<int>(tables.size());
    for (int t = 0; same && t < stores[s]->num_tables(); ++t) {
      same = stores[s]->table(t).name == tables[t].first && stores[s]->table(t).dim == tables[t].second;
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat("store ", s, " holds different tables from store 0"));
    }
  }
  return std::unique_ptr<EmbeddingClient>(
      new InProcessClient(std::move(stores), std::move(tables), std::move(roots), wire == Precision::kFp16));
}

absl::StatusOr<std::string> CutDirectory(const CutRoots& roots, CutKind kind, const std::string& name) {
  if (name.empty() || name.size() > 255 || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("cut directory '", name.substr(0, 64), "' is not a plain name"));
  }
  const std::string& root = kind == CutKind::kCheckpoint ? roots.checkpoint_root : roots.export_root;
  if (root.empty()) {
    return absl::FailedPreconditionError(kind == CutKind::kCheckpoint
                                             ? "this PS has no checkpoint directory (the job's checkpoint.dir)"
                                             : "this PS has no export directory (the job's export.dir)");
  }
  return JoinPath(root, name);
}

absl::StatusOr<std::unique_ptr<EmbeddingClient>> ConnectEmbeddingClient(const std::vector<std::string>& addresses,
                                                                        const ClientOptions& options) {
  if (addresses.empty()) return absl::InvalidArgumentError("no PS addresses given");
  KeepLargeBuffers();
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         rpc::ChannelCredentials(options.security));
  std::vector<std::unique_ptr<proto::EmbeddingService::Stub>> stubs;
  for (size_t s = 0; s < addresses.size(); ++s) {
    grpc::ChannelArguments args = rpc::ChannelArgumentsFor(options.security, Identity{Role::kPs, static_cast<int>(s)});
    args.SetMaxReceiveMessageSize(options.max_message_bytes);
    args.SetMaxSendMessageSize(options.max_message_bytes);
    stubs.push_back(proto::EmbeddingService::NewStub(grpc::CreateCustomChannel(addresses[s], credentials, args)));
  }
  std::vector<std::pair<std::string, int>> tables;
  std::vector<proto::HealthResponse> healths(stubs.size());
  const absl::Time deadline = absl::Now() + options.call_timeout;
  for (size_t s = 0; s < stubs.size(); ++s) {
    proto::HealthResponse& health = healths[s];
    grpc::Status status;
    // Waits for the channel to come up (the PS may still be starting), up to the deadline.
    for (absl::Duration backoff = options.initial_backoff;;) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + options.attempt_timeout)));
      status = stubs[s]->Health(&context, proto::HealthRequest(), &health);
      HYREC_RETURN_IF_ERROR(CertificateRefusal(status, absl::StrCat("PS shard ", s, " (", addresses[s], ")")));
      if (status.ok() || !Retryable(status.error_code()) || absl::Now() + backoff >= deadline) break;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
    if (!status.ok()) {
      return absl::Status(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat("PS shard ", s, " (", addresses[s], ") did not answer Health: ", status.error_message()));
    }
    if (!health.serving() || health.shard_index() != s || health.num_shards() != addresses.size()) {
      return absl::FailedPreconditionError(absl::StrCat("PS at ", addresses[s], " is shard ", health.shard_index(),
                                                        " of ", health.num_shards(), ", but was given as shard ", s,
                                                        " of ", addresses.size()));
    }
    std::vector<std::pair<std::string, int>> shard_tables;
    for (const proto::TableInfo& info : health.tables()) {
      shard_tables.emplace_back(info.name(), static_cast<int>(info.dim()));
    }
    if (s == 0) {
      tables = std::move(shard_tables);
    } else if (shard_tables != tables) {
      return absl::FailedPreconditionError(
          absl::StrCat("PS shard ", s, " (", addresses[s], ") holds different tables from shard 0"));
    }
  }
  return std::unique_ptr<EmbeddingClient>(
      new GrpcClient(addresses, std::move(stubs), std::move(tables), healths, options));
}

}  // namespace hyrec::embedding_ps
