// Follower: serving's view of a training job's export.dir, kept up to date while the job trains.
// It holds the newest complete model: a base export (an export directory, kind "export", or
// none before a job's first) with every committed delta after it applied in order
// (export.delta_every_*). Poll brings it up to
// date; a scorer takes model() and scores with it, and no Poll ever changes a model once handed
// out, so a scorer never sees a half-applied delta.
//
//   HYREC_ASSIGN_OR_RETURN(auto follower, Follower::Start("model/"));
//   for (;;) {
//     HYREC_ASSIGN_OR_RETURN(bool changed, follower->Poll());
//     std::shared_ptr<const Follower::Model> m = follower->model();
//     HYREC_RETURN_IF_ERROR(m->predictor->ScoreLines(source, lines, &logits));
//   }
//
// A newer base (an export of a greater step than the model's: the job's compaction, its final
// export, `hyrec export`) replaces the model whole; then the deltas after it are applied. A gap in
// the deltas, or a delta that does not verify, is refused (DATA_LOSS naming it) and the model
// stays as it was, until a newer base ends the gap.
#ifndef HYREC_DENSE_WORKER_FOLLOWER_H_
#define HYREC_DENSE_WORKER_FOLLOWER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/env.h"
#include "hyrec/dense_worker/predictor.h"

namespace hyrec::dense_worker {

class Follower {
 public:
  // One complete model; immutable.
  struct Model {
    std::shared_ptr<Predictor> predictor;
    std::string base;              // The base export's directory.
    std::string newest;            // The directory of the last delta applied, or the base.
    uint64_t step = 0;             // Of the base or of the last delta applied.
    uint64_t samples = 0;          // The job had trained at that cut,
    uint64_t created_unix_ms = 0;  // which was taken then.
    uint64_t delta_sequence = 0;   // The last delta applied (a base alone: the last before its cut).
    int deltas = 0;                // Deltas applied onto the base.
  };

  // Loads the newest base export under `export_root` and the deltas after it. Before a job's
  // first base, a follower starts from its first delta (sequence 1, which holds every row the
  // job's first run changed) when that is still there. NotFound when the root holds neither yet;
  // a damaged export, a gap or a damaged delta is an error as in Poll.
  static absl::StatusOr<std::unique_ptr<Follower>> Start(const std::string& export_root, Env* env = nullptr);

  // Brings the model up to date with what the root holds now: a newer base, then the committed
  // deltas after the model's. Returns whether the model changed (a greater step: deltas cut at
  // the model's own step are applied and counted, and change nothing). On an error the model is
  // as it was. Call from one thread at a time.
  absl::StatusOr<bool> Poll();

  // The newest complete model. Thread-safe.
  std::shared_ptr<const Model> model() const;

 private:
  Follower(std::string root, Env* env) : root_(std::move(root)), env_(env) {}
  // The newest base export that is newer than the model (greater step), or "" when none is.
  absl::StatusOr<std::string> NewerBase() const;

  const std::string root_;
  Env* const env_;
  ServingRows rows_;  // The model's rows (Poll's thread only).
  std::string base_;
  int deltas_ = 0;
  bool loaded_ = false;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Model> model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_FOLLOWER_H_
