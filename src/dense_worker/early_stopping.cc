#include "src/dense_worker/early_stopping.h"

namespace hyrec::dense_worker {

bool EarlyStopping::Note(uint64_t samples, const Evaluation& e) {
  report_->evals.emplace_back(samples, e);
  const Evaluation& best = report_->best_eval;
  const bool better = !report_->has_best_eval || (by_auc_ ? e.auc > best.auc : e.log_loss < best.log_loss);
  if (better) {
    report_->has_best_eval = true;
    report_->best_eval = e;
    report_->best_eval_samples = samples;
    evals_without_gain_ = 0;
    return true;
  }
  ++evals_without_gain_;
  if (patience_ > 0 && evals_without_gain_ >= patience_) stopped_ = true;
  return false;
}

}  // namespace hyrec::dense_worker
