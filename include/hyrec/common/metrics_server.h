// MetricsHttpServer: serves a MetricsRegistry as a Prometheus scrape target.
//
//   MetricsRegistry metrics;
//   HYREC_ASSIGN_OR_RETURN(auto server, MetricsHttpServer::Start("127.0.0.1", 9090, &metrics));
//   // GET http://host:9090/metrics -> metrics.Render(), text/plain; version=0.0.4
//   server->Stop();   // also on destruction
//
// Port 0 picks a free port (server->port() says which). The server runs on threads of its own
// (cpp-httplib from Debian) and renders the registry (running its collectors) at each scrape.
// Unknown paths answer 404; only GET and HEAD are served, and POST /checkpoint when the server was
// given an AdminAction (a training role's checkpoint at the next step; it answers 202 with the
// action's text, or 401/403 when the action's `authorize` refuses the request's Authorization
// header). A connection's reads and writes time out after 2 s and a pool of 64 threads serves
// them, so slow or stuck clients cannot keep a scrape waiting.
#ifndef HYREC_COMMON_METRICS_SERVER_H_
#define HYREC_COMMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hyrec/common/metrics.h"

namespace hyrec {

// What POST /checkpoint does.
struct AdminAction {
  std::function<std::string()> run;  // Empty: no POST /checkpoint (404).
  // Checks the request's Authorization header before `run`: UNAUTHENTICATED answers 401, any
  // other error 403, and nothing runs. Empty: every request may.
  std::function<absl::Status(const std::string& authorization)> authorize;
};

class MetricsHttpServer {
 public:
  // Binds host:port and starts serving; UNAVAILABLE when the address cannot be bound.
  // `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  MetricsRegistry* registry,
                                                                  AdminAction checkpoint = {});
  virtual ~MetricsHttpServer() = default;
  virtual int port() const = 0;
  virtual void Stop() = 0;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_METRICS_SERVER_H_
