// RunWorker: one dense worker's training loop, the same in every way hyrec runs: the embedded
// `hyrec train` (a thread per worker, in-process PS and loader), `hyrec train --processes` and
// hand-started `hyrec worker` processes (remote PS and loader), and programs built on the C++
// API. Everything it does comes from the worker's plan (include/hyrec/job/job_plan.h).
//
//   HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile("job.yaml"));
//   HYREC_ASSIGN_OR_RETURN(auto ps, embedding_ps::ConnectEmbeddingClient(plan.endpoints.ps, {}));
//   HYREC_ASSIGN_OR_RETURN(auto stream, data_loader::ConnectBatchStream(plan.endpoints.loader, 0, {}));
//   JobMonitor monitor(MonitorOptions{&std::cout});  // worker 0's progress, evaluations, summary
//   WorkerOptions options;
//   options.stream = stream.get();
//   options.ps = ps.get();
//   options.observer = &monitor;
//   HYREC_ASSIGN_OR_RETURN(TrainReport report, RunWorker(plan.workers[0], plan.endpoints, options));
//
// Per step, the workers first agree that every one of them has a batch and none was asked to
// stop (one small allreduce when there are several), so they stop together: at the end of the
// data (the last batches of a worker whose peers have none are not trained), on a stop request
// (options.stop, e.g. from SIGINT) after the current batch, or when one of them cannot get its
// next batch. Checkpoints and deltas (checkpoint.h) are cut at step boundaries the same way:
// every checkpoint.every_steps steps, and when worker 0 asks (checkpoint.every_seconds, SIGUSR1)
// through the same vote; at the end of training (checkpoint.at_end) or after an interrupt
// (checkpoint.on_interrupt); and at each held-out evaluation that improves on the best, whose
// checkpoint (kept beside checkpoint.keep_last's) the export (export.dir, written by worker 0 at
// the end) then uses: the export is the best evaluation's model whenever evaluations ran. A
// resumed run continues the step count (the learning-rate schedule), the samples and the early
// stopping state. Then: the learning rate of the dense optimizer's schedule, forward, the loss
// (NaN/Inf is an error naming the batch), backward with the dense gradients' allreduce, the dense
// step, and the embedding gradients to the PS (TrainingContext, trainer.h). Worker 0 reports
// progress every train.log_every_batches, evaluates every eval.every_batches, before the first
// batch of each new epoch with eval.every_epoch (the others wait for it, up to
// eval.timeout_seconds) and at the end (unless nothing was trained since the last evaluation,
// which then is the final one). With eval.patience, once that many evaluations in a row
// did not improve on the best one (eval.metric), the workers stop together as at the end of the
// data.
//
// A lost peer heals (train.heal_timeout_seconds > 0, several workers): when the step's vote or
// gradient allreduce fails, the survivors regroup (DenseSync::Regroup) and wait for a
// replacement, a process started with the lost worker's flags, whose DenseSync::Create joins the
// next generation. The survivor with the most steps sends every rank its dense parameters,
// optimizer state and counters; the replacement opens its stream at the lost worker's last
// trained batch (the loader replays it), and the group goes on from that step: no rollback, no
// sample trained twice or skipped, the lost worker's updates resent under the same step-derived
// (worker, sequence) so the PS applies each once. Worker 0 hosts the rendezvous: its loss cannot
// heal, and the job falls back to its checkpoint (hyrec train --processes does).
//
// Every LibTorch exception (a model's shape error, an allocation that fails) is caught and
// returned as a Status naming the batch and the operation.
#ifndef HYREC_DENSE_WORKER_WORKER_H_
#define HYREC_DENSE_WORKER_WORKER_H_

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/env.h"
#include "hyrec/common/security.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/dense_worker/checkpoint.h"
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/report.h"
#include "hyrec/dense_worker/trainer.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::dense_worker {

struct WorkerOptions {
  // This worker's batches: `stream`, or, when it is null, a stream `open_stream` opens once the
  // worker knows where it starts (after the rendezvous): at `next_batch`, the global id of the
  // first batch wanted (-1: where the loader starts this worker). A worker that replaces a lost
  // one opens it at the lost worker's last trained batch; with `stream` given it cannot.
  data_loader::BatchStream* stream = nullptr;
  std::function<absl::StatusOr<std::unique_ptr<data_loader::BatchStream>>(int64_t next_batch)> open_stream;
  embedding_ps::EmbeddingClient* ps = nullptr;  // The PS shards (required).
  TrainObserver* observer = nullptr;            // Worker 0's reports; may be null.
  // When it becomes true, the workers stop after their current batch; may be null.
  const std::atomic<bool>* stop = nullptr;
  // Set to true once the worker's set-up (rendezvous, parameter broadcast, resume) is done and
  // it trains: until then a stop has nothing to finish. May be null.
  std::atomic<bool>* training = nullptr;
  // LibTorch intra-op threads of the calling thread; 0: LibTorch's default. Workers that are
  // threads of one process give each a share of the cores.
  int intra_op_threads = 0;
  // Resume: the dense state to start from (its stream and PS already hold the checkpoint's
  // positions and rows); may be null.
  const DenseState* resume = nullptr;
  // Worker 0: when it becomes true, a checkpoint is cut at the next step and it is reset (SIGUSR1);
  // may be null.
  std::atomic<bool>* checkpoint_request = nullptr;
  std::string job_text;  // The job file's text, kept in checkpoints.
  std::string job_id;    // Worker 0: the job its checkpoints belong to (ClaimRunCheckpointDir).
  Env* env = nullptr;    // Checkpoint files; nullptr: Env::Default().
  // This worker's identity for the dense rendezvous (worker 0 hosts it); off by default, for
  // workers that are threads of one process.
  SecurityOptions security;
};

// Trains worker `plan.rank` of the job to the end of its data or a stop request. Returns this
// worker's report (worker 0's carries the job's samples, progress and evaluations).
absl::StatusOr<TrainReport> RunWorker(const job::WorkerPlan& plan, const job::Endpoints& endpoints,
                                      const WorkerOptions& options);

// The device of worker `rank` for a `device` setting (cpu | cuda | auto): cuda:(rank mod GPUs).
// FailedPrecondition when cuda is asked for and there is no GPU (or LibTorch has no CUDA).
absl::StatusOr<torch::Device> ResolveDevice(const std::string& device, int rank);

// The trainer's options for a worker's plan on `device`.
TrainerOptions TrainerOptionsFor(const job::WorkerPlan& plan, torch::Device device);

// The dense optimizer of a plan over `parameters`, at its base learning rate.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeDenseOptimizer(
    const job::DenseOptimizerSpec& spec, const std::vector<torch::Tensor>& parameters);

// Sets every parameter group's learning rate.
void SetLearningRate(torch::optim::Optimizer& optimizer, double learning_rate);

// FNV-1a over the bytes of every parameter of `model`, in order (copied to the CPU): equal
// fingerprints mean bit-identical dense parameters.
uint64_t DenseFingerprint(DenseModelImpl& model);

// Exact AUC and mean log loss of `model` on a held-out split (worker 0's job): the plan's
// eval_loader, or its test_loader.
absl::StatusOr<Evaluation> EvaluateHeldOut(const data_loader::LoaderOptions& split, embedding_ps::EmbeddingClient* ps,
                                           const TrainerOptions& options, DenseModelImpl& model);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_WORKER_H_
