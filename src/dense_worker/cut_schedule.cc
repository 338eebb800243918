#include "src/dense_worker/cut_schedule.h"

namespace hyrec::dense_worker {

void CutSchedule::Start(absl::Time now, uint64_t last_checkpoint_step) {
  last_checkpoint_at_ = now;
  last_delta_at_ = now;
  last_checkpoint_step_ = last_checkpoint_step;
}

bool CutSchedule::CheckpointAfterStep(uint64_t step) const {
  const int64_t every = o_.checkpoint_every_steps;
  return o_.checkpoints && every > 0 && step % static_cast<uint64_t>(every) == 0;
}

bool CutSchedule::DeltaAfterStep(uint64_t step) const {
  const int64_t every = o_.delta_every_steps;
  return every > 0 && step % static_cast<uint64_t>(every) == 0;
}

CutSchedule::Wish CutSchedule::WantsCheckpoint(absl::Time now, bool asked,
                                               const std::function<uint64_t()>& largest_log_bytes) const {
  if (!o_.checkpoints) return Wish::kNone;
  if (asked) return Wish::kAsked;
  const double every = o_.checkpoint_every_seconds;
  if (every > 0 && now - last_checkpoint_at_ >= absl::Seconds(every)) return Wish::kTime;
  const uint64_t bound = o_.update_log_max_bytes;
  if (bound == 0) return Wish::kNone;
  const uint64_t logged = largest_log_bytes();
  return logged >= bound ? Wish::kLogBytes : Wish::kNone;
}

bool CutSchedule::WantsDelta(absl::Time now) const {
  const double every = o_.delta_every_seconds;
  return every > 0 && now - last_delta_at_ >= absl::Seconds(every);
}

void CutSchedule::CheckpointCut(uint64_t step, absl::Time now) {
  last_checkpoint_step_ = step;
  last_checkpoint_at_ = now;
}

}  // namespace hyrec::dense_worker
