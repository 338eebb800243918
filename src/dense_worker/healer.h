// Healer: how a group of dense workers that lost a peer goes on. A collective failed (the
// cause); the survivors wait for the lost worker's replacement and form the next generation
// with it (Regroup), then every rank of that generation agrees on one dense state and the run's
// counters (Agree): the newest survivor's, the lowest rank among those with the most completed
// steps. What a rank then does with the agreed state (apply it, settle or retrain its batch, a
// replacement's set-up) is the training loop's.
//
//   Healer healer(sync, {.rank = rank, .timeout = absl::Seconds(60), .stop = &stop});
//   if (!healer.CanHeal()) return cause;
//   HYREC_RETURN_IF_ERROR(healer.Regroup(cause));
//   HYREC_ASSIGN_OR_RETURN(Healer::Agreement a, healer.Agree(completed_steps, capture_state));
//
// Thread safety: the training thread's, as its DenseSync.
#ifndef HYREC_SRC_DENSE_WORKER_HEALER_H_
#define HYREC_SRC_DENSE_WORKER_HEALER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/dense_worker/checkpoint.h"
#include "hyrec/nn_sync/dense_sync.h"

namespace hyrec::dense_worker {

// What a healed group's newest survivor hands the others: its dense state and the run's
// counters, so that every rank (a replacement too) goes on from the same step.
struct HealState {
  DenseState dense;              // model and optimizer; dense.state is not carried (the counters below are).
  uint64_t sequence_origin = 0;  // The update sequence of step s is this + s.
  uint32_t run_tag = 0;
  uint64_t base_step = 0, base_samples = 0;  // Of the checkpoint the run resumed from.
  uint64_t run_samples = 0;                  // The survivor's samples of this run (a replacement's predecessor's).
  int64_t last_batch_id = -1;                // Of the survivor's last trained batch; -1: none in this run.
  uint64_t last_cut_step = UINT64_MAX;
  uint64_t delta_sequence = 0;
  uint64_t cuts = 0;  // The run's cuts so far: the next one's directory name takes it.
  std::string best_checkpoint;
};

// The bytes one rank broadcasts, and back; malformed bytes are DATA_LOSS.
std::string EncodeHealState(const HealState& state);
absl::StatusOr<HealState> DecodeHealState(const std::string& bytes);

struct HealerOptions {
  int rank = 0;
  // How long the survivors wait for a replacement (train.heal_timeout_seconds); zero: a lost
  // peer fails the worker.
  absl::Duration timeout = absl::ZeroDuration();
  // A stop request (SIGTERM; the launcher stops the survivors when worker 0, the rendezvous's
  // host, was lost) ends the wait. May be null.
  const std::atomic<bool>* stop = nullptr;
  // The wait's slices: one that times out is repeated (joining a generation again is harmless)
  // until `timeout`, so that a stop request is seen within a slice.
  absl::Duration slice = absl::Seconds(2);
};

class Healer {
 public:
  // `sync` may be null (a worker alone: nothing heals); it must outlive this.
  Healer(nn_sync::DenseSync* sync, HealerOptions options) : sync_(sync), o_(options) {}

  // Whether a lost peer is waited for: a group, a timeout, and no stop requested.
  bool CanHeal() const;

  // Waits for the lost peer's replacement and forms the next generation with it. An error
  // carries `cause` and why the regroup failed (no replacement in time, worker 0 gone, a stop).
  absl::Status Regroup(const absl::Status& cause);

  struct Agreement {
    HealState state;     // The source's.
    int source = 0;      // The rank whose state it is.
    int64_t newest = 0;  // Its completed steps: the group goes on from there.
  };
  // Every rank of a new generation, survivors and replacements, at the same point: `completed`
  // is this rank's completed global steps (-1: a replacement, which has none); `capture` runs on
  // the source alone. FAILED_PRECONDITION when no rank has trained state.
  absl::StatusOr<Agreement> Agree(int64_t completed, const std::function<absl::StatusOr<HealState>()>& capture);

 private:
  nn_sync::DenseSync* const sync_;
  const HealerOptions o_;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_HEALER_H_
