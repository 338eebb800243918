// PsCluster: PS shards as real `hyrec-ps` processes on this machine, for the one-machine cluster
// topology (`--processes`), the demo, integration tests and benchmarks.
//
//   PsClusterOptions options;
//   options.binary = "build/hyrec-ps";
//   options.num_shards = 2;
//   options.args = {"--tables=user:16:adagrad", "--capacity_rows=1000000"};   // or job_config
//   HYREC_ASSIGN_OR_RETURN(auto cluster, PsCluster::Launch(options));
//   HYREC_ASSIGN_OR_RETURN(auto client, ConnectEmbeddingClient(cluster->addresses(), ClientOptions()));
//
// Each shard binds an ephemeral port on `host` and reports it on stdout. The destructor stops
// every shard (SIGTERM, then SIGKILL after stop_timeout).
#ifndef HYREC_EMBEDDING_PS_PS_CLUSTER_H_
#define HYREC_EMBEDDING_PS_PS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/subprocess.h"

namespace hyrec::embedding_ps {

struct PsClusterOptions {
  std::string binary;  // Path of hyrec-ps.
  // The job file every shard serves (`--config`, with its --shard_index); its ps.shards must be
  // num_shards. Empty: `args` give the tables (`--tables`), and --num_shards is passed.
  std::string job_config;
  int num_shards = 1;
  std::vector<std::string> args;  // Passed to every shard (tables, capacity, log level...).
  // The certificates (hyrec certs) the shards serve mTLS with (--certs). Empty: the job's
  // security section, or, without a job, plaintext (--security=none: loopback tests only).
  std::string certs;
  std::string host = "127.0.0.1";
  absl::Duration start_timeout = absl::Seconds(30);
  absl::Duration stop_timeout = absl::Seconds(5);
};

class PsCluster {
 public:
  static absl::StatusOr<std::unique_ptr<PsCluster>> Launch(const PsClusterOptions& options);
  ~PsCluster();
  PsCluster(const PsCluster&) = delete;
  PsCluster& operator=(const PsCluster&) = delete;

  const std::vector<std::string>& addresses() const { return addresses_; }
  Subprocess& shard(int index) { return *shards_[index]; }

  // SIGTERM to every running shard; OK when all exit 0 within stop_timeout.
  absl::Status Stop();

 private:
  explicit PsCluster(PsClusterOptions options) : options_(std::move(options)) {}
  PsClusterOptions options_;
  std::vector<std::unique_ptr<Subprocess>> shards_;
  std::vector<std::string> addresses_;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_PS_CLUSTER_H_
