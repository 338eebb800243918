// DataService: the loader as a process (`hyrec loader`), streaming each dense worker its batches
// over gRPC (proto/data.proto), and the client side that implements the same BatchStream as the
// in-process loader.
//
//   // The loader process.
//   LoaderOptions options;                     // synthetic data for 2 workers
//   options.num_workers = 2;
//   const std::vector<ReaderPosition> resume;  // from the beginning
//   HYREC_ASSIGN_OR_RETURN(auto loader, Loader::Start(options, resume));
//   DataServerOptions server_options;
//   server_options.port = 7100;
//   HYREC_ASSIGN_OR_RETURN(auto server, DataServer::Start(std::move(loader), options, resume, server_options));
//   // Worker 1.
//   HYREC_ASSIGN_OR_RETURN(auto stream, ConnectBatchStream("loader:7100", /*worker=*/1, {}));
//   for (Batch batch; stream->Next(&batch, absl::Seconds(60)).ok();) std::cout << batch.batch_id << "\n";
//
// Flow control: the client keeps at most `prefetch_batches` decoded batches and stops reading
// when they are full; gRPC's flow control then stops the server, whose per-worker queue then
// stops the loader. Nothing is dropped and memory stays bounded on both sides. The server keeps
// the last `replay_batches` batches (and `replay_bytes`) it sent to each worker, so a stream that breaks can reconnect
// (ConnectBatchStream with the next batch id it wants) without losing or repeating a batch, as
// long as no more than that many were in flight; otherwise the reconnect is FAILED_PRECONDITION
// and the worker resumes by restarting the loader from the saved positions. A worker's new
// stream waits a few seconds for its earlier one to end (a replacement for a lost worker opens
// its stream before the loader has seen the old one go), then is FAILED_PRECONDITION.
//
// A lost loader heals: a server started with StartDeferred begins reading once every worker
// has opened its stream (or DataServerOptions::arrival_grace after the first one did). When each
// of them reports where it stands (its stream was open before, to the lost loader), every worker
// resumes from there; otherwise from `starts`. So a
// replacement loader, started with the job's usual flags on the same address, hands each worker
// the batch after the last one it received: no sample is skipped or repeated. Workers whose
// streams reconnect (StreamClientOptions::reconnect) ride it out within their batch timeout.
#ifndef HYREC_DATA_LOADER_DATA_SERVICE_H_
#define HYREC_DATA_LOADER_DATA_SERVICE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/security.h"
#include "hyrec/data_loader/loader.h"

namespace hyrec::data_loader {

// Security: with options.security on (the cluster's default) the loader speaks mTLS, and a
// worker's stream is served only to that worker's identity ("worker-1" streams worker 1's
// batches), so no other process can take its batches; Info is for any identity of the job.
struct DataServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // Must cover the batches in flight to a worker (its prefetch, its lookahead, the transport):
  // a reconnecting stream, or a replacement worker, asks again for batches it never trained.
  int replay_batches = 32;
  // And at least this many bytes of them: gRPC's flow-control windows and the socket buffers can
  // hold many more small batches than replay_batches.
  size_t replay_bytes = 64 << 20;
  // StartDeferred: how long after the first worker's stream the loader waits for the others'
  // before it reads for the workers that came (a lost worker's replacement may need its peers to
  // train first). A worker that comes later is read for from its start in `starts` up to the
  // batch it asks for, those before dropped.
  absl::Duration arrival_grace = absl::Seconds(5);
  int max_message_bytes = 512 << 20;
  SecurityOptions security;  // Off: plaintext, every caller trusted (in-process tests only).
  // Called on the RPC's thread when worker 0 says the job's workers are done (JobDone; worker 0
  // and admin only), before it is answered; a callback that stops the process must let
  // Shutdown's grace finish the answer. Empty: JobDone is answered and nothing else.
  std::function<void()> on_job_done;
  // Asked before Info is answered and before each batch is sent: an error (this process is no
  // longer the job's loader: OwnershipEpoch::CheckLease) answers UNAVAILABLE with its message, so
  // that the worker reconnects to the loader that is. Empty: always the job's loader.
  std::function<absl::Status()> check_owner;
};

// Makes the loader once the workers' starting positions are known (Loader::Start's `resume`).
using LoaderFactory = std::function<absl::StatusOr<std::unique_ptr<Loader>>(const std::vector<ReaderPosition>& starts)>;

class DataServer {
 public:
  // Serves a loader that is already reading; `starts` are where its streams began (empty: from
  // the beginning).
  static absl::StatusOr<std::unique_ptr<DataServer>> Start(std::unique_ptr<Loader> loader,
                                                           const LoaderOptions& loader_options,
                                                           const std::vector<ReaderPosition>& starts,
                                                           const DataServerOptions& options);
  // Serves at once and makes the loader with `make` when every worker has opened its stream, or
  // options.arrival_grace after the first one did: from the positions they report if all report
  // one, else from `starts` (empty: the beginning) for each worker that reported none or has not
  // come. A failure of `make` is the loader's failure.
  static absl::StatusOr<std::unique_ptr<DataServer>> StartDeferred(LoaderFactory make,
                                                                   const LoaderOptions& loader_options,
                                                                   const std::vector<ReaderPosition>& starts,
                                                                   const DataServerOptions& options);
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  int port() const;
  // The loader's failure (or its factory's); OK while it is healthy or not yet made.
  absl::Status status() const;
  // Zero until the loader is made.
  LoaderStats Stats() const;
  // Each worker's stream position at the loader (where a new loader would resume it, prefetched
  // batches included); the starting positions until the loader is made.
  std::vector<ReaderPosition> Positions() const;
  void Shutdown(absl::Duration grace);
  void Wait();

 private:
  struct Impl;
  explicit DataServer(std::unique_ptr<Impl> impl);
  static absl::StatusOr<std::unique_ptr<DataServer>> Serve(std::unique_ptr<Impl> impl,
                                                           const DataServerOptions& options);
  std::unique_ptr<Impl> impl_;
};

// What a worker's model takes: every batch it receives is checked against it before use.
struct BatchShape {
  int num_dense = -1;  // -1 (each): what the loader's Info says.
  int num_tables = -1;
  int num_shards = -1;
  // Per slot, its table; empty: the loader's slot count, each slot checked against the tables
  // whose inverse covers it.
  std::vector<int> slot_tables;
};

// Checks a decoded batch: field sizes (labels, dense, offsets, weights, inverses, shard
// offsets), offsets that start at 0, never decrease and end at the id count, inverse indices
// inside the table's unique ids, and the counts of `shape`. DATA_LOSS naming the batch, the
// field and the index otherwise.
absl::Status ValidateBatch(const Batch& batch, const BatchShape& shape);

// Decodes one BatchProto (proto/data.proto, serialized) and validates it against `shape`, whose
// -1 counts must have been resolved. What the client does with every message (and the fuzzer).
absl::Status DecodeBatchMessage(const std::string& bytes, const BatchShape& shape, Batch* batch);

struct StreamClientOptions {
  int prefetch_batches = 4;
  absl::Duration connect_timeout = absl::Seconds(10);
  int max_message_bytes = 512 << 20;
  // Global id of the first batch wanted; -1: from where the loader started this worker.
  int64_t next_batch = -1;
  // Where this worker's stream stands, sent to the loader (DataServer::StartDeferred); its
  // next_batch is the batch wanted. Unset: a first stream.
  std::optional<ReaderPosition> position;
  // A stream that the loader's failure or replacement broke (UNAVAILABLE, CANCELLED, ABORTED,
  // INTERNAL, UNKNOWN) is reopened at once, with backoff and within Next's timeout, reporting a
  // position prefetch_batches + 8 batches before the one after the last received, at most back to
  // where the first batch this stream received starts (so that a replaced loader can serve a lost
  // worker's replacement the batch it last trained); Next drops
  // the batches sent again; a loader not back within Next's timeout is DEADLINE_EXCEEDED, as any
  // batch that did not come. Errors the loader chose (end of data, DATA_LOSS, a refused
  // position) are returned as they are.
  bool reconnect = false;
  // What the worker's model takes; a loader whose Info disagrees is FAILED_PRECONDITION at
  // connect, a batch that disagrees DATA_LOSS.
  BatchShape expect;
  // mTLS to the loader (its certificate must name "loader-0") as this worker's identity.
  SecurityOptions security;
};

// JobDone to the loader at `address` as `security`'s identity (worker 0 or an admin), within
// `timeout`: the job's workers need it no more.
absl::Status TellLoaderJobDone(const std::string& address, const SecurityOptions& security, absl::Duration timeout);

// Connects worker `worker`'s stream. Fails within connect_timeout when the loader does not answer.
absl::StatusOr<std::unique_ptr<BatchStream>> ConnectBatchStream(const std::string& address, int worker,
                                                                const StreamClientOptions& options);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_DATA_SERVICE_H_
