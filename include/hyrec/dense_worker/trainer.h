// TrainingContext: Persia's hybrid training step for one dense worker.
//
//   HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile("job.yaml"));
//   HYREC_ASSIGN_OR_RETURN(auto ps, embedding_ps::ConnectEmbeddingClient(plan.endpoints.ps, {}));
//   HYREC_ASSIGN_OR_RETURN(auto loader, data_loader::Loader::Start(plan.loader.options, {}));
//   HYREC_ASSIGN_OR_RETURN(std::shared_ptr<DenseModelImpl> model, MakeModel(plan.workers[0]));
//   torch::optim::Adam dense_optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
//   TrainingContext ctx(TrainerOptionsFor(plan.workers[0], torch::kCPU), loader->stream(0), ps.get(),
//                       /*sync=*/nullptr, model, &dense_optimizer);
//   for (TrainBatch* batch = nullptr; ctx.Next(&batch);) {
//     torch::Tensor logits = ctx.Forward(*batch);
//     HYREC_RETURN_IF_ERROR(ctx.Backward(torch::binary_cross_entropy_with_logits(logits, batch->labels)));
//   }
//   HYREC_RETURN_IF_ERROR(ctx.Finish());
//
// The context hides the PS, the loader, the staleness window and the dense sync:
// - Next: lookups for the next `embedding_staleness` batches are in flight while the current one
//   trains; a lookup for batch n is issued only when the updates of batches <= n - s - 1 were
//   acknowledged, so at most s batches of updates are unapplied when a lookup is issued.
//   Staleness 0 is fully synchronous, on the same code path.
// - Forward pools each slot's rows (sum, mean or sqrt-n over the sample's ids) from the batch's
//   unique rows per table, so autograd sums the gradients of duplicate ids; the rows of a table are
//   looked up once per batch, grouped by shard as the loader delivered them. The unique rows of
//   all tables of one dim travel as one tensor and all their slots pool in one embedding_bag
//   (one host-to-device copy and one kernel per dim, whatever the number of slots).
// - Device: the dense model, the pooling and the labels live on `options.device` (CPU, or a
//   CUDA GPU with a CUDA LibTorch); rows go there once per batch and their gradients come back.
// - Backward: backward, the dense gradient allreduce (DenseSync, when given), the dense optimizer
//   step, then the embedding gradients per unique id pushed to the PS without waiting, tagged
//   (worker id, sequence) so a retry is applied once.
// - Every batch is checked against the options before its rows are looked up (labels and dense
//   sizes, per-slot offsets, the inverse maps within the table's unique ids, the shard groups): a
//   malformed batch is InvalidArgument naming the batch and the slot, never a read out of bounds.
// The options come from the job plan (TrainerOptionsFor in worker.h); RunWorker runs this loop.
// - CPU workers sharing cores with in-process PS shards or a loader: call TuneTrainingProcess
//   (process_tuning.h) at the start of main, as hyrec train and hyrec worker do.
#ifndef HYREC_DENSE_WORKER_TRAINER_H_
#define HYREC_DENSE_WORKER_TRAINER_H_

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "hyrec/common/thread_priority.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/report.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/job/job_spec.h"
#include "hyrec/nn_sync/dense_sync.h"

namespace hyrec::dense_worker {

using Pooling = job::Pooling;

struct TrainerOptions {
  std::vector<std::string> table_names;  // PS table of each loader table index.
  std::vector<int> slot_tables;          // Loader table of each slot; empty: slot k is table k.
  std::vector<Pooling> pooling;          // Per slot; empty: sum everywhere.
  int embedding_staleness = 4;
  bool read_only = false;  // Evaluation: lookups only, no Backward, no window rule.
  uint32_t worker_id = 0;
  absl::Duration batch_timeout = absl::Seconds(120);
  // While the stream has no batch, asked once every `abandon_check_every`: true ends the wait
  // without an error (Next returns false and wait_abandoned() says so; nothing of the stream is
  // consumed). A worker whose batch cannot come until its group regroups (a peer was lost) says
  // so here. Null: wait up to batch_timeout.
  std::function<bool()> abandon_wait;
  absl::Duration abandon_check_every = absl::Seconds(1);
  torch::Device device = torch::kCPU;  // Where the model lives; pooling and labels go there.
  // Nice increment of the threads that call the PS (lookups ahead, updates behind), so that they
  // fill the cores the dense step leaves idle rather than preempt it; 0: as the caller, kIdleNice:
  // SCHED_IDLE (common/thread_priority.h). Against in-process stores those threads do the store's
  // CPU work: SCHED_IDLE by default. Against remote shards they mostly wait for a reply and must
  // take it as soon as it comes, which a SCHED_IDLE thread does not when the machine's cores are
  // busy (docs/benchmarks.md has the measurement).
  int background_nice = kIdleNice;  // With an in-process EmbeddingClient.
  int remote_background_nice = 10;  // With a remote one.
};

// A batch with its rows looked up, ready to train on.
struct TrainBatch {
  data_loader::Batch batch;
  torch::Tensor labels;  // [B] float, on the context's device
  // Unique rows, per group of tables with the same dim (the context's row groups): group g holds
  // its tables' unique rows one table after another, a [rows_g, dim_g] float tensor in host
  // memory; table t's rows start at row table_row_offset[t] of its group.
  std::vector<torch::Tensor> rows;
  std::vector<int64_t> table_row_offset;
  uint64_t index = 0;  // Position in this worker's sequence of batches.
  // Per row group, embedding_bag's input, prepared beside the lookup (off the training thread),
  // in host memory: `index` (int64) holds the group's ids (row numbers in the group, slot-major)
  // and then one offset per (slot, sample) bag; `weights` (float) the per-id pooling factors: the
  // id's own weight (SlotIds::weights) times 1/n or 1/sqrt(n) when its slot pools by mean or
  // sqrt-n (empty when every slot of the group sums ids of weight 1).
  struct Bags {
    torch::Tensor index;
    torch::Tensor weights;
  };
  std::vector<Bags> bags;
  // Set by Pool: per row group, the leaf tensor whose gradient goes back to the PS.
  std::vector<torch::Tensor> row_tensors;
};

class TrainingContext {
 public:
  // `sync` may be null (one worker); `model` and `dense_optimizer` may be null for a read_only
  // context (evaluation), which only looks up and pools.
  TrainingContext(TrainerOptions options, data_loader::BatchStream* stream, embedding_ps::EmbeddingClient* ps,
                  nn_sync::DenseSync* sync, std::shared_ptr<DenseModelImpl> model,
                  torch::optim::Optimizer* dense_optimizer);
  ~TrainingContext();

  // The next batch, rows looked up; false at the end of the data, on error (see status()) or
  // when options.abandon_wait ended the wait for one (see wait_abandoned()).
  bool Next(TrainBatch** batch);
  // Whether abandon_wait ended a wait for the stream since the last Next began.
  bool wait_abandoned() const { return wait_abandoned_; }
  torch::Tensor Forward(TrainBatch& batch);
  absl::Status Backward(torch::Tensor loss);
  // Waits for every pending update.
  absl::Status Finish();

  // When Backward's gradient sync failed (a peer was lost), the batch stays current and nothing
  // of it was applied. After the group heals (DenseSync::Regroup), either train it again
  // (Forward and Backward on the same batch), or, when the healed group's dense state already
  // includes its step (a peer completed that allreduce), settle it: its embedding gradients go
  // to the PS and it counts as trained, without a dense step.
  bool unsynced() const { return unsynced_; }
  absl::Status SettleWithoutStep();
  // The embedding part of Backward alone: the gradient of `loss` with respect to the batch's
  // rows (the dense parameters' gradients, their sync and the dense step left out) pushed as the
  // batch's update. A replacement worker resends a lost worker's last updates this way, under
  // their steps' sequences, so shards that never got them apply them and the others recognize
  // them as repeats.
  absl::Status PushEmbeddingGradients(torch::Tensor loss);
  // The update sequence of the next trained batch (each one takes the next): RunWorker derives
  // them from the step, so that a replacement worker resends a lost worker's updates with the
  // same sequences and the PS applies each once. Unset: from the clock at construction.
  void SetNextUpdateSequence(uint64_t sequence);

  absl::Status status() const { return status_; }
  TrainerStats stats() const;
  data_loader::ReaderPosition position() const { return stream_->Position(); }

  // Pools the batch's rows per slot into [B, dim] tensors on the context's device. With
  // requires_grad they keep the autograd link to the batch's `row_tensors` (which Forward's call
  // sets and Backward reads); without, row_tensors is left alone (evaluation and tests).
  std::vector<torch::Tensor> Pool(TrainBatch& batch, bool requires_grad);

 private:
  struct Pending {
    std::unique_ptr<TrainBatch> batch;
    std::future<absl::Status> rows;
  };
  struct PendingUpdate {
    uint64_t index;
    std::future<absl::Status> done;
  };
  // Tables of one embedding dim; their rows travel and pool together.
  struct RowGroup {
    int dim = 0;
    std::vector<int> tables;
    std::vector<int> slots;  // Slots reading these tables, in slot order.
  };
  absl::Status PopOldestUpdate();
  // The current batch's embedding gradients to the PS, without waiting; counts it trained.
  absl::Status PushUpdate();
  // Per-batch host buffers (rows, bag indices, row gradients), recycled (trainer.cc).
  class HostBufferPool;
  // The threads that run lookups and updates (trainer.cc).
  class TaskThreads;
  // Waits for the updates of batches < index, then takes the acknowledgements already there.
  absl::Status WaitForUpdatesBefore(uint64_t index);
  // Takes batches into the lookahead window (their lookups start) up to its depth: the batches the
  // stream holds now, and, with `wait` and an empty window, the next one however long it takes
  // (within batch_timeout). A batch in hand never waits for later ones: a stream's records train
  // as soon as their batch is there.
  void Fill(bool wait);
  // The stream's next batch within batch_timeout, asking abandon_wait between slices of it.
  absl::Status NextFromStream(data_loader::Batch* batch);
  absl::Status LookupRows(TrainBatch* tb);
  absl::Status CheckBatch(const data_loader::Batch& b) const;
  void PrepareBags(TrainBatch* tb) const;
  // The nice increment of the lookup and update threads for this context's PS client.
  int BackgroundNice() const { return ps_->remote() ? options_.remote_background_nice : options_.background_nice; }

  TrainerOptions options_;
  data_loader::BatchStream* stream_;
  embedding_ps::EmbeddingClient* ps_;
  nn_sync::DenseSync* sync_;
  std::shared_ptr<DenseModelImpl> model_;
  torch::optim::Optimizer* optimizer_;
  std::vector<int> dims_;         // Per loader table.
  std::vector<int> table_group_;  // Per loader table: its row group.
  std::vector<RowGroup> groups_;
  std::deque<Pending> window_;
  std::deque<PendingUpdate> updates_;
  std::unique_ptr<TrainBatch> current_;
  bool stream_done_ = false;
  bool wait_abandoned_ = false;
  uint64_t next_index_ = 0;
  // Update sequences start from the wall clock (milliseconds << 20), so a worker restarted with
  // the same worker id against a PS that outlived it sends sequences above all of its previous
  // run's (a run would need 2^20 batches a millisecond to overtake its successor): the PS sees
  // new updates, not repeats of the old run's.
  uint64_t sequence_ = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())) << 20;
  int64_t newest_acked_ = -1;
  bool unsynced_ = false;  // The current batch's gradient sync failed.
  absl::Status status_;
  TrainerStats stats_;
  double lookup_ms_total_ = 0, update_ms_total_ = 0, wait_ms_total_ = 0, staleness_total_ = 0;
  uint64_t lookups_ = 0, updates_acked_ = 0;
  std::shared_ptr<std::atomic<int64_t>> lookup_us_, update_us_;
  std::shared_ptr<HostBufferPool> buffers_;
  // Last: destroyed first, once the destructor has waited for every lookup and update.
  std::unique_ptr<TaskThreads> tasks_;
};

// Exact AUC and mean log loss of a model over a stream (no training, no PS updates), with the
// model in evaluation mode (no dropout) for the pass. When given, `scores` and `labels` receive
// every sample's logit and label, in stream order.
absl::StatusOr<Evaluation> Evaluate(data_loader::BatchStream* stream, embedding_ps::EmbeddingClient* ps,
                                    const TrainerOptions& options, DenseModelImpl& model,
                                    std::vector<float>* scores = nullptr, std::vector<float>* labels = nullptr);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_TRAINER_H_
