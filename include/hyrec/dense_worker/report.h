// What a training run reports, without LibTorch: the trainer's statistics, an evaluation, worker
// 0's progress at a log interval, the report at the end and the observer that receives them. The
// launcher, the monitor, the plot and the workers' event lines use these alone, so that they
// compile without LibTorch's headers.
#ifndef HYREC_DENSE_WORKER_REPORT_H_
#define HYREC_DENSE_WORKER_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hyrec::dense_worker {

// A worker's lookups, updates and waits (TrainingContext::stats, trainer.h).
struct TrainerStats {
  uint64_t batches = 0;
  uint64_t samples = 0;
  double lookup_ms = 0;         // Mean wall time of a batch's lookups.
  double update_ms = 0;         // Mean wall time of a batch's update (until acknowledged).
  double wait_for_rows_ms = 0;  // Mean time Next waited for rows (latency not hidden).
  // Mean over lookups of (batch looked up - 1 - newest batch whose update was acknowledged when the
  // lookup was issued): the batches of updates the rows may miss, counting batches not yet trained.
  // 0 when synchronous; between 1 (the lookahead runs one batch ahead at least) and the staleness
  // bound when hybrid, near the bound when updates are slow to apply.
  double observed_staleness = 0;
  uint64_t lookup_count = 0;  // Batches looked up (the means' denominators).
  uint64_t update_count = 0;  // Batches whose update was acknowledged.
};

// A held-out evaluation (Evaluate, trainer.h).
struct Evaluation {
  double auc = 0;
  double log_loss = 0;
  uint64_t samples = 0;
};

// Worker 0's view of the job at a log interval.
struct Progress {
  uint64_t samples = 0;          // Samples the job has trained (worker 0's times the workers).
  uint64_t planned_samples = 0;  // The job's total when the source says; 0: unknown.
  uint64_t batches = 0;          // Worker 0's steps.
  // File sources: of worker 0's last batch, its epoch (0-based), the bytes on disk of that
  // epoch's files read and their total (0 for a synthetic source), and the job's epochs (0:
  // forever). The progress line shows bytes read and, without planned_samples, an ETA from them.
  uint64_t epoch = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_total = 0;
  uint64_t epochs = 0;
  double elapsed_seconds = 0;
  double samples_per_second = 0;
  double loss = 0;  // Worker 0's mean training loss over the interval.
  // Progressive validation (eval.progressive_window): over worker 0's last samples, each scored
  // before it was trained on; samples 0 when off.
  Evaluation progressive;
  // The newest sample time worker 0 has trained (Sample::time, unix seconds; 0: its source has
  // none), and whether it reads a stream: then the progress shows event-time freshness, the
  // time since that sample happened.
  uint64_t event_time = 0;
  bool stream = false;
  TrainerStats stats;  // Worker 0's.
  bool last = false;   // The final (possibly shorter) interval.
};

struct TrainReport {
  uint64_t samples = 0;          // Trained by the whole job.
  uint64_t planned_samples = 0;  // 0: unknown.
  double elapsed_seconds = 0;
  double samples_per_second = 0;  // From the start of training to the end.
  // From the end of worker 0's batch kWarmupBatches to the end (0 for shorter runs): the steady
  // rate, without the first lookups into an empty PS and LibTorch's first-call costs.
  double steady_samples_per_second = 0;
  static constexpr uint64_t kWarmupBatches = 5;
  double first_loss = 0;                               // Worker 0's loss on its first batch.
  double mean_loss_last = 0;                           // Over the last log interval.
  std::vector<std::pair<uint64_t, double>> losses;     // (samples trained, mean loss of the interval)
  std::vector<std::pair<uint64_t, Evaluation>> evals;  // (samples trained, evaluation)
  bool has_final_eval = false;                         // False without held-out data or when interrupted.
  Evaluation final_eval;
  // The best of `evals` by eval.metric, and the samples trained when it was taken (the last
  // evaluation is final_eval, or evals.back() when there was none).
  bool has_best_eval = false;
  uint64_t best_eval_samples = 0;
  Evaluation best_eval;
  // The test split (eval.test_files / eval.test_samples), scored with the model the job keeps:
  // the best evaluation's with checkpoints, else the final one; and the samples trained when that
  // model was evaluated.
  bool has_test_eval = false;
  uint64_t test_eval_samples = 0;
  Evaluation test_eval;
  bool stopped_early = false;      // eval.patience evaluations in a row did not improve on the best.
  double teacher_auc = 0;          // Synthetic sources: the best reachable (0: unknown).
  bool interrupted = false;        // Stopped on request before the end of the data.
  uint64_t dense_fingerprint = 0;  // DenseFingerprint of the trained dense parameters.
  double dense_sum = 0;            // Sum of every dense parameter (for tolerances).
  uint64_t dense_parameters = 0;   // How many there are (the allreduce sends as many gradients).
  TrainerStats stats;              // Worker 0's.
  // Checkpoints (checkpoint.dir): the newest committed one and the best evaluation's (whenever
  // held-out evaluations ran), as directories; the export written at the end (export.dir).
  std::string last_checkpoint;
  std::string best_checkpoint;
  std::string export_dir;
  // Which model the export holds: the checkpoint it was written from, the samples trained when
  // that checkpoint was cut, and why that one.
  enum class ExportReason {
    kNone,              // No export was written.
    kBestEvaluation,    // The best held-out evaluation's checkpoint.
    kNoEvaluation,      // The last checkpoint: no held-out evaluation ran.
    kBestNotCommitted,  // The last checkpoint: the best evaluation's cut was not committed.
  };
  std::string export_checkpoint;
  uint64_t export_samples = 0;
  ExportReason export_reason = ExportReason::kNone;
  int checkpoints = 0;                  // Committed by this run (worker 0).
  int checkpoint_failures = 0;          // Cuts that failed (logged; the job went on).
  double checkpoint_pause_seconds = 0;  // Training time this worker spent in cuts.
  double checkpoint_write_seconds = 0;  // Worker 0: from each committed cut to its manifest's commit.
  uint64_t resumed_step = 0;            // The step the run resumed from (0: a fresh start).
  // Resumed from a checkpoint at the end of the data: nothing was trained, evaluated, cut or
  // exported.
  bool resumed_at_end = false;
  int heals = 0;  // Times this worker's group healed from a lost peer (a replacement's join counts).
};

// TrainReport::ExportReason as a word ("none", "best_evaluation", "no_evaluation",
// "best_not_committed"), as the --report file and the workers' events carry it, and back.
const char* ExportReasonName(TrainReport::ExportReason reason);
bool ParseExportReason(const std::string& name, TrainReport::ExportReason* reason);

// What worker 0 reports as training goes; called on its training thread.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void OnProgress(const Progress& progress) = 0;
  virtual void OnEvaluation(uint64_t samples, const Evaluation& evaluation) = 0;
  virtual void OnFinish(const TrainReport& report) = 0;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_REPORT_H_
