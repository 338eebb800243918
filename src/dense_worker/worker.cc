#include "hyrec/dense_worker/worker.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/data_loader/synthetic.h"
#include "hyrec/dense_worker/model_registry.h"
#include "hyrec/nn_sync/dense_sync.h"
#include "src/dense_worker/cut_schedule.h"
#include "src/dense_worker/evaluator.h"
#include "src/dense_worker/healer.h"
#include "src/dense_worker/progressive_validation.h"
#include "src/dense_worker/torch_status.h"

namespace hyrec::dense_worker {
namespace {

// Module initialization draws from LibTorch's global generator: workers that are threads of one
// process seed it and build their models one at a time, so every replica starts the same.
std::mutex& ModelInitMutex() {
  static std::mutex mu;
  return mu;
}

// One worker's run: set-up, the step loop, the end. Rank 0 also keeps the job's record.
class WorkerLoop {
 public:
  WorkerLoop(const job::WorkerPlan& plan, const job::Endpoints& endpoints, const WorkerOptions& options)
      : plan_(plan), endpoints_(endpoints), options_(options), leader_(plan.rank == 0) {}

  absl::StatusOr<TrainReport> Run() {
    HYREC_RETURN_IF_ERROR(SetUp());
    if (options_.training != nullptr) *options_.training = true;
    TrainingContext ctx(MainContextOptions(), stream_, options_.ps, sync_.get(), model_, optimizer_.get());
    if (!ctx.status().ok()) return ctx.status();
    ctx.SetNextUpdateSequence(sequence_origin_ + GlobalStep(ctx) + 1);
    start_ = absl::Now();
    for (;;) {
      absl::StatusOr<bool> go = NextStep(ctx, &batch_);
      if (!go.ok()) {
        // The context's own failure (a PS call past its recovery wait, the stream) is not a lost
        // peer: regrouping cannot mend it.
        if (!ctx.status().ok()) return go.status();
        HYREC_RETURN_IF_ERROR(HealOrFail(ctx, go.status()));
        continue;  // Vote again, with the batch in hand.
      }
      if (!*go) break;
      if (cut_checkpoint_now_ || cut_delta_now_) {
        HYREC_ASSIGN_OR_RETURN(const bool healed, CutBetweenSteps(ctx, cut_checkpoint_now_, cut_delta_now_));
        if (healed) continue;  // Vote again, with the batch in hand.
      }
      if (evaluate_now_) {  // A new epoch: evaluate the last one's model before training on.
        HYREC_ASSIGN_OR_RETURN(const bool go_on, EvaluateNow(ctx));
        if (!go_on) break;
      }
      // Read before the step: once trained, the context reuses the batch for a later one.
      const BatchMarks marks(*batch_);
      const absl::Status stepped = Step(ctx, *batch_);
      if (!stepped.ok()) {
        if (!ctx.unsynced()) return stepped;
        HYREC_RETURN_IF_ERROR(HealOrFail(ctx, stepped));
        continue;  // The batch is trained again, or was settled, once the group agreed.
      }
      const uint64_t epoch_before = last_epoch_;
      Trained(marks);
      Record(ctx);
      if (last_epoch_ != epoch_before) NoteEpochLength(RunSteps(ctx) - 1);
      HYREC_ASSIGN_OR_RETURN(const bool go_on, MaybeEvaluate(ctx));
      if (!go_on) break;
      HYREC_RETURN_IF_ERROR(MaybeCut(ctx));
    }
    HYREC_RETURN_IF_ERROR(ctx.Finish());
    return Finish(ctx);
  }

 private:
  absl::Status SetUp() {
    if ((options_.stream == nullptr && !options_.open_stream) || options_.ps == nullptr) {
      return absl::InvalidArgumentError("RunWorker needs a batch stream (or open_stream) and a PS client");
    }
    if (options_.intra_op_threads > 0) torch::set_num_threads(options_.intra_op_threads);
    HYREC_ASSIGN_OR_RETURN(device_, ResolveDevice(plan_.device, plan_.rank));
    if (leader_ && plan_.has_eval_data && !plan_.synthetic) {  // Before training, not after it.
      HYREC_RETURN_IF_ERROR(Annotate(data_loader::CheckSourceFiles(plan_.eval_loader.source).status(), "eval.files"));
    }
    if (leader_ && plan_.has_test_data && !plan_.synthetic) {
      HYREC_RETURN_IF_ERROR(
          Annotate(data_loader::CheckSourceFiles(plan_.test_loader.source).status(), "eval.test_files"));
    }
    {
      std::lock_guard<std::mutex> lock(ModelInitMutex());
      torch::manual_seed(plan_.seed);
      HYREC_ASSIGN_OR_RETURN(model_, MakeModel(plan_));
    }
    HYREC_RETURN_IF_ERROR(GuardTorch(absl::StrCat("moving model '", plan_.model.kind, "' to ", device_.str()), [&] {
      model_->to(device_);
      return absl::OkStatus();
    }));
    // Update sequences: from worker 0's clock, then one per step (the same on every worker).
    sequence_origin_ = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())) << 20;
    if (plan_.world_size > 1 || device_.is_cuda()) {
      nn_sync::SyncOptions sync;
      sync.rank = plan_.rank;
      sync.world_size = plan_.world_size;
      sync.master_addr = endpoints_.master_addr;
      sync.master_port = endpoints_.master_port;
      sync.timeout = absl::Seconds(plan_.sync_timeout_seconds);
      sync.device_is_cuda = device_.is_cuda();
      sync.security = options_.security;
      HYREC_ASSIGN_OR_RETURN(sync_, nn_sync::DenseSync::Create(sync));
      HealerOptions heal;
      heal.rank = plan_.rank;
      heal.timeout = absl::Seconds(plan_.heal_timeout_seconds);
      heal.stop = options_.stop;
      healer_ = std::make_unique<Healer>(sync_.get(), heal);
      if (sync_->replacement()) return JoinAsReplacement();
      HYREC_RETURN_IF_ERROR(sync_->BroadcastParameters(model_->parameters()));
      sync_->AttachToParameters(model_->parameters());
      std::string origin = std::to_string(sequence_origin_);
      HYREC_RETURN_IF_ERROR(sync_->BroadcastBytes(&origin, 0));
      if (!absl::SimpleAtoi(origin, &sequence_origin_)) return absl::InternalError("worker 0's update sequences");
    }
    HYREC_ASSIGN_OR_RETURN(optimizer_, MakeDenseOptimizer(plan_.dense_optimizer, model_->parameters()));
    trainer_options_ = TrainerOptionsFor(plan_, device_);
    HYREC_RETURN_IF_ERROR(OpenStream(-1));
    last_position_ = stream_->Position();
    if (options_.resume != nullptr) HYREC_RETURN_IF_ERROR(Resume(*options_.resume));
    HYREC_ASSIGN_OR_RETURN(const uint32_t tag, AgreeRunTag());
    return SetUpCuts(tag);
  }

  // The worker's stream: the caller's, or opened at `next_batch` (-1: where the loader starts it).
  absl::Status OpenStream(int64_t next_batch) {
    if (options_.stream != nullptr) {
      stream_ = options_.stream;
      return absl::OkStatus();
    }
    HYREC_ASSIGN_OR_RETURN(owned_stream_, options_.open_stream(next_batch));
    stream_ = owned_stream_.get();
    return absl::OkStatus();
  }

  // Continues the counters of the run a checkpoint was cut from.
  absl::Status Resume(const DenseState& dense) {
    HYREC_RETURN_IF_ERROR(ApplyDenseState(dense, *model_, optimizer_.get(), /*restore_rng=*/leader_));
    const TrainState& s = dense.state;
    base_step_ = s.step;
    base_samples_ = s.samples;
    last_epoch_ = s.epoch;
    report_.resumed_step = s.step;
    EvaluatorState e;
    e.has_best = s.has_best_eval;
    e.best.auc = s.best_auc;
    e.best.log_loss = s.best_log_loss;
    e.best.samples = s.best_eval_samples;
    e.best_at_samples = s.best_at_samples;
    e.evals_without_gain = s.evals_without_gain;
    evaluator_.Resume(e);
    return absl::OkStatus();
  }

  bool HasCuts() const { return !plan_.checkpoint.dir.empty() || plan_.serving.takes_deltas(); }

  // The run's tag names its cuts: worker 0's clock, agreed by every worker.
  absl::StatusOr<uint32_t> AgreeRunTag() {
    int tag = static_cast<int>(absl::ToUnixSeconds(absl::Now()) & 0x7fffffff);
    if (HasCuts() && sync_ != nullptr) {
      HYREC_ASSIGN_OR_RETURN(tag, sync_->AllMin(leader_ ? tag : INT_MAX, absl::Seconds(plan_.sync_timeout_seconds)));
    }
    return static_cast<uint32_t>(tag);
  }

  absl::Status SetUpCuts(uint32_t tag) {
    run_tag_ = tag;
    if (!HasCuts()) return absl::OkStatus();
    const bool deltas = plan_.serving.takes_deltas();
    JobCuts::Options o;
    o.plan = &plan_;
    o.job_text = options_.job_text;
    o.ps = options_.ps;
    o.sync = sync_.get();
    o.env = options_.env;
    o.run_tag = tag;
    o.job_id = options_.job_id;
    cuts_ = std::make_unique<JobCuts>(std::move(o));
    uint64_t last_checkpoint_step = UINT64_MAX;
    if (healed_from_ != nullptr) {  // A replacement continues its peers' cuts.
      cuts_->Resume(healed_from_->best_checkpoint, healed_from_->delta_sequence, healed_from_->cuts);
      last_checkpoint_step = healed_from_->last_cut_step;
    } else if (options_.resume != nullptr) {
      const TrainState& s = options_.resume->state;
      cuts_->Resume(s.best_checkpoint, s.delta_sequence);
      last_checkpoint_step = s.step;
      if (leader_ && deltas) DropDeltasAfter(s.delta_sequence);
    }
    schedule_.Start(absl::Now(), last_checkpoint_step);
    return absl::OkStatus();
  }

  // A resumed run's deltas replace those the abandoned run took after its checkpoint.
  void DropDeltasAfter(uint64_t sequence) {
    Env* env = options_.env != nullptr ? options_.env : Env::Default();
    for (const std::string& name : ListCheckpointDirs(env, plan_.serving.dir, kDeltaPrefix)) {
      uint64_t seq = 0;
      if (!DeltaSequenceOf(name, &seq) || seq <= sequence) continue;
      (void)DeleteDirAndFiles(env, JoinPath(plan_.serving.dir, name));
    }
  }

  // Steps of this run: a replacement counts those its lost predecessor took.
  uint64_t RunSteps(const TrainingContext& ctx) const { return healed_steps_ + ctx.stats().batches; }
  uint64_t RunSamples(const TrainingContext& ctx) const { return healed_samples_ + ctx.stats().samples; }
  uint64_t GlobalStep(const TrainingContext& ctx) const { return base_step_ + RunSteps(ctx); }

  TrainState State(const TrainingContext& ctx) const {
    TrainState s;
    s.step = GlobalStep(ctx);
    s.samples = JobSamples(ctx);
    s.epoch = last_epoch_;
    const EvaluatorState e = evaluator_.state();
    s.has_best_eval = e.has_best;
    s.best_auc = e.best.auc;
    s.best_log_loss = e.best.log_loss;
    s.best_eval_samples = e.best.samples;
    s.best_at_samples = e.best_at_samples;
    s.evals_without_gain = e.evals_without_gain;
    return s;
  }

  uint64_t JobSamples(const TrainingContext& ctx) const {
    return base_samples_ + RunSamples(ctx) * static_cast<uint64_t>(plan_.world_size);
  }

  // One cut: every update of this worker applied first (the drain), then JobCuts.
  // `healed`: non-null where the group may heal (between steps): a cut whose agreement failed
  // (a peer lost) is abandoned, the group heals as after a step's collective, and *healed says so.
  absl::Status CutNow(TrainingContext& ctx, JobCuts::Kind kind, const Evaluation* eval, bool* healed = nullptr) {
    if (cuts_ == nullptr) return absl::OkStatus();
    const absl::Time began = absl::Now();
    HYREC_RETURN_IF_ERROR(ctx.Finish());
    const absl::Status cut = cuts_->Cut(kind, began, State(ctx), last_position_, *model_, optimizer_.get(), eval);
    if (!cut.ok() && healed != nullptr && cuts_->group_lost() && ctx.status().ok()) {
      HYREC_RETURN_IF_ERROR(HealOrFail(ctx, cut));
      *healed = true;
      return absl::OkStatus();
    }
    HYREC_RETURN_IF_ERROR(cut);
    if (kind == JobCuts::Kind::kCheckpoint) {
      schedule_.CheckpointCut(GlobalStep(ctx), absl::Now());
    } else {
      schedule_.DeltaCut(absl::Now());
    }
    return absl::OkStatus();
  }

  // A checkpoint and/or a delta between steps; true when a peer was lost in one and the group
  // healed (the rest skipped: the caller goes back to the vote, where its peers are).
  absl::StatusOr<bool> CutBetweenSteps(TrainingContext& ctx, bool checkpoint, bool delta) {
    bool healed = false;
    if (checkpoint) HYREC_RETURN_IF_ERROR(CutNow(ctx, JobCuts::Kind::kCheckpoint, nullptr, &healed));
    if (delta && !healed) HYREC_RETURN_IF_ERROR(CutNow(ctx, JobCuts::Kind::kDelta, nullptr, &healed));
    return healed;
  }

  // The cuts every worker knows to take after this step (by step counts).
  absl::Status MaybeCut(TrainingContext& ctx) {
    if (cuts_ == nullptr) return absl::OkStatus();
    const uint64_t step = GlobalStep(ctx);
    return CutBetweenSteps(ctx, schedule_.CheckpointAfterStep(step), schedule_.DeltaAfterStep(step)).status();
  }

  // Worker 0's wishes for a cut before the next step: time since the last, or SIGUSR1.
  bool WantsCheckpoint() {
    if (!leader_ || cuts_ == nullptr || plan_.checkpoint.dir.empty()) return false;
    const bool asked = options_.checkpoint_request != nullptr && options_.checkpoint_request->exchange(false);
    uint64_t logged = 0;
    const CutSchedule::Wish wish =
        schedule_.WantsCheckpoint(absl::Now(), asked, [&] { return logged = options_.ps->LargestLogBytes(); });
    if (wish == CutSchedule::Wish::kLogBytes) {
      std::cerr << "hyrec worker 0: a PS shard's update log holds " << logged
                << " bytes since the last checkpoint (ps.update_log.max_bytes " << plan_.update_log_max_bytes
                << "): cutting one" << std::endl;
    }
    return wish != CutSchedule::Wish::kNone;
  }
  bool WantsDelta() const { return leader_ && cuts_ != nullptr && schedule_.WantsDelta(absl::Now()); }

  // What the loop keeps of a batch once it trained (read before the step: once trained, the
  // context reuses the batch for a later one).
  struct BatchMarks {
    explicit BatchMarks(const TrainBatch& b)
        : epoch(b.batch.epoch),
          bytes_read(b.batch.bytes_read),
          bytes_total(b.batch.bytes_total),
          batch_id(static_cast<int64_t>(b.batch.batch_id)),
          data_time(b.batch.data_time),
          position(b.batch.next_position) {}
    uint64_t epoch, bytes_read, bytes_total;
    int64_t batch_id;
    uint64_t data_time;
    data_loader::ReaderPosition position;
  };
  void Trained(const BatchMarks& m) {
    last_epoch_ = m.epoch;
    last_bytes_read_ = m.bytes_read;
    last_bytes_total_ = m.bytes_total;
    last_batch_id_ = m.batch_id;
    newest_event_time_ = std::max(newest_event_time_, m.data_time);
    last_position_ = m.position;
    batch_ = nullptr;
  }

  HealState CaptureHeal(const TrainingContext& ctx) const {
    HealState h;
    h.sequence_origin = sequence_origin_;
    h.run_tag = run_tag_;
    h.base_step = base_step_;
    h.base_samples = base_samples_;
    h.run_samples = RunSamples(ctx);
    h.last_batch_id = last_batch_id_;
    h.last_cut_step = schedule_.last_checkpoint_step();
    h.delta_sequence = cuts_ != nullptr ? cuts_->delta_sequence() : 0;
    h.cuts = cuts_ != nullptr ? cuts_->cuts() : 0;
    h.best_checkpoint = cuts_ != nullptr ? cuts_->best_checkpoint() : std::string();
    return h;
  }

  // A collective of the step failed (`cause`): a peer was lost. With heal on, the survivors
  // regroup with its replacement and agree on the dense state (Rejoin); otherwise, or when that
  // fails (worker 0 was lost, no replacement came), the worker fails with both reasons.
  absl::Status HealOrFail(TrainingContext& ctx, const absl::Status& cause) {
    if (healer_ == nullptr || !healer_->CanHeal()) return cause;
    const absl::Time began = absl::Now();
    HYREC_RETURN_IF_ERROR(healer_->Regroup(cause));
    const absl::Status rejoined = Rejoin(&ctx);
    if (!rejoined.ok()) {
      return absl::Status(rejoined.code(),
                          absl::StrCat(cause.message(), "; healing the group failed: ", rejoined.message()));
    }
    ++report_.heals;
    std::cerr << "hyrec worker " << plan_.rank << ": the group healed in "
              << absl::FormatDuration(absl::Trunc(absl::Now() - began, absl::Milliseconds(10))) << " (generation "
              << sync_->generation() << ", step " << GlobalStep(ctx) << ")" << std::endl;
    return absl::OkStatus();
  }

  // Every rank of a new generation, survivors and replacements, takes the newest survivor's
  // dense state and counters (Healer::Agree). Steps differ by at most one: a survivor whose
  // gradient sync failed on a step another one completed settles that batch (its gradient is in
  // the step); one whose sync failed on a step nobody completed trains the batch again. Null
  // `ctx`: a replacement, which has none yet.
  absl::Status Rejoin(TrainingContext* ctx) {
    const int64_t completed = ctx == nullptr ? -1 : static_cast<int64_t>(GlobalStep(*ctx));
    HYREC_ASSIGN_OR_RETURN(Healer::Agreement agreed, healer_->Agree(completed, [&]() -> absl::StatusOr<HealState> {
      HealState h = CaptureHeal(*ctx);
      HYREC_ASSIGN_OR_RETURN(h.dense, CaptureDenseState(*model_, optimizer_.get(), State(*ctx)));
      return h;
    }));
    HealState& heal = agreed.state;
    const int source = agreed.source;
    const int64_t newest = agreed.newest;
    if (plan_.rank != source) {
      HYREC_RETURN_IF_ERROR(ApplyDenseState(heal.dense, *model_, optimizer_.get(), /*restore_rng=*/false));
    }
    if (ctx == nullptr) {
      base_step_ = heal.base_step;
      base_samples_ = heal.base_samples;
      healed_steps_ = static_cast<uint64_t>(newest) - heal.base_step;
      healed_samples_ = heal.run_samples;
      sequence_origin_ = heal.sequence_origin;
      run_tag_ = heal.run_tag;
      // Batch ids go round the workers: the lost worker's batch of that step is its own rank's.
      last_batch_id_ = heal.last_batch_id < 0 ? -1 : heal.last_batch_id - source + plan_.rank;
      healed_from_ = std::make_unique<HealState>(std::move(heal));
      return absl::OkStatus();
    }
    const bool unsynced = batch_ != nullptr && ctx->unsynced();
    if (completed == newest - 1 && unsynced) {
      const BatchMarks marks(*batch_);
      HYREC_RETURN_IF_ERROR(ctx->SettleWithoutStep());
      Trained(marks);
      Record(*ctx);
    } else if (completed != newest) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", plan_.rank, " is at step ", completed, " and worker ", source, " at step ", newest));
    }
    ctx->SetNextUpdateSequence(sequence_origin_ + GlobalStep(*ctx) + 1);
    return absl::OkStatus();
  }

  // Set-up of a process that replaces a lost worker (DenseSync::replacement()): the dense state
  // and counters from the group, then its stream from the lost worker's last trained batch
  // (read to learn the position after it, and dropped), so it trains the batch after.
  absl::Status JoinAsReplacement() {
    if (options_.stream != nullptr) {
      return absl::FailedPreconditionError(
          "this worker replaces a lost one, which needs its stream opened at the lost worker's batch "
          "(WorkerOptions::open_stream)");
    }
    sync_->AttachToParameters(model_->parameters());
    HYREC_ASSIGN_OR_RETURN(optimizer_, MakeDenseOptimizer(plan_.dense_optimizer, model_->parameters()));
    trainer_options_ = TrainerOptionsFor(plan_, device_);
    HYREC_RETURN_IF_ERROR(Rejoin(nullptr));
    ++report_.heals;
    HYREC_RETURN_IF_ERROR(ResendLostUpdates());
    HYREC_RETURN_IF_ERROR(OpenStream(last_batch_id_));
    if (last_batch_id_ >= 0) {
      data_loader::Batch last;
      HYREC_RETURN_IF_ERROR(Annotate(stream_->Next(&last, absl::Seconds(plan_.batch_timeout_seconds)),
                                     absl::StrCat("replaying batch ", last_batch_id_, " of the lost worker")));
      if (static_cast<int64_t>(last.batch_id) != last_batch_id_) {
        return absl::DataLossError(absl::StrCat("the loader sent batch ", last.batch_id, " for batch ", last_batch_id_,
                                                " of the lost worker"));
      }
      last_epoch_ = last.epoch;
    }
    last_position_ = stream_->Position();
    std::cerr << "hyrec worker " << plan_.rank << ": joined generation " << sync_->generation()
              << " in place of a lost worker, at step " << base_step_ + healed_steps_ << std::endl;
    return SetUpCuts(run_tag_);
  }

  // The lost worker's last updates may not have reached every shard: at most its last
  // embedding_staleness + 1 were unacknowledged when it was lost. The replacement recomputes
  // them (its stream reopened at the first of those batches, the gradients taken from the healed
  // dense state and the rows as they are now) and sends each under its step's sequence: a shard
  // that applied the lost worker's original recognizes the repeat, one that did not applies it.
  // The stream is then closed; JoinAsReplacement opens it again after the last of them.
  absl::Status ResendLostUpdates() {
    const uint64_t newest = base_step_ + healed_steps_;
    const uint64_t count = std::min<uint64_t>(static_cast<uint64_t>(plan_.embedding_staleness) + 1, healed_steps_);
    if (count == 0 || last_batch_id_ < 0) return absl::OkStatus();
    const int64_t first = last_batch_id_ - static_cast<int64_t>((count - 1) * plan_.world_size);
    HYREC_RETURN_IF_ERROR(OpenStream(first));
    {
      TrainerOptions o = trainer_options_;
      o.embedding_staleness = 0;
      TrainingContext resend(o, stream_, options_.ps, /*sync=*/nullptr, model_, optimizer_.get());
      resend.SetNextUpdateSequence(sequence_origin_ + newest - count + 1);
      for (uint64_t i = 0; i < count; ++i) {
        TrainBatch* batch = nullptr;
        if (!resend.Next(&batch)) {
          return Annotate(resend.status().ok() ? absl::OutOfRangeError("the stream ended") : resend.status(),
                          absl::StrCat("resending the lost worker's update of batch ", first + i * plan_.world_size));
        }
        const int64_t want = first + static_cast<int64_t>(i * plan_.world_size);
        if (static_cast<int64_t>(batch->batch.batch_id) != want) {
          return absl::DataLossError(absl::StrCat("the loader sent batch ", batch->batch.batch_id, " for batch ", want,
                                                  " of the lost worker"));
        }
        HYREC_RETURN_IF_ERROR(GuardTorch(absl::StrCat("resending the lost worker's update of batch ", want), [&] {
          torch::Tensor loss = torch::binary_cross_entropy_with_logits(resend.Forward(*batch), batch->labels);
          return resend.PushEmbeddingGradients(loss);
        }));
      }
      HYREC_RETURN_IF_ERROR(resend.Finish());
    }
    owned_stream_.reset();  // Its lookahead read past the last of them.
    stream_ = nullptr;
    return absl::OkStatus();
  }

  // Votes of the step agreement; the smallest wins.
  static constexpr int kVoteStop = 0;  // Asked to stop.
  // No batch (the end of its data, or an error getting one), or worker 0 stopped early.
  static constexpr int kVoteEnd = 1;
  static constexpr int kVoteEvaluate = 2;  // Worker 0: evaluate before this step (a new epoch).
  static constexpr int kVoteGo = 3;

  // The next batch, once every worker has one and none was asked to stop; sets evaluate_now_
  // when worker 0 asked for an evaluation first.
  // The training loop's context: a worker that waits for its next batch also watches for a
  // replacement of a lost peer waiting to regroup. Its own batch may not come until they have
  // (the loader holds a new generation's batches until every worker's stream has arrived), and
  // it would learn of the loss only in the vote.
  // A stop request ends the wait too: a stream without end may have nothing to send for a long
  // time, and the stop is voted on as usual.
  TrainerOptions MainContextOptions() const {
    TrainerOptions o = trainer_options_;
    std::function<bool()> replacement_waiting;
    if (sync_ != nullptr && plan_.heal_timeout_seconds > 0) {
      nn_sync::DenseSync* sync = sync_.get();
      const int rank = plan_.rank;
      auto said = std::make_shared<bool>(false);
      replacement_waiting = [sync, rank, said] {
        absl::StatusOr<bool> waiting = sync->ReplacementWaiting();
        if (!waiting.ok()) {  // Said once: the wait goes on, and the vote finds out.
          if (!*said) std::cerr << "hyrec worker " << rank << ": " << waiting.status().message() << std::endl;
          *said = true;
          return false;
        }
        return *waiting;
      };
    }
    const std::atomic<bool>* stop = options_.stop;
    if (stop != nullptr || replacement_waiting) {
      o.abandon_wait = [stop, replacement_waiting] {
        return (stop != nullptr && stop->load()) || (replacement_waiting && replacement_waiting());
      };
    }
    return o;
  }

  absl::StatusOr<bool> NextStep(TrainingContext& ctx, TrainBatch** batch) {
    // A batch in hand (the vote or the step failed and the group healed) is voted on again.
    const bool has_batch = *batch != nullptr || ctx.Next(batch);
    const bool stop = options_.stop != nullptr && options_.stop->load();
    if (!has_batch && ctx.wait_abandoned() && !stop) {
      return absl::AbortedError(
          absl::StrCat("worker ", plan_.rank, ": a replacement of a lost worker waits to regroup"));
    }
    int vote = stop ? kVoteStop : has_batch ? kVoteGo : kVoteEnd;
    if (vote == kVoteGo && leader_ && evaluator_.DueAtEpoch(RunSteps(ctx), last_epoch_, (*batch)->batch.epoch)) {
      vote = kVoteEvaluate;
    }
    // Two low bits carry worker 0's wish for a checkpoint and a delta first (0: wanted), so the
    // smallest vote still decides and every worker learns both.
    const bool ckpt = vote >= kVoteEvaluate && WantsCheckpoint();
    const bool delta = vote >= kVoteEvaluate && WantsDelta();
    vote = vote * 4 + (ckpt ? 0 : 2) + (delta ? 0 : 1);
    if (sync_ != nullptr) {
      HYREC_ASSIGN_OR_RETURN(vote, sync_->AllMin(vote, absl::Seconds(plan_.batch_timeout_seconds)));
    }
    if (!ctx.status().ok()) return ctx.status();  // The others stop with this worker.
    cut_checkpoint_now_ = (vote & 2) == 0;
    cut_delta_now_ = (vote & 1) == 0;
    vote /= 4;
    interrupted_ = vote == kVoteStop;
    evaluate_now_ = vote == kVoteEvaluate;
    return vote >= kVoteEvaluate;
  }

  absl::Status Step(TrainingContext& ctx, TrainBatch& batch) {
    const uint64_t step = GlobalStep(ctx);
    if (plan_.dense_optimizer.schedule.kind != job::LrSchedule::Kind::kConstant ||
        plan_.dense_optimizer.schedule.warmup_steps > 0) {
      SetLearningRate(*optimizer_, plan_.dense_optimizer.learning_rate *
                                       plan_.dense_optimizer.schedule.Factor(static_cast<int64_t>(step)));
    }
    torch::Tensor loss;
    HYREC_RETURN_IF_ERROR(GuardTorch(absl::StrCat("batch ", step, ": forward of model '", plan_.model.kind, "'"), [&] {
      const torch::Tensor logits = ctx.Forward(batch);
      loss = torch::binary_cross_entropy_with_logits(logits, batch.labels);
      loss_value_ = loss.item<double>();
      if (progressive_.has_value()) {  // Scored before it trains the model.
        const torch::Tensor scored = logits.detach().to(torch::kCPU).to(torch::kFloat).contiguous();
        progressive_->Add(scored.data_ptr<float>(), batch.batch.labels.data(),
                          std::min<size_t>(static_cast<size_t>(scored.numel()), batch.batch.labels.size()));
      }
      return absl::OkStatus();
    }));
    if (!std::isfinite(loss_value_)) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", step, " (global batch ", batch.batch.batch_id,
                                                     "): the loss became ", loss_value_,
                                                     "; lower the learning rates or check the data"));
    }
    absl::Status backward;
    HYREC_RETURN_IF_ERROR(GuardTorch(absl::StrCat("batch ", step, ": backward and dense step"), [&] {
      backward = ctx.Backward(loss);
      return absl::OkStatus();
    }));
    return Annotate(backward, absl::StrCat("batch ", step));
  }

  // The loss window, the warm-up mark and the progress report (to the observer, when given).
  void Record(const TrainingContext& ctx) {
    const TrainerStats st = ctx.stats();
    if (st.batches == 1) report_.first_loss = loss_value_;
    loss_window_ += loss_value_;
    ++loss_count_;
    const uint64_t samples = JobSamples(ctx);
    if (st.batches == TrainReport::kWarmupBatches) {
      warm_start_ = absl::Now();
      warm_samples_ = samples;
    }
    if (st.batches % static_cast<uint64_t>(plan_.log_every_batches) == 0) Report(st, samples, /*last=*/false);
  }

  void Report(const TrainerStats& st, uint64_t samples, bool last) {
    if (loss_count_ == 0) return;
    Progress p;
    p.samples = samples;
    p.planned_samples = plan_.planned_samples;
    p.batches = st.batches;
    p.epoch = last_epoch_;
    p.bytes_read = last_bytes_read_;
    p.bytes_total = last_bytes_total_;
    p.epochs = plan_.epochs;
    p.elapsed_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    p.samples_per_second = samples / std::max(p.elapsed_seconds, 1e-9);
    p.loss = loss_window_ / loss_count_;
    if (progressive_.has_value()) p.progressive = progressive_->Measure();
    p.event_time = newest_event_time_;
    p.stream = plan_.stream.has_value();
    p.stats = st;
    p.last = last;
    report_.mean_loss_last = p.loss;
    report_.losses.emplace_back(samples, p.loss);
    loss_window_ = 0;
    loss_count_ = 0;
    if (options_.observer != nullptr) options_.observer->OnProgress(p);
  }

  // Every eval.every_batches steps: worker 0 evaluates while the others wait for it. False: stop.
  absl::StatusOr<bool> MaybeEvaluate(TrainingContext& ctx) {
    if (!evaluator_.DueAfterStep(RunSteps(ctx))) return true;
    return EvaluateNow(ctx);
  }

  // Worker 0 evaluates and judges early stopping while the others wait for it; returns whether
  // the workers go on (false once worker 0 stopped early: they stop together).
  // An evaluation the job keeps as its best is cut as a checkpoint at once (every worker learns
  // of it through the vote's low bit).
  absl::StatusOr<bool> EvaluateNow(TrainingContext& ctx) {
    Evaluator::Verdict verdict;
    if (leader_) {
      HYREC_ASSIGN_OR_RETURN(verdict, evaluator_.Evaluate(JobSamples(ctx)));
    }
    const bool keep_best = verdict.keep_best && cuts_ != nullptr;
    int vote = (evaluator_.stopped() ? kVoteEnd : kVoteGo) * 2 + (keep_best ? 0 : 1);
    if (sync_ != nullptr) {
      HYREC_ASSIGN_OR_RETURN(vote, sync_->AllMin(vote, absl::Seconds(plan_.eval.timeout_seconds)));
    }
    if ((vote & 1) == 0) {
      HYREC_RETURN_IF_ERROR(CutNow(ctx, JobCuts::Kind::kCheckpoint, leader_ ? &verdict.eval : nullptr));
    }
    evaluator_.set_stopped(vote / 2 == kVoteEnd);
    return !evaluator_.stopped();
  }

  absl::StatusOr<TrainReport> Finish(TrainingContext& ctx) {
    const absl::Time end = absl::Now();
    const TrainerStats st = ctx.stats();
    report_.stats = st;
    report_.interrupted = interrupted_;
    report_.stopped_early = evaluator_.stopped();
    uint64_t run_samples = RunSamples(ctx);
    if (sync_ != nullptr) {  // The job's samples: every worker's.
      torch::Tensor samples = torch::full({1}, static_cast<double>(run_samples),
                                          torch::TensorOptions().dtype(torch::kDouble).device(device_));
      HYREC_RETURN_IF_ERROR(sync_->AllreduceMean(samples));
      run_samples = static_cast<uint64_t>(std::llround(samples.item<double>() * plan_.world_size));
    }
    report_.samples = base_samples_ + run_samples;
    report_.planned_samples = plan_.planned_samples;
    report_.elapsed_seconds = absl::ToDoubleSeconds(end - start_);
    report_.samples_per_second = run_samples / std::max(report_.elapsed_seconds, 1e-9);
    if (warm_start_ != absl::InfinitePast() && report_.samples > warm_samples_) {
      report_.steady_samples_per_second =
          (report_.samples - warm_samples_) / std::max(absl::ToDoubleSeconds(end - warm_start_), 1e-9);
    }
    HYREC_RETURN_IF_ERROR(GuardTorch("reading the dense parameters", [&] {
      report_.dense_fingerprint = DenseFingerprint(*model_);
      double sum = 0;
      report_.dense_parameters = 0;
      for (const torch::Tensor& p : model_->parameters()) {
        sum += p.detach().to(torch::kCPU).to(torch::kDouble).sum().item<double>();
        report_.dense_parameters += static_cast<uint64_t>(p.numel());
      }
      report_.dense_sum = sum;
      return absl::OkStatus();
    }));
    report_.resumed_at_end = report_.resumed_step > 0 && run_samples == 0 && !interrupted_;
    if (report_.resumed_at_end) {  // Its checkpoint and export stand as they are.
      if (leader_ && options_.observer != nullptr) options_.observer->OnFinish(report_);
      return report_;
    }
    if (leader_) HYREC_RETURN_IF_ERROR(FinalEvaluation(st));
    HYREC_RETURN_IF_ERROR(FinalCuts(ctx));
    if (!leader_) return report_;
    if (options_.observer != nullptr) options_.observer->OnFinish(report_);
    return report_;
  }

  // Worker 0, once per run: a run whose epoch is only a few staleness windows long says so, since
  // there the window's delay costs accuracy (docs/architecture.md, "Choosing the staleness").
  // `batches`: the steps of its first epoch, told when the next one starts, or at the end of a
  // run of one epoch.
  void NoteEpochLength(uint64_t batches) {
    const int staleness = plan_.embedding_staleness;
    if (!leader_ || epoch_length_noted_ || staleness == 0 || base_step_ > 0 || batches == 0) return;
    epoch_length_noted_ = true;
    if (batches >= kMinWindowsPerEpoch * static_cast<uint64_t>(staleness)) return;
    std::cerr << "hyrec: note: an epoch is " << batches << " steps, only " << batches / staleness
              << " staleness windows of " << staleness
              << " (train.embedding_staleness): on data this small the window's delay may cost accuracy; "
                 "compare a run at 0 (docs/architecture.md, \"Choosing the staleness\")"
              << std::endl;
  }
  static constexpr uint64_t kMinWindowsPerEpoch = 25;

  // Worker 0: the last progress report and the evaluations at the end.
  absl::Status FinalEvaluation(const TrainerStats& st) {
    Report(st, report_.samples, /*last=*/true);
    if (!interrupted_ && plan_.epochs == 1) NoteEpochLength(st.batches);
    if (plan_.synthetic) {
      report_.teacher_auc =
          data_loader::SyntheticSource(plan_.eval_loader.source.synthetic).TeacherAuc(plan_.eval.samples);
    }
    return evaluator_.Finish(report_.samples, interrupted_);
  }

  absl::StatusOr<Evaluation> Score(Evaluator::Split split) {
    const data_loader::LoaderOptions& data = split == Evaluator::Split::kEval ? plan_.eval_loader : plan_.test_loader;
    return EvaluateHeldOut(data, options_.ps, trainer_options_, *model_);
  }

  // The checkpoint at the end (or after an interrupt), the last delta, and worker 0's export.
  absl::Status FinalCuts(TrainingContext& ctx) {
    if (cuts_ == nullptr) return absl::OkStatus();
    const bool wanted = plan_.StoppedShort(interrupted_) ? plan_.checkpoint.on_interrupt : plan_.checkpoint.at_end;
    if (wanted && !plan_.checkpoint.dir.empty() && GlobalStep(ctx) != schedule_.last_checkpoint_step()) {
      HYREC_RETURN_IF_ERROR(
          CutNow(ctx, JobCuts::Kind::kCheckpoint, report_.has_final_eval ? &report_.final_eval : nullptr));
    }
    if (plan_.serving.takes_deltas()) {
      HYREC_RETURN_IF_ERROR(CutNow(ctx, JobCuts::Kind::kDelta, nullptr));
    }
    HYREC_RETURN_IF_ERROR(cuts_->Finish());
    report_.last_checkpoint = cuts_->last_checkpoint();
    report_.best_checkpoint = cuts_->best_checkpoint();
    report_.checkpoints = cuts_->committed();
    report_.checkpoint_failures = cuts_->failed();
    report_.checkpoint_pause_seconds = cuts_->pause_seconds();
    report_.checkpoint_write_seconds = cuts_->write_seconds();
    if (!leader_ || plan_.serving.dir.empty() || plan_.StoppedShort(interrupted_)) return absl::OkStatus();
    const bool best = evaluator_.keeps_best() && !report_.best_checkpoint.empty();
    const std::string& from = best ? report_.best_checkpoint : report_.last_checkpoint;
    if (from.empty()) {
      return FailedExport(absl::FailedPreconditionError("no checkpoint was committed to export"));
    }
    // The compaction of a job with deltas may have exported that checkpoint already.
    const std::string made = FindExportOf(options_.env, plan_.serving.dir, from);
    absl::StatusOr<std::string> out = !made.empty() ? made : ExportCheckpoint(options_.env, from, plan_.serving.dir);
    if (!out.ok()) return FailedExport(out.status());
    report_.export_dir = *out;
    if (plan_.serving.takes_deltas()) {
      const absl::Status retired =
          RetireExports(options_.env, plan_.serving.dir, plan_.serving.keep_bases, options_.job_id);
      if (!retired.ok()) std::cerr << "hyrec: retiring old exports: " << retired.message() << "\n";
    }
    report_.export_checkpoint = from;
    report_.export_samples = best ? report_.best_eval_samples : report_.samples;
    report_.export_reason = best                    ? TrainReport::ExportReason::kBestEvaluation
                            : report_.has_best_eval ? TrainReport::ExportReason::kBestNotCommitted
                                                    : TrainReport::ExportReason::kNoEvaluation;
    return absl::OkStatus();
  }

  absl::Status FailedExport(const absl::Status& status) {
    const absl::Status s = Annotate(status, "export");
    if (plan_.checkpoint.fail_on_error) return s;
    std::cerr << "hyrec: " << s.message() << "\n";
    return absl::OkStatus();
  }

  const job::WorkerPlan& plan_;
  const job::Endpoints& endpoints_;
  const WorkerOptions& options_;
  const bool leader_;
  torch::Device device_ = torch::kCPU;
  std::shared_ptr<DenseModelImpl> model_;
  std::unique_ptr<nn_sync::DenseSync> sync_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  TrainerOptions trainer_options_;
  absl::Time start_ = absl::Now();
  absl::Time warm_start_ = absl::InfinitePast();
  uint64_t warm_samples_ = 0;
  double loss_value_ = 0;
  double loss_window_ = 0;
  uint64_t loss_count_ = 0;
  bool interrupted_ = false;
  bool evaluate_now_ = false;
  bool epoch_length_noted_ = false;
  uint64_t last_epoch_ = 0;
  uint64_t last_bytes_read_ = 0;
  uint64_t newest_event_time_ = 0;  // Of the samples worker 0 trained (Sample::time, unix s).
  uint64_t last_bytes_total_ = 0;
  data_loader::ReaderPosition last_position_;   // After the last trained batch.
  int64_t last_batch_id_ = -1;                  // Of the last trained batch; -1: none yet.
  data_loader::BatchStream* stream_ = nullptr;  // options_.stream, or owned_stream_.
  std::unique_ptr<data_loader::BatchStream> owned_stream_;
  TrainBatch* batch_ = nullptr;   // The batch in hand: voted on or trained, not yet done.
  uint64_t sequence_origin_ = 0;  // The update sequence of step s is this + s.
  uint32_t run_tag_ = 0;
  uint64_t healed_steps_ = 0;  // A replacement: the steps and samples of this run before it joined.
  uint64_t healed_samples_ = 0;
  std::unique_ptr<HealState> healed_from_;  // A replacement: what the group handed it.
  uint64_t base_step_ = 0;                  // Of the checkpoint resumed from.
  uint64_t base_samples_ = 0;
  std::unique_ptr<JobCuts> cuts_;  // Null without checkpoints and deltas.
  bool cut_checkpoint_now_ = false;
  bool cut_delta_now_ = false;
  TrainReport report_;
  CutSchedule schedule_{ScheduleOf(plan_)};
  std::unique_ptr<Healer> healer_;  // Null for a worker alone.
  // Worker 0's, with eval.progressive_window.
  std::optional<ProgressiveValidation> progressive_ =
      leader_ && plan_.eval.progressive_window > 0
          ? std::optional<ProgressiveValidation>(static_cast<size_t>(plan_.eval.progressive_window))
          : std::nullopt;
  // Worker 0's evaluations; the others learn its stop from EvaluateNow's vote.
  Evaluator evaluator_{EvaluatorOptionsOf(plan_), [this](Evaluator::Split split) { return Score(split); },
                       options_.observer, &report_};

  static CutScheduleOptions ScheduleOf(const job::WorkerPlan& plan) {
    CutScheduleOptions o;
    o.checkpoints = !plan.checkpoint.dir.empty();
    o.checkpoint_every_steps = plan.checkpoint.every_steps;
    o.checkpoint_every_seconds = plan.checkpoint.every_seconds;
    o.delta_every_steps = plan.serving.delta_every_steps;
    o.delta_every_seconds = plan.serving.delta_every_seconds;
    o.update_log_max_bytes = plan.update_log_max_bytes;
    return o;
  }

  static EvaluatorOptions EvaluatorOptionsOf(const job::WorkerPlan& plan) {
    EvaluatorOptions o;
    o.has_eval_data = plan.has_eval_data;
    o.has_test_data = plan.has_test_data;
    // With held-out data and checkpoints, the model the job keeps is the best evaluation's (cut
    // as a checkpoint when it is taken, kept beside checkpoint.keep_last's and exported at the
    // end), not the last one trained; early stopping or not.
    o.keeps_best = plan.has_eval_data && !plan.checkpoint.dir.empty();
    o.metric = plan.eval.metric;
    o.patience = plan.eval.patience;
    o.every_batches = plan.eval.every_batches;
    o.every_epoch = plan.eval.every_epoch;
    return o;
  }
};

}  // namespace

namespace {

// Adam and AdamW take the same settings; they differ in how the weight decay applies.
template <typename Optimizer, typename Options>
std::unique_ptr<torch::optim::Optimizer> MakeAdamLike(const job::DenseOptimizerSpec& s,
                                                      const std::vector<torch::Tensor>& parameters) {
  return std::make_unique<Optimizer>(
      parameters,
      Options(s.learning_rate).betas(std::make_tuple(s.beta1, s.beta2)).eps(s.epsilon).weight_decay(s.weight_decay));
}

}  // namespace

absl::StatusOr<torch::Device> ResolveDevice(const std::string& device, int rank) {
  if (device != "cpu" && device != "cuda" && device != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("train.device '", device, "' is not cpu, cuda or auto"));
  }
  const bool cuda = torch::cuda::is_available();
  if (device == "cpu" || (device == "auto" && !cuda)) return torch::Device(torch::kCPU);
  if (!cuda) {
    return absl::FailedPreconditionError(
        "train.device is cuda but no GPU is usable (no device, or this LibTorch was built without CUDA)");
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank % gpus));
}

TrainerOptions TrainerOptionsFor(const job::WorkerPlan& plan, torch::Device device) {
  TrainerOptions o;
  o.table_names = plan.table_names;
  o.slot_tables = plan.slot_tables;
  o.pooling = plan.pooling;
  o.embedding_staleness = plan.embedding_staleness;
  o.worker_id = static_cast<uint32_t>(plan.rank);
  o.batch_timeout = absl::Seconds(plan.batch_timeout_seconds);
  o.device = device;
  return o;
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeDenseOptimizer(
    const job::DenseOptimizerSpec& s, const std::vector<torch::Tensor>& parameters) {
  namespace optim = torch::optim;
  switch (s.kind) {
    case job::DenseOptimizerKind::kSgd:
      return std::unique_ptr<optim::Optimizer>(std::make_unique<optim::SGD>(
          parameters, optim::SGDOptions(s.learning_rate).momentum(s.momentum).weight_decay(s.weight_decay)));
    case job::DenseOptimizerKind::kAdagrad:
      return std::unique_ptr<optim::Optimizer>(std::make_unique<optim::Adagrad>(
          parameters, optim::AdagradOptions(s.learning_rate).weight_decay(s.weight_decay).eps(s.epsilon)));
    case job::DenseOptimizerKind::kAdam:
      return MakeAdamLike<optim::Adam, optim::AdamOptions>(s, parameters);
    case job::DenseOptimizerKind::kAdamW:
      return MakeAdamLike<optim::AdamW, optim::AdamWOptions>(s, parameters);
  }
  return absl::InvalidArgumentError("train.dense_optimizer: an unknown kind");
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double learning_rate) {
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) group.options().set_lr(learning_rate);
}

uint64_t DenseFingerprint(DenseModelImpl& model) {
  uint64_t h = 1469598103934665603ULL;
  for (const torch::Tensor& p : model.parameters()) {
    const torch::Tensor t = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  }
  return h;
}

absl::StatusOr<Evaluation> EvaluateHeldOut(const data_loader::LoaderOptions& split, embedding_ps::EmbeddingClient* ps,
                                           const TrainerOptions& options, DenseModelImpl& model) {
  HYREC_ASSIGN_OR_RETURN(auto loader, data_loader::Loader::Start(split, {}));
  absl::StatusOr<Evaluation> e;
  HYREC_RETURN_IF_ERROR(GuardTorch("evaluating on the held-out data", [&] {
    e = Evaluate(loader->stream(0), ps, options, model);
    return absl::OkStatus();
  }));
  return e;
}

absl::StatusOr<TrainReport> RunWorker(const job::WorkerPlan& plan, const job::Endpoints& endpoints,
                                      const WorkerOptions& options) {
  WorkerLoop loop(plan, endpoints, options);
  absl::StatusOr<TrainReport> report;
  absl::Status guarded = GuardTorch(absl::StrCat("worker ", plan.rank), [&] {
    report = loop.Run();
    return absl::OkStatus();
  });
  if (!guarded.ok()) return guarded;
  return report;
}

}  // namespace hyrec::dense_worker
