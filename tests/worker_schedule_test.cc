// The training loop's parts that decide without LibTorch: when it cuts (CutSchedule), when it
// evaluates, which model it keeps and tests (Evaluator), and when it stops early and which
// evaluation is the best (EarlyStopping).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/dense_worker/cut_schedule.h"
#include "src/dense_worker/early_stopping.h"
#include "src/dense_worker/evaluator.h"
#include "src/dense_worker/progressive_validation.h"

namespace hyrec::dense_worker {
namespace {

absl::Time At(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }
uint64_t NoLog() {
  ADD_FAILURE() << "the logs' size is asked for only with a bound";
  return 0;
}

TEST(CutSchedule, CutsByStepsByTimeOnRequestAndAtTheLogsBound) {
  CutScheduleOptions o;
  o.checkpoints = true;
  o.checkpoint_every_steps = 100;
  o.checkpoint_every_seconds = 60;
  o.delta_every_steps = 10;
  o.delta_every_seconds = 5;
  CutSchedule schedule(o);
  schedule.Start(At(0), UINT64_MAX);
  EXPECT_TRUE(schedule.CheckpointAfterStep(200));
  EXPECT_FALSE(schedule.CheckpointAfterStep(250));
  EXPECT_TRUE(schedule.DeltaAfterStep(250));
  EXPECT_FALSE(schedule.DeltaAfterStep(255));
  EXPECT_EQ(schedule.WantsCheckpoint(At(59), false, NoLog), CutSchedule::Wish::kNone);
  EXPECT_EQ(schedule.WantsCheckpoint(At(59), true, NoLog), CutSchedule::Wish::kAsked);
  EXPECT_EQ(schedule.WantsCheckpoint(At(60), false, NoLog), CutSchedule::Wish::kTime);
  schedule.CheckpointCut(300, At(60));  // The clock restarts at the cut.
  EXPECT_EQ(schedule.WantsCheckpoint(At(100), false, NoLog), CutSchedule::Wish::kNone);
  EXPECT_EQ(schedule.last_checkpoint_step(), 300u);
  EXPECT_FALSE(schedule.WantsDelta(At(4)));
  EXPECT_TRUE(schedule.WantsDelta(At(5)));
  schedule.DeltaCut(At(5));
  EXPECT_FALSE(schedule.WantsDelta(At(9)));

  o.update_log_max_bytes = 1000;
  CutSchedule bounded(o);
  bounded.Start(At(0), 7);
  EXPECT_EQ(bounded.WantsCheckpoint(At(1), false, [] { return uint64_t{999}; }), CutSchedule::Wish::kNone);
  EXPECT_EQ(bounded.WantsCheckpoint(At(1), false, [] { return uint64_t{1000}; }), CutSchedule::Wish::kLogBytes);
  EXPECT_EQ(bounded.last_checkpoint_step(), 7u);
}

TEST(CutSchedule, AJobWithoutCheckpointsNeverWantsOne) {
  CutScheduleOptions o;
  o.checkpoint_every_steps = 1;
  o.checkpoint_every_seconds = 1;
  o.update_log_max_bytes = 1;
  CutSchedule schedule(o);
  schedule.Start(At(0), UINT64_MAX);
  EXPECT_FALSE(schedule.CheckpointAfterStep(1));
  EXPECT_EQ(schedule.WantsCheckpoint(At(100), true, NoLog), CutSchedule::Wish::kNone);
  EXPECT_FALSE(schedule.WantsDelta(At(100)));
}

TEST(EarlyStopping, KeepsTheBestByItsMetricAndStopsAfterPatience) {
  TrainReport report;
  EarlyStopping auc("auc", 2, &report);
  EXPECT_TRUE(auc.Note(100, Evaluation{0.70, 0.5, 10}));
  EXPECT_TRUE(auc.Note(200, Evaluation{0.75, 0.6, 10}));  // Higher AUC wins, whatever the loss.
  EXPECT_FALSE(auc.Note(300, Evaluation{0.74, 0.4, 10}));
  EXPECT_FALSE(auc.stopped());
  EXPECT_FALSE(auc.Note(400, Evaluation{0.75, 0.4, 10}));  // Equal is no gain.
  EXPECT_TRUE(auc.stopped());
  EXPECT_EQ(auc.evals_without_gain(), 2);
  EXPECT_EQ(report.evals.size(), 4u);
  EXPECT_TRUE(report.has_best_eval);
  EXPECT_EQ(report.best_eval_samples, 200u);
  EXPECT_EQ(report.best_eval.auc, 0.75);

  TrainReport by_loss;
  EarlyStopping loss("log_loss", 0, &by_loss);
  EXPECT_TRUE(loss.Note(1, Evaluation{0.9, 0.5, 1}));
  EXPECT_TRUE(loss.Note(2, Evaluation{0.1, 0.4, 1}));  // Lower loss wins, whatever the AUC.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(loss.Note(3 + i, Evaluation{0.9, 0.45, 1}));
  EXPECT_FALSE(loss.stopped()) << "patience 0: never";
  EXPECT_EQ(by_loss.best_eval_samples, 2u);

  // A resumed run goes on counting from its checkpoint.
  TrainReport resumed;
  EarlyStopping again("auc", 3, &resumed);
  again.set_evals_without_gain(2);
  resumed.has_best_eval = true;
  resumed.best_eval = Evaluation{0.8, 0.3, 1};
  EXPECT_FALSE(again.Note(10, Evaluation{0.79, 0.3, 1}));
  EXPECT_TRUE(again.stopped());
}

// Scores from a script: the eval split's in order, the test split's as 0.5 + the evaluations
// scored so far / 100; records what was asked for.
class ScriptedScores {
 public:
  explicit ScriptedScores(std::vector<double> eval_aucs) : eval_aucs_(std::move(eval_aucs)) {}
  Evaluator::ScoreFn fn() {
    return [this](Evaluator::Split split) -> absl::StatusOr<Evaluation> {
      asked_.push_back(split);
      if (split == Evaluator::Split::kTest) return Evaluation{0.5 + next_ / 100.0, 0.1, 7};
      if (next_ >= eval_aucs_.size()) return absl::InternalError("no score left");
      return Evaluation{eval_aucs_[next_++], 0.2, 9};
    };
  }
  size_t tests() const { return std::count(asked_.begin(), asked_.end(), Evaluator::Split::kTest); }
  size_t evals() const { return asked_.size() - tests(); }

 private:
  std::vector<double> eval_aucs_;
  size_t next_ = 0;
  std::vector<Evaluator::Split> asked_;
};

class CountingObserver : public TrainObserver {
 public:
  void OnProgress(const Progress&) override {}
  void OnEvaluation(uint64_t samples, const Evaluation&) override { seen.push_back(samples); }
  void OnFinish(const TrainReport&) override {}
  std::vector<uint64_t> seen;
};

EvaluatorOptions WithHeldOut(bool keeps_best) {
  EvaluatorOptions o;
  o.has_eval_data = true;
  o.has_test_data = true;
  o.keeps_best = keeps_best;
  o.every_batches = 10;
  o.every_epoch = true;
  return o;
}

TEST(Evaluator, IsDueByStepsAndAtANewEpochOnlyWithHeldOutData) {
  Evaluator e(WithHeldOut(false), ScriptedScores({}).fn(), nullptr, nullptr);
  EXPECT_FALSE(e.DueAfterStep(9));
  EXPECT_TRUE(e.DueAfterStep(20));
  EXPECT_FALSE(e.DueAtEpoch(0, 0, 1)) << "nothing trained yet";
  EXPECT_FALSE(e.DueAtEpoch(5, 1, 1));
  EXPECT_TRUE(e.DueAtEpoch(5, 1, 2));
  EvaluatorOptions none = WithHeldOut(false);
  none.has_eval_data = false;
  Evaluator without(none, ScriptedScores({}).fn(), nullptr, nullptr);
  EXPECT_FALSE(without.DueAfterStep(20));
  EXPECT_FALSE(without.DueAtEpoch(5, 1, 2));
}

// Keeping the best: each new best is kept (cut) and tested at once; the final evaluation, when
// it is no gain, leaves the test of the best standing.
TEST(Evaluator, AJobThatKeepsTheBestTestsEachNewBestAndNotTheLast) {
  TrainReport report;
  ScriptedScores scores({0.70, 0.75, 0.72, 0.71});
  CountingObserver observer;
  Evaluator e(WithHeldOut(true), scores.fn(), &observer, &report);
  absl::StatusOr<Evaluator::Verdict> v = e.Evaluate(100);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->improved);
  EXPECT_TRUE(v->keep_best);
  v = e.Evaluate(200);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->keep_best);
  EXPECT_EQ(v->eval.auc, 0.75);
  v = e.Evaluate(300);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->improved);
  EXPECT_FALSE(v->keep_best);
  EXPECT_EQ(scores.tests(), 2u);
  EXPECT_EQ(report.test_eval_samples, 200u);
  ASSERT_TRUE(e.Finish(400, /*interrupted=*/false).ok());
  EXPECT_TRUE(report.has_final_eval);
  EXPECT_EQ(report.final_eval.auc, 0.71);
  EXPECT_EQ(scores.tests(), 2u) << "the kept model is the best's, tested when it was taken";
  EXPECT_EQ(report.test_eval_samples, 200u);
  EXPECT_EQ(report.best_eval_samples, 200u);
  EXPECT_EQ(observer.seen, (std::vector<uint64_t>{100, 200, 300, 400}));
}

// Without checkpoints the job keeps the last model: tested once, at the end; an evaluation
// taken with nothing trained since is not taken again.
TEST(Evaluator, AJobThatKeepsTheLastModelTestsItAtTheEnd) {
  TrainReport report;
  ScriptedScores scores({0.70, 0.75});
  Evaluator e(WithHeldOut(false), scores.fn(), nullptr, &report);
  ASSERT_TRUE(e.Evaluate(100).ok());
  absl::StatusOr<Evaluator::Verdict> v = e.Evaluate(200);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->improved);
  EXPECT_FALSE(v->keep_best);
  EXPECT_EQ(scores.tests(), 0u);
  ASSERT_TRUE(e.Finish(200, /*interrupted=*/false).ok());
  EXPECT_EQ(scores.evals(), 2u);
  EXPECT_EQ(report.final_eval.auc, 0.75);
  EXPECT_EQ(scores.tests(), 1u);
  EXPECT_TRUE(report.has_test_eval);
  EXPECT_EQ(report.test_eval_samples, 200u);

  TrainReport interrupted_report;
  ScriptedScores none({});
  Evaluator interrupted(WithHeldOut(false), none.fn(), nullptr, &interrupted_report);
  ASSERT_TRUE(interrupted.Finish(50, /*interrupted=*/true).ok());
  EXPECT_FALSE(interrupted_report.has_final_eval);
  EXPECT_EQ(none.evals() + none.tests(), 0u);
}

TEST(Evaluator, PatienceStopsAndAResumedRunGoesOnCounting) {
  EvaluatorOptions o = WithHeldOut(true);
  o.patience = 2;
  TrainReport report;
  ScriptedScores scores({0.8, 0.7});
  Evaluator e(o, scores.fn(), nullptr, &report);
  ASSERT_TRUE(e.Evaluate(10).ok());
  ASSERT_TRUE(e.Evaluate(20).ok());
  EXPECT_FALSE(e.stopped());
  const EvaluatorState saved = e.state();
  EXPECT_TRUE(saved.has_best);
  EXPECT_EQ(saved.best.auc, 0.8);
  EXPECT_EQ(saved.best_at_samples, 10u);
  EXPECT_EQ(saved.evals_without_gain, 1);

  TrainReport resumed_report;
  ScriptedScores more({0.79});
  Evaluator resumed(o, more.fn(), nullptr, &resumed_report);
  resumed.Resume(saved);
  absl::StatusOr<Evaluator::Verdict> v = resumed.Evaluate(30);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->improved) << "0.79 is below the resumed best";
  EXPECT_TRUE(resumed.stopped());
  EXPECT_EQ(resumed_report.best_eval_samples, 10u);

  ScriptedScores failing({});
  Evaluator broken(o, failing.fn(), nullptr, &report);
  EXPECT_EQ(broken.Evaluate(40).status().code(), absl::StatusCode::kInternal);
}

// The window holds the last samples only; AUC and log loss are over what it holds.
TEST(ProgressiveValidation, MeasuresTheLastWindowOfSamples) {
  ProgressiveValidation pv(4);
  EXPECT_EQ(pv.Measure().samples, 0u);
  const float wrong_logits[] = {5, 5, -5, -5};
  const float wrong_labels[] = {0, 0, 1, 1};
  pv.Add(wrong_logits, wrong_labels, 4);
  Evaluation e = pv.Measure();
  EXPECT_EQ(e.samples, 4u);
  EXPECT_EQ(e.auc, 0.0);
  EXPECT_NEAR(e.log_loss, 5.0067153, 1e-5);  // -log(sigmoid(-5)).
  const float right_logits[] = {2, -3, 1, -1};
  const float right_labels[] = {1, 0, 1, 0};
  pv.Add(right_logits, right_labels, 3);  // Three of the four replaced.
  e = pv.Measure();
  EXPECT_EQ(e.samples, 4u);
  // Kept: (-5, 1) and the three right ones: positives 2, 1, -5; negatives -3.
  EXPECT_NEAR(e.auc, 2.0 / 3.0, 1e-9);
  pv.Add(right_logits + 3, right_labels + 3, 1);
  EXPECT_EQ(pv.Measure().auc, 1.0);
  EXPECT_NEAR(pv.Measure().log_loss,
              (std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-3.0)) + std::log1p(std::exp(-1.0)) +
               std::log1p(std::exp(-1.0))) /
                  4,
              1e-6);
}

}  // namespace
}  // namespace hyrec::dense_worker
