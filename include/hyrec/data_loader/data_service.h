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
// the last `replay_batches` batches it sent to each worker, so a stream that breaks can reconnect
// (ConnectBatchStream with the next batch id it wants) without losing or repeating a batch, as
// long as no more than that many were in flight; otherwise the reconnect is FAILED_PRECONDITION
// and the worker resumes by restarting the loader from the saved positions.
#ifndef HYREC_DATA_LOADER_DATA_SERVICE_H_
#define HYREC_DATA_LOADER_DATA_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/data_loader/loader.h"

namespace hyrec::data_loader {

struct DataServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;
  int replay_batches = 16;  // Must cover the batches in flight (client prefetch + transport).
  int max_message_bytes = 512 << 20;
};

class DataServer {
 public:
  static absl::StatusOr<std::unique_ptr<DataServer>> Start(std::unique_ptr<Loader> loader,
                                                           const LoaderOptions& loader_options,
                                                           const std::vector<ReaderPosition>& starts,
                                                           const DataServerOptions& options);
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  int port() const;
  void Shutdown(absl::Duration grace);
  void Wait();

 private:
  struct Impl;
  explicit DataServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct StreamClientOptions {
  int prefetch_batches = 4;
  absl::Duration connect_timeout = absl::Seconds(10);
  int max_message_bytes = 512 << 20;
  // Global id of the first batch wanted; -1: from where the loader started this worker.
  int64_t next_batch = -1;
};

// Connects worker `worker`'s stream. Fails within connect_timeout when the loader does not answer.
absl::StatusOr<std::unique_ptr<BatchStream>> ConnectBatchStream(const std::string& address, int worker,
                                                                const StreamClientOptions& options);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_DATA_SERVICE_H_
