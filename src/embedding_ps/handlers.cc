#include "src/embedding_ps/handlers.h"

#include <cstring>

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hyrec/common/data_time.h"
#include "hyrec/common/status_macros.h"
#include "src/embedding_ps/wire.h"

namespace hyrec::embedding_ps {
namespace {

// Room for the answer's other fields beside its values.
constexpr size_t kResponseSlack = 1024;

// Validates the fields every request has (table, precision, ids) and decodes the ids; returns
// the table index.
absl::StatusOr<int> ParseCommon(const EmbeddingShardStore& store, const RequestLimits& limits,
                                const std::string& table_name, int precision, const std::string& ids_field,
                                std::vector<uint64_t>* ids) {
  absl::StatusOr<int> table = store.TableIndex(table_name);
  if (!table.ok()) return table.status();
  if (!wire::ValidPrecision(precision)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown precision ", precision));
  }
  const size_t n = ids_field.size() / sizeof(uint64_t);
  if (n > limits.max_ids_per_request) {
    return absl::ResourceExhaustedError(
        absl::StrCat(n, " ids in one request; this PS accepts at most ", limits.max_ids_per_request));
  }
  absl::Status status = wire::DecodeIds(ids_field, ids);
  if (!status.ok()) return status;
  return table;
}

// INVALID_ARGUMENT for a data time more than kMaxDataTimeAheadSeconds after this shard's clock:
// raised to it, a ttl table would expire every row it holds.
absl::Status CheckDataTime(uint64_t data_time) {
  const uint64_t now = UnixSecondsNow();
  if (!DataTimeTooFarAhead(data_time, now)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("data_time ", data_time, " is more than ", kMaxDataTimeAheadSeconds,
                                                 " s after this shard's clock (", now,
                                                 "): refused, so that no table's rows expire by it"));
}

}  // namespace

absl::Status HandleLookup(EmbeddingShardStore& store, const RequestLimits& limits, const proto::LookupRequest& request,
                          proto::LookupResponse* response) {
  std::vector<uint64_t> ids;
  absl::StatusOr<int> table = ParseCommon(store, limits, request.table(), request.precision(), request.ids(), &ids);
  if (!table.ok()) return table.status();
  HYREC_RETURN_IF_ERROR(CheckDataTime(request.data_time()));
  if (request.data_time() != 0) store.AdvanceDataTime(*table, request.data_time());
  absl::Status status;
  const int dim = store.table(*table).dim;
  const size_t n = ids.size() * dim;
  const size_t answer_bytes = n * wire::BytesPerValue(request.precision());
  if (answer_bytes + kResponseSlack > static_cast<size_t>(limits.max_message_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat("the answer to ", ids.size(), " ids of dim ", dim, " would be ",
                                                     answer_bytes, " bytes; this PS sends at most ",
                                                     limits.max_message_bytes, " (split the request)"));
  }
  LookupResult result;
  response->set_dim(dim);
  response->set_precision(request.precision());
  std::string* values = response->mutable_values();
  if (request.precision() == proto::PRECISION_FP32) {
    values->resize(n * sizeof(float));
    status = store.Lookup(*table, ids, absl::MakeSpan(reinterpret_cast<float*>(values->data()), n), &result);
  } else {
    std::vector<float> rows(n);
    status = store.Lookup(*table, ids, absl::MakeSpan(rows), &result);
    if (status.ok()) wire::EncodeValues(rows, request.precision(), values);
  }
  if (!status.ok()) return status;
  response->set_not_admitted(result.not_admitted);
  return absl::OkStatus();
}

namespace {

// With a disk tier: the rows of every well-formed part on disk, read back into DRAM together
// (EmbeddingShardStore::ReadBack) before each part is served alone. A malformed part is left to
// its own refusal.
template <typename Parts>
absl::Status ReadBackFromDisk(EmbeddingShardStore& store, const Parts& parts) {
  if (!store.has_disk_tier()) return absl::OkStatus();
  std::vector<std::vector<uint64_t>> ids;
  std::vector<EmbeddingShardStore::TableIds> reads;
  ids.reserve(parts.size());
  for (const auto& part : parts) {
    absl::StatusOr<int> table = store.TableIndex(part.table());
    if (!table.ok() || part.ids().size() % sizeof(uint64_t) != 0) continue;
    ids.emplace_back(part.ids().size() / sizeof(uint64_t));
    std::memcpy(ids.back().data(), part.ids().data(), part.ids().size());
    reads.push_back({*table, ids.back()});
  }
  return store.ReadBack(reads);
}

}  // namespace

absl::Status HandleLookupTables(EmbeddingShardStore& store, const RequestLimits& limits,
                                const proto::LookupTablesRequest& request, proto::LookupTablesResponse* response) {
  if (request.lookups_size() == 0) return absl::InvalidArgumentError("LookupTables without lookups");
  if (static_cast<uint64_t>(request.lookups_size()) > limits.max_ids_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat(
        request.lookups_size(), " lookups in one request; this PS accepts at most ", limits.max_ids_per_request));
  }
  // The whole answer is bounded before anything is read or allocated.
  size_t answer_bytes = kResponseSlack;
  for (int k = 0; k < request.lookups_size(); ++k) {
    const proto::LookupRequest& l = request.lookups(k);
    absl::StatusOr<int> table = store.TableIndex(l.table());
    if (!table.ok()) {
      return absl::Status(table.status().code(), absl::StrCat("lookup ", k, ": ", table.status().message()));
    }
    if (absl::Status time = CheckDataTime(l.data_time()); !time.ok()) {
      return absl::Status(time.code(), absl::StrCat("lookup ", k, ": ", time.message()));
    }
    const size_t width = wire::ValidPrecision(l.precision()) ? wire::BytesPerValue(l.precision()) : 0;
    answer_bytes += l.ids().size() / sizeof(uint64_t) * store.table(*table).dim * width + kResponseSlack;
  }
  if (answer_bytes > static_cast<size_t>(limits.max_message_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat("the answer to ", request.lookups_size(), " lookups would be ",
                                                     answer_bytes, " bytes; this PS sends at most ",
                                                     limits.max_message_bytes, " (split the request)"));
  }
  HYREC_RETURN_IF_ERROR(ReadBackFromDisk(store, request.lookups()));
  for (int k = 0; k < request.lookups_size(); ++k) {
    absl::Status status = HandleLookup(store, limits, request.lookups(k), response->add_lookups());
    if (!status.ok()) {
      response->Clear();
      return absl::Status(
          status.code(),
          absl::StrCat("lookup ", k, " (table '", request.lookups(k).table().substr(0, 64), "'): ", status.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// An Update request, validated and decoded.
struct ParsedUpdate {
  int table = 0;
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  UpdateResult result;
};

absl::Status ParseUpdate(const EmbeddingShardStore& store, const RequestLimits& limits,
                         const proto::UpdateRequest& request, ParsedUpdate* parsed) {
  absl::StatusOr<int> table =
      ParseCommon(store, limits, request.table(), request.precision(), request.ids(), &parsed->ids);
  if (!table.ok()) return table.status();
  parsed->table = *table;
  const int dim = store.table(*table).dim;
  const size_t expected = parsed->ids.size() * dim * wire::BytesPerValue(request.precision());
  if (request.grads().size() != expected) {  // Before the gradients get memory of their own.
    return absl::InvalidArgumentError(absl::StrCat("grads field holds ", request.grads().size(), " bytes, expected ",
                                                   expected, " (", parsed->ids.size(), " ids x dim ", dim, ")"));
  }
  parsed->grads.resize(parsed->ids.size() * dim);
  return wire::DecodeValues(request.grads(), request.precision(), "grads", absl::MakeSpan(parsed->grads));
}

// Validates every request before it applies any, then applies them all (logged as one record
// with `log`); results[k] is request k's.
absl::Status ApplyUpdates(EmbeddingShardStore& store, const RequestLimits& limits,
                          absl::Span<const proto::UpdateRequest* const> requests, std::vector<ParsedUpdate>* parsed,
                          UpdateLog* log) {
  parsed->resize(requests.size());
  // What the store would refuse is refused here, for every part before any is applied or logged:
  // a refused call changes no row and no dedup window, and leaves no record to replay. (One
  // unlogged update needs no check apart: the store validates it whole before it writes.)
  const bool check = log != nullptr || requests.size() > 1;
  for (size_t k = 0; k < requests.size(); ++k) {
    ParsedUpdate& p = (*parsed)[k];
    absl::Status status = ParseUpdate(store, limits, *requests[k], &p);
    if (status.ok() && check) {
      status = store.CheckUpdate(p.table, p.ids, p.grads, UpdateId{requests[k]->worker_id(), requests[k]->sequence()});
    }
    if (!status.ok()) {
      if (requests.size() == 1) return status;
      return absl::Status(status.code(), absl::StrCat("update ", k, " (table '", requests[k]->table().substr(0, 64),
                                                      "'): ", status.message(), "; nothing was applied"));
    }
  }
  if (store.has_disk_tier()) {
    std::vector<EmbeddingShardStore::TableIds> reads;
    for (const ParsedUpdate& p : *parsed) reads.push_back({p.table, p.ids});
    HYREC_RETURN_IF_ERROR(store.ReadBack(reads));
  }
  absl::Status status;
  const auto apply = [&] {
    for (size_t k = 0; k < requests.size() && status.ok(); ++k) {
      ParsedUpdate& p = (*parsed)[k];
      status =
          store.Update(p.table, p.ids, p.grads, UpdateId{requests[k]->worker_id(), requests[k]->sequence()}, &p.result);
    }
  };
  if (log == nullptr) {
    apply();
    return status;
  }
  // Applied while its record's group is written; acknowledged only once the record is durable.
  // An update applied but not logged (the log failed) is refused, and the log stays failed, so
  // nothing is acknowledged from then on; a retry of it is recognized by its sequence.
  std::vector<LoggedUpdate> logged(requests.size());
  for (size_t k = 0; k < requests.size(); ++k) {
    const proto::UpdateRequest& r = *requests[k];
    logged[k] =
        LoggedUpdate{r.table(), r.worker_id(), r.sequence(), static_cast<uint32_t>(r.precision()), r.ids(), r.grads()};
  }
  if (absl::Status appended = log->Append(logged, apply); !appended.ok()) {
    return absl::UnavailableError(absl::StrCat("not acknowledged: ", appended.message()));
  }
  return status;
}

void FillResponse(const UpdateResult& result, proto::UpdateResponse* response) {
  response->set_duplicate(result.duplicate);
  response->set_applied(result.applied);
  response->set_dropped(result.dropped);
  response->set_nonfinite(result.nonfinite);
}

}  // namespace

absl::Status HandleUpdate(EmbeddingShardStore& store, const RequestLimits& limits, const proto::UpdateRequest& request,
                          proto::UpdateResponse* response, UpdateLog* log) {
  const proto::UpdateRequest* requests[] = {&request};
  std::vector<ParsedUpdate> parsed;
  HYREC_RETURN_IF_ERROR(ApplyUpdates(store, limits, requests, &parsed, log));
  FillResponse(parsed[0].result, response);
  return absl::OkStatus();
}

absl::Status HandleUpdateTables(EmbeddingShardStore& store, const RequestLimits& limits,
                                const proto::UpdateTablesRequest& request, proto::UpdateTablesResponse* response,
                                UpdateLog* log) {
  if (request.updates_size() == 0) return absl::InvalidArgumentError("UpdateTables without updates");
  if (static_cast<uint64_t>(request.updates_size()) > limits.max_ids_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat(
        request.updates_size(), " updates in one request; this PS accepts at most ", limits.max_ids_per_request));
  }
  std::vector<const proto::UpdateRequest*> requests;
  requests.reserve(request.updates_size());
  for (const proto::UpdateRequest& u : request.updates()) requests.push_back(&u);
  std::vector<ParsedUpdate> parsed;
  HYREC_RETURN_IF_ERROR(ApplyUpdates(store, limits, requests, &parsed, log));
  for (const ParsedUpdate& p : parsed) FillResponse(p.result, response->add_updates());
  return absl::OkStatus();
}

proto::UpdateRequest ToRequest(const LoggedUpdate& update) {
  proto::UpdateRequest request;
  request.set_table(update.table.data(), update.table.size());
  request.set_worker_id(update.worker_id);
  request.set_sequence(update.sequence);
  request.set_precision(static_cast<proto::Precision>(update.precision));
  request.set_ids(update.ids.data(), update.ids.size());
  request.set_grads(update.grads.data(), update.grads.size());
  return request;
}

absl::Status ReplayInto(const UpdateLog& log, uint64_t first, EmbeddingShardStore* store, ReplayStats* stats) {
  const RequestLimits limits{~uint64_t{0}, std::numeric_limits<int>::max()};
  return log.Replay(
      first,
      [&](const LoggedUpdate& u) {
        proto::UpdateResponse response;
        if (!HandleUpdate(*store, limits, ToRequest(u), &response).ok()) ++stats->refused;
        return absl::OkStatus();
      },
      stats);
}

}  // namespace hyrec::embedding_ps
