#include "src/common/rpc.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "grpc/support/log.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/env.h"
#include "hyrec/common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace hyrec::rpc {
namespace {

constexpr uint64_t kMaxSecurityFileBytes = 1 << 20;

}  // namespace

// A small file (token, secret) read again when its modification time changes, checked at most
// once per `interval`.
class ReloadingFile {
 public:
  ReloadingFile(std::string path, absl::Duration interval) : path_(std::move(path)), interval_(interval) {}

  absl::StatusOr<std::string> Get() {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now < next_check_ && value_.ok()) return value_;
    next_check_ = now + interval_;
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) {
      value_ = absl::UnauthenticatedError(absl::StrCat("cannot read ", path_, ": ", std::strerror(errno)));
      return value_;
    }
    if (value_.ok() && st.st_mtim.tv_sec == mtime_.tv_sec && st.st_mtim.tv_nsec == mtime_.tv_nsec &&
        st.st_size == size_) {
      return value_;
    }
    absl::StatusOr<std::string> text = ReadFileToString(Env::Default(), path_, kMaxSecurityFileBytes);
    if (!text.ok()) {
      value_ = absl::UnauthenticatedError(absl::StrCat("cannot read ", path_, ": ", text.status().message()));
      return value_;
    }
    const std::string trimmed(absl::StripAsciiWhitespace(*text));
    if (trimmed.empty()) {
      value_ = absl::UnauthenticatedError(absl::StrCat(path_, " is empty"));
      return value_;
    }
    value_ = trimmed;
    mtime_ = st.st_mtim;
    size_ = st.st_size;
    return value_;
  }

 private:
  const std::string path_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::StatusOr<std::string> value_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not read yet");
  struct timespec mtime_ ABSL_GUARDED_BY(mu_) {};
  off_t size_ ABSL_GUARDED_BY(mu_) = -1;
};

namespace {

// The caller's identity: from its bearer token when it sends one (a bad token is refused,
// whatever the certificate), else from its certificate's common name.
absl::StatusOr<Identity> CallerIdentity(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                                        const grpc::AuthContext& context, ReloadingFile* secret) {
  auto header = metadata.find("authorization");
  if (header != metadata.end()) {
    if (secret == nullptr) return absl::UnauthenticatedError("this server accepts no tokens (no token secret)");
    absl::StatusOr<std::string> key = secret->Get();
    if (!key.ok()) return absl::UnauthenticatedError("the server cannot read its token secret");
    return VerifyBearerToken(*key, absl::string_view(header->second.data(), header->second.size()), absl::Now());
  }
  const std::vector<grpc::string_ref> names = context.FindPropertyValues("x509_common_name");
  if (names.empty()) return absl::UnauthenticatedError("the caller presented no certificate and no token");
  absl::StatusOr<Identity> identity = ParseIdentityName(absl::string_view(names[0].data(), names[0].size()));
  if (!identity.ok()) return absl::UnauthenticatedError(identity.status().message());
  return identity;
}

std::shared_ptr<ReloadingFile> SecretFile(const SecurityOptions& security) {
  if (security.token_secret_file.empty()) return nullptr;
  return std::make_shared<ReloadingFile>(security.token_secret_file, security.reload_interval);
}

// Admits only calls whose caller has an identity of the job, before any handler runs.
class IdentityProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit IdentityProcessor(const SecurityOptions& security) : secret_(SecretFile(security)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    absl::StatusOr<Identity> identity = CallerIdentity(metadata, *context, secret_.get());
    if (!identity.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(identity.status().message()));
    }
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<ReloadingFile> secret_;
};

class TokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(const SecurityOptions& security) : token_(security.token_file, security.reload_interval) {}

  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    absl::StatusOr<std::string> token = token_.Get();
    if (!token.ok()) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(token.status().message()));
    metadata->insert({"authorization", "Bearer " + *token});
    return grpc::Status::OK;
  }

 private:
  ReloadingFile token_;
};

unsigned RefreshSeconds(const SecurityOptions& security) {
  return static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(security.reload_interval)));
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(const SecurityOptions& security) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      security.key_file, security.cert_file, security.ca_file, RefreshSeconds(security));
}

absl::Status CheckFile(const std::string& path, absl::string_view what, bool pem) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("no ", what, " file given"));
  absl::StatusOr<std::string> text = ReadFileToString(Env::Default(), path, kMaxSecurityFileBytes);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path, ": ", text.status().message()));
  }
  if (pem && !absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", path, " is not a PEM file"));
  }
  if (!pem && absl::StripAsciiWhitespace(*text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", path, " is empty"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSecurityFiles(const SecurityOptions& security) {
  if (!security.enabled) return absl::OkStatus();
  absl::Status status = CheckFile(security.ca_file, "CA certificate", true);
  if (status.ok()) status = CheckFile(security.cert_file, "certificate", true);
  if (status.ok()) status = CheckFile(security.key_file, "private key", true);
  if (status.ok() && !security.token_file.empty()) status = CheckFile(security.token_file, "token", false);
  if (status.ok() && !security.token_secret_file.empty()) {
    status = CheckFile(security.token_secret_file, "token secret", false);
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(status.message(), " (hyrec certs writes a job's files)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const SecurityOptions& security) {
  if (!security.enabled) return grpc::InsecureServerCredentials();
  absl::Status files = CheckSecurityFiles(security);
  if (!files.ok()) return files;
  grpc::experimental::TlsServerCredentialsOptions options(Provider(security));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::experimental::TlsServerCredentials(options);
  if (credentials == nullptr) return absl::InternalError("cannot build the server's TLS credentials");
  credentials->SetAuthMetadataProcessor(std::make_shared<IdentityProcessor>(security));
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const SecurityOptions& security) {
  if (!security.enabled) return grpc::InsecureChannelCredentials();
  absl::Status files = CheckSecurityFiles(security);
  if (!files.ok()) return files;
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(security));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::experimental::TlsCredentials(options);
  if (credentials == nullptr) return absl::InternalError("cannot build the client's TLS credentials");
  if (security.token_file.empty()) return credentials;
  return grpc::CompositeChannelCredentials(
      credentials, grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenPlugin>(security)));
}

void SetServerName(const SecurityOptions& security, const Identity& server, grpc::ChannelArguments* args) {
  if (security.enabled) args->SetSslTargetNameOverride(IdentityName(server));
}

namespace {
std::atomic<int64_t> keepalive_ms{absl::ToInt64Milliseconds(kDefaultKeepalive)};
}  // namespace

}  // namespace hyrec::rpc

namespace hyrec {

void SetKeepalive(absl::Duration timeout) {
  rpc::keepalive_ms.store(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
}

absl::Duration Keepalive() { return absl::Milliseconds(rpc::keepalive_ms.load()); }

}  // namespace hyrec

namespace hyrec::rpc {

grpc::ChannelArguments ChannelArgumentsFor(const SecurityOptions& security, const Identity& server) {
  grpc::ChannelArguments args;
  SetServerName(security, server, &args);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A name is resolved again at most once a second (not gRPC's 30 s) when its connection fails.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  const int64_t keepalive = keepalive_ms.load();
  if (keepalive > 0) {
    const int half = static_cast<int>(std::max<int64_t>(1, keepalive / 2));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, half);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, half);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    // Pings go on while a stream sends nothing (a paused batch stream), not two and then none.
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  return args;
}

Authorizer::Authorizer(const SecurityOptions& security)
    : enabled_(security.enabled), secret_(security.enabled ? SecretFile(security) : nullptr) {}

std::optional<Identity> Authorizer::Peer(const grpc::ServerContext& context) const {
  if (!enabled_) return std::nullopt;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return std::nullopt;
  absl::StatusOr<Identity> identity = CallerIdentity(context.client_metadata(), *auth, secret_.get());
  if (!identity.ok()) return std::nullopt;
  return *identity;
}

absl::Status Authorizer::Allow(const grpc::ServerContext& context, std::initializer_list<Role> roles,
                               absl::string_view method) const {
  if (!enabled_) return absl::OkStatus();
  const std::optional<Identity> peer = Peer(context);
  if (!peer.has_value()) return absl::UnauthenticatedError(absl::StrCat(method, ": the caller has no identity"));
  for (Role role : roles) {
    if (peer->role == role) return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (Role role : roles) names.emplace_back(RoleName(role));
  return absl::PermissionDeniedError(
      absl::StrCat(method, " is for ", absl::StrJoin(names, " or "), "; the caller is ", IdentityName(*peer)));
}

namespace {

struct GrpcLogWindow {
  absl::Time start = absl::InfinitePast();
  int admitted = 0;
  uint64_t held = 0;  // Held back in this window.
};

absl::Mutex grpc_log_mu(absl::kConstInit);
std::atomic<uint64_t> grpc_log_suppressed{0};

absl::flat_hash_map<std::pair<const char*, int>, GrpcLogWindow>& GrpcLogWindows()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(grpc_log_mu) {
  static auto* windows = new absl::flat_hash_map<std::pair<const char*, int>, GrpcLogWindow>();
  return *windows;
}

void LogGrpcLine(gpr_log_func_args* args) {
  constexpr int kBurst = 10;
  constexpr absl::Duration kInterval = absl::Seconds(10);
  const char* file = args->file != nullptr ? args->file : "?";
  const char* message = args->message != nullptr ? args->message : "";
  if (absl::StartsWith(message, "assertion failed")) {  // An abort follows: no queue.
    std::fprintf(stderr, "grpc %s:%d: %s\n", file, args->line, message);
    return;
  }
  uint64_t held = 0;
  {
    absl::MutexLock lock(&grpc_log_mu);
    GrpcLogWindow& w = GrpcLogWindows()[{args->file, args->line}];
    const absl::Time now = absl::Now();
    if (now - w.start >= kInterval) {
      held = w.held;
      w = GrpcLogWindow{now, 0, 0};
    }
    if (w.admitted >= kBurst) {
      ++w.held;
      grpc_log_suppressed.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    ++w.admitted;
  }
  const spdlog::level::level_enum level = args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::warn
                                          : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                                                    : spdlog::level::debug;
  const char* base = std::strrchr(file, '/');
  if (SaysCertificateNotSignedByCa(message)) {
    // A peer of another CA (another job's, or certificates made again): said in words.
    spdlog::warn(
        "a TLS peer's certificate is not signed by this job's CA (or it refused ours), so the connection "
        "was refused (grpc {}:{}: {})",
        base ? base + 1 : file, args->line, message);
    return;
  }
  if (held > 0)
    spdlog::log(level, "grpc {}:{}: {} more like the next were held back", base ? base + 1 : file, args->line, held);
  spdlog::log(level, "grpc {}:{}: {}", base ? base + 1 : file, args->line, message);
}

}  // namespace

void RouteGrpcLogs() { gpr_set_log_function(LogGrpcLine); }

uint64_t SuppressedGrpcLogLines() { return grpc_log_suppressed.load(std::memory_order_relaxed); }

bool LogLimiter::Admit() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - window_start_ >= interval_) {
    window_start_ = now;
    admitted_ = 0;
  }
  return admitted_++ < burst_;
}

absl::Status Authorizer::AllowWorker(const grpc::ServerContext& context, int64_t worker, bool or_admin,
                                     absl::string_view method) const {
  if (!enabled_) return absl::OkStatus();
  const std::optional<Identity> peer = Peer(context);
  if (!peer.has_value()) return absl::UnauthenticatedError(absl::StrCat(method, ": the caller has no identity"));
  if (or_admin && peer->role == Role::kAdmin) return absl::OkStatus();
  if (peer->role == Role::kWorker && peer->index == worker) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(method, " as worker ", worker, " is for worker-", worker,
                                                  or_admin ? " or admin" : "", "; the caller is ", IdentityName(*peer),
                                                  " (a worker acts only as itself)"));
}

// ---- RpcServer ----

absl::StatusOr<std::unique_ptr<RpcServer>> RpcServer::Start(const ServerConfig& config,
                                                            const std::vector<grpc::Service*>& services) {
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", config.port, " out of range"));
  }
  auto server = std::unique_ptr<RpcServer>(new RpcServer());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(config.security);
  if (!credentials.ok()) return credentials.status();

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(config.port);
  const int resolved =
      getaddrinfo(config.host.empty() ? nullptr : config.host.c_str(), port_text.c_str(), &hints, &found);
  if (resolved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host '", config.host, "': ", gai_strerror(resolved)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && server->listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // Not SO_REUSEPORT: a taken port fails.
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    server->listen_fd_ = fd;
  }
  freeaddrinfo(found);
  const std::string address = absl::StrCat(config.host, ":", config.port);
  if (server->listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  server->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  server->fd_limit_ = limit.rlim_cur == RLIM_INFINITY ? (1 << 20) : static_cast<int>(limit.rlim_cur);
  server->fd_limit_ -= std::max(0, config.reserved_fds);
  if (::pipe2(server->wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }

  grpc::ServerBuilder builder;
  server->acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, *credentials);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(config.max_message_bytes);
  builder.SetMaxSendMessageSize(config.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(config.handshake_timeout)));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(config.max_connection_idle)));
  if (const int64_t keepalive = keepalive_ms.load(); keepalive > 0) {
    // The server pings its clients as they ping it (a worker lost while it holds a batch stream
    // is noticed), and takes their pings at any rate and without calls: a client's keepalive is
    // never answered with GOAWAY "too many pings".
    const int half = static_cast<int>(std::max<int64_t>(1, keepalive / 2));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, half);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, half);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    server->unacked_timeout_ms_ = half;
  }
  const int threads = config.threads > 0 ? config.threads : kDefaultServerThreads;
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, threads);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot start the server on ", address));
  RpcServer* raw = server.get();
  server->accept_thread_ = std::make_unique<std::thread>([raw] { raw->AcceptLoop(); });
  return server;
}

void RpcServer::AcceptLoop() {
  absl::Duration backoff = absl::Milliseconds(10);
  absl::Time next_log = absl::InfinitePast();
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (stopping_.load()) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the pending connection waits in the backlog; try again.
      accept_errors_.fetch_add(1, std::memory_order_relaxed);
      if (absl::Now() >= next_log) {
        spdlog::warn("accept on port {} failed: {}; backing off {}", port_, std::strerror(errno),
                     absl::FormatDuration(backoff));
        next_log = absl::Now() + absl::Seconds(10);
      }
      pollfd wake{wake_fds_[0], POLLIN, 0};
      ::poll(&wake, 1, static_cast<int>(absl::ToInt64Milliseconds(backoff)));
      backoff = std::min(backoff * 2, absl::Seconds(1));
      continue;
    }
    backoff = absl::Milliseconds(10);
    if (fd >= fd_limit_) {
      ::close(fd);
      refused_connections_.fetch_add(1, std::memory_order_relaxed);
      if (absl::Now() >= next_log) {
        spdlog::warn("port {}: refusing connections, {} descriptors in use", port_, fd);
        next_log = absl::Now() + absl::Seconds(10);
      }
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // gRPC gives the sockets it accepts itself TCP_USER_TIMEOUT at the keepalive's timeout; these
    // come from this listener. Without it a reply blocked on a peer that stopped acknowledging (its
    // host cut off) holds the connection's writes, the keepalive's ping among them, until the
    // kernel's retransmissions give up (minutes): a batch stream to a worker lost during a cut
    // would stay open, and its replacement would be refused as a second stream.
    if (unacked_timeout_ms_ > 0) {
      ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_timeout_ms_, sizeof(unacked_timeout_ms_));
    }
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
    connection.listener_fd = listen_fd_;
    connection.fd = fd;
    acceptor_->HandleNewConnection(&connection);
  }
}

void RpcServer::Shutdown(absl::Duration grace) {
  if (!stopping_.exchange(true)) {
    const char byte = 0;
    (void)!::write(wake_fds_[1], &byte, 1);
    if (accept_thread_ != nullptr) accept_thread_->join();
  }
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
}

void RpcServer::Wait() { server_->Wait(); }

RpcServer::~RpcServer() {
  if (server_ != nullptr) {
    Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
  if (accept_thread_ != nullptr && accept_thread_->joinable()) accept_thread_->join();
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace hyrec::rpc
