// HealthServer: the gRPC Health Checking Protocol (grpc.health.v1.Health/Check) on a port of its
// own, in plaintext, for Kubernetes' `grpc:` readiness, liveness and startup probes (a probe
// presents no client certificate, so it cannot reach a role's mTLS service).
//
//   HYREC_ASSIGN_OR_RETURN(auto health, HealthServer::Start({"10.0.3.7", 8081}));
//   ... restore the shard ...
//   health->SetServing(true);    // readiness passes from now on
//
// The answer is SERVING or NOT_SERVING for the empty service name (the whole role) and NOT_FOUND
// for any other; nothing else about the role is served. A role reports NOT_SERVING until it is
// ready for its peers (a PS shard: restored and listening) and again while it shuts down.
// Thread-safe.
#ifndef HYREC_COMMON_HEALTH_H_
#define HYREC_COMMON_HEALTH_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace hyrec {

struct HealthOptions {
  std::string host = "127.0.0.1";  // A name or an address; "0.0.0.0" for every interface.
  int port = 0;                    // 0: an ephemeral port, reported by port().
};

class HealthServer {
 public:
  // Listening on options.host:options.port, NOT_SERVING. Unavailable when the port is taken.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const HealthOptions& options);
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  void SetServing(bool serving);
  int port() const { return port_; }

  struct Impl;

 private:
  HealthServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// One Check of the server at `address` ("host:port") within `timeout`: OK when it answers
// SERVING, Unavailable (NOT_SERVING, or no answer) otherwise. What a kubelet's probe does.
absl::Status CheckHealth(const std::string& address, double timeout_seconds);

}  // namespace hyrec

#endif  // HYREC_COMMON_HEALTH_H_
