#include "hyrec/dense_worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "hyrec/common/staleness_window.h"
#include "hyrec/common/thread_priority.h"
#include "hyrec/data_loader/synthetic.h"

namespace hyrec::dense_worker {
namespace {

using data_loader::Batch;

int TableOfSlot(const TrainerOptions& o, int slot) { return o.slot_tables.empty() ? slot : o.slot_tables[slot]; }

// A copy of host memory `t` (which it does not own) on `device`.
torch::Tensor ToDevice(const torch::Tensor& t, const torch::Device& device) {
  return device.is_cpu() ? t.clone() : t.to(device);
}

// `t` (host memory the tensor owns) on `device`: itself on the CPU.
torch::Tensor OnDevice(const torch::Tensor& t, const torch::Device& device) {
  return device.is_cpu() ? t : t.to(device);
}

// Sum pooling of `rows` into bags on the CPU, optionally weighted per id (mean and sqrt-n pooling
// come as weights). `index` holds the `ids` row numbers, then one start offset per bag. The
// forward is LibTorch's embedding_bag; the backward is a plain scatter-add of each bag's gradient
// into its rows: LibTorch 1.13's CPU embedding_bag backward sorts the indices, which costs several
// times more (docs/benchmarks.md).
struct CpuBagSum : public torch::autograd::Function<CpuBagSum> {
  // `weights`: one per id, or an empty tensor for plain sums (an undefined tensor cannot be an
  // input of a custom autograd function in LibTorch 1.13). `grad_buffer`: memory for the rows'
  // gradient ([rows, dim] float; any other shape, e.g. empty, and backward allocates its own).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor rows, torch::Tensor index,
                               int64_t ids, torch::Tensor weights, torch::Tensor grad_buffer) {
    namespace F = torch::nn::functional;
    const int64_t bags = index.size(0) - ids;
    auto options = F::EmbeddingBagFuncOptions().offsets(index.narrow(0, ids, bags)).mode(torch::kSum);
    if (weights.numel() > 0) options.per_sample_weights(weights);
    ctx->save_for_backward({index, weights});
    ctx->saved_data["ids"] = ids;
    ctx->saved_data["rows"] = rows.size(0);
    ctx->saved_data["grad_buffer"] = grad_buffer;
    return F::embedding_bag(index.narrow(0, 0, ids), rows, options);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const int64_t ids = ctx->saved_data["ids"].toInt();
    const torch::Tensor grad_out = grads[0].contiguous();
    const int64_t bags = grad_out.size(0), dim = grad_out.size(1), rows = ctx->saved_data["rows"].toInt();
    torch::Tensor grad_rows = ctx->saved_data["grad_buffer"].toTensor();
    if (grad_rows.dim() == 2 && grad_rows.size(0) == rows && grad_rows.size(1) == dim &&
        grad_rows.scalar_type() == torch::kFloat) {
      grad_rows.zero_();
    } else {
      grad_rows = torch::zeros({rows, dim}, grad_out.options());
    }
    const int64_t* index = saved[0].data_ptr<int64_t>();
    const int64_t* offsets = index + ids;
    const float* weights = saved[1].numel() > 0 ? saved[1].data_ptr<float>() : nullptr;
    const float* g = grad_out.data_ptr<float>();
    float* out = grad_rows.data_ptr<float>();
    for (int64_t b = 0; b < bags; ++b) {
      const int64_t end = b + 1 < bags ? offsets[b + 1] : ids;
      const float* gb = g + b * dim;
      for (int64_t j = offsets[b]; j < end; ++j) {
        float* dst = out + index[j] * dim;
        const float scale = weights != nullptr ? weights[j] : 1.0f;
        for (int64_t d = 0; d < dim; ++d) dst[d] += scale * gb[d];
      }
    }
    return {grad_rows, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// Host memory for the tensors a context allocates for every batch (rows, bag indices, row
// gradients): the storage of a freed tensor comes back here and serves the next request it fits,
// so a batch reuses pages already mapped instead of faulting in new ones. It matters above glibc's
// largest mmap threshold (32 MiB), where every allocation maps fresh zero pages, as the rows and
// gradients of an embedding-heavy batch do. Thread-safe (lookups
// take buffers on their own threads, updates free them on theirs); tensors may outlive the
// context, as each holds the pool.
class TrainingContext::HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  ~HostBufferPool() {
    for (const Block& b : free_) std::free(b.data);
  }

  // An uninitialized host tensor of `sizes`, contiguous, 64-byte aligned.
  torch::Tensor Take(std::vector<int64_t> sizes, torch::ScalarType dtype) {
    int64_t numel = 1;
    for (int64_t d : sizes) numel *= d;
    const size_t need = static_cast<size_t>(numel) * c10::elementSize(dtype);
    if (need == 0) return torch::empty(sizes, torch::TensorOptions().dtype(dtype));
    Block block{nullptr, 0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {  // The smallest free block that fits, wasting < half.
        if (free_[i].bytes >= need && free_[i].bytes <= 2 * need &&
            (best == free_.size() || free_[i].bytes < free_[best].bytes)) {
          best = i;
        }
      }
      if (best < free_.size()) {
        block = free_[best];
        free_[best] = free_.back();
        free_.pop_back();
      }
    }
    if (block.data == nullptr) {
      // 1/8 headroom, so that the next batches' slightly larger requests fit too.
      block.bytes = (need + need / 8 + 4095) & ~size_t{4095};
      block.data = std::aligned_alloc(64, block.bytes);
      if (block.data == nullptr) throw std::bad_alloc();
    }
    std::shared_ptr<HostBufferPool> self = shared_from_this();
    return torch::from_blob(
        block.data, sizes, [self, block](void*) { self->Give(block); }, torch::TensorOptions().dtype(dtype));
  }

 private:
  struct Block {
    void* data;
    size_t bytes;
  };
  // Batches in flight hold a few buffers each (rows, index, weights, gradients); a window of
  // staleness s keeps about s + 3 batches alive.
  static constexpr size_t kMaxFree = 32;

  void Give(Block block) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_.size() < kMaxFree) {
        free_.push_back(block);
        return;
      }
    }
    std::free(block.data);
  }

  std::mutex mu_;
  std::vector<Block> free_;  // Guarded by mu_.
};

// The threads that run a context's lookups and updates, started once at the priority of its PS
// calls (a thread started per call cost a clone, a priority change and an exit a batch each, on
// the training thread's side too). There are as many as tasks can be in flight together, so a
// task never waits for a thread: lookups of the window overlap, as against remote shards they
// must. Tasks run in any order; the destructor runs what is queued, then joins.
class TrainingContext::TaskThreads {
 public:
  TaskThreads(int threads, int nice) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this, nice] { Loop(nice); });
  }
  ~TaskThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  std::future<absl::Status> Run(std::function<absl::Status()> task) {
    std::packaged_task<absl::Status()> packaged(std::move(task));
    std::future<absl::Status> done = packaged.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(packaged));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void Loop(int nice) {
    LowerThisThreadsPriority(nice);
    for (;;) {
      std::packaged_task<absl::Status()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // Stopping, nothing left.
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // Its captures (a batch, its gradients) are released here, on this thread.
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<absl::Status()>> queue_;  // Guarded by mu_.
  bool stop_ = false;                                     // Guarded by mu_.
  std::vector<std::thread> threads_;
};

TrainingContext::TrainingContext(TrainerOptions options, data_loader::BatchStream* stream,
                                 embedding_ps::EmbeddingClient* ps, nn_sync::DenseSync* sync,
                                 std::shared_ptr<DenseModelImpl> model, torch::optim::Optimizer* dense_optimizer)
    : options_(std::move(options)),
      stream_(stream),
      ps_(ps),
      sync_(sync),
      model_(std::move(model)),
      optimizer_(dense_optimizer),
      lookup_us_(std::make_shared<std::atomic<int64_t>>(0)),
      update_us_(std::make_shared<std::atomic<int64_t>>(0)),
      buffers_(std::make_shared<HostBufferPool>()) {
  for (const std::string& name : options_.table_names) {
    absl::StatusOr<int> dim = ps_->TableDim(name);
    dims_.push_back(dim.ok() ? *dim : 0);
    if (!dim.ok() && status_.ok()) status_ = dim.status();
  }
  for (size_t t = 0; t < dims_.size(); ++t) {
    size_t g = 0;
    while (g < groups_.size() && groups_[g].dim != dims_[t]) ++g;
    if (g == groups_.size()) groups_.push_back(RowGroup{dims_[t], {}, {}});
    groups_[g].tables.push_back(static_cast<int>(t));
    table_group_.push_back(static_cast<int>(g));
  }
  const size_t slots = options_.slot_tables.empty() ? dims_.size() : options_.slot_tables.size();
  for (size_t s = 0; s < slots; ++s) {
    const int t = TableOfSlot(options_, static_cast<int>(s));
    if (t < 0 || t >= static_cast<int>(dims_.size())) {
      if (status_.ok())
        status_ = absl::InvalidArgumentError(absl::StrCat("slot ", s, " maps to table ", t, " of ", dims_.size()));
      continue;
    }
    groups_[table_group_[t]].slots.push_back(static_cast<int>(s));
  }
  // In flight at once: the window's lookups, and its updates.
  const StalenessWindow window(options_.embedding_staleness);
  const int lookups = static_cast<int>(window.depth());
  tasks_ = std::make_unique<TaskThreads>(options_.read_only ? lookups : lookups + window.max_updates_in_flight(),
                                         BackgroundNice());
}

absl::Status TrainingContext::CheckBatch(const Batch& b) const {
  const auto bad = [&](auto... what) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", b.batch_id, ": ", what...));
  };
  const size_t samples = static_cast<size_t>(std::max(b.batch_size, 0));
  if (b.batch_size < 1) return bad("no samples");
  if (b.labels.size() != samples) return bad(b.labels.size(), " labels for ", samples, " samples");
  if (b.num_dense < 0 || b.dense.size() != samples * static_cast<size_t>(b.num_dense)) {
    return bad(b.dense.size(), " dense values for ", samples, " samples of ", b.num_dense);
  }
  if (b.tables.size() != dims_.size()) return bad(b.tables.size(), " tables, the job has ", dims_.size());
  const size_t slots = options_.slot_tables.empty() ? dims_.size() : options_.slot_tables.size();
  if (b.slots.size() != slots) return bad(b.slots.size(), " slots, the job has ", slots);
  for (size_t t = 0; t < b.tables.size(); ++t) {
    const data_loader::TableIds& table = b.tables[t];
    const std::vector<uint32_t>& offsets = table.shard_offsets;
    if (offsets.size() != static_cast<size_t>(ps_->num_shards()) + 1 || offsets.front() != 0 ||
        offsets.back() != table.unique_ids.size() || !std::is_sorted(offsets.begin(), offsets.end())) {
      return bad("table ", t, "'s ids are not grouped by the ", ps_->num_shards(), " PS shards");
    }
  }
  for (size_t s = 0; s < slots; ++s) {
    const data_loader::SlotIds& slot = b.slots[s];
    if (slot.offsets.size() != samples + 1 || slot.offsets.front() != 0 || slot.offsets.back() != slot.ids.size() ||
        !std::is_sorted(slot.offsets.begin(), slot.offsets.end())) {
      return bad("slot ", s, "'s offsets do not delimit its ", slot.ids.size(), " ids in ", samples, " samples");
    }
    if (!slot.weights.empty()) {
      if (slot.weights.size() != slot.ids.size()) {
        return bad("slot ", s, " has ", slot.weights.size(), " weights for ", slot.ids.size(), " ids");
      }
      for (size_t j = 0; j < slot.weights.size(); ++j) {
        if (!std::isfinite(slot.weights[j])) return bad("slot ", s, "'s weight ", j, " is ", slot.weights[j]);
      }
    }
    const data_loader::TableIds& table = b.tables[TableOfSlot(options_, static_cast<int>(s))];
    if (s >= table.inverse.size() || table.inverse[s].size() != slot.ids.size()) {
      return bad("slot ", s, " has no inverse map into its table ", TableOfSlot(options_, static_cast<int>(s)),
                 " (the loader's slot-to-table map differs from the trainer's)");
    }
    const size_t unique = table.unique_ids.size();
    for (uint32_t u : table.inverse[s]) {
      if (u >= unique) return bad("slot ", s, " refers to unique id ", u, " of ", unique);
    }
  }
  return absl::OkStatus();
}

// Looks up every table's unique rows of a batch (grouped by shard as the loader delivered them)
// into the batch's row groups.
absl::Status TrainingContext::LookupRows(TrainBatch* tb) {
  const Batch& b = tb->batch;
  if (absl::Status s = CheckBatch(b); !s.ok()) return s;
  tb->rows.resize(groups_.size());
  tb->table_row_offset.assign(dims_.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    int64_t rows = 0;
    for (int t : groups_[g].tables) {
      tb->table_row_offset[t] = rows;
      rows += static_cast<int64_t>(b.tables[t].unique_ids.size());
    }
    tb->rows[g] = buffers_->Take({rows, groups_[g].dim}, torch::kFloat);
  }
  // All tables in one call: against remote shards every request is in flight at once (round
  // trips overlap instead of adding up); in process the lookups run one after another here.
  std::vector<embedding_ps::EmbeddingClient::ShardedLookup> lookups;
  lookups.reserve(b.tables.size());
  for (size_t t = 0; t < b.tables.size(); ++t) {
    const data_loader::TableIds& ids = b.tables[t];
    if (ids.unique_ids.empty()) continue;
    float* out = tb->rows[table_group_[t]].data_ptr<float>() + tb->table_row_offset[t] * dims_[t];
    lookups.push_back({options_.table_names[t], ids.unique_ids, ids.shard_offsets,
                       absl::MakeSpan(out, ids.unique_ids.size() * dims_[t]), b.data_time});
  }
  return ps_->LookupShardedTables(lookups);
}

TrainingContext::~TrainingContext() {
  for (auto& p : window_) p.rows.wait();
  for (auto& u : updates_) u.done.wait();
}

absl::Status TrainingContext::PopOldestUpdate() {
  absl::Status s = updates_.front().done.get();
  newest_acked_ = static_cast<int64_t>(updates_.front().index);
  ++updates_acked_;
  updates_.pop_front();
  return s;
}

absl::Status TrainingContext::WaitForUpdatesBefore(uint64_t index) {
  while (!updates_.empty() && updates_.front().index < index) {
    absl::Status s = PopOldestUpdate();
    if (!s.ok()) return s;
  }
  // Also take the acknowledgements that have already come, without waiting: the observed
  // staleness counts from the newest update applied by now, not from the newest one waited for.
  while (!updates_.empty() && updates_.front().done.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    absl::Status s = PopOldestUpdate();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TrainingContext::NextFromStream(data_loader::Batch* batch) {
  if (!options_.abandon_wait) return stream_->Next(batch, options_.batch_timeout);
  const absl::Time deadline = absl::Now() + options_.batch_timeout;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    absl::Status s = stream_->Next(batch, std::min(left, options_.abandon_check_every));
    if (!absl::IsDeadlineExceeded(s)) return s;
    if (absl::Now() >= deadline) {  // The slice's message names the slice: say the whole wait.
      return absl::DeadlineExceededError(
          absl::StrCat("no batch within ", absl::FormatDuration(options_.batch_timeout), " (", s.message(), ")"));
    }
    if (options_.abandon_wait()) {
      wait_abandoned_ = true;
      return absl::AbortedError("the wait for the next batch was abandoned");
    }
  }
}

void TrainingContext::Fill(bool wait) {
  // Lookups run the window's depth ahead and updates may lag the rest of it (StalenessWindow).
  const StalenessWindow rule(options_.embedding_staleness);
  while (status_.ok() && !stream_done_ && window_.size() < rule.depth()) {
    const uint64_t n = next_index_;
    if (!options_.read_only) {
      if (stats_.batches < rule.TrainedBefore(n)) return;
      absl::Status st = WaitForUpdatesBefore(rule.AckedBefore(n));
      if (!st.ok()) {
        status_ = st;
        return;
      }
    }
    auto tb = std::make_unique<TrainBatch>();
    const bool waits = wait && window_.empty();
    absl::Status s = waits ? NextFromStream(&tb->batch) : stream_->Next(&tb->batch, absl::ZeroDuration());
    if (!waits && absl::IsDeadlineExceeded(s)) return;  // None there yet: the next Next waits.
    if (wait_abandoned_) return;
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
    std::future<absl::Status> rows = tasks_->Run([this, raw, lookup_us] {
      const absl::Time start = absl::Now();
      absl::Status st = LookupRows(raw);
      *lookup_us += absl::ToInt64Microseconds(absl::Now() - start);
      if (st.ok()) PrepareBags(raw);  // Pooling's indices, also off the training thread.
      return st;
    });
    window_.push_back(Pending{std::move(tb), std::move(rows)});
  }
}

bool TrainingContext::Next(TrainBatch** batch) {
  if (!status_.ok()) return false;
  wait_abandoned_ = false;
  Fill(/*wait=*/true);
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
  current_->labels = ToDevice(
      torch::from_blob(current_->batch.labels.data(), {current_->batch.batch_size}, torch::kFloat), options_.device);
  *batch = current_.get();
  Fill(/*wait=*/false);  // Keep the window full while this batch trains.
  return status_.ok();
}

// One bag per (slot of the group, sample), slot-major: bag k * B + i.
void TrainingContext::PrepareBags(TrainBatch* tb) const {
  const Batch& b = tb->batch;
  const int64_t batch_size = b.batch_size;
  tb->bags.assign(groups_.size(), TrainBatch::Bags());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const RowGroup& group = groups_[g];
    TrainBatch::Bags& bag = tb->bags[g];
    const int64_t bags = static_cast<int64_t>(group.slots.size()) * batch_size;
    int64_t ids = 0;
    bool weighted = false;
    for (int s : group.slots) {
      ids += static_cast<int64_t>(b.slots[s].ids.size());
      if (!options_.pooling.empty() && options_.pooling[s] != Pooling::kSum) weighted = true;
      if (!b.slots[s].weights.empty()) weighted = true;
    }
    bag.index = buffers_->Take({ids + bags}, torch::kLong);
    bag.weights = buffers_->Take({weighted ? ids : 0}, torch::kFloat);
    int64_t* indices = bag.index.data_ptr<int64_t>();
    int64_t* offsets = indices + ids;
    float* weights = bag.weights.data_ptr<float>();
    int64_t next = 0;
    for (size_t k = 0; k < group.slots.size(); ++k) {
      const int s = group.slots[k];
      const int t = TableOfSlot(options_, s);
      const data_loader::SlotIds& slot = b.slots[s];
      const std::vector<uint32_t>& inverse = b.tables[t].inverse[s];
      const int64_t base = tb->table_row_offset[t];
      const Pooling pooling = options_.pooling.empty() ? Pooling::kSum : options_.pooling[s];
      for (int64_t i = 0; i < batch_size; ++i) {
        offsets[k * batch_size + i] = next;
        const uint32_t begin = slot.offsets[i], end = slot.offsets[i + 1];
        float scale = 1.0f;
        if (end > begin && pooling == Pooling::kMean) scale = 1.0f / static_cast<float>(end - begin);
        if (end > begin && pooling == Pooling::kSqrtN) scale = 1.0f / std::sqrt(static_cast<float>(end - begin));
        const float* id_weights = slot.weights.empty() ? nullptr : slot.weights.data();
        for (uint32_t j = begin; j < end; ++j, ++next) {
          indices[next] = base + inverse[j];
          if (weighted) weights[next] = id_weights != nullptr ? scale * id_weights[j] : scale;
        }
      }
    }
  }
}

std::vector<torch::Tensor> TrainingContext::Pool(TrainBatch& tb, bool requires_grad) {
  namespace F = torch::nn::functional;
  const Batch& b = tb.batch;
  const int64_t batch_size = b.batch_size;
  if (requires_grad) tb.row_tensors.assign(groups_.size(), torch::Tensor());
  if (tb.bags.size() != groups_.size()) PrepareBags(&tb);
  std::vector<torch::Tensor> pooled(b.slots.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const RowGroup& group = groups_[g];
    const int64_t rows = tb.rows[g].size(0);
    // On the CPU the batch's own rows tensor is the leaf whose gradient goes to the PS.
    torch::Tensor r = OnDevice(tb.rows[g], options_.device);
    if (requires_grad) {
      r.requires_grad_(true);
      if (r.grad().defined()) r.mutable_grad() = torch::Tensor();  // A batch trained again after a heal.
      tb.row_tensors[g] = r;
    }
    const TrainBatch::Bags& bag = tb.bags[g];
    const int64_t bags = static_cast<int64_t>(group.slots.size()) * batch_size;
    const int64_t ids = bag.index.numel() - bags;
    const bool weighted = bag.weights.numel() > 0;
    torch::Tensor out;
    if (ids == 0) {
      out = torch::zeros({bags, group.dim}, r.options().requires_grad(false));
    } else {
      // One host buffer (ids, then offsets), so one copy reaches the device.
      torch::Tensor all = OnDevice(bag.index, options_.device);
      torch::Tensor weights = OnDevice(bag.weights, options_.device);  // Empty when unweighted.
      if (options_.device.is_cpu()) {
        torch::Tensor grad_buffer =
            requires_grad ? buffers_->Take({rows, group.dim}, torch::kFloat) : torch::empty({0});
        out = CpuBagSum::apply(r, all, ids, weights, grad_buffer);
      } else {
        auto bag_options = F::EmbeddingBagFuncOptions().offsets(all.narrow(0, ids, bags)).mode(torch::kSum);
        if (weighted) bag_options.per_sample_weights(weights);
        out = F::embedding_bag(all.narrow(0, 0, ids), r, bag_options);
      }
    }
    // unbind, not out[k]: its backward stacks the slots' gradients in one operation, where each
    // out[k] would back-propagate a zero-filled gradient of the whole group, once per slot.
    std::vector<torch::Tensor> slots =
        out.view({static_cast<int64_t>(group.slots.size()), batch_size, group.dim}).unbind(0);
    for (size_t k = 0; k < group.slots.size(); ++k) pooled[group.slots[k]] = slots[k];
  }
  return pooled;
}

torch::Tensor TrainingContext::Forward(TrainBatch& tb) {
  if (optimizer_ != nullptr) optimizer_->zero_grad();
  std::vector<torch::Tensor> pooled = Pool(tb, /*requires_grad=*/true);
  torch::Tensor dense =
      ToDevice(torch::from_blob(tb.batch.dense.data(), {tb.batch.batch_size, tb.batch.num_dense}, torch::kFloat),
               options_.device);
  return model_->forward(dense, pooled);
}

absl::Status TrainingContext::Backward(torch::Tensor loss) {
  if (current_ == nullptr) return absl::FailedPreconditionError("Backward without a batch from Next");
  if (optimizer_ == nullptr || options_.read_only) {
    return absl::FailedPreconditionError("Backward on a read-only context (no optimizer)");
  }
  unsynced_ = false;
  loss.backward();
  if (sync_ != nullptr) {
    absl::Status s = sync_->FinishGradientSync();
    if (!s.ok()) {
      unsynced_ = true;  // The batch stays current: trained again, or settled, after a heal.
      return s;
    }
  }
  optimizer_->step();
  return PushUpdate();
}

absl::Status TrainingContext::SettleWithoutStep() {
  if (current_ == nullptr || !unsynced_) {
    return absl::FailedPreconditionError("SettleWithoutStep without a batch whose gradient sync failed");
  }
  unsynced_ = false;
  return PushUpdate();
}

absl::Status TrainingContext::PushEmbeddingGradients(torch::Tensor loss) {
  if (current_ == nullptr) return absl::FailedPreconditionError("PushEmbeddingGradients without a batch from Next");
  std::vector<torch::Tensor> rows;
  std::vector<size_t> groups;
  for (size_t g = 0; g < current_->row_tensors.size(); ++g) {
    if (!current_->row_tensors[g].defined()) continue;
    rows.push_back(current_->row_tensors[g]);
    groups.push_back(g);
  }
  // Only the rows' gradients: the dense parameters' (and their sync hooks) are not reached.
  const std::vector<torch::Tensor> grads =
      torch::autograd::grad({loss}, rows, /*grad_outputs=*/{}, /*retain_graph=*/false, /*create_graph=*/false,
                            /*allow_unused=*/true);
  for (size_t i = 0; i < groups.size(); ++i) current_->row_tensors[groups[i]].mutable_grad() = grads[i];
  return PushUpdate();
}

void TrainingContext::SetNextUpdateSequence(uint64_t sequence) { sequence_ = sequence - 1; }

absl::Status TrainingContext::PushUpdate() {
  // Embedding gradients per unique id (duplicates and pooling already accounted by autograd):
  // the leaf tensors' gradients themselves on the CPU (no copy), one device-to-host copy per row
  // group otherwise; a group that got no gradient pushes zeros.
  auto grads = std::make_shared<std::vector<torch::Tensor>>();
  for (size_t g = 0; g < current_->rows.size(); ++g) {
    torch::Tensor grad;
    if (g < current_->row_tensors.size() && current_->row_tensors[g].defined()) grad = current_->row_tensors[g].grad();
    grads->push_back(grad.defined() ? grad.to(torch::kCPU).contiguous() : torch::zeros_like(current_->rows[g]));
  }
  auto batch = std::shared_ptr<TrainBatch>(current_.release());
  const uint64_t sequence = ++sequence_;
  auto update_us = update_us_;
  std::future<absl::Status> done = tasks_->Run([this, batch, grads, sequence, update_us] {
    const absl::Time start = absl::Now();
    std::vector<embedding_ps::EmbeddingClient::ShardedUpdate> updates;
    updates.reserve(batch->batch.tables.size());
    for (size_t t = 0; t < batch->batch.tables.size(); ++t) {
      const data_loader::TableIds& ids = batch->batch.tables[t];
      if (ids.unique_ids.empty()) continue;
      const float* g = (*grads)[table_group_[t]].data_ptr<float>() + batch->table_row_offset[t] * dims_[t];
      updates.push_back({options_.table_names[t], ids.unique_ids, ids.shard_offsets,
                         absl::MakeConstSpan(g, ids.unique_ids.size() * dims_[t])});
    }
    absl::Status s = ps_->UpdateShardedTables(updates, embedding_ps::UpdateId{options_.worker_id, sequence});
    if (!s.ok()) return s;
    *update_us += absl::ToInt64Microseconds(absl::Now() - start);
    return absl::OkStatus();
  });
  updates_.push_back(PendingUpdate{batch->index, std::move(done)});
  ++stats_.batches;
  stats_.samples += static_cast<uint64_t>(batch->batch.batch_size);
  Fill(/*wait=*/false);  // Lookups that waited for this batch to train can go now.
  return status_;
}

absl::Status TrainingContext::Finish() {
  absl::Status s = WaitForUpdatesBefore(UINT64_MAX);
  if (!s.ok() && status_.ok()) status_ = s;
  return status_;
}

TrainerStats TrainingContext::stats() const {
  TrainerStats s = stats_;
  s.lookup_count = lookups_;
  s.update_count = updates_acked_;
  if (lookups_ > 0) {
    s.lookup_ms = lookup_us_->load() / 1000.0 / lookups_;
    s.observed_staleness = staleness_total_ / lookups_;
    s.wait_for_rows_ms = wait_ms_total_ / lookups_;
  }
  if (updates_acked_ > 0) s.update_ms = update_us_->load() / 1000.0 / updates_acked_;
  return s;
}

absl::StatusOr<Evaluation> Evaluate(data_loader::BatchStream* stream, embedding_ps::EmbeddingClient* ps,
                                    const TrainerOptions& options, DenseModelImpl& model,
                                    std::vector<float>* scores_out, std::vector<float>* labels_out) {
  torch::NoGradGuard no_grad;
  // Evaluation mode (no dropout) for the pass, then the mode the model was in.
  struct ModeGuard {
    explicit ModeGuard(DenseModelImpl& m) : model(m), training(m.is_training()) { model.eval(); }
    ~ModeGuard() { model.train(training); }
    DenseModelImpl& model;
    const bool training;
  } mode(model);
  std::vector<float> scores, labels;
  double loss_sum = 0;
  // A read-only context: lookups (two batches ahead) and pooling, no optimizer, no updates.
  TrainerOptions eval_options = options;
  eval_options.embedding_staleness = 2;
  eval_options.read_only = true;
  TrainingContext ctx(eval_options, stream, ps, nullptr, nullptr, nullptr);
  for (TrainBatch* tb = nullptr; ctx.Next(&tb);) {
    std::vector<torch::Tensor> pooled = ctx.Pool(*tb, /*requires_grad=*/false);
    torch::Tensor dense =
        ToDevice(torch::from_blob(tb->batch.dense.data(), {tb->batch.batch_size, tb->batch.num_dense}, torch::kFloat),
                 options.device);
    torch::Tensor logits = model.forward(dense, pooled).to(torch::kCPU);
    loss_sum += torch::binary_cross_entropy_with_logits(logits, tb->labels.to(torch::kCPU), {}, {}, at::Reduction::Sum)
                    .item<double>();
    const float* l = logits.data_ptr<float>();
    scores.insert(scores.end(), l, l + logits.numel());
    labels.insert(labels.end(), tb->batch.labels.begin(), tb->batch.labels.end());
  }
  if (!ctx.status().ok()) return ctx.status();
  if (scores_out != nullptr) *scores_out = scores;
  if (labels_out != nullptr) *labels_out = labels;
  Evaluation e;
  e.samples = scores.size();
  e.auc = data_loader::ExactAuc(scores, labels);
  e.log_loss = e.samples > 0 ? loss_sum / e.samples : 0;
  return e;
}

}  // namespace hyrec::dense_worker
