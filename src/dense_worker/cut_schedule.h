// CutSchedule: when a training run cuts a checkpoint or a delta. By steps, every worker knows
// the cuts due after a step on its own; by time, by request (SIGUSR1) or by the size of the PS
// update logs, worker 0 wishes for one and the step's vote tells the others. Times come from the
// caller, so that the schedule is tested without a clock. Not thread-safe; no LibTorch.
#ifndef HYREC_SRC_DENSE_WORKER_CUT_SCHEDULE_H_
#define HYREC_SRC_DENSE_WORKER_CUT_SCHEDULE_H_

#include <cstdint>
#include <functional>

#include "absl/time/time.h"

namespace hyrec::dense_worker {

struct CutScheduleOptions {
  bool checkpoints = false;             // The job has checkpoint.dir.
  int64_t checkpoint_every_steps = 0;   // 0: not by steps.
  double checkpoint_every_seconds = 0;  // 0: not by time.
  int64_t delta_every_steps = 0;
  double delta_every_seconds = 0;
  uint64_t update_log_max_bytes = 0;  // A checkpoint once a shard's log holds this much; 0: never.
};

class CutSchedule {
 public:
  explicit CutSchedule(CutScheduleOptions options) : o_(options) {}

  // Why worker 0 wants a checkpoint before the next step.
  enum class Wish { kNone, kAsked, kTime, kLogBytes };

  // The clocks start (a run's cuts set up at `now`); the last checkpoint was cut at `step`
  // (UINT64_MAX: none this run).
  void Start(absl::Time now, uint64_t last_checkpoint_step);
  // The cuts due after global step `step` by step counts.
  bool CheckpointAfterStep(uint64_t step) const;
  bool DeltaAfterStep(uint64_t step) const;
  // Worker 0's wish before the next step: `asked` (a request), the checkpoint interval passed,
  // or `largest_log_bytes()` (called only with a bound) at the update logs' bound.
  Wish WantsCheckpoint(absl::Time now, bool asked, const std::function<uint64_t()>& largest_log_bytes) const;
  bool WantsDelta(absl::Time now) const;
  // A checkpoint was cut at global step `step`, at `now`; a delta at `now`.
  void CheckpointCut(uint64_t step, absl::Time now);
  void DeltaCut(absl::Time now) { last_delta_at_ = now; }
  // The step of the last checkpoint (UINT64_MAX: none this run): the final one is skipped when
  // nothing trained since.
  uint64_t last_checkpoint_step() const { return last_checkpoint_step_; }

 private:
  CutScheduleOptions o_;
  uint64_t last_checkpoint_step_ = UINT64_MAX;
  absl::Time last_checkpoint_at_ = absl::InfinitePast();
  absl::Time last_delta_at_ = absl::InfinitePast();
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_CUT_SCHEDULE_H_
