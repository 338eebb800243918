// The PS's Lookup and Update handlers without the transport: what the gRPC service runs once a
// call is admitted, and what the RPC fuzzer (tests/fuzz/rpc_fuzz.cc) feeds untrusted requests.
//
// Every size is checked against the request and the table before anything is allocated or a
// row created (docs/security.md): an unknown table is NOT_FOUND; an unknown precision, ids that
// are not whole uint64s or gradients of the wrong length INVALID_ARGUMENT; more ids than
// max_ids_per_request, or an answer larger than max_message_bytes, RESOURCE_EXHAUSTED.
#ifndef HYREC_SRC_EMBEDDING_PS_HANDLERS_H_
#define HYREC_SRC_EMBEDDING_PS_HANDLERS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "embedding.pb.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/update_log.h"

namespace hyrec::embedding_ps {

struct RequestLimits {
  uint64_t max_ids_per_request = 1 << 22;
  int max_message_bytes = 256 << 20;
};

absl::Status HandleLookup(EmbeddingShardStore& store, const RequestLimits& limits, const proto::LookupRequest& request,
                          proto::LookupResponse* response);

// Several Lookups in one call, each answered as HandleLookup would; the whole answer is checked
// against max_message_bytes before any row is read. At most max_ids_per_request lookups.
absl::Status HandleLookupTables(EmbeddingShardStore& store, const RequestLimits& limits,
                                const proto::LookupTablesRequest& request, proto::LookupTablesResponse* response);

// With `log`, a valid request is applied while its record is appended to the log, and OK only
// once the record is durable as the log's policy says; a failed append is UNAVAILABLE (the
// client retries, and the retry is recognized by its sequence).
absl::Status HandleUpdate(EmbeddingShardStore& store, const RequestLimits& limits, const proto::UpdateRequest& request,
                          proto::UpdateResponse* response, UpdateLog* log = nullptr);

// Several Updates in one call, as HandleUpdate each, but all validated before any is applied
// (an invalid one refuses the call, naming it, and nothing is applied) and logged as one record.
// At most max_ids_per_request updates; response->updates(k) answers request.updates(k).
absl::Status HandleUpdateTables(EmbeddingShardStore& store, const RequestLimits& limits,
                                const proto::UpdateTablesRequest& request, proto::UpdateTablesResponse* response,
                                UpdateLog* log = nullptr);

// The request a logged update was (for a replay through HandleUpdate).
proto::UpdateRequest ToRequest(const LoggedUpdate& update);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_SRC_EMBEDDING_PS_HANDLERS_H_
