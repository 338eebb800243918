#include "hyrec/data_loader/data_service.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "data.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "hyrec/common/grpc_status.h"
#include "hyrec/common/status_macros.h"
#include "spdlog/spdlog.h"
#include "src/common/rpc.h"
#include "src/data_loader/batch_codec.h"

namespace hyrec::data_loader {
namespace {

// How long a worker's new stream waits for its earlier one to end before it is refused.
constexpr absl::Duration kStreamTakeover = absl::Seconds(5);

class DataServiceImpl final : public proto::DataService::Service {
 public:
  // `loader` is reading already; or null, and `make` makes it once every worker arrived.
  DataServiceImpl(std::unique_ptr<Loader> loader, LoaderFactory make, const LoaderOptions& loader_options,
                  std::vector<ReaderPosition> starts, const DataServerOptions& server_options)
      : authorizer_(server_options.security),
        make_(std::move(make)),
        options_(loader_options),
        replay_batches_(server_options.replay_batches),
        replay_bytes_(server_options.replay_bytes),
        arrival_grace_(server_options.arrival_grace),
        on_job_done_(server_options.on_job_done),
        check_owner_(server_options.check_owner),
        workers_(loader_options.num_workers),
        starts_(std::move(starts)),
        loader_(std::move(loader)) {
    if (starts_.empty()) {
      for (int w = 0; w < options_.num_workers; ++w) {
        ReaderPosition start;
        start.next_batch = static_cast<uint64_t>(w);
        starts_.push_back(start);
      }
    }
    for (int w = 0; w < options_.num_workers; ++w) workers_[w].StartAt(starts_[w]);
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    if (loader_ != nullptr) loader_->Stop();
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    return loader_ != nullptr ? loader_->status() : absl::OkStatus();
  }

  LoaderStats Stats() const {
    absl::MutexLock lock(&mu_);
    return loader_ != nullptr ? loader_->Stats() : LoaderStats();
  }

  std::vector<ReaderPosition> Positions() const {
    absl::MutexLock lock(&mu_);
    if (loader_ == nullptr) return starts_;
    std::vector<ReaderPosition> out;
    for (int w = 0; w < options_.num_workers; ++w) out.push_back(loader_->stream(w)->Position());
    return out;
  }

  grpc::Status Info(grpc::ServerContext* context, const proto::LoaderInfoRequest*,
                    proto::LoaderInfoResponse* out) override {
    absl::Status allowed = authorizer_.Allow(*context, {Role::kWorker, Role::kPs, Role::kLoader, Role::kAdmin}, "Info");
    if (!allowed.ok()) return Refused("Info", allowed);
    if (grpc::Status owned = CheckOwner(); !owned.ok()) return owned;
    out->set_num_workers(options_.num_workers);
    out->set_num_slots(options_.num_batch_slots());
    out->set_num_dense(options_.source.num_dense());
    out->set_num_tables(options_.num_tables());
    out->set_num_shards(options_.num_shards);
    {
      absl::MutexLock lock(&mu_);
      for (const ReaderPosition& p : starts_) ToProto(p, out->add_start_positions());
    }
    const LoaderStats stats = Stats();
    out->set_lines(stats.lines);
    out->set_bad_lines(stats.bad_lines);
    out->set_samples(stats.samples);
    out->set_batches(stats.batches);
    const absl::Status failure = status();
    if (!failure.ok()) out->set_failure(failure.ToString());
    return grpc::Status::OK;
  }

  grpc::Status JobDone(grpc::ServerContext* context, const proto::LoaderJobDoneRequest*,
                       proto::LoaderJobDoneResponse*) override {
    absl::Status allowed = authorizer_.AllowWorker(*context, 0, /*or_admin=*/true, "JobDone");
    if (!allowed.ok()) return Refused("JobDone", allowed);
    // A callback that stops the process lets this answer finish first (Shutdown's grace).
    if (on_job_done_) on_job_done_();
    return grpc::Status::OK;
  }

  grpc::Status StreamBatches(grpc::ServerContext* context, const proto::StreamRequest* request,
                             grpc::ServerWriter<proto::BatchProto>* writer) override {
    const int w = static_cast<int>(request->worker());
    // A worker's batches go to that worker only: no other process can take them.
    absl::Status allowed = authorizer_.AllowWorker(*context, request->worker(), /*or_admin=*/false, "StreamBatches");
    if (!allowed.ok()) {
      return Refused("StreamBatches", allowed);
    }
    if (grpc::Status owned = CheckOwner(); !owned.ok()) return owned;
    if (request->worker() >= static_cast<uint32_t>(options_.num_workers)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("worker ", request->worker(), " is not in [0, ", options_.num_workers, ")"));
    }
    Worker& worker = workers_[w];
    {
      // A worker's earlier stream may still be open here for a moment after that worker was
      // lost (until its call is seen cancelled): its replacement waits for it to end.
      absl::MutexLock lock(&mu_);
      const auto free = [&worker]() { return !worker.active; };
      if (!mu_.AwaitWithTimeout(absl::Condition(&free), kStreamTakeover)) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("worker ", w, " already has an open stream"));
      }
      worker.active = true;
    }
    absl::StatusOr<Loader*> loader = Arrive(context, *request);
    grpc::Status status =
        loader.ok() ? Serve(context, **loader, request->next_batch(), w, writer) : ToGrpcStatus(loader.status());
    absl::MutexLock lock(&mu_);
    worker.active = false;
    return status;
  }

 private:
  struct Worker {
    bool active = false;
    std::deque<std::pair<uint64_t, proto::BatchProto>> sent;  // The last ones sent (replay_batches, replay_bytes).
    size_t sent_bytes = 0;
    uint64_t next_from_loader = 0;  // Id the loader hands out next.
    ReaderPosition next_start;      // Where that batch starts.

    void StartAt(const ReaderPosition& start) {
      next_from_loader = start.next_batch;
      next_start = start;
    }
    // `batch` came from the loader: `message` (its encoding, when sent) carries where it starts.
    void Took(const Batch& batch, int num_workers, proto::BatchProto* message) {
      if (message != nullptr) ToProto(next_start, message->mutable_position());
      next_from_loader = batch.batch_id + num_workers;
      next_start = batch.next_position;
    }
  };

  // UNAVAILABLE once this process is no longer the job's loader (DataServerOptions::check_owner):
  // the worker reconnects and reaches the one that is.
  grpc::Status CheckOwner() const {
    if (!check_owner_) return grpc::Status::OK;
    const absl::Status owned = check_owner_();
    if (owned.ok()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(owned.message()));
  }

  grpc::Status Refused(absl::string_view method, const absl::Status& status) {
    if (log_limit_.Admit()) spdlog::warn("{} refused: {}", std::string(method), status.ToString());
    return ToGrpcStatus(status);
  }

  // The loader, once it reads: made here when this stream is the last worker's first, or
  // arrival_grace after the first worker's.
  absl::StatusOr<Loader*> Arrive(grpc::ServerContext* context, const proto::StreamRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const int w = static_cast<int>(request.worker());
    absl::MutexLock lock(&mu_);
    if (loader_ == nullptr && failure_.ok() && !arrived_[w].has_value()) {
      Arrival& arrival = arrived_[w].emplace();
      if (request.has_position()) arrival.position = FromProto(request.position());
      arrival.next_batch = request.next_batch();
      if (num_arrived_++ == 0) first_arrival_ = absl::Now();
      if (num_arrived_ == options_.num_workers) MakeLoader();
    }
    const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return loader_ != nullptr || !failure_.ok() || stopped_;
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200))) {
      if (context->IsCancelled()) return absl::CancelledError("client gone");
      if (failure_.ok() && absl::Now() - first_arrival_ >= arrival_grace_) {
        spdlog::warn(
            "{} of {} workers opened their streams within {}: reading for them; the others are served "
            "from their starts when they come",
            num_arrived_, options_.num_workers, absl::FormatDuration(arrival_grace_));
        MakeLoader();
      }
    }
    if (!failure_.ok()) return failure_;
    if (loader_ == nullptr) return absl::CancelledError("the loader is stopping");
    return loader_.get();
  }

  void MakeLoader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<ReaderPosition> positions = starts_;
    int reported = 0, derived = 0;
    for (int w = 0; w < options_.num_workers; ++w) {
      if (!arrived_[w].has_value() || !arrived_[w]->position.has_value()) continue;
      ++reported;
      positions[w] = *arrived_[w]->position;
    }
    // A worker without a position that asks for a batch other than its start (a replacement of
    // a lost worker, which knows the batch but not the window): its batch is read from the
    // latest window known to start at or before it, the others' or the job's starts.
    for (int w = 0; w < options_.num_workers; ++w) {
      if (!arrived_[w].has_value()) continue;
      const uint64_t wanted = arrived_[w]->next_batch;
      if (arrived_[w]->position.has_value() || wanted == starts_[w].next_batch ||
          wanted % options_.num_workers != static_cast<uint64_t>(w)) {
        continue;
      }
      std::optional<ReaderPosition> window;
      for (int v = 0; v < options_.num_workers; ++v) {
        const bool reported = arrived_[v].has_value() && arrived_[v]->position.has_value();
        for (const ReaderPosition* p : {&starts_[v], reported ? &*arrived_[v]->position : nullptr}) {
          if (p != nullptr && p->window_global <= wanted && (!window || p->window_global > window->window_global)) {
            window = *p;
          }
        }
      }
      if (!window) continue;
      positions[w] = *window;
      positions[w].next_batch = wanted;
      ++derived;
      spdlog::info("worker {} asks for batch {} without a position: read from the window at batch {}", w, wanted,
                   window->window_global);
    }
    if (reported == options_.num_workers) {
      spdlog::info("every worker reported where its stream stands: resuming each from there");
    } else if (reported + derived > 0) {
      spdlog::warn(
          "{} of {} workers reported where their streams stand, {} asked for a batch; the others start where "
          "the job starts them",
          reported, options_.num_workers, derived);
    }
    absl::StatusOr<std::unique_ptr<Loader>> made = make_(positions);
    if (!made.ok()) {
      failure_ = made.status();
      spdlog::error("the loader did not start: {}", failure_.ToString());
      return;
    }
    starts_ = positions;
    for (int w = 0; w < options_.num_workers; ++w) workers_[w].StartAt(positions[w]);
    loader_ = std::move(*made);
    if (stopped_) loader_->Stop();
  }

  // A worker that asks for a later batch than this loader would send it next (it came after the
  // loader started, past arrival_grace, or replaces a worker lost after this loader sent it some):
  // the batches before it are read and dropped (the same batches as from a later window).
  absl::Status ReadUpTo(grpc::ServerContext* context, BatchStream* stream, uint64_t next, int w) {
    Worker& worker = workers_[w];
    Batch batch;
    for (uint64_t dropped = 0; next > worker.next_from_loader;) {
      absl::Status s = stream->Next(&batch, absl::Milliseconds(200));
      if (absl::IsDeadlineExceeded(s)) {
        if (context->IsCancelled()) return absl::CancelledError("client gone");
        continue;
      }
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("reading up to batch ", next, " of worker ", w, ": ", s.message()));
      }
      worker.Took(batch, options_.num_workers, nullptr);
      ++dropped;
      if (worker.next_from_loader > next) {
        return absl::InternalError(
            absl::StrCat("worker ", w, " asked for batch ", next, " and the loader read batch ", batch.batch_id));
      }
      if (worker.next_from_loader == next) {
        spdlog::info("worker {}: read and dropped {} batches up to batch {}, which it asked for", w, dropped, next);
      }
    }
    return absl::OkStatus();
  }

  grpc::Status Serve(grpc::ServerContext* context, Loader& loader, uint64_t next, int w,
                     grpc::ServerWriter<proto::BatchProto>* writer) {
    Worker& worker = workers_[w];  // Only this (single active) stream touches it.
    BatchStream* stream = loader.stream(w);
    // Also after this loader sent the worker's stream some batches: a replacement may ask for a
    // later batch than its lost predecessor was sent here, which trained the ones between from
    // the loader before this one.
    if (next > worker.next_from_loader && next % options_.num_workers == static_cast<uint64_t>(w)) {
      const absl::Status read = ReadUpTo(context, stream, next, w);
      if (!read.ok()) return ToGrpcStatus(read);
    }
    Batch batch;
    if (next > worker.next_from_loader || next % options_.num_workers != static_cast<uint64_t>(w)) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("worker ", w, " asked for batch ", next, "; this loader serves it batch ",
                                       worker.next_from_loader, " next"));
    }
    if (next < worker.next_from_loader && (worker.sent.empty() || next < worker.sent.front().first)) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("batch ", next, " of worker ", w,
                                       " is no longer buffered; restart the loader from the "
                                       "worker's saved position"));
    }
    for (const auto& [id, message] : worker.sent) {
      if (id < next) continue;
      if (grpc::Status owned = CheckOwner(); !owned.ok()) return owned;
      if (!writer->Write(message)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    }
    for (;;) {
      absl::Status s = stream->Next(&batch, absl::Milliseconds(200));
      if (absl::IsDeadlineExceeded(s)) {
        if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
        continue;
      }
      if (absl::IsOutOfRange(s)) return grpc::Status::OK;
      if (!s.ok()) return ToGrpcStatus(s);
      worker.sent.emplace_back(batch.batch_id, proto::BatchProto());
      EncodeBatch(batch, &worker.sent.back().second);
      worker.Took(batch, options_.num_workers, &worker.sent.back().second);
      worker.sent_bytes += worker.sent.back().second.ByteSizeLong();
      // At least replay_batches and at least replay_bytes of them: the transport's windows hold
      // many small batches a worker never read.
      while (static_cast<int>(worker.sent.size()) > replay_batches_ && worker.sent_bytes > replay_bytes_) {
        worker.sent_bytes -= worker.sent.front().second.ByteSizeLong();
        worker.sent.pop_front();
      }
      if (grpc::Status owned = CheckOwner(); !owned.ok()) return owned;
      if (!writer->Write(worker.sent.back().second)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      }
    }
  }

  const rpc::Authorizer authorizer_;
  rpc::LogLimiter log_limit_;
  const LoaderFactory make_;
  const LoaderOptions options_;
  const int replay_batches_;
  const size_t replay_bytes_;
  const absl::Duration arrival_grace_;
  const std::function<void()> on_job_done_;
  const std::function<absl::Status()> check_owner_;
  std::vector<Worker> workers_;
  mutable absl::Mutex mu_;
  // Each worker's first stream: unset until it came; then the position it reported, if any,
  // and the batch it asked for.
  struct Arrival {
    std::optional<ReaderPosition> position;
    uint64_t next_batch = 0;
  };
  std::vector<std::optional<Arrival>> arrived_ ABSL_GUARDED_BY(mu_) =
      std::vector<std::optional<Arrival>>(options_.num_workers);
  int num_arrived_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_arrival_ ABSL_GUARDED_BY(mu_);
  std::vector<ReaderPosition> starts_ ABSL_GUARDED_BY(mu_);
  // Set once and never replaced: Serve uses it without the lock.
  std::unique_ptr<Loader> loader_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // The factory's.
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// The client end: a callback reader that stops reading while its queue is full.
class RemoteBatchStream final : public BatchStream, public grpc::ClientReadReactor<proto::BatchProto> {
 public:
  // `report`: send `start` to the loader as where this worker's stream stands.
  RemoteBatchStream(std::shared_ptr<grpc::Channel> channel, int worker, uint64_t next, ReaderPosition start,
                    bool report, int capacity, BatchShape shape)
      : channel_(channel),
        stub_(proto::DataService::NewStub(channel)),
        shape_(std::move(shape)),
        capacity_(capacity),
        position_(start),
        received_(start) {
    request_.set_worker(worker);
    request_.set_next_batch(next);
    if (report) {
      ToProto(start, request_.mutable_position());
      recent_.push_back(start);  // A real position: Received may rewind to it.
    }
    stub_->async()->StreamBatches(&context_, &request_, this);
    StartRead(&incoming_);
    StartCall();
  }

  ~RemoteBatchStream() override {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows.
    Batch batch;
    absl::Status decoded = DecodeBatch(incoming_, &batch);
    if (decoded.ok()) decoded = ValidateBatch(batch, shape_);
    absl::MutexLock lock(&mu_);
    if (!decoded.ok()) {
      if (error_.ok()) error_ = decoded;
      context_.TryCancel();
      return;
    }
    received_ = batch.next_position;
    received_any_ = true;
    // Where the first batch received starts is a real position too (this call's start, when not
    // reported, is only a batch id).
    if (recent_.empty() && incoming_.has_position()) recent_.push_back(FromProto(incoming_.position()));
    recent_.push_back(batch.next_position);
    if (recent_.size() > kKeptPositions) recent_.pop_front();
    queue_.push_back(std::move(batch));
    if (static_cast<int>(queue_.size()) < capacity_) {
      StartRead(&incoming_);
    } else {
      paused_ = true;
    }
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) {
      error_ = status.ok() ? absl::OutOfRangeError("end of data")
                           : absl::Status(FromGrpcStatus(status).code(),
                                          absl::StrCat("batch stream: ", status.error_message()));
    }
    done_ = true;
  }

  absl::Status Next(Batch* batch, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || done_ || !error_.ok(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("no batch from the loader within ", absl::FormatDuration(timeout)));
    }
    if (queue_.empty()) return error_.ok() ? absl::UnavailableError("stream ended") : error_;
    *batch = std::move(queue_.front());
    queue_.pop_front();
    position_ = batch->next_position;
    if (paused_ && !done_) {
      paused_ = false;
      StartRead(&incoming_);
    }
    return absl::OkStatus();
  }

  ReaderPosition Position() const override {
    absl::MutexLock lock(&mu_);
    return position_;
  }

  // Waits up to `timeout` for the call to end: then its final status (OUT_OF_RANGE at the end of
  // the data), while queued batches may still be read; nullopt while it runs.
  std::optional<absl::Status> AwaitEnd(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), timeout)) return std::nullopt;
    return error_;
  }

  // A paused call has no read pending, and gRPC ends it only at the next read, however long the
  // consumer takes: a loader lost meanwhile would go unnoticed. Ends the call (UNAVAILABLE) when
  // it is paused and its channel has not been READY at two checks in a row. Called by the watcher.
  void EndIfConnectionLost() {
    const bool connected = channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    absl::MutexLock lock(&mu_);
    if (!paused_ || done_ || connected) {
      unready_checks_ = 0;
      return;
    }
    if (++unready_checks_ < 2) return;
    if (error_.ok()) error_ = absl::UnavailableError("batch stream: the connection to the loader dropped");
    context_.TryCancel();
  }

  // Where a stream opened now goes on: `rewind` batches before the one after the last batch
  // received (queued ones included; as far back as the start of this call's first batch), or
  // where this one started; and whether it received any.
  ReaderPosition Received(int rewind, bool* any) const {
    absl::MutexLock lock(&mu_);
    *any = received_any_;
    if (recent_.empty()) return received_;
    const int back = std::min<int>(rewind, static_cast<int>(recent_.size()) - 1);
    return recent_[recent_.size() - 1 - back];
  }

  static constexpr size_t kKeptPositions = 64;  // Of the last batches received: how far Received rewinds.

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::DataService::Stub> stub_;
  const BatchShape shape_;
  grpc::ClientContext context_;
  proto::StreamRequest request_;
  proto::BatchProto incoming_;
  const int capacity_;
  mutable absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  ReaderPosition position_ ABSL_GUARDED_BY(mu_);
  ReaderPosition received_ ABSL_GUARDED_BY(mu_);
  bool received_any_ ABSL_GUARDED_BY(mu_) = false;
  // The positions after the last batches received (at most kKeptPositions), and before them the
  // call's start when it was a reported position, else where the first batch received starts.
  std::deque<ReaderPosition> recent_ ABSL_GUARDED_BY(mu_);
  int unready_checks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

struct DataServer::Impl {
  std::unique_ptr<DataServiceImpl> service;
  std::unique_ptr<rpc::RpcServer> server;
};

DataServer::DataServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DataServer::~DataServer() {
  impl_->service->Stop();
  Shutdown(absl::ZeroDuration());
  Wait();
}

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Serve(std::unique_ptr<Impl> impl,
                                                              const DataServerOptions& options) {
  rpc::ServerConfig config;
  config.host = options.host;
  config.port = options.port;
  config.security = options.security;
  config.max_message_bytes = options.max_message_bytes;
  HYREC_ASSIGN_OR_RETURN(impl->server, rpc::RpcServer::Start(config, {impl->service.get()}));
  return std::unique_ptr<DataServer>(new DataServer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Start(std::unique_ptr<Loader> loader,
                                                              const LoaderOptions& loader_options,
                                                              const std::vector<ReaderPosition>& starts,
                                                              const DataServerOptions& options) {
  if (loader == nullptr) return absl::InvalidArgumentError("DataServer needs a loader");
  std::vector<ReaderPosition> start_positions = starts;
  if (start_positions.empty()) {
    for (int w = 0; w < loader_options.num_workers; ++w) start_positions.push_back(loader->stream(w)->Position());
  }
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<DataServiceImpl>(std::move(loader), nullptr, loader_options,
                                                    std::move(start_positions), options);
  return Serve(std::move(impl), options);
}

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::StartDeferred(LoaderFactory make,
                                                                      const LoaderOptions& loader_options,
                                                                      const std::vector<ReaderPosition>& starts,
                                                                      const DataServerOptions& options) {
  if (make == nullptr) return absl::InvalidArgumentError("DataServer needs a loader factory");
  if (!starts.empty() && static_cast<int>(starts.size()) != loader_options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(starts.size(), " starting positions for ", loader_options.num_workers, " workers"));
  }
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<DataServiceImpl>(nullptr, std::move(make), loader_options, starts, options);
  return Serve(std::move(impl), options);
}

int DataServer::port() const { return impl_->server->port(); }

absl::Status DataServer::status() const { return impl_->service->status(); }

LoaderStats DataServer::Stats() const { return impl_->service->Stats(); }

std::vector<ReaderPosition> DataServer::Positions() const { return impl_->service->Positions(); }

void DataServer::Shutdown(absl::Duration grace) {
  impl_->service->Stop();
  impl_->server->Shutdown(grace);
}

void DataServer::Wait() { impl_->server->Wait(); }

namespace {

// One stream: the loader's Info checked against what the worker expects, then StreamBatches.
absl::StatusOr<std::unique_ptr<RemoteBatchStream>> ConnectOnce(const std::string& address, int worker,
                                                               const StreamClientOptions& options) {
  grpc::ChannelArguments args = rpc::ChannelArgumentsFor(options.security, Identity{Role::kLoader, 0});
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         rpc::ChannelCredentials(options.security));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, credentials, args);
  auto stub = proto::DataService::NewStub(channel);
  proto::LoaderInfoResponse info;
  grpc::Status status;
  // Attempts without wait_for_ready, so that a failed TLS handshake comes back as what it is (a
  // certificate of another CA, which waiting cannot mend) rather than as the deadline.
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (absl::Duration backoff = absl::Milliseconds(50);;) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    status = stub->Info(&context, proto::LoaderInfoRequest(), &info);
    HYREC_RETURN_IF_ERROR(CertificateRefusal(status, absl::StrCat("the loader at ", address)));
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  if (!status.ok()) {
    return absl::Status(FromGrpcStatus(status).code(),
                        absl::StrCat("loader at ", address, " did not answer: ", status.error_message()));
  }
  if (worker < 0 || worker >= static_cast<int>(info.num_workers()) ||
      info.start_positions_size() != static_cast<int>(info.num_workers())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker, " is not in [0, ", info.num_workers(), ") of the loader at ", address));
  }
  BatchShape shape = options.expect;
  const auto resolve = [&](const char* what, int* expected, uint32_t served) -> absl::Status {
    if (*expected >= 0 && static_cast<uint32_t>(*expected) != served) {
      return absl::FailedPreconditionError(absl::StrCat("the loader at ", address, " serves ", served, " ", what,
                                                        "; this worker's model takes ", *expected));
    }
    *expected = static_cast<int>(served);
    return absl::OkStatus();
  };
  HYREC_RETURN_IF_ERROR(resolve("dense features", &shape.num_dense, info.num_dense()));
  HYREC_RETURN_IF_ERROR(resolve("tables", &shape.num_tables, info.num_tables()));
  HYREC_RETURN_IF_ERROR(resolve("PS shards", &shape.num_shards, info.num_shards()));
  if (!shape.slot_tables.empty() && shape.slot_tables.size() != info.num_slots()) {
    return absl::FailedPreconditionError(absl::StrCat("the loader at ", address, " serves ", info.num_slots(),
                                                      " slots; this worker's model takes ", shape.slot_tables.size()));
  }
  ReaderPosition position = FromProto(info.start_positions(worker));
  if (options.position.has_value()) {
    position = *options.position;
  } else if (options.next_batch >= 0) {
    position.next_batch = static_cast<uint64_t>(options.next_batch);
  }
  return std::make_unique<RemoteBatchStream>(std::move(channel), worker, position.next_batch, position,
                                             options.position.has_value(), std::max(1, options.prefetch_batches),
                                             std::move(shape));
}

}  // namespace

absl::Status TellLoaderJobDone(const std::string& address, const SecurityOptions& security, absl::Duration timeout) {
  grpc::ChannelArguments args = rpc::ChannelArgumentsFor(security, Identity{Role::kLoader, 0});
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, rpc::ChannelCredentials(security));
  auto stub = proto::DataService::NewStub(grpc::CreateCustomChannel(address, credentials, args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::LoaderJobDoneResponse response;
  const grpc::Status status = stub->JobDone(&context, proto::LoaderJobDoneRequest(), &response);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(FromGrpcStatus(status).code(),
                      absl::StrCat("telling the loader at ", address, " the job is done: ", status.error_message()));
}

namespace {

// What a lost or replaced loader does to a stream, as opposed to what the loader chose to say.
bool Broken(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

// Reopens a broken stream as soon as it breaks (not once its queue is drained: the worker may be
// waiting on its peers, who wait on the loader, which waits for every worker's stream), reporting
// where it stands: rewind_ batches before the batch after the last one received. Next reads the
// old stream's queued batches first and drops the batches sent again.
class ReconnectingBatchStream final : public BatchStream {
 public:
  ReconnectingBatchStream(std::string address, int worker, StreamClientOptions options,
                          std::unique_ptr<RemoteBatchStream> stream)
      : address_(std::move(address)),
        worker_(worker),
        options_(std::move(options)),
        rewind_(std::max(1, options_.prefetch_batches) + kTrainerLookahead),
        position_(stream->Position()) {
    streams_.push_back(std::move(stream));
    watcher_ = std::thread([this] { Watch(); });
  }

  ~ReconnectingBatchStream() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    watcher_.join();
  }

  absl::Status Next(Batch* batch, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      RemoteBatchStream* front;
      {
        absl::MutexLock lock(&mu_);
        front = streams_.front().get();
      }
      absl::Status s = front->Next(batch, std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (s.ok() && batch->batch_id < position_.next_batch) continue;  // Sent again after a rewind.
      if (s.ok()) {
        position_ = batch->next_position;
        return s;
      }
      if (!Broken(s)) return s;
      absl::MutexLock lock(&mu_);
      auto reopened = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_.size() > 1 || !fatal_.ok(); };
      if (!mu_.AwaitWithDeadline(absl::Condition(&reopened), deadline)) {
        return absl::DeadlineExceededError(absl::StrCat("the loader at ", address_,
                                                        " was lost and did not come back within ",
                                                        absl::FormatDuration(timeout), ": ", s.message()));
      }
      if (streams_.size() > 1) {
        streams_.pop_front();
        continue;
      }
      return fatal_;
    }
  }

  ReaderPosition Position() const override { return position_; }

 private:
  void Watch() {
    for (;;) {
      RemoteBatchStream* back;
      {
        absl::MutexLock lock(&mu_);
        back = streams_.back().get();
      }
      std::optional<absl::Status> end;
      while (!(end = back->AwaitEnd(absl::Milliseconds(200))).has_value()) {
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return;
        }
        back->EndIfConnectionLost();
      }
      if (!Broken(*end)) return;  // The end of the data, or the loader's own error: Next returns it.
      bool any = false;
      const ReaderPosition from = back->Received(rewind_, &any);
      received_ = received_ || any;
      spdlog::warn("worker {}: the stream from the loader at {} broke ({}); reopening it from batch {}", worker_,
                   address_, end->ToString(), from.next_batch);
      StreamClientOptions again = options_;
      if (received_) {
        again.position = from;
      } else {
        again.next_batch = static_cast<int64_t>(from.next_batch);
      }
      // Short attempts, retried: the stream's owner may go away (and wait for this thread) meanwhile.
      again.connect_timeout = std::min(options_.connect_timeout, absl::Seconds(1));
      absl::Duration backoff = absl::Milliseconds(50);
      for (;;) {
        {
          absl::MutexLock lock(&mu_);
          if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff)) return;
        }
        backoff = std::min(backoff * 2, absl::Seconds(2));
        absl::StatusOr<std::unique_ptr<RemoteBatchStream>> reopened = ConnectOnce(address_, worker_, again);
        absl::MutexLock lock(&mu_);
        if (reopened.ok()) {
          spdlog::info("worker {}: reopened the stream from the loader at {} at batch {}", worker_, address_,
                       from.next_batch);
          streams_.push_back(std::move(*reopened));
          break;
        }
        if (!Broken(reopened.status()) && !absl::IsDeadlineExceeded(reopened.status())) {
          fatal_ = reopened.status();  // A loader that refuses this worker or its model: final.
          return;
        }
      }
    }
  }

  // Batches a worker may hold beyond its stream's queue (the one training, the next prepared,
  // those whose updates are in flight): a reopened stream starts this many more before the
  // last batch received, so that a lost worker's replacement finds its last trained batch in
  // the loader's replay buffer (DataServerOptions::replay_batches must cover prefetch + this).
  static constexpr int kTrainerLookahead = 8;

  const std::string address_;
  const int worker_;
  const StreamClientOptions options_;
  const int rewind_;         // Batches before the last received that a reopened stream starts at.
  ReaderPosition position_;  // After the last batch Next returned (the consumer's thread only).
  bool received_ = false;    // Some stream received a batch (the watcher's thread only).
  absl::Mutex mu_;
  // The open stream last; older ones (broken) before it while their queued batches are read.
  std::deque<std::unique_ptr<RemoteBatchStream>> streams_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchStream>> ConnectBatchStream(const std::string& address, int worker,
                                                                const StreamClientOptions& options) {
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<RemoteBatchStream> stream, ConnectOnce(address, worker, options));
  if (!options.reconnect) return std::unique_ptr<BatchStream>(std::move(stream));
  return std::unique_ptr<BatchStream>(new ReconnectingBatchStream(address, worker, options, std::move(stream)));
}

}  // namespace hyrec::data_loader
