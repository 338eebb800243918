#include "hyrec/dense_worker/trainer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "hyrec/data_loader/synthetic.h"

namespace hyrec::dense_worker {
namespace {

using data_loader::Batch;

int TableOfSlot(const TrainerOptions& o, int slot) {
  return o.slot_tables.empty() ? slot : o.slot_tables[slot];
}

// Runs fn(t) for every table t of a batch at once (each is a round trip to the PS shards, so they
// overlap instead of adding up) and returns the first error.
template <typename Fn>
absl::Status ForEachTableConcurrently(size_t tables, Fn fn) {
  std::vector<std::future<absl::Status>> calls;
  for (size_t t = 1; t < tables; ++t) calls.push_back(std::async(std::launch::async, [&fn, t] { return fn(t); }));
  absl::Status status = tables > 0 ? fn(0) : absl::OkStatus();
  for (auto& c : calls) {
    absl::Status s = c.get();
    if (status.ok()) status = s;
  }
  return status;
}

// Looks up every table's unique rows of a batch, grouped by shard as the loader delivered them.
absl::Status LookupRows(embedding_ps::EmbeddingClient* ps, const TrainerOptions& options,
                        const std::vector<int>& dims, TrainBatch* tb) {
  const Batch& b = tb->batch;
  tb->rows.resize(b.tables.size());
  return ForEachTableConcurrently(b.tables.size(), [&](size_t t) {
    const data_loader::TableIds& ids = b.tables[t];
    tb->rows[t].resize(ids.unique_ids.size() * dims[t]);
    if (ids.unique_ids.empty()) return absl::OkStatus();
    return ps->LookupSharded(options.table_names[t], ids.unique_ids, ids.shard_offsets,
                             absl::MakeSpan(tb->rows[t]));
  });
}

}  // namespace

TrainingContext::TrainingContext(TrainerOptions options, data_loader::BatchStream* stream,
                                 embedding_ps::EmbeddingClient* ps, nn_sync::DenseSync* sync,
                                 std::shared_ptr<DenseModelImpl> model, torch::optim::Optimizer* dense_optimizer)
    : options_(std::move(options)), stream_(stream), ps_(ps), sync_(sync), model_(std::move(model)),
      optimizer_(dense_optimizer), lookup_us_(std::make_shared<std::atomic<int64_t>>(0)),
      update_us_(std::make_shared<std::atomic<int64_t>>(0)) {
  for (const std::string& name : options_.table_names) {
    absl::StatusOr<int> dim = ps_->TableDim(name);
    dims_.push_back(dim.ok() ? *dim : 0);
    if (!dim.ok() && status_.ok()) status_ = dim.status();
  }
}

TrainingContext::~TrainingContext() {
  for (auto& p : window_) p.rows.wait();
  for (auto& u : updates_) u.done.wait();
}

absl::Status TrainingContext::WaitForUpdatesBefore(uint64_t index) {
  while (!updates_.empty() && updates_.front().index < index) {
    absl::Status s = updates_.front().done.get();
    newest_acked_ = static_cast<int64_t>(updates_.front().index);
    updates_.pop_front();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void TrainingContext::Fill() {
  // Lookups run `depth` batches ahead and updates may lag the rest of the window: a lookup for
  // batch n needs every update of batches < n - s acknowledged (so at most s batches of updates
  // are unapplied when it is issued), and batch n - s - 1 must have trained.
  const int s = options_.embedding_staleness;
  const size_t depth = static_cast<size_t>(std::max(1, (s + 1) / 2));
  while (status_.ok() && !stream_done_ && window_.size() < depth) {
    const uint64_t n = next_index_;
    if (!options_.read_only && n > static_cast<uint64_t>(s)) {
      if (stats_.batches < n - s) return;  // Batch n - s - 1 has not trained yet.
      absl::Status st = WaitForUpdatesBefore(n - s);
      if (!st.ok()) {
        status_ = st;
        return;
      }
    }
    auto tb = std::make_unique<TrainBatch>();
    absl::Status s = stream_->Next(&tb->batch, options_.batch_timeout);
    if (absl::IsOutOfRange(s)) {
      stream_done_ = true;
      return;
    }
    if (!s.ok()) {
      status_ = s;
      return;
    }
    tb->index = n;
    ++next_index_;
    staleness_total_ += static_cast<double>(static_cast<int64_t>(n) - 1 - newest_acked_);
    ++lookups_;
    TrainBatch* raw = tb.get();
    auto lookup_us = lookup_us_;
    std::future<absl::Status> rows = std::async(std::launch::async, [this, raw, lookup_us] {
      const absl::Time start = absl::Now();
      absl::Status st = LookupRows(ps_, options_, dims_, raw);
      *lookup_us += absl::ToInt64Microseconds(absl::Now() - start);
      return st;
    });
    window_.push_back(Pending{std::move(tb), std::move(rows)});
  }
}

bool TrainingContext::Next(TrainBatch** batch) {
  if (!status_.ok()) return false;
  Fill();
  if (window_.empty()) return false;
  Pending pending = std::move(window_.front());
  window_.pop_front();
  const absl::Time start = absl::Now();
  absl::Status s = pending.rows.get();
  wait_ms_total_ += absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!s.ok()) {
    status_ = s;
    return false;
  }
  current_ = std::move(pending.batch);
  current_->labels = torch::from_blob(current_->batch.labels.data(), {current_->batch.batch_size},
                                      torch::kFloat).clone();
  *batch = current_.get();
  Fill();  // Keep the window full while this batch trains.
  return status_.ok();
}

std::vector<torch::Tensor> TrainingContext::Pool(TrainBatch& tb, bool requires_grad) {
  const Batch& b = tb.batch;
  tb.row_tensors.clear();
  for (size_t t = 0; t < b.tables.size(); ++t) {
    const int64_t rows = static_cast<int64_t>(b.tables[t].unique_ids.size());
    torch::Tensor r = torch::from_blob(tb.rows[t].data(), {rows, dims_[t]}, torch::kFloat).clone();
    if (requires_grad) r.requires_grad_(true);
    tb.row_tensors.push_back(r);
  }
  std::vector<torch::Tensor> pooled;
  const int64_t batch_size = b.batch_size;
  for (size_t s = 0; s < b.slots.size(); ++s) {
    const int t = TableOfSlot(options_, static_cast<int>(s));
    const data_loader::SlotIds& slot = b.slots[s];
    const std::vector<uint32_t>& inverse = b.tables[t].inverse[s];
    std::vector<int64_t> index(inverse.begin(), inverse.end());
    std::vector<int64_t> sample(inverse.size());
    std::vector<float> scale(batch_size, 1.0f);
    for (int64_t i = 0; i < batch_size; ++i) {
      const uint32_t count = slot.offsets[i + 1] - slot.offsets[i];
      for (uint32_t j = slot.offsets[i]; j < slot.offsets[i + 1]; ++j) sample[j] = i;
      const Pooling pooling = options_.pooling.empty() ? Pooling::kSum : options_.pooling[s];
      if (count > 0 && pooling == Pooling::kMean) scale[i] = 1.0f / count;
      if (count > 0 && pooling == Pooling::kSqrtN) scale[i] = 1.0f / std::sqrt(static_cast<float>(count));
    }
    torch::Tensor gathered = tb.row_tensors[t].index_select(
        0, torch::from_blob(index.data(), {static_cast<int64_t>(index.size())}, torch::kLong).clone());
    torch::Tensor sum = torch::zeros({batch_size, dims_[t]}).index_add(
        0, torch::from_blob(sample.data(), {static_cast<int64_t>(sample.size())}, torch::kLong).clone(),
        gathered);
    pooled.push_back(sum * torch::from_blob(scale.data(), {batch_size, 1}, torch::kFloat).clone());
  }
  return pooled;
}

torch::Tensor TrainingContext::Forward(TrainBatch& tb) {
  if (optimizer_ != nullptr) optimizer_->zero_grad();
  std::vector<torch::Tensor> pooled = Pool(tb, /*requires_grad=*/true);
  torch::Tensor dense = torch::from_blob(tb.batch.dense.data(), {tb.batch.batch_size, tb.batch.num_dense},
                                         torch::kFloat).clone();
  return model_->forward(dense, pooled);
}

absl::Status TrainingContext::Backward(torch::Tensor loss) {
  if (current_ == nullptr) return absl::FailedPreconditionError("Backward without a batch from Next");
  if (optimizer_ == nullptr || options_.read_only) {
    return absl::FailedPreconditionError("Backward on a read-only context (no optimizer)");
  }
  loss.backward();
  if (sync_ != nullptr) {
    absl::Status s = sync_->FinishGradientSync();
    if (!s.ok()) return status_ = s;
  }
  optimizer_->step();
  // Embedding gradients per unique id (duplicates and pooling already accounted by autograd).
  auto grads = std::make_shared<std::vector<std::vector<float>>>();
  for (size_t t = 0; t < current_->row_tensors.size(); ++t) {
    torch::Tensor g = current_->row_tensors[t].grad();
    std::vector<float> values(current_->rows[t].size(), 0.0f);
    if (g.defined()) {
      g = g.contiguous();
      std::memcpy(values.data(), g.data_ptr<float>(), values.size() * sizeof(float));
    }
    grads->push_back(std::move(values));
  }
  auto batch = std::shared_ptr<TrainBatch>(current_.release());
  const uint64_t sequence = ++sequence_;
  auto update_us = update_us_;
  std::future<absl::Status> done = std::async(std::launch::async, [this, batch, grads, sequence, update_us] {
    const absl::Time start = absl::Now();
    absl::Status s = ForEachTableConcurrently(batch->batch.tables.size(), [&](size_t t) {
      const data_loader::TableIds& ids = batch->batch.tables[t];
      if (ids.unique_ids.empty()) return absl::OkStatus();
      return ps_->UpdateSharded(options_.table_names[t], ids.unique_ids, ids.shard_offsets, (*grads)[t],
                                embedding_ps::UpdateId{options_.worker_id, sequence * 1024 + t + 1});
    });
    if (!s.ok()) return s;
    *update_us += absl::ToInt64Microseconds(absl::Now() - start);
    return absl::OkStatus();
  });
  updates_.push_back(PendingUpdate{batch->index, std::move(done)});
  ++updates_done_;
  ++stats_.batches;
  stats_.samples += static_cast<uint64_t>(batch->batch.batch_size);
  Fill();  // Lookups that waited for this batch to train can go now.
  return status_;
}

absl::Status TrainingContext::Finish() {
  absl::Status s = WaitForUpdatesBefore(UINT64_MAX);
  if (!s.ok() && status_.ok()) status_ = s;
  return status_;
}

TrainerStats TrainingContext::stats() const {
  TrainerStats s = stats_;
  if (lookups_ > 0) {
    s.lookup_ms = lookup_us_->load() / 1000.0 / lookups_;
    s.observed_staleness = staleness_total_ / lookups_;
    s.wait_for_rows_ms = wait_ms_total_ / lookups_;
  }
  if (updates_done_ > 0) s.update_ms = update_us_->load() / 1000.0 / updates_done_;
  return s;
}

absl::StatusOr<Evaluation> Evaluate(data_loader::BatchStream* stream, embedding_ps::EmbeddingClient* ps,
                                    const TrainerOptions& options, DenseModelImpl& model) {
  torch::NoGradGuard no_grad;
  std::vector<float> scores, labels;
  double loss_sum = 0;
  // A read-only context: lookups (two batches ahead) and pooling, no optimizer, no updates.
  TrainerOptions eval_options = options;
  eval_options.embedding_staleness = 2;
  eval_options.read_only = true;
  TrainingContext ctx(eval_options, stream, ps, nullptr, nullptr, nullptr);
  for (TrainBatch* tb = nullptr; ctx.Next(&tb);) {
    std::vector<torch::Tensor> pooled = ctx.Pool(*tb, /*requires_grad=*/false);
    torch::Tensor dense = torch::from_blob(tb->batch.dense.data(), {tb->batch.batch_size, tb->batch.num_dense},
                                           torch::kFloat).clone();
    torch::Tensor logits = model.forward(dense, pooled);
    loss_sum += torch::binary_cross_entropy_with_logits(logits, tb->labels, {}, {}, at::Reduction::Sum).item<double>();
    const float* l = logits.data_ptr<float>();
    scores.insert(scores.end(), l, l + logits.numel());
    labels.insert(labels.end(), tb->batch.labels.begin(), tb->batch.labels.end());
  }
  if (!ctx.status().ok()) return ctx.status();
  Evaluation e;
  e.samples = scores.size();
  e.auc = data_loader::ExactAuc(scores, labels);
  e.log_loss = e.samples > 0 ? loss_sum / e.samples : 0;
  return e;
}

}  // namespace hyrec::dense_worker
