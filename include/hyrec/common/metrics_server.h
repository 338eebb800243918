// MetricsHttpServer: serves a MetricsRegistry as a Prometheus scrape target.
//
//   MetricsRegistry metrics;
//   HYREC_ASSIGN_OR_RETURN(auto server, MetricsHttpServer::Start("0.0.0.0", 9090, &metrics));
//   // GET http://host:9090/metrics -> metrics.Render(), text/plain; version=0.0.4
//   server->Stop();   // also on destruction
//
// Port 0 picks a free port (server->port() says which). The server runs on threads of its own
// (cpp-httplib from Debian) and renders the registry (running its collectors) at each scrape. Unknown paths answer 404;
// only GET and HEAD are served, and POST /checkpoint when the server was given an `on_checkpoint` action (a training
// role's admin request: a checkpoint at the next step; it answers 202 with the action's text). Reads and writes of a
// connection time out after 5 s, so a stuck scraper cannot hold a thread forever.
#ifndef HYREC_COMMON_METRICS_SERVER_H_
#define HYREC_COMMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hyrec/common/metrics.h"

namespace hyrec {

class MetricsHttpServer {
 public:
  // Binds host:port and starts serving; UNAVAILABLE when the address cannot be bound.
  // `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  MetricsRegistry* registry,
                                                                  std::function<std::string()> on_checkpoint = {});
  virtual ~MetricsHttpServer() = default;
  virtual int port() const = 0;
  virtual void Stop() = 0;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_METRICS_SERVER_H_
