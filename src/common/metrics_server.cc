#include "hyrec/common/metrics_server.h"

#include <thread>

#include "absl/strings/str_cat.h"

#ifdef HYREC_HAVE_HTTPLIB
#include <httplib.h>

namespace hyrec {
namespace {

class HttplibMetricsServer final : public MetricsHttpServer {
 public:
  HttplibMetricsServer(MetricsRegistry* registry, AdminAction checkpoint) : registry_(registry) {
    // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would let a second
    // process share (and silently split) the port instead of failing to bind.
    server_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
    });
    server_.set_read_timeout(2, 0);
    server_.set_write_timeout(2, 0);
    server_.set_keep_alive_timeout(2);
    server_.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
      response.set_content(registry_->Render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    if (checkpoint.run) {
      // Before routing: a POST without a body (no Content-Length, as `curl -X POST` sends it)
      // would otherwise be refused with a bare 400 before any handler sees it.
      server_.set_pre_routing_handler([checkpoint](const httplib::Request& request, httplib::Response& response) {
        if (request.method != "POST" || request.path != "/checkpoint")
          return httplib::Server::HandlerResponse::Unhandled;
        if (checkpoint.authorize) {
          const absl::Status allowed = checkpoint.authorize(request.get_header_value("Authorization"));
          if (!allowed.ok()) {
            response.status = absl::IsUnauthenticated(allowed) ? 401 : 403;
            response.set_content(std::string(allowed.message()) + "\n", "text/plain; charset=utf-8");
            return httplib::Server::HandlerResponse::Handled;
          }
        }
        response.status = 202;
        response.set_content(checkpoint.run(), "text/plain; charset=utf-8");
        return httplib::Server::HandlerResponse::Handled;
      });
    }
  }
  ~HttplibMetricsServer() override { Stop(); }

  absl::Status Bind(const std::string& host, int port) {
    port_ = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ <= 0) {
      return absl::UnavailableError(absl::StrCat("metrics endpoint: cannot bind ", host, ":", port));
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  void Stop() override {
    if (thread_.joinable()) {
      server_.stop();
      thread_.join();
    }
  }

 private:
  static constexpr size_t kThreads = 64;

  MetricsRegistry* registry_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host, int port,
                                                                            MetricsRegistry* registry,
                                                                            AdminAction checkpoint) {
  if (port < 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is out of range"));
  auto server = std::make_unique<HttplibMetricsServer>(registry, std::move(checkpoint));
  absl::Status s = server->Bind(host, port);
  if (!s.ok()) return s;
  return std::unique_ptr<MetricsHttpServer>(std::move(server));
}

}  // namespace hyrec

#else  // Configured with -DHYREC_WITH_HTTP=OFF.

namespace hyrec {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string&, int, MetricsRegistry*,
                                                                            AdminAction) {
  return absl::UnimplementedError("this build has no metrics endpoint (configured with -DHYREC_WITH_HTTP=OFF)");
}

}  // namespace hyrec

#endif
