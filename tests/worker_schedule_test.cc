// The training loop's parts that decide without LibTorch: when it cuts (CutSchedule) and when
// it stops early and which evaluation is the best (EarlyStopping).
#include <gtest/gtest.h>

#include "src/dense_worker/cut_schedule.h"
#include "src/dense_worker/early_stopping.h"

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
  EXPECT_FALSE(schedule.has_deltas());
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

}  // namespace
}  // namespace hyrec::dense_worker
