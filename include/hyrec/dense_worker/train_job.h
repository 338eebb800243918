// RunTrainJob: a whole training job in one process, the embedded default behind `hyrec train`:
// the plan's PS shards as in-process stores, its loader in process, and its workers as threads
// (synchronised by a Gloo process group on loopback when there are several), each running
// RunWorker (worker.h) exactly as a worker process would.
//
//   HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile("job.yaml"));
//   JobMonitor monitor(MonitorOptions{&std::cout, /*live=*/false});
//   TrainJobOptions options;
//   options.observer = &monitor;
//   HYREC_ASSIGN_OR_RETURN(TrainReport report, RunTrainJob(plan, options));
//
// docs/configuration.md lists every key of a job file.
#ifndef HYREC_DENSE_WORKER_TRAIN_JOB_H_
#define HYREC_DENSE_WORKER_TRAIN_JOB_H_

#include <atomic>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/env.h"
#include "hyrec/common/metrics.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/dense_worker/report.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::dense_worker {

struct TrainJobOptions {
  TrainObserver* observer = nullptr;  // Worker 0's reports (e.g. a JobMonitor); may be null.
  // Every PS shard's statistics are published here at each report and at the end; may be null.
  MetricsRegistry* metrics = nullptr;
  const std::atomic<bool>* stop = nullptr;  // When set: stop after the current batch.
  // When not empty, one stream per worker that replaces the plan's training loader (whose source
  // still sizes the progress line and feeds the held-out split), e.g. batches already in memory:
  // train_benchmark times the training step without the loader's work, as its LibTorch
  // references are timed. The streams must outlive the call.
  std::vector<data_loader::BatchStream*> streams;
  // "latest" or a checkpoint directory: every shard, the loader and every worker resume from it
  // (reshards when the job has other shard or worker counts). Empty: a fresh start.
  std::string resume;
  // Worker 0 cuts a checkpoint at its next step when this becomes true (and resets it).
  std::atomic<bool>* checkpoint_request = nullptr;
  Env* env = nullptr;  // Checkpoint files; nullptr: Env::Default().
};

// Runs the job; returns worker 0's report (the first failure of any worker otherwise).
absl::StatusOr<TrainReport> RunTrainJob(const job::JobPlan& plan, const TrainJobOptions& options);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_TRAIN_JOB_H_
