// Evaluator: worker 0's held-out evaluations during a run. It scores the model on the eval
// split when the loop asks (every eval.every_batches steps, at a new epoch, at the end), judges
// them with EarlyStopping, and scores the test split with the model the job keeps: the best
// evaluation's when the job keeps the best (held-out data and checkpoints), else the final one.
// Everything lands in the run's TrainReport and goes to the observer. The scoring itself is the
// caller's (a function), so that the decisions are tested without a model. Not thread-safe;
// no LibTorch.
//
//   Evaluator evaluator(EvaluatorOptionsFor(plan), score, observer, &report);
//   HYREC_ASSIGN_OR_RETURN(const Evaluator::Verdict v, evaluator.Evaluate(samples));
//   if (v.keep_best) { /* cut a checkpoint of this model */ }
//   if (evaluator.stopped()) { /* patience ran out */ }
#ifndef HYREC_SRC_DENSE_WORKER_EVALUATOR_H_
#define HYREC_SRC_DENSE_WORKER_EVALUATOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "hyrec/dense_worker/report.h"
#include "src/dense_worker/early_stopping.h"

namespace hyrec::dense_worker {

struct EvaluatorOptions {
  bool has_eval_data = false;  // Without it nothing is evaluated.
  bool has_test_data = false;  // Without it nothing is tested.
  // The job keeps the best evaluation's model (held-out data and checkpoints): a new best is
  // cut as a checkpoint and tested at once.
  bool keeps_best = false;
  std::string metric = "auc";  // eval.metric: auc (higher wins) or log_loss (lower wins).
  int patience = 0;            // eval.patience; 0: never stop early.
  int64_t every_batches = 0;   // eval.every_batches; 0: not by steps.
  bool every_epoch = false;    // eval.every_epoch: before the first step of each new epoch.
};

// What a checkpoint keeps of the evaluations, so that a resumed run goes on judging them.
struct EvaluatorState {
  bool has_best = false;
  Evaluation best;
  uint64_t best_at_samples = 0;  // Samples trained when the best was taken.
  int evals_without_gain = 0;
};

class Evaluator {
 public:
  enum class Split { kEval, kTest };
  // Scores the model as it is now on one held-out split.
  using ScoreFn = std::function<absl::StatusOr<Evaluation>(Split)>;

  // `observer` may be null; `report` must outlive this.
  Evaluator(const EvaluatorOptions& options, ScoreFn score, TrainObserver* observer, TrainReport* report);

  // Whether an evaluation is due after this run's step `run_steps` (1-based), or before a batch
  // of `batch_epoch` when the last trained one was of `last_epoch` (a new epoch).
  bool DueAfterStep(uint64_t run_steps) const;
  bool DueAtEpoch(uint64_t run_steps, uint64_t last_epoch, uint64_t batch_epoch) const;

  struct Verdict {
    Evaluation eval;
    bool improved = false;   // The new best.
    bool keep_best = false;  // improved, and the job keeps the best: cut it as a checkpoint.
  };
  // Scores the eval split with `samples` trained, records it, judges early stopping and, for a
  // new best the job keeps, scores the test split.
  absl::StatusOr<Verdict> Evaluate(uint64_t samples);

  // At the end of a run that trained `samples`: the final evaluation (the last one again when
  // nothing trained since it) and the test split when the job keeps the final model. Nothing
  // when interrupted or without held-out data.
  absl::Status Finish(uint64_t samples, bool interrupted);

  bool keeps_best() const { return o_.keeps_best; }
  // Whether the run stops early: patience ran out here, or (on the other workers) set_stopped
  // passed worker 0's decision on.
  bool stopped() const { return early_stopping_.stopped(); }
  void set_stopped(bool stopped) { early_stopping_.set_stopped(stopped); }

  EvaluatorState state() const;
  void Resume(const EvaluatorState& state);

 private:
  absl::Status Test(uint64_t samples);

  const EvaluatorOptions o_;
  const ScoreFn score_;
  TrainObserver* const observer_;
  TrainReport* const report_;
  EarlyStopping early_stopping_;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_EVALUATOR_H_
