#include "src/dense_worker/evaluator.h"

#include <utility>

#include "hyrec/common/status_macros.h"

namespace hyrec::dense_worker {

Evaluator::Evaluator(const EvaluatorOptions& options, ScoreFn score, TrainObserver* observer, TrainReport* report)
    : o_(options),
      score_(std::move(score)),
      observer_(observer),
      report_(report),
      early_stopping_(options.metric, options.patience, report) {}

bool Evaluator::DueAfterStep(uint64_t run_steps) const {
  return o_.has_eval_data && o_.every_batches > 0 && run_steps % static_cast<uint64_t>(o_.every_batches) == 0;
}

bool Evaluator::DueAtEpoch(uint64_t run_steps, uint64_t last_epoch, uint64_t batch_epoch) const {
  return o_.has_eval_data && o_.every_epoch && run_steps > 0 && batch_epoch != last_epoch;
}

absl::StatusOr<Evaluator::Verdict> Evaluator::Evaluate(uint64_t samples) {
  Verdict v;
  HYREC_ASSIGN_OR_RETURN(v.eval, score_(Split::kEval));
  v.improved = early_stopping_.Note(samples, v.eval);
  v.keep_best = v.improved && o_.keeps_best;
  if (v.keep_best) HYREC_RETURN_IF_ERROR(Test(samples));
  if (observer_ != nullptr) observer_->OnEvaluation(samples, v.eval);
  return v;
}

absl::Status Evaluator::Finish(uint64_t samples, bool interrupted) {
  if (!o_.has_eval_data || interrupted) return absl::OkStatus();
  if (!report_->evals.empty() && report_->evals.back().first == samples) {
    // Nothing was trained since the last evaluation (an early stop, an epoch's end).
    report_->final_eval = report_->evals.back().second;
  } else {
    HYREC_ASSIGN_OR_RETURN(report_->final_eval, score_(Split::kEval));
    const bool improved = early_stopping_.Note(samples, report_->final_eval);
    if (observer_ != nullptr) observer_->OnEvaluation(samples, report_->final_eval);
    if (improved && o_.keeps_best) HYREC_RETURN_IF_ERROR(Test(samples));
  }
  report_->has_final_eval = true;
  if (!o_.keeps_best) HYREC_RETURN_IF_ERROR(Test(samples));
  return absl::OkStatus();
}

absl::Status Evaluator::Test(uint64_t samples) {
  if (!o_.has_test_data) return absl::OkStatus();
  HYREC_ASSIGN_OR_RETURN(report_->test_eval, score_(Split::kTest));
  report_->has_test_eval = true;
  report_->test_eval_samples = samples;
  return absl::OkStatus();
}

EvaluatorState Evaluator::state() const {
  EvaluatorState s;
  s.has_best = report_->has_best_eval;
  s.best = report_->best_eval;
  s.best_at_samples = report_->best_eval_samples;
  s.evals_without_gain = early_stopping_.evals_without_gain();
  return s;
}

void Evaluator::Resume(const EvaluatorState& s) {
  early_stopping_.set_evals_without_gain(s.evals_without_gain);
  report_->has_best_eval = s.has_best;
  if (!s.has_best) return;
  report_->best_eval = s.best;
  report_->best_eval_samples = s.best_at_samples;
}

}  // namespace hyrec::dense_worker
