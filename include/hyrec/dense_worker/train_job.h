// A whole training job on one machine (the embedded default behind `hyrec train`): PS shards as
// in-process stores, the loader in process, `workers` dense workers as threads synchronised by a
// Gloo process group on loopback, evaluation on a held-out split.
//
//   HYREC_ASSIGN_OR_RETURN(TrainJobConfig config, ParseTrainJobConfig(yaml, "job.yaml"));
//   HYREC_ASSIGN_OR_RETURN(TrainReport report, RunTrainJob(config, &std::cout));
//
// docs/configuration.md lists every key.
#ifndef HYREC_DENSE_WORKER_TRAIN_JOB_H_
#define HYREC_DENSE_WORKER_TRAIN_JOB_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/metrics.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/dense_worker/trainer.h"
#include "hyrec/embedding_ps/table_config.h"

namespace YAML {
class Node;
}

namespace hyrec::dense_worker {

struct TrainJobConfig {
  data_loader::LoaderOptions loader;       // Training data; num_workers = workers.
  uint64_t eval_samples = 50'000;          // Held-out synthetic samples (synthetic sources).
  std::vector<std::string> eval_files;     // Held-out files (file sources), same format.
  int eval_every_batches = 0;              // 0: evaluate at the end only.
  // Model.
  std::string model = "dlrm";              // dlrm | dcn
  int embedding_dim = 16;
  std::vector<int> bottom = {512, 256};
  std::vector<int> top = {512, 256};
  Pooling pooling = Pooling::kSum;
  // PS.
  int ps_shards = 2;
  uint64_t ps_capacity_rows = 0;
  embedding_ps::OptimizerConfig embedding_optimizer;
  embedding_ps::InitializerConfig embedding_initializer;
  // Training.
  int workers = 1;
  int embedding_staleness = 4;
  std::string dense_optimizer = "adam";    // adam | adagrad | sgd
  double dense_learning_rate = 1e-3;
  int log_every_batches = 100;
  uint64_t seed = 1;
  // cpu | cuda | auto (cuda when LibTorch has CUDA and a GPU is present). On cuda, worker w uses
  // GPU w and the dense sync is NCCL (also for one worker, which then exercises the same path).
  std::string device = "cpu";

  absl::Status Validate() const;
};

struct TrainReport {
  Evaluation final_eval;
  std::vector<std::pair<uint64_t, Evaluation>> evals;  // (samples trained, evaluation)
  double teacher_auc = 0;                              // Synthetic sources: the best reachable.
  double samples_per_second = 0;                       // From the start of training to the end.
  // From the end of worker 0's batch kWarmupBatches to the end (0 for shorter runs): the steady
  // rate, without the first lookups into an empty PS and LibTorch's first-call costs.
  double steady_samples_per_second = 0;
  static constexpr uint64_t kWarmupBatches = 5;
  uint64_t samples = 0;
  double mean_loss_last = 0;                           // Over the last log interval.
  std::vector<std::pair<uint64_t, double>> losses;     // (samples trained, mean loss of the interval)
  TrainerStats stats;                                  // Worker 0's.
};

// The device of worker `rank` for a `device` setting (cpu | cuda | auto): cuda:(rank mod GPUs).
// FailedPrecondition when cuda is asked for and there is no GPU (or LibTorch has no CUDA).
absl::StatusOr<torch::Device> ResolveDevice(const std::string& device, int rank);

// The held-out split's loader options: the synthetic teacher's samples from index 2^40 on
// (eval_samples of them), or eval.files for file sources; one worker, one epoch, no shuffle.
data_loader::LoaderOptions HeldOutLoaderOptions(const TrainJobConfig& config);

// The job's dense model (DLRM or DCN-v2), initialized from the global LibTorch generator.
std::shared_ptr<DenseModelImpl> MakeModel(const TrainJobConfig& config);

absl::StatusOr<TrainJobConfig> ParseTrainJobConfig(const YAML::Node& root, absl::string_view source_name);

// Runs the job; progress goes to `log` (a live line on a terminal, plain lines otherwise) and,
// when `metrics` is given, to it at every log interval (PublishTrainerMetrics, PublishPsMetrics,
// PublishEvaluation; plus hyrec_train_samples_total, hyrec_train_samples_per_second and
// hyrec_train_loss).
// `streams`, when not empty, holds one stream per worker that replaces the config's training
// loader (whose source then only sizes the progress line and feeds the held-out split), e.g.
// batches already in memory: train_benchmark times the training step without the loader's work,
// as its LibTorch references are timed. The streams must outlive the call.
absl::StatusOr<TrainReport> RunTrainJob(const TrainJobConfig& config, std::ostream* log, bool terminal,
                                        MetricsRegistry* metrics = nullptr,
                                        const std::vector<data_loader::BatchStream*>& streams = {});

// hyrec_train_samples_total (counter), hyrec_train_samples_per_second and hyrec_train_loss
// (gauges), labelled with `labels`.
void PublishProgress(double samples, double samples_per_second, double loss, const MetricLabels& labels,
                     MetricsRegistry* metrics);
// Metric families (docs/configuration.md lists them), labelled worker="<id>" or table="<name>":
//   hyrec_ps_lookup_seconds, hyrec_ps_update_seconds, hyrec_wait_for_rows_seconds (summaries:
//   per batch), hyrec_observed_staleness (gauge: mean batches of updates unapplied at lookup).
void PublishTrainerMetrics(const TrainerStats& stats, uint32_t worker, MetricsRegistry* metrics);
//   every PS shard's PublishStoreMetrics (rows, evictions, lookups, updates per table), labelled
//   shard="<index>". Errors (a shard down) are returned.
absl::Status PublishPsMetrics(embedding_ps::EmbeddingClient* ps, MetricsRegistry* metrics);
//   hyrec_eval_auc, hyrec_eval_log_loss, hyrec_eval_samples (gauges).
void PublishEvaluation(const Evaluation& evaluation, MetricsRegistry* metrics);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_TRAIN_JOB_H_
