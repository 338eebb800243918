// The rendezvous of a job's dense workers: the key-value store their c10d process group is built
// on, in place of c10d's TCPStore (which listens on every interface and admits anyone who
// reaches its port). Worker 0 hosts it on the plan's master address only, through RpcServer
// (mTLS with the job's certificates when security is on; only workers may call it); the other
// ranks reach it over gRPC, and worker 0 uses its table in-process. No LibTorch here:
// dense_sync.cc adapts it to c10d::Store.
//
//   RendezvousOptions options;
//   options.host = "10.0.0.5";  options.port = 29500;  options.timeout = absl::Seconds(60);
//   options.security = SecurityInDirectory("certs", {Role::kWorker, rank});
//   HYREC_ASSIGN_OR_RETURN(auto store, rank == 0 ? HostRendezvous(options) : JoinRendezvous(options));
//   HYREC_RETURN_IF_ERROR(store->Set("rank/1", "ready"));
//   HYREC_RETURN_IF_ERROR(store->Wait({"rank/0", "rank/1"}, absl::Seconds(60)));
//
// Every call has a deadline (`timeout`, or the wait's own): a dead or frozen host becomes
// DEADLINE_EXCEEDED or UNAVAILABLE, never a hang. Thread-safe.
#ifndef HYREC_SRC_NN_SYNC_RENDEZVOUS_H_
#define HYREC_SRC_NN_SYNC_RENDEZVOUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/security.h"

namespace hyrec::nn_sync {

struct RendezvousLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = 1 << 20;   // c10d's values are addresses and NCCL ids: bytes, not MBs.
  size_t max_total_bytes = 64 << 20;  // Keys and values together.
  size_t max_keys_per_call = 4096;    // Check and Wait.
};

struct RendezvousOptions {
  std::string host = "127.0.0.1";  // Worker 0's address (the plan's cluster.master host).
  int port = 29500;
  // This worker's identity's files. Under mTLS the host presents worker 0's certificate, the
  // others check that name and present their own; only workers are admitted.
  SecurityOptions security;
  absl::Duration timeout = absl::Seconds(60);  // Deadline of every call that does not wait.
  RendezvousLimits limits;
};

// What c10d's Store needs, as Status values.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  // INVALID_ARGUMENT or RESOURCE_EXHAUSTED when the key or value pass the limits.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits for the key for up to `timeout`: DEADLINE_EXCEEDED naming it otherwise.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Adds `delta` to the key's decimal integer value (0 when missing) and returns the sum;
  // INVALID_ARGUMENT when the value is not an integer.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Whether the key was there.
  virtual absl::StatusOr<bool> Delete(const std::string& key) = 0;
  // Whether every key is set, without waiting.
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;
  virtual absl::StatusOr<int64_t> NumKeys() = 0;
  // Waits until every key is set, for up to `timeout`: DEADLINE_EXCEEDED naming the missing ones.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;

  // The host's port (the one bound, when options.port was 0).
  virtual int port() const = 0;
};

// Worker 0: binds options.host:options.port (UNAVAILABLE when taken or not this machine's
// address) and serves the table until the returned object is destroyed; its own calls go to the
// table directly.
absl::StatusOr<std::unique_ptr<Rendezvous>> HostRendezvous(const RendezvousOptions& options);

// The other ranks: a client of worker 0's rendezvous. It connects lazily; each call waits for
// the host to come up within its deadline.
absl::StatusOr<std::unique_ptr<Rendezvous>> JoinRendezvous(const RendezvousOptions& options);

}  // namespace hyrec::nn_sync

#endif  // HYREC_SRC_NN_SYNC_RENDEZVOUS_H_
