// EarlyStopping: what worker 0 makes of its held-out evaluations. It records each, keeps the best
// by eval.metric (auc: higher; log_loss: lower), and stops the run once eval.patience
// evaluations in a row did not improve on the best. Not thread-safe; no LibTorch.
#ifndef HYREC_SRC_DENSE_WORKER_EARLY_STOPPING_H_
#define HYREC_SRC_DENSE_WORKER_EARLY_STOPPING_H_

#include <cstdint>
#include <string>

#include "hyrec/dense_worker/report.h"

namespace hyrec::dense_worker {

class EarlyStopping {
 public:
  // `report` receives the evaluations and the best (evals, has_best_eval, best_eval,
  // best_eval_samples) and must outlive this. patience 0: never stop.
  EarlyStopping(const std::string& metric, int patience, TrainReport* report)
      : by_auc_(metric != "log_loss"), patience_(patience), report_(report) {}

  // Records the evaluation taken when `samples` had trained; true when it is the new best.
  bool Note(uint64_t samples, const Evaluation& e);
  // Whether patience ran out (or Stop was called: worker 0 decided, the others learn it).
  bool stopped() const { return stopped_; }
  void set_stopped(bool stopped) { stopped_ = stopped; }
  // Evaluations since the best, which a checkpoint carries so that a resumed run goes on counting.
  int evals_without_gain() const { return evals_without_gain_; }
  void set_evals_without_gain(int n) { evals_without_gain_ = n; }

 private:
  const bool by_auc_;
  const int patience_;
  TrainReport* const report_;
  int evals_without_gain_ = 0;
  bool stopped_ = false;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_EARLY_STOPPING_H_
