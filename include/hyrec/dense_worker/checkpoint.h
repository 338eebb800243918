// Checkpoints, resume and export of a training job (docs/checkpoint-format.md).
//
// A checkpoint is one consistent cut of the whole job, taken at a step boundary that every worker
// agrees on (the step vote, worker.h):
//   1. every worker waits until all its embedding updates are acknowledged (the staleness window
//      drains: every update issued before the cut is applied);
//   2. every worker writes its loader position (after its last trained batch) into the
//      checkpoint's directory, unsynced (worker 0's commit syncs it); the workers agree that all
//      succeeded;
//   3. worker 0 asks every PS shard to copy its store (rows, optimizer state, admission and dedup
//      state) and copies the dense parameters, the dense optimizer's state and the training
//      counters into memory; the workers agree again, and only then train on (no update after
//      the cut can reach a shard before its copy is taken);
//   4. in the background, the shards write their files, worker 0 writes the dense file and,
//      once every file is durable, the manifest (the commit point), then retires old checkpoints.
// Training pauses for steps 1-3 only. Draining was chosen over versioned updates and
// watermarks: the window is at most embedding_staleness batches, so the drain costs a few
// batches' update latency, and the store needs no per-row versions.
//
// Deltas (export.delta_every_*) are cut the same way without positions: the shards write the
// rows changed since the previous delta, weights only, with tombstones for evicted rows.
#ifndef HYREC_DENSE_WORKER_CHECKPOINT_H_
#define HYREC_DENSE_WORKER_CHECKPOINT_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/data_loader/sample.h"
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/trainer.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/nn_sync/dense_sync.h"

namespace hyrec::dense_worker {

inline constexpr char kDenseFileName[] = "dense.blk";
inline constexpr char kModelFileName[] = "model.pt";

// The training counters a checkpoint keeps beside the weights.
struct TrainState {
  uint64_t step = 0;     // Optimizer steps each worker had taken.
  uint64_t samples = 0;  // Samples the job had trained.
  uint64_t epoch = 0;    // Of worker 0's last trained batch.
  bool has_best_eval = false;
  double best_auc = 0;
  double best_log_loss = 0;
  uint64_t best_eval_samples = 0;  // Held-out samples of the best evaluation.
  uint64_t best_at_samples = 0;    // Samples trained when it was taken.
  int evals_without_gain = 0;
  uint64_t delta_sequence = 0;  // Deltas taken before the cut.
  std::string best_checkpoint;  // Directory name of the best evaluation's checkpoint.
};

// The dense part of a checkpoint: LibTorch archives of the model and its optimizer, and the
// CPU generator's state (dropout), as bytes.
struct DenseState {
  TrainState state;
  std::string model;
  std::string optimizer;
  std::string rng;
};

// The dense state as tensor copies, taken while training waits and serialized later
// (SerializeDenseCopy) while it trains on: copying is a memcpy per tensor, serializing is not.
// The model is copied as Module::save lays it out (each module's parameters, buffers and
// serializable children, recursively; an override of save() is not called) and the optimizer's
// state (adam, adamw, adagrad, sgd) with its tensors cloned; another optimizer is serialized
// at once.
struct DenseCopy;
absl::StatusOr<std::shared_ptr<const DenseCopy>> CopyDenseState(DenseModelImpl& model,
                                                                torch::optim::Optimizer* optimizer,
                                                                const TrainState& state);
absl::StatusOr<DenseState> SerializeDenseCopy(const DenseCopy& copy);
// Both at once: the model's parameters (and buffers), its optimizer's state and the CPU
// generator's.
absl::StatusOr<DenseState> CaptureDenseState(DenseModelImpl& model, torch::optim::Optimizer* optimizer,
                                             const TrainState& state);
// Loads what CaptureDenseState copied into a model of the same plan (and its optimizer, when
// given): InvalidArgument naming the parameter when the shapes differ.
absl::Status ApplyDenseState(const DenseState& dense, DenseModelImpl& model, torch::optim::Optimizer* optimizer,
                             bool restore_rng);

absl::StatusOr<FileEntry> WriteDenseFile(Env* env, const std::string& dir, const DenseState& dense);
absl::StatusOr<DenseState> ReadDenseFile(Env* env, const std::string& dir, const CheckpointManifest& manifest);

// What a run resumes from.
struct ResumePoint {
  std::string dir;
  CheckpointManifest manifest;
  DenseState dense;
  std::vector<data_loader::ReaderPosition> positions;  // One per worker of the new run.
};

// Resolves `which` ("latest" under root, or a directory), verifies it and reads its dense state
// and positions (remapped to `workers`). A checkpoint that does not verify is never loaded:
// "latest" passes over it to the previous one (logged).
absl::StatusOr<ResumePoint> LoadResumePoint(Env* env, const std::string& root, const std::string& which, int workers);

// Worker 0 of a run (the process that commits checkpoints), before the workers form their group:
// takes checkpoint.dir for the run (ClaimCheckpointDir), as a run of the job of `resume` (the
// checkpoint it resumes from), or of a new job. No claim (and no job id) without checkpoint.dir.
absl::StatusOr<CheckpointDirClaim> ClaimRunCheckpointDir(Env* env, const std::string& checkpoint_dir,
                                                         const ResumePoint* resume);

// Builds the PS shard `shard` of a plan from a checkpoint (resharding when the counts differ).
absl::StatusOr<std::shared_ptr<embedding_ps::EmbeddingShardStore>> RestoreShardStore(Env* env, const std::string& dir,
                                                                                     const CheckpointManifest& manifest,
                                                                                     const job::PsShardPlan& shard);

// Writes the serving artifact of a checkpoint into a new directory under `export_root`
// ("model-<step>-<time>"): model.pt (the dense model's LibTorch archive), rows-<i>-of-<n>.blk
// (every shard's rows, weights only) and a manifest of kind "export" holding the job's text.
// Returns the directory.
absl::StatusOr<std::string> ExportCheckpoint(Env* env, const std::string& checkpoint_dir,
                                             const std::string& export_root);

// The committed export under `export_root` already made from the checkpoint `checkpoint_dir`
// (the same job, step, samples and delta sequence), or "" when there is none.
std::string FindExportOf(Env* env, const std::string& export_root, const std::string& checkpoint_dir);

// Retention of a job's serving artifacts under `export_root`: of the base exports of job `job_id`
// (any job when empty), the newest `keep_bases` are kept and older ones deleted, and so is every
// delta the oldest kept base already holds (its sequence at most that base's delta_sequence).
// Call once the newest base is committed.
absl::Status RetireExports(Env* env, const std::string& export_root, int keep_bases, const std::string& job_id);

// Runs a worker's cuts. Every worker of the job calls Cut at the same steps with the same kind.
class JobCuts {
 public:
  struct Options {
    const job::WorkerPlan* plan = nullptr;
    std::string job_text;
    embedding_ps::EmbeddingClient* ps = nullptr;
    nn_sync::DenseSync* sync = nullptr;  // Null with one worker.
    Env* env = nullptr;
    uint32_t run_tag = 0;  // The same on every worker; names this run's cuts.
    // Worker 0: the job its checkpoints belong to (ClaimRunCheckpointDir); its retention deletes
    // only that job's.
    std::string job_id;
  };
  explicit JobCuts(Options options);
  ~JobCuts();

  enum class Kind { kCheckpoint, kDelta };
  // One cut at a step boundary, its drain (every update acknowledged) done since `began`, which
  // the pause counts from. `position` is this worker's resume point after its last trained
  // batch; `eval` the evaluation just taken at this step, if any. Returns an error only when the
  // job must stop (checkpoint.fail_on_error, or the workers' agreement itself failed); other
  // failures are logged and counted.
  absl::Status Cut(Kind kind, absl::Time began, const TrainState& state, const data_loader::ReaderPosition& position,
                   DenseModelImpl& model, torch::optim::Optimizer* optimizer, const Evaluation* eval);
  // Waits for the last background commit; its error when checkpoint.fail_on_error.
  absl::Status Finish();
  // The last Cut failed because the workers' agreement did (a peer was lost): the cut was
  // abandoned and worker 0 removed what it wrote, so the group may heal and go on.
  bool group_lost() const { return group_lost_; }

  // Worker 0: the newest committed checkpoint and the best evaluation's, as directories.
  std::string last_checkpoint() const;
  std::string best_checkpoint() const;
  // A resumed run: the best evaluation's checkpoint of the run it resumes, and its deltas. A
  // replacement worker also takes its group's count of cuts, which names the next one.
  void Resume(const std::string& best_checkpoint, uint64_t delta_sequence, uint64_t cuts = 0);
  uint64_t delta_sequence() const { return delta_sequence_; }
  uint64_t cuts() const { return cuts_; }  // Of this run, checkpoints and deltas, failed ones too.
  int committed() const;                   // Worker 0: checkpoints committed (deltas are not counted).
  int bases() const;                       // Worker 0: base exports written by compaction (export.base_every_deltas).
  int failed() const;                      // Cuts (checkpoints or deltas) that failed.
  double pause_seconds() const { return pause_seconds_; }  // Training time spent in cuts, drains included.
  // Worker 0: of the committed checkpoints (committed() of them), the time from each cut to its
  // manifest's commit.
  double write_seconds() const;

 private:
  struct Shared;
  struct Commit;  // What worker 0's commit thread finishes of a cut.
  absl::StatusOr<bool> Agree(bool ok);
  absl::Status Failed(const absl::Status& status);
  // Worker 0's commit of a cut every worker agreed on: the dense file, the shards' files, the
  // manifest, then (a checkpoint) retiring old ones; a failure removes what the cut wrote.
  void RunCommit(Commit& c);
  void CommitStreamOffsets(const Commit& c);
  // After checkpoint `c` committed: exports it as a new base when compaction is due.
  void Compact(const Commit& c);
  // Worker 0's part of a cut once every worker wrote its own: the previous commit done (its
  // failure, with fail_on_error, fails this cut), the shards told to begin, the dense state
  // copied. Returns `local`, or what failed.
  absl::Status BeginLeaderPart(absl::Status local, bool checkpoint, const std::string& name, const std::string& dir,
                               uint64_t id, bool best, const TrainState& state, DenseModelImpl& model,
                               torch::optim::Optimizer* optimizer, bool* begun,
                               std::shared_ptr<const DenseCopy>* dense);
  // The manifest of a cut, without its files and tables.
  CheckpointManifest ManifestOf(bool checkpoint, const TrainState& state, uint64_t delta_sequence,
                                const Evaluation* eval) const;
  absl::Status WriteAndCommit(Commit& c, bool* committed, bool* awaited);

  Options options_;
  const bool leader_;
  uint64_t cuts_ = 0;
  uint64_t delta_sequence_ = 0;
  bool group_lost_ = false;
  double pause_seconds_ = 0;
  std::shared_ptr<Shared> shared_;
  std::thread commit_;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_CHECKPOINT_H_
