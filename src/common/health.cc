#include "hyrec/common/health.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "health.grpc.pb.h"

namespace hyrec {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext*, const HealthCheckRequest* request, HealthCheckResponse* response) override {
    if (!request->service().empty()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
    response->set_status(serving_.load() ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }
  void SetServing(bool serving) { serving_.store(serving); }

 private:
  std::atomic<bool> serving_{false};
};

// The host part of a gRPC listening address: IPv6 literals go in brackets.
std::string ListenAddress(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace

struct HealthServer::Impl {
  HealthService service;
  std::unique_ptr<grpc::Server> server;
};

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const HealthOptions& options) {
  std::unique_ptr<HealthServer> health(new HealthServer());
  health->impl_ = std::make_unique<Impl>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(ListenAddress(options.host, options.port), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&health->impl_->service);
  // A probe is one small call at a time: one polling thread is plenty.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  health->impl_->server = builder.BuildAndStart();
  if (health->impl_->server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("the health port ", ListenAddress(options.host, options.port),
                                               " cannot be bound (--health_host, --health_port)"));
  }
  health->port_ = port;
  return health;
}

HealthServer::~HealthServer() {
  if (impl_ != nullptr && impl_->server != nullptr) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    impl_->server->Wait();
  }
}

void HealthServer::SetServing(bool serving) { impl_->service.SetServing(serving); }

absl::Status CheckHealth(const std::string& address, double timeout_seconds) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, HealthCheckRequest(), &response);
  if (!status.ok()) return absl::UnavailableError(absl::StrCat(address, ": ", status.error_message()));
  if (response.status() != HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(address, ": NOT_SERVING"));
  }
  return absl::OkStatus();
}

}  // namespace hyrec
