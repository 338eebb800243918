#include "hyrec/embedding_ps/server.h"

#include <atomic>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "embedding.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "hyrec/common/allocator.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/grpc_status.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "spdlog/spdlog.h"
#include "src/common/rpc.h"
#include "src/embedding_ps/bounded_request.h"
#include "src/embedding_ps/handlers.h"

namespace hyrec::embedding_ps {
namespace {

void FillStats(const EmbeddingShardStore& store, const ServerOptions& options, const rpc::RpcServer* listener,
               proto::StatsResponse* out) {
  const StoreStats stats = store.Stats();
  if (listener != nullptr) {
    out->set_accept_errors(listener->accept_errors());
    out->set_refused_connections(listener->refused_connections());
  }
  out->set_shard_index(options.shard_index);
  out->set_num_shards(options.num_shards);
  out->set_capacity_rows(stats.capacity_rows);
  out->set_capacity_bytes(stats.capacity_bytes);
  out->set_rows(stats.rows);
  out->set_bytes(stats.bytes);
  out->set_payload_bytes(stats.payload_bytes);
  out->set_rejected_requests(store.rejected_requests());
  for (const TableStats& t : stats.tables) {
    proto::TableStats* p = out->add_tables();
    p->set_name(t.name);
    p->set_dim(t.dim);
    p->set_optimizer(t.optimizer);
    p->set_rows(t.rows);
    p->set_bytes(t.bytes);
    p->set_row_bytes(t.row_bytes);
    p->set_lookups(t.lookups);
    p->set_updates(t.updates);
    p->set_evictions(t.evictions);
    p->set_admission_rejections(t.admission_rejections);
    p->set_dropped_updates(t.dropped_updates);
    p->set_rejected_nonfinite(t.rejected_nonfinite);
    p->set_duplicate_updates(t.duplicate_updates);
    p->set_capacity_rows(t.capacity_rows);
    p->set_nonfinite_results(t.nonfinite_results);
    p->set_eviction_policy(t.eviction_policy);
    p->set_expirations(t.expirations);
    p->set_data_time(t.data_time);
  }
}

class EmbeddingServiceImpl final : public proto::EmbeddingService::Service {
 public:
  EmbeddingServiceImpl(std::shared_ptr<EmbeddingShardStore> store, ServerOptions options)
      : store_(std::move(store)),
        options_(std::move(options)),
        authorizer_(options_.security),
        cutter_(store_, options_.shard_index, options_.num_shards),
        incarnation_(RandomId()) {
    // The multi-part calls read their requests through BoundedRequest: parts counted before
    // any is decoded. (Streamed unary is the server's view of a unary call: one read, one write.)
    MarkMethodStreamed(kLookupTablesMethod,
                       new grpc::internal::StreamedUnaryHandler<BoundedRequest<proto::LookupTablesRequest>,
                                                                proto::LookupTablesResponse>(
                           [this](grpc::ServerContext* context, auto* streamer) {
                             return Bounded(context, streamer, "LookupTables", &EmbeddingServiceImpl::LookupTables);
                           }));
    MarkMethodStreamed(kUpdateTablesMethod,
                       new grpc::internal::StreamedUnaryHandler<BoundedRequest<proto::UpdateTablesRequest>,
                                                                proto::UpdateTablesResponse>(
                           [this](grpc::ServerContext* context, auto* streamer) {
                             return Bounded(context, streamer, "UpdateTables", &EmbeddingServiceImpl::UpdateTables);
                           }));
  }

  void set_listener(const rpc::RpcServer* listener) { listener_.store(listener); }

  // With an update log, a new owner of the shard answers only once its former owner's lease has
  // run out (UpdateLog::UntilServeable): until then every call is UNAVAILABLE (retried by the
  // caller; not logged, a start's first second).
  grpc::Status NotYetServing() const {
    if (options_.update_log == nullptr) return grpc::Status::OK;
    const absl::Duration wait = options_.update_log->UntilServeable();
    if (wait <= absl::ZeroDuration()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("PS shard ", options_.shard_index, " serves in ", absl::FormatDuration(wait),
                                     ", once a former owner's lease on its update log has run out"));
  }

  // With an update log: a shard answers from its rows only while its lease on the log's ownership
  // holds (UpdateLog::CheckLease); otherwise UNAVAILABLE, so that the caller retries and reaches
  // the new owner (a role's on_fenced stops this process).
  absl::Status CheckOwnerLease() const {
    if (options_.update_log == nullptr) return absl::OkStatus();
    absl::Status owned = options_.update_log->CheckLease();
    if (owned.ok()) return owned;
    return absl::UnavailableError(absl::StrCat("PS shard ", options_.shard_index, ": ", owned.message()));
  }

  grpc::Status BeginCut(grpc::ServerContext* context, const proto::BeginCutRequest* request,
                        proto::BeginCutResponse*) override {
    if (absl::Status allowed = AllowCut(*context, "BeginCut"); !allowed.ok()) return Refused("BeginCut", allowed);
    const CutKind kind = request->kind() == proto::CUT_DELTA ? CutKind::kDelta : CutKind::kCheckpoint;
    absl::StatusOr<std::string> dir =
        CutDirectory(CutRoots{options_.checkpoint_root, options_.export_root, nullptr}, kind, request->name());
    absl::Status status = dir.status();
    if (status.ok() && request->kind() != proto::CUT_CHECKPOINT && request->kind() != proto::CUT_DELTA) {
      status = absl::InvalidArgumentError(absl::StrCat("unknown cut kind ", request->kind()));
    }
    if (status.ok() && kind == CutKind::kCheckpoint) status = RotateLog(request->name());
    if (status.ok()) status = cutter_.Begin(*dir, request->id(), kind);
    if (!status.ok()) {
      return Refused("BeginCut", status);
    } else {
      spdlog::info("cut {} ({}): snapshot taken, writing {}", request->id(),
                   kind == CutKind::kCheckpoint ? "checkpoint" : "delta", *dir);
    }
    return ToGrpcStatus(status);
  }

  grpc::Status JobDone(grpc::ServerContext* context, const proto::JobDoneRequest*, proto::JobDoneResponse*) override {
    if (absl::Status allowed = AllowCut(*context, "JobDone"); !allowed.ok()) return Refused("JobDone", allowed);
    // A callback that stops the process lets this answer finish first (Shutdown's grace).
    if (options_.on_job_done) options_.on_job_done();
    return grpc::Status::OK;
  }

  grpc::Status AwaitCut(grpc::ServerContext* context, const proto::AwaitCutRequest* request,
                        proto::AwaitCutResponse* response) override {
    if (absl::Status allowed = AllowCut(*context, "AwaitCut"); !allowed.ok()) return Refused("AwaitCut", allowed);
    const absl::Duration wait = absl::Milliseconds(std::min<uint32_t>(request->wait_ms(), 10000));
    absl::StatusOr<ShardFileInfo> info = cutter_.Await(request->id(), wait);
    if (absl::IsDeadlineExceeded(info.status())) {
      response->set_done(false);
      return grpc::Status::OK;
    }
    if (!info.ok()) return ToGrpcStatus(info.status());
    response->set_done(true);
    response->set_file(info->file.name);
    response->set_length(info->file.length);
    response->set_crc32(info->file.crc32);
    for (uint64_t rows : info->table_rows) response->add_table_rows(rows);
    return grpc::Status::OK;
  }

  grpc::Status Lookup(grpc::ServerContext* context, const proto::LookupRequest* request,
                      proto::LookupResponse* response) override {
    if (grpc::Status waiting = NotYetServing(); !waiting.ok()) return waiting;
    absl::Status status = authorizer_.Allow(*context, {Role::kWorker, Role::kAdmin}, "Lookup");
    if (status.ok()) status = CheckOwnerLease();
    if (status.ok()) status = HandleLookup(*store_, Limits(), *request, response);
    if (!status.ok()) return Refused("Lookup", status);
    response->set_incarnation(incarnation_);
    return grpc::Status::OK;
  }

  grpc::Status LookupTables(grpc::ServerContext* context, const proto::LookupTablesRequest* request,
                            proto::LookupTablesResponse* response) override {
    if (grpc::Status waiting = NotYetServing(); !waiting.ok()) return waiting;
    absl::Status status = authorizer_.Allow(*context, {Role::kWorker, Role::kAdmin}, "LookupTables");
    if (status.ok()) status = CheckOwnerLease();
    if (status.ok()) status = HandleLookupTables(*store_, Limits(), *request, response);
    if (!status.ok()) return Refused("LookupTables", status);
    response->set_incarnation(incarnation_);
    return grpc::Status::OK;
  }

  grpc::Status Update(grpc::ServerContext* context, const proto::UpdateRequest* request,
                      proto::UpdateResponse* response) override {
    if (grpc::Status waiting = NotYetServing(); !waiting.ok()) return waiting;
    // A worker updates rows under its own id only: no one else can fill its dedup window.
    absl::Status status = authorizer_.AllowWorker(*context, request->worker_id(), /*or_admin=*/false, "Update");
    if (status.ok()) status = CheckOwnerLease();
    if (status.ok()) status = HandleUpdate(*store_, Limits(), *request, response, options_.update_log.get());
    if (!status.ok()) return Refused("Update", status);
    response->set_incarnation(incarnation_);
    return grpc::Status::OK;
  }

  grpc::Status UpdateTables(grpc::ServerContext* context, const proto::UpdateTablesRequest* request,
                            proto::UpdateTablesResponse* response) override {
    if (grpc::Status waiting = NotYetServing(); !waiting.ok()) return waiting;
    absl::Status status;
    uint32_t checked = 0;
    for (int k = 0; k < request->updates_size() && status.ok(); ++k) {
      const uint32_t worker = request->updates(k).worker_id();
      if (k > 0 && worker == checked) continue;
      status = authorizer_.AllowWorker(*context, worker, /*or_admin=*/false, "UpdateTables");
      checked = worker;
    }
    if (status.ok()) status = CheckOwnerLease();
    if (status.ok()) status = HandleUpdateTables(*store_, Limits(), *request, response, options_.update_log.get());
    if (!status.ok()) return Refused("UpdateTables", status);
    response->set_incarnation(incarnation_);
    if (options_.update_log != nullptr) response->set_log_bytes(options_.update_log->bytes_since_cut());
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext* context, const proto::StatsRequest*,
                     proto::StatsResponse* response) override {
    if (absl::Status allowed = AllowAnyone(*context, "Stats"); !allowed.ok()) return Refused("Stats", allowed);
    FillStats(*store_, options_, listener_.load(), response);
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext* context, const proto::HealthRequest*,
                      proto::HealthResponse* response) override {
    if (grpc::Status waiting = NotYetServing(); !waiting.ok()) return waiting;
    if (absl::Status allowed = AllowAnyone(*context, "Health"); !allowed.ok()) return Refused("Health", allowed);
    if (absl::Status owned = CheckOwnerLease(); !owned.ok()) return Refused("Health", owned);
    response->set_serving(true);
    response->set_incarnation(incarnation_);
    response->set_lineage(options_.update_log != nullptr ? options_.update_log->lineage() : incarnation_);
    response->set_shard_index(options_.shard_index);
    response->set_num_shards(options_.num_shards);
    for (int t = 0; t < store_->num_tables(); ++t) {
      proto::TableInfo* info = response->add_tables();
      info->set_name(store_->table(t).name);
      info->set_dim(store_->table(t).dim);
    }
    return grpc::Status::OK;
  }

 private:
  // A checkpoint cut starts a new log segment, which starts from its snapshot; the segments
  // before the newest committed checkpoint (its MANIFEST written) are no longer needed.
  absl::Status RotateLog(const std::string& name) {
    UpdateLog* log = options_.update_log.get();
    if (log == nullptr) return absl::OkStatus();
    {
      std::lock_guard<std::mutex> lock(rotate_mu_);
      if (name == rotated_) return absl::OkStatus();  // A retried BeginCut of this cut.
      rotated_ = name;
    }
    const std::string root = options_.checkpoint_root;
    HYREC_RETURN_IF_ERROR(log->Truncate([&](const std::string& checkpoint) {
      return Env::Default()->FileExists(JoinPath(JoinPath(root, checkpoint), kManifestName));
    }));
    HYREC_ASSIGN_OR_RETURN(const uint64_t segment, log->Rotate(name));
    spdlog::info("update log: segment {} starts from checkpoint {}", segment, name);
    return absl::OkStatus();
  }

  // The indices of LookupTables and UpdateTables in proto/embedding.proto's EmbeddingService.
  static constexpr int kLookupTablesMethod = 1;
  static constexpr int kUpdateTablesMethod = 3;

  // Reads a multi-part call's request with its parts bounded (4 per table of the shard, and 16),
  // then answers it with `handle`.
  template <typename Request, typename Response>
  grpc::Status Bounded(grpc::ServerContext* context, grpc::ServerUnaryStreamer<BoundedRequest<Request>, Response>* call,
                       absl::string_view method,
                       grpc::Status (EmbeddingServiceImpl::*handle)(grpc::ServerContext*, const Request*, Response*)) {
    BoundedRequest<Request> in;
    in.max_parts = 4 * store_->tables().size() + 16;
    if (!call->Read(&in)) return grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request");
    if (!in.refusal.ok()) return Refused(method, in.refusal);
    Response response;
    const grpc::Status status = (this->*handle)(context, &in.request, &response);
    if (status.ok() && !call->Write(response)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its answer");
    }
    return status;
  }

  RequestLimits Limits() const { return RequestLimits{options_.max_ids_per_request, options_.max_message_bytes}; }

  // Counts and logs a refused call (at most a few lines per interval, so that a flood of bad
  // calls cannot flood the log) and returns its status.
  grpc::Status Refused(absl::string_view method, const absl::Status& status) {
    store_->CountRejectedRequest();
    if (log_limit_.Admit()) spdlog::warn("{} refused: {}", std::string(method), status.ToString());
    return ToGrpcStatus(status);
  }

  absl::Status AllowAnyone(const grpc::ServerContext& context, absl::string_view method) const {
    return authorizer_.Allow(context, {Role::kWorker, Role::kPs, Role::kLoader, Role::kAdmin}, method);
  }

  // Cuts are run by worker 0 for the job, or asked for by an admin.
  absl::Status AllowCut(const grpc::ServerContext& context, absl::string_view method) const {
    return authorizer_.AllowWorker(context, 0, /*or_admin=*/true, method);
  }

  const std::shared_ptr<EmbeddingShardStore> store_;
  const ServerOptions options_;
  const rpc::Authorizer authorizer_;
  ShardCheckpointer cutter_;
  const uint64_t incarnation_;
  std::mutex rotate_mu_;
  std::string rotated_;  // The checkpoint the log's newest segment starts from.
  std::atomic<const rpc::RpcServer*> listener_{nullptr};
  rpc::LogLimiter log_limit_;
};

}  // namespace

struct EmbeddingServer::Impl {
  std::unique_ptr<EmbeddingServiceImpl> service;
  std::unique_ptr<rpc::RpcServer> server;
};

EmbeddingServer::EmbeddingServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EmbeddingServer::~EmbeddingServer() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

absl::StatusOr<std::unique_ptr<EmbeddingServer>> EmbeddingServer::Start(std::shared_ptr<EmbeddingShardStore> store,
                                                                        const ServerOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("EmbeddingServer needs a store");
  if (options.num_shards < 1 || options.shard_index < 0 || options.shard_index >= options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard index ", options.shard_index, " is not in [0, ", options.num_shards, ")"));
  }
  KeepLargeBuffers();
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<EmbeddingServiceImpl>(std::move(store), options);
  rpc::ServerConfig config;
  config.host = options.host;
  config.port = options.port;
  config.security = options.security;
  config.threads = options.threads;
  config.max_message_bytes = options.max_message_bytes;
  HYREC_ASSIGN_OR_RETURN(impl->server, rpc::RpcServer::Start(config, {impl->service.get()}));
  impl->service->set_listener(impl->server.get());
  return std::unique_ptr<EmbeddingServer>(new EmbeddingServer(std::move(impl)));
}

int EmbeddingServer::port() const { return impl_->server->port(); }
uint64_t EmbeddingServer::accept_errors() const { return impl_->server->accept_errors(); }
uint64_t EmbeddingServer::refused_connections() const { return impl_->server->refused_connections(); }

void EmbeddingServer::Shutdown(absl::Duration grace) { impl_->server->Shutdown(grace); }

void EmbeddingServer::Wait() { impl_->server->Wait(); }

}  // namespace hyrec::embedding_ps
