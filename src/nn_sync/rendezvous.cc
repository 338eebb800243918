#include "src/nn_sync/rendezvous.h"

#include <algorithm>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "hyrec/common/grpc_status.h"
#include "hyrec/common/status_macros.h"
#include "rendezvous.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "src/common/rpc.h"

namespace hyrec::nn_sync {
namespace {

constexpr size_t kEntryOverhead = 64;                            // Bytes a key costs besides its text and value.
constexpr absl::Duration kPollCancel = absl::Milliseconds(100);  // How often a waiting call checks its caller.
constexpr absl::Duration kLongestWait = absl::Hours(1);          // Of one Get or Wait, on either side.

// The keys and values, with waits for keys to be set. Thread-safe.
class Table {
 public:
  explicit Table(RendezvousLimits limits) : limits_(limits) {}

  absl::Status Set(const std::string& key, const std::string& value) {
    HYREC_RETURN_IF_ERROR(CheckKey(key));
    if (value.size() > limits_.max_value_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the value of rendezvous key '", Printable(key), "' is ",
                                                     value.size(), " bytes, over the limit of ",
                                                     limits_.max_value_bytes));
    }
    absl::MutexLock lock(&mu_);
    return PutLocked(key, value);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline, const std::function<bool()>& cancelled) {
    HYREC_RETURN_IF_ERROR(CheckKey(key));
    absl::MutexLock lock(&mu_);
    HYREC_RETURN_IF_ERROR(AwaitLocked({key}, deadline, cancelled));
    return values_.find(key)->second;
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) {
    HYREC_RETURN_IF_ERROR(CheckKey(key));
    absl::MutexLock lock(&mu_);
    int64_t current = 0;
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous key '", Printable(key), "' holds a value that is not an integer"));
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::InvalidArgumentError(
          absl::StrCat("adding ", delta, " to rendezvous key '", Printable(key), "' (", current, ") overflows"));
    }
    HYREC_RETURN_IF_ERROR(PutLocked(key, std::to_string(sum)));
    return sum;
  }

  absl::StatusOr<bool> Delete(const std::string& key) {
    HYREC_RETURN_IF_ERROR(CheckKey(key));
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return false;
    total_bytes_ -= EntryBytes(it->first, it->second);
    values_.erase(it);
    return true;
  }

  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) {
    HYREC_RETURN_IF_ERROR(CheckKeys(keys));
    absl::MutexLock lock(&mu_);
    return AllSetLocked(keys);
  }

  int64_t NumKeys() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(values_.size());
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Time deadline, const std::function<bool()>& cancelled) {
    HYREC_RETURN_IF_ERROR(CheckKeys(keys));
    absl::MutexLock lock(&mu_);
    return AwaitLocked(keys, deadline, cancelled);
  }

  // Ends every wait (UNAVAILABLE) and refuses new ones: the host is going away.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  static size_t EntryBytes(const std::string& key, const std::string& value) {
    return key.size() + value.size() + kEntryOverhead;
  }

  // Keys are c10d's (ASCII); anything else is shown escaped, at most 64 bytes of it.
  static std::string Printable(absl::string_view key) {
    std::string out;
    for (char c : key.substr(0, 64)) {
      if (c >= 0x20 && c < 0x7f) {
        out += c;
      } else {
        out += absl::StrCat("\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
      }
    }
    if (key.size() > 64) out += "...";
    return out;
  }

  absl::Status CheckKey(const std::string& key) const {
    if (key.empty()) return absl::InvalidArgumentError("a rendezvous key is empty");
    if (key.size() > limits_.max_key_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("rendezvous key '", Printable(key), "' is ", key.size(),
                                                     " bytes, over the limit of ", limits_.max_key_bytes));
    }
    return absl::OkStatus();
  }

  absl::Status CheckKeys(const std::vector<std::string>& keys) const {
    if (keys.size() > limits_.max_keys_per_call) {
      return absl::InvalidArgumentError(
          absl::StrCat(keys.size(), " rendezvous keys in one call, over the limit of ", limits_.max_keys_per_call));
    }
    for (const std::string& key : keys) HYREC_RETURN_IF_ERROR(CheckKey(key));
    return absl::OkStatus();
  }

  absl::Status PutLocked(const std::string& key, const std::string& value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = values_.find(key);
    const size_t old_bytes = it == values_.end() ? 0 : EntryBytes(key, it->second);
    const size_t new_total = total_bytes_ - old_bytes + EntryBytes(key, value);
    if (new_total > limits_.max_total_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the rendezvous holds ", total_bytes_, " bytes; setting key '",
                                                       Printable(key), "' would pass the limit of ",
                                                       limits_.max_total_bytes));
    }
    values_[key] = value;
    total_bytes_ = new_total;
    return absl::OkStatus();
  }

  bool AllSetLocked(const std::vector<std::string>& keys) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return values_.contains(k); });
  }

  absl::Status AwaitLocked(const std::vector<std::string>& keys, absl::Time deadline,
                           const std::function<bool()>& cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || AllSetLocked(keys); };
    for (;;) {
      if (closed_) return absl::UnavailableError("the rendezvous host is shutting down");
      if (AllSetLocked(keys)) return absl::OkStatus();
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        std::vector<std::string> missing;
        for (const std::string& k : keys) {
          if (!values_.contains(k)) missing.push_back(Printable(k));
          if (missing.size() == 8) break;
        }
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous timed out waiting for key(s) ", absl::StrJoin(missing, ", ")));
      }
      if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
      mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, now + kPollCancel));
    }
  }

  const RendezvousLimits limits_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

std::vector<std::string> Keys(const proto::RendezvousRequest& request) {
  return std::vector<std::string>(request.keys().begin(), request.keys().end());
}

absl::Time WaitDeadline(const grpc::ServerContext& context, const proto::RendezvousRequest& request) {
  const absl::Time asked = absl::Now() + std::min(absl::Milliseconds(request.timeout_ms()), kLongestWait);
  return std::min(asked, absl::FromChrono(context.deadline()));
}

class RendezvousService final : public proto::Rendezvous::Service {
 public:
  RendezvousService(std::shared_ptr<Table> table, const SecurityOptions& security)
      : table_(std::move(table)), authorizer_(security) {}

  grpc::Status Set(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                   proto::RendezvousResponse*) override {
    return Answer(*context, "Set", *request, /*keys=*/1,
                  [&] { return table_->Set(request->keys(0), request->value()); });
  }

  grpc::Status Get(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                   proto::RendezvousResponse* response) override {
    return Answer(*context, "Get", *request, 1, [&]() -> absl::Status {
      HYREC_ASSIGN_OR_RETURN(*response->mutable_value(),
                             table_->Get(request->keys(0), WaitDeadline(*context, *request), Cancelled(*context)));
      return absl::OkStatus();
    });
  }

  grpc::Status Add(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                   proto::RendezvousResponse* response) override {
    return Answer(*context, "Add", *request, 1, [&]() -> absl::Status {
      HYREC_ASSIGN_OR_RETURN(const int64_t sum, table_->Add(request->keys(0), request->delta()));
      response->set_number(sum);
      return absl::OkStatus();
    });
  }

  grpc::Status Delete(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                      proto::RendezvousResponse* response) override {
    return Answer(*context, "Delete", *request, 1, [&]() -> absl::Status {
      HYREC_ASSIGN_OR_RETURN(const bool found, table_->Delete(request->keys(0)));
      response->set_found(found);
      return absl::OkStatus();
    });
  }

  grpc::Status Check(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                     proto::RendezvousResponse* response) override {
    return Answer(*context, "Check", *request, -1, [&]() -> absl::Status {
      HYREC_ASSIGN_OR_RETURN(const bool found, table_->Check(Keys(*request)));
      response->set_found(found);
      return absl::OkStatus();
    });
  }

  grpc::Status Wait(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                    proto::RendezvousResponse*) override {
    return Answer(*context, "Wait", *request, -1,
                  [&] { return table_->Wait(Keys(*request), WaitDeadline(*context, *request), Cancelled(*context)); });
  }

  grpc::Status NumKeys(grpc::ServerContext* context, const proto::RendezvousRequest* request,
                       proto::RendezvousResponse* response) override {
    return Answer(*context, "NumKeys", *request, 0, [&] {
      response->set_number(table_->NumKeys());
      return absl::OkStatus();
    });
  }

 private:
  static std::function<bool()> Cancelled(grpc::ServerContext& context) {
    return [&context] { return context.IsCancelled(); };
  }

  // Admits only the job's workers, checks the number of keys (`keys`; -1: any), then runs `body`.
  grpc::Status Answer(const grpc::ServerContext& context, absl::string_view method,
                      const proto::RendezvousRequest& request, int keys, const std::function<absl::Status()>& body) {
    absl::Status status = authorizer_.Allow(context, {Role::kWorker}, absl::StrCat("Rendezvous.", method));
    if (status.ok() && keys >= 0 && request.keys_size() != keys) {
      status = absl::InvalidArgumentError(
          absl::StrCat("Rendezvous.", method, " takes ", keys, " key(s), not ", request.keys_size()));
    }
    if (status.ok()) status = body();
    const bool refused = absl::IsPermissionDenied(status) || absl::IsUnauthenticated(status) ||
                         absl::IsInvalidArgument(status) || absl::IsResourceExhausted(status);
    if (refused && log_limit_.Admit())
      spdlog::warn("Rendezvous.{} refused: {}", std::string(method), status.ToString());
    return ToGrpcStatus(status);
  }

  const std::shared_ptr<Table> table_;
  const rpc::Authorizer authorizer_;
  rpc::LogLimiter log_limit_;
};

std::string Address(const RendezvousOptions& options) {
  const bool v6 = options.host.find(':') != std::string::npos;
  return v6 ? absl::StrCat("[", options.host, "]:", options.port) : absl::StrCat(options.host, ":", options.port);
}

int MaxMessageBytes(const RendezvousLimits& limits) {
  const size_t keys = limits.max_keys_per_call * (limits.max_key_bytes + 8);
  return static_cast<int>(std::min<size_t>(std::max(keys, limits.max_value_bytes) + (64 << 10), 1 << 30));
}

// Worker 0's: the table in-process, served to the others.
class HostedRendezvous final : public Rendezvous {
 public:
  explicit HostedRendezvous(RendezvousLimits limits) : table_(std::make_shared<Table>(limits)) {}

  ~HostedRendezvous() override {
    table_->Close();
    if (server_ != nullptr) {
      server_->Shutdown(absl::Seconds(1));
      server_->Wait();
    }
  }

  absl::Status Serve(const RendezvousOptions& options) {
    service_ = std::make_unique<RendezvousService>(table_, options.security);
    rpc::ServerConfig config;
    config.host = options.host;
    config.port = options.port;
    config.security = options.security;
    config.max_message_bytes = MaxMessageBytes(options.limits);
    absl::StatusOr<std::unique_ptr<rpc::RpcServer>> server = rpc::RpcServer::Start(config, {service_.get()});
    if (!server.ok()) return Annotate(server.status(), absl::StrCat("hosting the rendezvous at ", Address(options)));
    server_ = *std::move(server);
    return absl::OkStatus();
  }

  absl::Status Set(const std::string& key, const std::string& value) override { return table_->Set(key, value); }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return table_->Get(key, absl::Now() + timeout, nullptr);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override { return table_->Add(key, delta); }
  absl::StatusOr<bool> Delete(const std::string& key) override { return table_->Delete(key); }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override { return table_->Check(keys); }
  absl::StatusOr<int64_t> NumKeys() override { return table_->NumKeys(); }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return table_->Wait(keys, absl::Now() + timeout, nullptr);
  }
  int port() const override { return server_->port(); }

 private:
  const std::shared_ptr<Table> table_;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<rpc::RpcServer> server_;
};

// The other ranks': calls to worker 0's.
class RemoteRendezvous final : public Rendezvous {
 public:
  RemoteRendezvous(const RendezvousOptions& options, std::unique_ptr<proto::Rendezvous::Stub> stub)
      : options_(options), address_(Address(options)), stub_(std::move(stub)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    proto::RendezvousRequest request;
    request.add_keys(key);
    request.set_value(value);
    proto::RendezvousResponse response;
    return Call("Set", &proto::Rendezvous::Stub::Set, request, &response, absl::ZeroDuration());
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    proto::RendezvousRequest request;
    request.add_keys(key);
    request.set_timeout_ms(TimeoutMs(timeout));
    proto::RendezvousResponse response;
    HYREC_RETURN_IF_ERROR(Call("Get", &proto::Rendezvous::Stub::Get, request, &response, timeout));
    return std::move(*response.mutable_value());
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    proto::RendezvousRequest request;
    request.add_keys(key);
    request.set_delta(delta);
    proto::RendezvousResponse response;
    HYREC_RETURN_IF_ERROR(Call("Add", &proto::Rendezvous::Stub::Add, request, &response, absl::ZeroDuration()));
    return response.number();
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    proto::RendezvousRequest request;
    request.add_keys(key);
    proto::RendezvousResponse response;
    HYREC_RETURN_IF_ERROR(Call("Delete", &proto::Rendezvous::Stub::Delete, request, &response, absl::ZeroDuration()));
    return response.found();
  }

  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    proto::RendezvousRequest request;
    for (const std::string& k : keys) request.add_keys(k);
    proto::RendezvousResponse response;
    HYREC_RETURN_IF_ERROR(Call("Check", &proto::Rendezvous::Stub::Check, request, &response, absl::ZeroDuration()));
    return response.found();
  }

  absl::StatusOr<int64_t> NumKeys() override {
    proto::RendezvousRequest request;
    proto::RendezvousResponse response;
    HYREC_RETURN_IF_ERROR(Call("NumKeys", &proto::Rendezvous::Stub::NumKeys, request, &response, absl::ZeroDuration()));
    return response.number();
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    proto::RendezvousRequest request;
    for (const std::string& k : keys) request.add_keys(k);
    request.set_timeout_ms(TimeoutMs(timeout));
    proto::RendezvousResponse response;
    return Call("Wait", &proto::Rendezvous::Stub::Wait, request, &response, timeout);
  }

  int port() const override { return options_.port; }

 private:
  static uint32_t TimeoutMs(absl::Duration timeout) {
    return static_cast<uint32_t>(absl::ToInt64Milliseconds(std::clamp(timeout, absl::ZeroDuration(), kLongestWait)));
  }

  // One call with the deadline options_.timeout + `waits` (the server answers a wait that runs
  // out itself, naming the keys, before this deadline); it waits for the host to come up.
  using Method = grpc::Status (proto::Rendezvous::Stub::*)(grpc::ClientContext*, const proto::RendezvousRequest&,
                                                           proto::RendezvousResponse*);

  absl::Status Call(absl::string_view name, Method method, const proto::RendezvousRequest& request,
                    proto::RendezvousResponse* response, absl::Duration waits) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout + std::max(waits, absl::ZeroDuration())));
    context.set_wait_for_ready(true);
    const grpc::Status status = (stub_.get()->*method)(&context, request, response);
    if (status.ok()) return absl::OkStatus();
    return Annotate(FromGrpcStatus(status), absl::StrCat("Rendezvous.", name, " at ", address_));
  }

  const RendezvousOptions options_;
  const std::string address_;
  const std::unique_ptr<proto::Rendezvous::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> HostRendezvous(const RendezvousOptions& options) {
  auto host = std::make_unique<HostedRendezvous>(options.limits);
  HYREC_RETURN_IF_ERROR(host->Serve(options));
  return std::unique_ptr<Rendezvous>(std::move(host));
}

absl::StatusOr<std::unique_ptr<Rendezvous>> JoinRendezvous(const RendezvousOptions& options) {
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("the rendezvous timeout must be positive");
  HYREC_RETURN_IF_ERROR(rpc::CheckSecurityFiles(options.security));
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         rpc::ChannelCredentials(options.security));
  // Ranks may start well before worker 0 (pods scheduled apart): the channel retries the
  // connection at least every second, as TCPStore's clients do (ChannelArgumentsFor), not on
  // gRPC's backoff that grows to two minutes.
  grpc::ChannelArguments args = rpc::ChannelArgumentsFor(options.security, Identity{Role::kWorker, 0});
  args.SetMaxReceiveMessageSize(MaxMessageBytes(options.limits));
  auto stub = proto::Rendezvous::NewStub(grpc::CreateCustomChannel(Address(options), credentials, args));
  return std::unique_ptr<Rendezvous>(new RemoteRendezvous(options, std::move(stub)));
}

}  // namespace hyrec::nn_sync
