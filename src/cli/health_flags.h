// --health_host and --health_port: a role's grpc.health.v1 endpoint (hyrec/common/health.h),
// which Kubernetes' grpc probes call. Off unless --health_port is given.
#ifndef HYREC_SRC_CLI_HEALTH_FLAGS_H_
#define HYREC_SRC_CLI_HEALTH_FLAGS_H_

#include <iostream>
#include <memory>
#include <string>

#include "hyrec/common/flags.h"
#include "hyrec/common/health.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::cli {

struct HealthFlags {
  std::string host = "127.0.0.1";
  int port = -1;  // -1: no health endpoint; 0: any free port (printed).
};

inline void AddHealthFlags(FlagSet& flags, HealthFlags* f) {
  flags.String("health_host", &f->host, "HOST", "Address the grpc.health.v1 endpoint binds (plaintext).");
  flags.Int("health_port", &f->port,
            "Serve grpc.health.v1 (Kubernetes grpc probes) on this port: SERVING once the role is ready "
            "(0: any free port, printed; -1: off).",
            -1, 65535);
}

// The endpoint, NOT_SERVING, or null when --health_port is -1. `role` names it in the line
// printed with the port.
inline absl::StatusOr<std::unique_ptr<HealthServer>> MaybeServeHealth(const HealthFlags& f, const std::string& role) {
  if (f.port < 0) return std::unique_ptr<HealthServer>();
  HYREC_ASSIGN_OR_RETURN(auto health, HealthServer::Start(HealthOptions{f.host, f.port}));
  std::cout << role << " health on " << f.host << ":" << health->port() << std::endl;
  return health;
}

// Sets the endpoint's status when there is one.
inline void SetServing(HealthServer* health, bool serving) {
  if (health != nullptr) health->SetServing(serving);
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_HEALTH_FLAGS_H_
