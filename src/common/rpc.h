// The gRPC side of hyrec's services (docs/security.md): credentials from SecurityOptions, the
// caller's identity and role checks in handlers, and RpcServer, a gRPC server on a listener of
// its own. Include only from targets that link gRPC (hyrec_rpc).
//
//   ServerConfig config;
//   config.port = 0;
//   config.security = SecurityInDirectory("certs", {Role::kPs, 0});
//   HYREC_ASSIGN_OR_RETURN(auto server, RpcServer::Start(config, {&service}));
//   // In a handler:
//   HYREC_RETURN_IF_ERROR(authorizer.Allow(*context, {Role::kWorker}, "Update"));
//
// Why a listener of its own: gRPC's stops accepting for good after one accept() failure such as
// EMFILE, and it sets SO_REUSEPORT, so a second server on a taken port starts and shares it.
// RpcServer's accept loop backs off and retries on EMFILE/ENFILE, refuses connections that would
// leave fewer than `reserved_fds` descriptors for the process's files, binds without
// SO_REUSEPORT (a taken port is UNAVAILABLE), and hands each connection to gRPC.
#ifndef HYREC_SRC_COMMON_RPC_H_
#define HYREC_SRC_COMMON_RPC_H_

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "hyrec/common/keepalive.h"
#include "hyrec/common/security.h"

namespace hyrec::rpc {

// Checks that the files `security` names can be read (when enabled), so that a role with a
// missing certificate, key, token or secret fails at start-up naming the file.
absl::Status CheckSecurityFiles(const SecurityOptions& security);

// mTLS: the server's certificate, client certificates required and verified against the CA, the
// files reloaded as they change; an auth processor establishes each caller's identity (token,
// else certificate) before any handler runs. Insecure credentials when security is off.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const SecurityOptions& security);

// Credentials and channel arguments for reaching `server` (its certificate must name it, as
// "ps-1"); with a token file, the token is sent on every call.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const SecurityOptions& security);
void SetServerName(const SecurityOptions& security, const Identity& server, grpc::ChannelArguments* args);

// Arguments for a channel to `server`: its name for TLS (SetServerName), the process's
// keepalive (hyrec/common/keepalive.h), reconnection attempts and the name resolved again at
// least once a second, so that a peer back from a partition (or replaced at its name, on
// another address) is reached within a second of answering.
grpc::ChannelArguments ChannelArgumentsFor(const SecurityOptions& security, const Identity& server);

class ReloadingFile;

// Role checks for one service's handlers. The caller's identity is established again from the
// call (its token, else its certificate), as the auth processor did before admitting the call:
// gRPC shares one auth context between the calls of a connection, so nothing is written there.
class Authorizer {
 public:
  explicit Authorizer(const SecurityOptions& security);

  // The caller's identity; nullopt when security is off (every caller is trusted).
  std::optional<Identity> Peer(const grpc::ServerContext& context) const;

  // OK when security is off or the caller's role is one of `roles`; PERMISSION_DENIED naming the
  // method and the caller otherwise, UNAUTHENTICATED without an identity.
  absl::Status Allow(const grpc::ServerContext& context, std::initializer_list<Role> roles,
                     absl::string_view method) const;

  // OK when security is off, or the caller is worker `worker` (or admin, with `or_admin`):
  // a worker acts only as itself (its update ids, its batch stream). PERMISSION_DENIED naming
  // the method and the caller otherwise, UNAUTHENTICATED without an identity.
  absl::Status AllowWorker(const grpc::ServerContext& context, int64_t worker, bool or_admin,
                           absl::string_view method) const;

  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::shared_ptr<ReloadingFile> secret_;  // Null: tokens are refused.
};

// Lets through at most `burst` log lines per `interval` (thread-safe), so that a flood of bad
// calls costs the log a few lines, not a line each.
class LogLimiter {
 public:
  explicit LogLimiter(int burst = 10, absl::Duration interval = absl::Seconds(10))
      : burst_(burst), interval_(interval) {}
  bool Admit();

 private:
  const int burst_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int admitted_ ABSL_GUARDED_BY(mu_) = 0;
};

// Routes gRPC's own log lines (gpr_log: failed TLS handshakes, broken connections) into spdlog's
// default logger, at most 10 per source line per 10 s; the others are counted and summed up
// in one line when that line's window turns. With the roles' asynchronous logger no gRPC thread
// then waits on a slow or unread stderr. A failed gRPC assertion is still written at once.
void RouteGrpcLogs();
// gRPC log lines held back since the process started.
uint64_t SuppressedGrpcLogLines();

inline constexpr int kDefaultServerThreads = 64;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port, reported by port().
  SecurityOptions security;
  // Threads kept waiting for calls (the sync server's most pollers). A call that finds none
  // waiting starts a thread, which ends after its call when this many already wait: a burst of
  // calls that block (a PS's Updates waiting for their log's sync) beyond it creates and ends
  // a thread each. 0: kDefaultServerThreads. Idle threads cost their stacks only.
  int threads = 0;
  int max_message_bytes = 256 << 20;
  int max_concurrent_streams = 64;                         // Per connection.
  absl::Duration handshake_timeout = absl::Seconds(10);    // TLS and HTTP/2 set-up of a new connection.
  absl::Duration max_connection_idle = absl::Minutes(10);  // A connection with no calls is closed.
  int reserved_fds = 64;  // Descriptors kept free of connections, for files and outgoing calls.
};

class RpcServer {
 public:
  // Binds, builds the gRPC server with `services` and starts accepting. UNAVAILABLE when the
  // address cannot be bound (taken, or not this machine's).
  static absl::StatusOr<std::unique_ptr<RpcServer>> Start(const ServerConfig& config,
                                                          const std::vector<grpc::Service*>& services);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  int port() const { return port_; }

  // Stops accepting, lets in-flight calls finish for up to `grace`, then cancels them.
  void Shutdown(absl::Duration grace);
  void Wait();

  // accept() failures (EMFILE, ENFILE, ...) the listener backed off from, and connections closed
  // because the process was short of descriptors.
  uint64_t accept_errors() const { return accept_errors_.load(std::memory_order_relaxed); }
  uint64_t refused_connections() const { return refused_connections_.load(std::memory_order_relaxed); }

 private:
  RpcServer() = default;
  void AcceptLoop();

  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};
  int port_ = 0;
  int fd_limit_ = 0;
  int unacked_timeout_ms_ = 0;  // TCP_USER_TIMEOUT of accepted connections; 0: the kernel's.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> accept_errors_{0};
  std::atomic<uint64_t> refused_connections_{0};
  std::unique_ptr<std::thread> accept_thread_;
};

}  // namespace hyrec::rpc

#endif  // HYREC_SRC_COMMON_RPC_H_
