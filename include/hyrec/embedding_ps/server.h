// EmbeddingServer: serves one EmbeddingShardStore over gRPC (proto/embedding.proto).
//
//   StoreOptions store_options;
//   store_options.tables = {TableConfig{"user", 16}};
//   HYREC_ASSIGN_OR_RETURN(std::shared_ptr<EmbeddingShardStore> store, EmbeddingShardStore::Create(store_options));
//   ServerOptions options;
//   options.port = 0;  // ephemeral; read it back with port()
//   HYREC_ASSIGN_OR_RETURN(auto server, EmbeddingServer::Start(store, options));
//   std::cout << "listening on " << server->port() << "\n";
//   ...
//   server->Shutdown(absl::Seconds(5));
//
// With security on (the cluster's default), the server speaks mTLS and each call is checked
// against the caller's identity before its handler reads the request: Update is for workers, and
// only with their own worker id; Lookup for workers and admin; BeginCut/AwaitCut for worker 0
// (which runs the job's cuts) and admin; Stats and Health for any identity of the job.
//
// Every request is validated before anything is allocated or created for it: an unknown table
// is NOT_FOUND; a byte field of the wrong length, an unknown precision or a NaN/Inf gradient is
// INVALID_ARGUMENT; a request over max_ids_per_request, or a Lookup whose answer would pass
// max_message_bytes, is RESOURCE_EXHAUSTED. A refused request changes nothing and the server goes
// on serving. BeginCut/AwaitCut take checkpoints and deltas of the store (shard_checkpoint.h),
// written only under the options' roots. Thread safety: Shutdown and Wait may be called from any
// thread.
#ifndef HYREC_EMBEDDING_PS_SERVER_H_
#define HYREC_EMBEDDING_PS_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/security.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/update_log.h"

namespace hyrec::embedding_ps {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;         // 0: an ephemeral port, reported by port().
  int threads = 0;      // gRPC threads kept waiting for calls; 0: 64 (rpc::ServerConfig::threads).
  int shard_index = 0;  // This server's position among num_shards PS shards.
  int num_shards = 1;
  uint64_t max_ids_per_request = 1 << 22;
  int max_message_bytes = 256 << 20;
  // Where BeginCut writes (a request names only a directory under one of these); empty roots
  // refuse cuts of that kind with FAILED_PRECONDITION.
  std::string checkpoint_root;
  std::string export_root;
  // mTLS and identities; off: plaintext, every caller trusted (in-process tests only).
  SecurityOptions security;
  // The shard's update log (update_log.h): each Update is appended (durably, as its sync policy
  // says) before it is applied and acknowledged, and each checkpoint cut opens a new segment and
  // truncates the segments before the newest committed checkpoint. Null: no log; the shard's
  // lineage is then its incarnation (a restart loses its state).
  std::shared_ptr<UpdateLog> update_log;
  // Called on the RPC's thread when worker 0 says the job's workers are done (JobDone; worker 0
  // and admin only), before it is answered; a callback that stops the process must let Shutdown's
  // grace finish the answer. Empty: JobDone is answered and nothing else.
  std::function<void()> on_job_done;
};

class EmbeddingServer {
 public:
  // Binds and starts serving. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<EmbeddingServer>> Start(std::shared_ptr<EmbeddingShardStore> store,
                                                                const ServerOptions& options);

  ~EmbeddingServer();
  EmbeddingServer(const EmbeddingServer&) = delete;
  EmbeddingServer& operator=(const EmbeddingServer&) = delete;

  int port() const;
  uint64_t accept_errors() const;        // accept() failures the listener backed off from.
  uint64_t refused_connections() const;  // Connections closed for want of descriptors.

  // Stops accepting requests, lets in-flight ones finish for up to `grace`, then cancels them.
  void Shutdown(absl::Duration grace);

  // Blocks until the server has shut down.
  void Wait();

 private:
  struct Impl;
  explicit EmbeddingServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_SERVER_H_
