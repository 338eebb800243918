#include "hyrec/dense_worker/train_job.h"

#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/thread_priority.h"
#include "hyrec/data_loader/loader_metrics.h"
#include "hyrec/dense_worker/monitor.h"
#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/dense_worker/worker.h"
#include "hyrec/embedding_ps/client.h"

namespace hyrec::dense_worker {
namespace {

// Passes worker 0's reports on, publishing the in-process shards' and loader's statistics with
// each.
class PsMetricsObserver : public TrainObserver {
 public:
  PsMetricsObserver(TrainObserver* next, embedding_ps::EmbeddingClient* ps, const data_loader::Loader* loader,
                    MetricsRegistry* metrics)
      : next_(next), ps_(ps), loader_(loader), metrics_(metrics) {}
  void OnProgress(const Progress& p) override {
    (void)PublishPsMetrics(ps_, metrics_);
    if (loader_ != nullptr) data_loader::PublishLoaderMetrics(loader_->Stats(), metrics_);
    if (next_ != nullptr) next_->OnProgress(p);
  }
  void OnEvaluation(uint64_t samples, const Evaluation& e) override {
    if (next_ != nullptr) next_->OnEvaluation(samples, e);
  }
  void OnFinish(const TrainReport& r) override {
    (void)PublishPsMetrics(ps_, metrics_);
    if (next_ != nullptr) next_->OnFinish(r);
  }

 private:
  TrainObserver* next_;
  embedding_ps::EmbeddingClient* ps_;
  const data_loader::Loader* loader_;  // Null when the workers' streams come from elsewhere.
  MetricsRegistry* metrics_;
};

// The plan's shards as in-process stores, restored from `resume` (each shard on its own thread)
// when given.
absl::StatusOr<std::unique_ptr<embedding_ps::EmbeddingClient>> InProcessShards(const job::JobPlan& plan,
                                                                               const ResumePoint* resume, Env* env) {
  const size_t n = plan.ps.size();
  std::vector<std::shared_ptr<embedding_ps::EmbeddingShardStore>> stores(n);
  std::vector<absl::Status> errors(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::shared_ptr<embedding_ps::EmbeddingShardStore>> store;
      if (resume != nullptr) {
        store = RestoreShardStore(env, resume->dir, resume->manifest, plan.ps[i]);
      } else {
        store = embedding_ps::EmbeddingShardStore::Create(plan.ps[i].store);
      }
      if (store.ok()) {
        stores[i] = std::move(*store);
      } else {
        errors[i] = Annotate(store.status(), absl::StrCat("PS shard ", i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& e : errors) HYREC_RETURN_IF_ERROR(e);
  embedding_ps::CutRoots roots;
  roots.checkpoint_root = plan.ps[0].checkpoint_root;
  roots.export_root = plan.ps[0].export_root;
  roots.env = env;
  return embedding_ps::NewInProcessEmbeddingClient(
      std::move(stores), roots,
      plan.workers[0].ps_wire_fp16 ? embedding_ps::Precision::kFp16 : embedding_ps::Precision::kFp32);
}

}  // namespace

absl::StatusOr<TrainReport> RunTrainJob(const job::JobPlan& plan, const TrainJobOptions& options) {
  const int workers = static_cast<int>(plan.workers.size());
  if (!options.streams.empty() && options.streams.size() != plan.workers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.streams.size(), " batch streams given for ", workers, " workers"));
  }
  TuneTrainingProcess();  // Idle BLAS threads sleep, freed tensors stay mapped (process_tuning.h).
  HYREC_ASSIGN_OR_RETURN(const torch::Device device, ResolveDevice(plan.workers[0].device, 0));
  if (device.is_cuda() && workers > static_cast<int>(torch::cuda::device_count())) {
    return absl::FailedPreconditionError(absl::StrCat("train.workers is ", workers, " on cuda but there are ",
                                                      torch::cuda::device_count(),
                                                      " GPUs (NCCL needs one GPU per worker)"));
  }
  std::optional<ResumePoint> resume;
  if (!options.resume.empty()) {
    HYREC_ASSIGN_OR_RETURN(resume, LoadResumePoint(options.env, plan.spec.checkpoint.dir, options.resume, workers));
  }
  HYREC_ASSIGN_OR_RETURN(const CheckpointDirClaim claim,
                         ClaimRunCheckpointDir(options.env, plan.spec.checkpoint.dir, resume ? &*resume : nullptr));
  HYREC_ASSIGN_OR_RETURN(auto ps, InProcessShards(plan, resume ? &*resume : nullptr, options.env));
  // The loader shares the machine with the dense step: its threads run on the cores it leaves idle.
  std::unique_ptr<data_loader::Loader> loader;
  if (options.streams.empty()) {
    data_loader::LoaderOptions loader_options = plan.loader.options;
    loader_options.thread_nice = kIdleNice;
    HYREC_ASSIGN_OR_RETURN(
        loader, data_loader::Loader::Start(loader_options,
                                           resume ? resume->positions : std::vector<data_loader::ReaderPosition>()));
  }
  PsMetricsObserver observer(options.observer, ps.get(), loader.get(), options.metrics);
  job::Endpoints endpoints = plan.endpoints;  // One process: the rendezvous is on loopback.
  endpoints.master_addr = "127.0.0.1";
  endpoints.master_port = PickFreeLoopbackPort();

  std::mutex mu;
  absl::Status failure;
  std::vector<TrainReport> reports(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions worker;
      worker.stream = loader != nullptr ? loader->stream(w) : options.streams[w];
      worker.ps = ps.get();
      worker.observer = w == 0 ? &observer : nullptr;
      worker.stop = options.stop;
      worker.resume = resume ? &resume->dense : nullptr;
      worker.checkpoint_request = w == 0 ? options.checkpoint_request : nullptr;
      worker.job_text = plan.spec.text;
      worker.job_id = claim.job_id;
      worker.env = options.env;
      // Workers that are threads share the cores: one intra-op thread each. One worker keeps
      // LibTorch's default.
      worker.intra_op_threads = workers > 1 ? 1 : 0;
      absl::StatusOr<TrainReport> report = RunWorker(plan.workers[w], endpoints, worker);
      std::lock_guard<std::mutex> lock(mu);
      if (report.ok()) {
        reports[w] = std::move(*report);
        return;
      }
      if (failure.ok()) failure = Annotate(report.status(), absl::StrCat("worker ", w));
      if (loader != nullptr) loader->Stop();  // Unblocks the other workers' streams.
    });
  }
  for (std::thread& t : threads) t.join();
  if (!failure.ok()) return failure;
  return reports[0];
}

}  // namespace hyrec::dense_worker
