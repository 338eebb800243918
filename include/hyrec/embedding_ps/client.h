// EmbeddingClient: how workers read and update embeddings held by one or many parameter servers.
//
// One interface, two implementations:
//   - ConnectEmbeddingClient(addresses, options): gRPC to PS processes (`hyrec ps`), one address
//     per shard in shard order;
//   - NewInProcessEmbeddingClient(stores): the same logic over stores in this process, with no
//     network (the embedded default and unit tests).
// Both deduplicate ids within a request, place each id on shard ShardForId(id, num_shards)
// (jump consistent hash; hyrec/common/hash.h), send the per-shard requests in parallel and
// reassemble rows in the caller's order, so both give the same rows for the same calls.
//
//   HYREC_ASSIGN_OR_RETURN(auto client,
//                          ConnectEmbeddingClient({"ps-0:7000", "ps-1:7000"}, ClientOptions()));
//   HYREC_ASSIGN_OR_RETURN(int dim, client->TableDim("user"));
//   const std::vector<uint64_t> ids = {17, 42, 17};
//   std::vector<float> rows(ids.size() * dim);
//   HYREC_RETURN_IF_ERROR(client->Lookup("user", ids, absl::MakeSpan(rows)));
//   const std::vector<float> grads(rows.size(), 0.01f);
//   HYREC_RETURN_IF_ERROR(client->Update("user", ids, grads, UpdateId{/*worker_id=*/0, /*sequence=*/1}));
//
// Every remote call has a deadline (ClientOptions::call_timeout, overall, across retries); a
// dead or frozen PS becomes an UNAVAILABLE or DEADLINE_EXCEEDED Status within it. Transient
// failures are retried with jittered exponential backoff; Update retries are safe because the PS
// deduplicates (worker_id, sequence).
//
// Thread safety: all methods may be called concurrently from many threads.
#ifndef HYREC_EMBEDDING_PS_CLIENT_H_
#define HYREC_EMBEDDING_PS_CLIENT_H_

#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hyrec/common/security.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"

namespace hyrec::embedding_ps {

enum class Precision { kFp32, kFp16 };

struct ClientOptions {
  // Overall deadline of one Lookup/Update/Stats call, retries included.
  absl::Duration call_timeout = absl::Seconds(10);
  // Deadline of one attempt (capped by what is left of call_timeout).
  absl::Duration attempt_timeout = absl::Seconds(5);
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(1);
  // Encoding of rows and gradients on the wire (NewInProcessEmbeddingClient takes its own).
  Precision precision = Precision::kFp32;
  // Largest gRPC message accepted or sent.
  int max_message_bytes = 256 << 20;
  // mTLS to the shards (each must present the certificate of "ps-<index>") and this process's
  // identity; off: plaintext (security.h).
  SecurityOptions security;
};

// What one shard reported (StoreStats plus the shard's identity).
struct ShardStats {
  int shard_index = 0;
  int num_shards = 1;
  uint64_t rejected_requests = 0;
  uint64_t accept_errors = 0;        // accept() failures the shard's listener backed off from.
  uint64_t refused_connections = 0;  // Connections it closed for want of descriptors.
  StoreStats store;
};

class EmbeddingClient {
 public:
  virtual ~EmbeddingClient() = default;

  virtual int num_shards() const = 0;

  // True when calls cross the network, so several issued at once overlap their round trips;
  // false for in-process stores, whose calls are CPU work on the calling thread.
  virtual bool remote() const = 0;

  // Dimension of a table, or NotFound naming it.
  virtual absl::StatusOr<int> TableDim(absl::string_view table) const = 0;

  // Reads the rows of `ids` (any order, duplicates allowed) into `out`, which must hold
  // ids.size() * dim floats; rows come back in the order of `ids`. On error `out` is unspecified.
  virtual absl::Status Lookup(absl::string_view table, absl::Span<const uint64_t> ids, absl::Span<float> out) = 0;

  // Applies `grads` (ids.size() * dim floats) to the rows of `ids`; the gradients of duplicate
  // ids are summed first. `update_id` is sent to every shard touched; a retried or repeated
  // update of this table with the same id is applied once (see UpdateId). A NaN/Inf gradient is
  // InvalidArgument and no shard applies anything.
  virtual absl::Status Update(absl::string_view table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                              UpdateId update_id) = 0;

  // Lookup and Update of ids that are already unique and grouped by shard, as the data loader
  // delivers them (shard k owns ids[shard_offsets[k] .. shard_offsets[k+1])): no deduplication
  // or placement work on the caller's side. shard_offsets must have num_shards() + 1 entries.
  virtual absl::Status LookupSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                                     absl::Span<const uint32_t> shard_offsets, absl::Span<float> out) = 0;
  virtual absl::Status UpdateSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                                     absl::Span<const uint32_t> shard_offsets, absl::Span<const float> grads,
                                     UpdateId update_id) = 0;

  // One table's share of a multi-table call: its ids already unique and grouped by shard, as for
  // LookupSharded and UpdateSharded.
  struct ShardedLookup {
    absl::string_view table;
    absl::Span<const uint64_t> ids;
    absl::Span<const uint32_t> shard_offsets;
    absl::Span<float> out;
    // The newest sample time (seconds) of the batch read; each shard raises the table's data
    // time to it first (EmbeddingShardStore::AdvanceDataTime). 0: none.
    uint64_t data_time = 0;
  };
  struct ShardedUpdate {
    absl::string_view table;
    absl::Span<const uint64_t> ids;
    absl::Span<const uint32_t> shard_offsets;
    absl::Span<const float> grads;
  };
  // LookupSharded for several tables in one call, as a dense worker reads a batch. Against
  // remote shards every (table, shard) request is in flight at once, from the calling thread
  // (no thread per table); in process they run one after another on it. Returns the first error,
  // naming the table; the `out` spans are then unspecified.
  virtual absl::Status LookupShardedTables(absl::Span<const ShardedLookup> lookups) = 0;
  // UpdateSharded for several tables, each with `update_id` (sequences are per table, see
  // UpdateId). Every table's arguments and gradients are checked before anything is sent: a bad
  // one (a NaN/Inf gradient, a wrong size) is InvalidArgument naming the table, and no shard
  // applies anything. A failure after that (a shard down) may leave other tables applied; a retry
  // with the same `update_id` applies only what is missing.
  virtual absl::Status UpdateShardedTables(absl::Span<const ShardedUpdate> updates, UpdateId update_id) = 0;

  // Statistics of every shard, in shard order.
  virtual absl::StatusOr<std::vector<ShardStats>> Stats() = 0;

  // The largest update log among the shards, in bytes since its last checkpoint cut, as their
  // latest UpdateTables answers said (0 after a checkpoint's BeginCut until they say again, and
  // for clients whose shards keep no log).
  virtual uint64_t LargestLogBytes() const { return 0; }

  // Cuts (shard_checkpoint.h). BeginCut: every shard cuts its store now (kCheckpoint: rows with
  // optimizer state, admission and dedup state; kDelta: its changes since the last delta) and
  // writes the cut in the background, into the directory `name` (a plain name) under its
  // checkpoint root or export root. Returns once every shard has taken its cut (an in-memory
  // copy, or a forked writer for a large store), within `timeout`.
  // The caller makes the cut consistent: no update of its job may be in flight. Repeating the id
  // of the cut in progress is acknowledged, not redone. Clients that cannot cut return
  // Unimplemented.
  virtual absl::Status BeginCut(CutKind kind, const std::string& name, uint64_t id, absl::Duration timeout) {
    return absl::UnimplementedError("this PS client takes no checkpoints");
  }
  // Waits up to `timeout` for every shard's write of cut `id`; their files in shard order. A
  // shard's failure is returned only once every other shard was awaited too (none still writes
  // into the cut's directory unless the timeout passed).
  virtual absl::StatusOr<std::vector<ShardFileInfo>> AwaitCut(uint64_t id, absl::Duration timeout) {
    return absl::UnimplementedError("this PS client takes no checkpoints");
  }
};

// Where in-process shards write their cuts (a PS process has the same two in ServerOptions).
struct CutRoots {
  std::string checkpoint_root;  // checkpoint.dir; empty: checkpoints are refused.
  std::string export_root;      // export.dir; empty: deltas are refused.
  Env* env = nullptr;           // nullptr: Env::Default().
};

// "<root>/<name>" for a cut of `kind`: InvalidArgument unless `name` is a plain directory name,
// FailedPrecondition when that root is not set.
absl::StatusOr<std::string> CutDirectory(const CutRoots& roots, CutKind kind, const std::string& name);

// Connects to PS processes, one address per shard in shard order. Checks each with Health
// (within options.call_timeout): every shard must be serving, report its position as its shard
// index and addresses.size() as the shard count, and hold the same tables with the same dims.
absl::StatusOr<std::unique_ptr<EmbeddingClient>> ConnectEmbeddingClient(const std::vector<std::string>& addresses,
                                                                        const ClientOptions& options);

// A client over stores in this process; shard k is stores[k]. All stores must hold the same
// tables with the same dims. With `wire` kFp16 the rows it reads and the gradients it applies
// are rounded to fp16 (to nearest, ties to even) as a remote client's would be on the wire.
absl::StatusOr<std::unique_ptr<EmbeddingClient>> NewInProcessEmbeddingClient(
    std::vector<std::shared_ptr<EmbeddingShardStore>> stores, CutRoots roots = {}, Precision wire = Precision::kFp32);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_CLIENT_H_
