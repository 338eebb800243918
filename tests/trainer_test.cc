// TrainingContext's pooling and embedding gradients against a hand computation: tables of two
// dims (so two row groups), a table shared by two slots, duplicate ids, an empty slot, and sum,
// mean and sqrt-n pooling. Runs on the CPU and, when LibTorch has CUDA and a GPU is present, on
// the GPU (the same numbers must come out). Hybrid updates that complete out of order are each
// applied once. Also: SleepIdleBlasThreads keeps matrix products
// right across OpenBLAS's pool restart, and RetainFreedMemory makes a freed block's pages reusable
// without page faults.
#include "hyrec/dense_worker/trainer.h"

#include <dlfcn.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/dense_worker/process_tuning.h"

#include "gtest/gtest.h"

namespace hyrec::dense_worker {
namespace {

using data_loader::Batch;
using data_loader::Sample;

constexpr int kSlots = 4;
const std::vector<int> kSlotTables = {0, 1, 2, 0};  // Table "a" is read by slots 0 and 3.
const std::vector<int> kDims = {4, 3, 4};           // Tables a and c share a row group.
const std::vector<Pooling> kPooling = {Pooling::kSum, Pooling::kMean, Pooling::kSqrtN, Pooling::kSum};

// The same batch, `times` times.
class RepeatedBatch : public data_loader::BatchStream {
 public:
  explicit RepeatedBatch(Batch batch, int times = 1) : batch_(std::move(batch)), left_(times) {}
  absl::Status Next(Batch* batch, absl::Duration) override {
    if (left_ == 0) return absl::OutOfRangeError("end");
    --left_;
    *batch = batch_;
    return absl::OkStatus();
  }
  data_loader::ReaderPosition Position() const override { return {}; }

 private:
  Batch batch_;
  int left_;
};

// The in-process PS, with each table's update of each batch held back 0-29 ms (by a hash of the
// table and the sequence): a worker's updates then complete out of order, across batches and
// tables, as they do on a loaded machine.
class SlowUpdates : public embedding_ps::EmbeddingClient {
 public:
  explicit SlowUpdates(std::unique_ptr<embedding_ps::EmbeddingClient> ps) : ps_(std::move(ps)) {}
  int num_shards() const override { return ps_->num_shards(); }
  bool remote() const override { return ps_->remote(); }
  absl::StatusOr<int> TableDim(absl::string_view table) const override { return ps_->TableDim(table); }
  absl::Status Lookup(absl::string_view table, absl::Span<const uint64_t> ids, absl::Span<float> out) override {
    return ps_->Lookup(table, ids, out);
  }
  absl::Status Update(absl::string_view table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                      embedding_ps::UpdateId update_id) override {
    Delay(table, update_id);
    return ps_->Update(table, ids, grads, update_id);
  }
  absl::Status LookupSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                             absl::Span<const uint32_t> shard_offsets, absl::Span<float> out) override {
    return ps_->LookupSharded(table, ids, shard_offsets, out);
  }
  absl::Status UpdateSharded(absl::string_view table, absl::Span<const uint64_t> ids,
                             absl::Span<const uint32_t> shard_offsets, absl::Span<const float> grads,
                             embedding_ps::UpdateId update_id) override {
    Delay(table, update_id);
    return ps_->UpdateSharded(table, ids, shard_offsets, grads, update_id);
  }
  absl::Status LookupShardedTables(absl::Span<const ShardedLookup> lookups) override {
    return ps_->LookupShardedTables(lookups);
  }
  absl::Status UpdateShardedTables(absl::Span<const ShardedUpdate> updates, embedding_ps::UpdateId update_id) override {
    for (const ShardedUpdate& u : updates) {  // One table at a time, each held back on its own.
      Delay(u.table, update_id);
      absl::Status s = ps_->UpdateSharded(u.table, u.ids, u.shard_offsets, u.grads, update_id);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<embedding_ps::ShardStats>> Stats() override { return ps_->Stats(); }

 private:
  static void Delay(absl::string_view table, embedding_ps::UpdateId id) {
    const uint64_t h =
        (id.sequence * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(table[0]) * 0xC2B2AE3D27D4EB4Full);
    std::this_thread::sleep_for(std::chrono::milliseconds((h >> 40) % 30));
  }
  std::unique_ptr<embedding_ps::EmbeddingClient> ps_;
};

// logits_i = sum_s (s + 1) * sum(pooled_s[i]) + w * dense_i0: d(sum logits)/d(pooled_s) = s + 1.
struct WeightedSum : DenseModelImpl {
  WeightedSum() { w = register_parameter("w", torch::ones({1})); }
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override {
    torch::Tensor out = dense.select(1, 0) * w;
    for (size_t s = 0; s < pooled.size(); ++s) out = out + static_cast<double>(s + 1) * pooled[s].sum(1);
    return out;
  }
  torch::Tensor w;
};

// With `weighted`, samples 0 and 2 weigh their ids (a libsvm line's values); sample 1 has no
// weights, so its ids weigh 1.
std::vector<Sample> Samples(bool weighted = false) {
  // ids per sample per slot; sample 2 has no id in slot 1, sample 0 repeats id 7 in slot 0.
  const std::vector<std::vector<std::vector<uint64_t>>> ids = {
      {{7, 7, 3}, {1}, {5, 6}, {3}},
      {{3}, {1, 2}, {5}, {9, 7}},
      {{11}, {}, {6, 6, 5}, {7}},
  };
  std::vector<Sample> samples;
  for (const auto& per_slot : ids) {
    Sample s;
    s.Clear(kSlots);
    s.label = 1;
    s.dense = {0.5f};
    for (int k = 0; k < kSlots; ++k) {
      s.ids.insert(s.ids.end(), per_slot[k].begin(), per_slot[k].end());
      s.slot_offsets[k + 1] = static_cast<uint32_t>(s.ids.size());
    }
    if (weighted && samples.size() != 1) {
      for (size_t j = 0; j < s.ids.size(); ++j) s.weights.push_back(0.5f + 0.75f * static_cast<float>(j));
    }
    samples.push_back(s);
  }
  return samples;
}

float Weight(const Sample& sample, uint32_t j) { return sample.weights.empty() ? 1.0f : sample.weights[j]; }

float Scale(Pooling p, size_t count) {
  if (count == 0 || p == Pooling::kSum) return 1.0f;
  return p == Pooling::kMean ? 1.0f / count : 1.0f / std::sqrt(static_cast<float>(count));
}

// Three tables (SGD with learning rate 1: new row = old row - gradient) on two in-process shards,
// and the one batch of Samples().
struct Fixture {
  TrainerOptions options;
  std::unique_ptr<embedding_ps::EmbeddingClient> ps;
  std::vector<Sample> samples;
  Batch batch;

  std::vector<float> Row(int table, uint64_t id) {
    std::vector<float> r(kDims[table]);
    EXPECT_TRUE(ps->Lookup(options.table_names[table], {id}, absl::MakeSpan(r)).ok());
    return r;
  }
};

Fixture MakeFixture(torch::Device device, int staleness, bool weighted = false) {
  Fixture f;
  f.samples = Samples(weighted);
  embedding_ps::StoreOptions store_options;
  for (int t = 0; t < 3; ++t) {
    embedding_ps::TableConfig table;
    table.name = std::string(1, static_cast<char>('a' + t));
    table.dim = kDims[t];
    table.seed = 10 + t;
    table.optimizer.kind = embedding_ps::OptimizerKind::kSgd;
    table.optimizer.learning_rate = 1.0f;
    store_options.tables.push_back(table);
    f.options.table_names.push_back(table.name);
  }
  std::vector<std::shared_ptr<embedding_ps::EmbeddingShardStore>> stores;
  for (int s = 0; s < 2; ++s) stores.push_back(*embedding_ps::EmbeddingShardStore::Create(store_options));
  f.ps = *embedding_ps::NewInProcessEmbeddingClient(stores);
  f.options.slot_tables = kSlotTables;
  f.options.pooling = kPooling;
  f.options.embedding_staleness = staleness;
  f.options.device = device;
  data_loader::BuildBatch(f.samples, f.samples.size(), 1, kSlots, kSlotTables, 3, 2, &f.batch);
  return f;
}

// With WeightedSum and loss = sum of logits, each (table, id)'s gradient in one batch, whatever
// the rows hold: the sum over its occurrences of its pooling scale * (slot + 1).
std::map<std::pair<int, uint64_t>, float> GradientCoefficients(const std::vector<Sample>& samples) {
  std::map<std::pair<int, uint64_t>, float> coefficient;
  for (int s = 0; s < kSlots; ++s) {
    for (const Sample& sample : samples) {
      const uint32_t begin = sample.slot_offsets[s], end = sample.slot_offsets[s + 1];
      const float scale = Scale(kPooling[s], end - begin);
      for (uint32_t j = begin; j < end; ++j) {
        coefficient[{kSlotTables[s], sample.ids[j]}] += scale * Weight(sample, j) * (s + 1);
      }
    }
  }
  return coefficient;
}

void CheckPoolingAndGradients(torch::Device device, bool weighted = false) {
  Fixture f = MakeFixture(device, /*staleness=*/0, weighted);
  if (weighted) {
    ASSERT_EQ(f.batch.slots[0].weights.size(), f.batch.slots[0].ids.size());
  }
  TrainerOptions& options = f.options;
  const std::vector<Sample>& samples = f.samples;
  // Expected pooled values, by hand.
  std::map<std::pair<int, uint64_t>, std::vector<float>> before;
  std::vector<std::vector<std::vector<float>>> expected(kSlots);
  for (int s = 0; s < kSlots; ++s) {
    const int t = kSlotTables[s];
    for (const Sample& sample : samples) {
      const uint32_t begin = sample.slot_offsets[s], end = sample.slot_offsets[s + 1];
      const float scale = Scale(kPooling[s], end - begin);
      std::vector<float> pooled(kDims[t], 0.0f);
      for (uint32_t j = begin; j < end; ++j) {
        const uint64_t id = sample.ids[j];
        if (!before.count({t, id})) before[{t, id}] = f.Row(t, id);
        for (int d = 0; d < kDims[t]; ++d) pooled[d] += scale * Weight(sample, j) * before[{t, id}][d];
      }
      expected[s].push_back(pooled);
    }
  }
  const auto coefficient = GradientCoefficients(samples);

  RepeatedBatch stream(f.batch);
  auto model = std::make_shared<WeightedSum>();
  model->to(device);
  torch::optim::SGD dense_optimizer(model->parameters(), torch::optim::SGDOptions(0.0));
  TrainingContext ctx(options, &stream, f.ps.get(), nullptr, model, &dense_optimizer);
  TrainBatch* tb = nullptr;
  ASSERT_TRUE(ctx.Next(&tb)) << ctx.status();
  EXPECT_EQ(tb->labels.device(), device);
  EXPECT_EQ(tb->rows.size(), 2u);  // Row groups: dim 4 (tables a, c) and dim 3 (table b).
  torch::Tensor logits = ctx.Forward(*tb);
  ASSERT_EQ(tb->row_tensors.size(), 2u);
  std::vector<torch::Tensor> pooled = ctx.Pool(*tb, /*requires_grad=*/false);
  ASSERT_EQ(pooled.size(), static_cast<size_t>(kSlots));
  for (int s = 0; s < kSlots; ++s) {
    torch::Tensor p = pooled[s].to(torch::kCPU);
    ASSERT_EQ(p.size(0), 3);
    ASSERT_EQ(p.size(1), kDims[kSlotTables[s]]);
    for (int i = 0; i < 3; ++i) {
      for (int d = 0; d < p.size(1); ++d) {
        EXPECT_NEAR(p[i][d].item<float>(), expected[s][i][d], 1e-5) << "slot " << s << " sample " << i << " dim " << d;
      }
    }
  }
  ASSERT_TRUE(ctx.Backward(logits.sum()).ok()) << ctx.status();
  ASSERT_TRUE(ctx.Finish().ok());
  EXPECT_FALSE(ctx.Next(&tb));
  // Every row moved by exactly its gradient: the sum over its occurrences of scale * (s + 1).
  for (const auto& [key, old] : before) {
    const std::vector<float> now = f.Row(key.first, key.second);
    for (int d = 0; d < kDims[key.first]; ++d) {
      EXPECT_NEAR(now[d], old[d] - coefficient.at(key), 1e-5) << "table " << key.first << " id " << key.second;
    }
  }
}

TEST(TrainingContext, PoolsAndPushesPerIdGradientsOnCpu) { CheckPoolingAndGradients(torch::kCPU); }

// Weighted ids (libsvm values, weighted CSV columns): each row pools times its weight (and its
// slot's mean or sqrt-n scale), and its gradient is scaled by the same weight.
TEST(TrainingContext, WeightedIdsPoolAndPushGradientsTimesTheirWeights) {
  CheckPoolingAndGradients(torch::kCPU, /*weighted=*/true);
}

TEST(TrainingContext, PoolsAndPushesPerIdGradientsOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  CheckPoolingAndGradients(torch::Device(torch::kCUDA, 0));
}

// Hybrid (staleness 4) with updates that complete out of order across batches and tables: every
// update is applied exactly once (none taken by the PS for a repeat), and lookups run at most 4
// batches of updates behind. The gradients do not depend on the rows (see GradientCoefficients),
// so after N batches each row has moved by exactly N times its one-batch gradient.
TEST(TrainingContext, UpdatesCompletingOutOfOrderAreEachAppliedOnce) {
  constexpr int kBatches = 40;
  Fixture f = MakeFixture(torch::kCPU, /*staleness=*/4);
  f.ps = std::make_unique<SlowUpdates>(std::move(f.ps));
  const auto coefficient = GradientCoefficients(f.samples);
  std::map<std::pair<int, uint64_t>, std::vector<float>> before;
  for (const auto& [key, c] : coefficient) before[key] = f.Row(key.first, key.second);

  RepeatedBatch stream(f.batch, kBatches);
  auto model = std::make_shared<WeightedSum>();
  torch::optim::SGD dense_optimizer(model->parameters(), torch::optim::SGDOptions(0.0));
  TrainingContext ctx(f.options, &stream, f.ps.get(), nullptr, model, &dense_optimizer);
  for (TrainBatch* tb = nullptr; ctx.Next(&tb);) ASSERT_TRUE(ctx.Backward(ctx.Forward(*tb).sum()).ok());
  ASSERT_TRUE(ctx.Finish().ok()) << ctx.status();
  EXPECT_EQ(ctx.stats().batches, static_cast<uint64_t>(kBatches));
  EXPECT_EQ(ctx.stats().update_count, static_cast<uint64_t>(kBatches));
  EXPECT_GT(ctx.stats().observed_staleness, 2.0);  // Slow updates: lookups ran near the bound...
  EXPECT_LE(ctx.stats().observed_staleness, 4.0);  // ...and never past it.
  auto stats = f.ps->Stats();
  ASSERT_TRUE(stats.ok());
  for (const auto& shard : *stats) {
    for (const auto& table : shard.store.tables) EXPECT_EQ(table.duplicate_updates, 0u) << table.name;
  }
  for (const auto& [key, old] : before) {
    const std::vector<float> now = f.Row(key.first, key.second);
    for (int d = 0; d < kDims[key.first]; ++d) {
      EXPECT_NEAR(now[d], old[d] - kBatches * coefficient.at(key), 1e-3)
          << "table " << key.first << " id " << key.second;
    }
  }
}

// A batch that does not fit the trainer's options is an error naming the batch and what is wrong,
// before anything reads out of its bounds: a loader whose slot-to-table map differs from the
// trainer's (the map was once set in two places), an inverse index past the table's unique ids,
// offsets that overrun the ids, missing labels or slots.
TEST(TrainingContext, AMalformedBatchIsAnErrorNamingIt) {
  const auto run = [](const Fixture& f, const Batch& batch) {
    RepeatedBatch stream(batch);
    auto model = std::make_shared<WeightedSum>();
    torch::optim::SGD dense_optimizer(model->parameters(), torch::optim::SGDOptions(0.0));
    TrainingContext ctx(f.options, &stream, f.ps.get(), nullptr, model, &dense_optimizer);
    TrainBatch* tb = nullptr;
    EXPECT_FALSE(ctx.Next(&tb));
    EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument) << ctx.status();
    return std::string(ctx.status().message());
  };
  Fixture f = MakeFixture(torch::kCPU, /*staleness=*/0);
  Batch other_map;  // Slot 3 in table c by the loader, table a by the trainer.
  data_loader::BuildBatch(f.samples, f.samples.size(), 1, kSlots, {0, 1, 2, 2}, 3, 2, &other_map);
  EXPECT_NE(run(f, other_map)
                .find("slot 3 has no inverse map into its table 0 (the loader's slot-to-table map "
                      "differs from the trainer's)"),
            std::string::npos);
  Batch past = f.batch;
  past.tables[1].inverse[1].back() = 1000;
  EXPECT_NE(run(f, past).find("slot 1 refers to unique id 1000 of 2"), std::string::npos) << run(f, past);
  Batch overrun = f.batch;
  overrun.slots[2].offsets[3] = 99;
  EXPECT_NE(run(f, overrun).find("slot 2's offsets do not delimit its 6 ids in 3 samples"), std::string::npos);
  Batch labels = f.batch;
  labels.labels.pop_back();
  EXPECT_NE(run(f, labels).find("2 labels for 3 samples"), std::string::npos);
  Batch slots = f.batch;
  slots.slots.pop_back();
  EXPECT_NE(run(f, slots).find("3 slots, the job has 4"), std::string::npos);
  Batch shards = f.batch;
  shards.tables[0].shard_offsets = {0, 5};
  EXPECT_NE(run(f, shards).find("table 0's ids are not grouped by the 2 PS shards"), std::string::npos);
  Batch empty = f.batch;
  empty.batch_size = 0;
  EXPECT_NE(run(f, empty).find("no samples"), std::string::npos);
}

// A worker restarted with the same worker id against the same PS: its updates are new to the PS,
// not repeats of its previous run's (update sequences start from the clock).
TEST(TrainingContext, ARestartedWorkersUpdatesAreNotTakenForRepeats) {
  Fixture f = MakeFixture(torch::kCPU, /*staleness=*/4);
  const auto coefficient = GradientCoefficients(f.samples);
  std::map<std::pair<int, uint64_t>, std::vector<float>> before;
  for (const auto& [key, c] : coefficient) before[key] = f.Row(key.first, key.second);
  for (int run = 0; run < 2; ++run) {
    absl::SleepFor(absl::Milliseconds(2));  // A restart takes longer than this.
    RepeatedBatch stream(f.batch, 3);
    auto model = std::make_shared<WeightedSum>();
    torch::optim::SGD dense_optimizer(model->parameters(), torch::optim::SGDOptions(0.0));
    TrainingContext ctx(f.options, &stream, f.ps.get(), nullptr, model, &dense_optimizer);
    for (TrainBatch* tb = nullptr; ctx.Next(&tb);) ASSERT_TRUE(ctx.Backward(ctx.Forward(*tb).sum()).ok());
    ASSERT_TRUE(ctx.Finish().ok()) << ctx.status();
  }
  for (const auto& [key, old] : before) {
    const std::vector<float> now = f.Row(key.first, key.second);
    for (int d = 0; d < kDims[key.first]; ++d) {
      EXPECT_NEAR(now[d], old[d] - 6 * coefficient.at(key), 1e-4) << "table " << key.first << " id " << key.second;
    }
  }
}

// A stream that has no batch until release(): as a loader that holds a worker's batches until
// every worker's stream has arrived.
class WithheldBatch : public data_loader::BatchStream {
 public:
  explicit WithheldBatch(Batch batch) : batch_(std::move(batch)) {}
  absl::Status Next(Batch* batch, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&released_), timeout)) {
      ++deadlines_;
      return absl::DeadlineExceededError("no batch");
    }
    if (sent_) return absl::OutOfRangeError("end");
    sent_ = true;
    *batch = batch_;
    return absl::OkStatus();
  }
  data_loader::ReaderPosition Position() const override { return {}; }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  int deadlines() {
    absl::MutexLock lock(&mu_);
    return deadlines_;
  }

 private:
  absl::Mutex mu_;
  Batch batch_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_ ABSL_GUARDED_BY(mu_) = false;
  int deadlines_ ABSL_GUARDED_BY(mu_) = 0;
};

// A worker waiting for a batch that cannot come yet (its peer's replacement must regroup first)
// is asked between slices of the wait whether to give up: it does so without an error and
// without consuming anything, and the batch is there for the next Next. Without abandon_wait the
// wait runs to batch_timeout.
TEST(TrainingContext, AnAbandonedWaitForABatchIsNoErrorAndLosesNothing) {
  Fixture f = MakeFixture(torch::kCPU, /*staleness=*/0);
  f.options.abandon_check_every = absl::Milliseconds(20);
  int asked = 0;
  f.options.abandon_wait = [&asked] { return ++asked == 3; };
  WithheldBatch stream(f.batch);
  auto model = std::make_shared<WeightedSum>();
  torch::optim::SGD dense_optimizer(model->parameters(), torch::optim::SGDOptions(0.0));
  TrainingContext ctx(f.options, &stream, f.ps.get(), nullptr, model, &dense_optimizer);
  TrainBatch* tb = nullptr;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(ctx.Next(&tb));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(ctx.wait_abandoned());
  EXPECT_TRUE(ctx.status().ok()) << ctx.status();
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(stream.deadlines(), 3);
  stream.Release();
  ASSERT_TRUE(ctx.Next(&tb)) << ctx.status();
  EXPECT_FALSE(ctx.wait_abandoned());
  EXPECT_EQ(tb->batch.batch_size, f.batch.batch_size);
  ASSERT_TRUE(ctx.Backward(ctx.Forward(*tb).sum()).ok());
  EXPECT_FALSE(ctx.Next(&tb));  // The end of the data.
  EXPECT_FALSE(ctx.wait_abandoned());
  ASSERT_TRUE(ctx.Finish().ok()) << ctx.status();
  EXPECT_EQ(ctx.stats().batches, 1u);
  // Never abandoned: the wait ends at batch_timeout, and its error says so.
  Fixture h = MakeFixture(torch::kCPU, /*staleness=*/0);
  h.options.abandon_check_every = absl::Milliseconds(20);
  h.options.batch_timeout = absl::Milliseconds(100);
  h.options.abandon_wait = [] { return false; };
  WithheldBatch late(h.batch);
  TrainingContext waited(h.options, &late, h.ps.get(), nullptr, model, &dense_optimizer);
  EXPECT_FALSE(waited.Next(&tb));
  EXPECT_FALSE(waited.wait_abandoned());
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded) << waited.status();
  EXPECT_TRUE(absl::StrContains(waited.status().message(), "no batch within 100ms")) << waited.status();
  EXPECT_GE(late.deadlines(), 4);

  // No abandon_wait: one wait of batch_timeout, then its error.
  Fixture g = MakeFixture(torch::kCPU, /*staleness=*/0);
  g.options.batch_timeout = absl::Milliseconds(200);
  WithheldBatch never(g.batch);
  TrainingContext plain(g.options, &never, g.ps.get(), nullptr, model, &dense_optimizer);
  EXPECT_FALSE(plain.Next(&tb));
  EXPECT_FALSE(plain.wait_abandoned());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kDeadlineExceeded) << plain.status();
  EXPECT_EQ(never.deadlines(), 1);
}

// A product large enough for OpenBLAS to split across its threads, against a double-precision
// loop.
void ExpectProductRight() {
  torch::manual_seed(3);
  const int64_t n = 256;
  torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::Tensor c = torch::mm(a, b);
  auto pa = a.accessor<float, 2>(), pb = b.accessor<float, 2>(), pc = c.accessor<float, 2>();
  for (int64_t i = 0; i < n; i += 37) {
    for (int64_t j = 0; j < n; j += 41) {
      double want = 0;
      for (int64_t k = 0; k < n; ++k) want += static_cast<double>(pa[i][k]) * pb[k][j];
      EXPECT_NEAR(pc[i][j], want, 1e-3) << i << "," << j;
    }
  }
}

TEST(SleepIdleBlasThreads, SetsTheTimeoutOnceKeepsTheUsersAndProductsStayRight) {
  ExpectProductRight();  // The pool exists, spinning by default.
  const char* before = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  const std::string users = before != nullptr ? before : "";
  const bool openblas = dlsym(RTLD_DEFAULT, "openblas_read_env") != nullptr;
  const bool applied = SleepIdleBlasThreads();
  if (before != nullptr) {
    EXPECT_FALSE(applied);
    EXPECT_EQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), users);  // The user's value stands.
  } else {
    EXPECT_EQ(applied, openblas);
    if (openblas) {
      EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "4");
    }
  }
  ExpectProductRight();                        // Through the restarted pool.
  EXPECT_EQ(SleepIdleBlasThreads(), applied);  // Later calls change nothing.
  ExpectProductRight();
}

// Minor page faults of the calling thread so far.
long ThreadPageFaults() {
  rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

TEST(RetainFreedMemory, AFreedBlockIsReusedWithoutPageFaults) {
  const bool users = std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
                     std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr || std::getenv("GLIBC_TUNABLES") != nullptr;
  const bool applied = RetainFreedMemory();
  EXPECT_EQ(RetainFreedMemory(), applied);  // Once per process.
  if (!applied) GTEST_SKIP() << (users ? "the environment sets malloc's thresholds" : "not glibc");
  // 24 MiB: more than any block this test binary freed before, so glibc's own adaptive threshold
  // (which follows the largest block freed so far) would map it afresh each time: with the
  // defaults the second round below faults in all 6,144 pages again.
  constexpr size_t kBytes = 24u << 20;
  constexpr long kPages = kBytes / 4096;
  std::thread([&] {  // A thread of its own: its own malloc arena, as a pipeline thread has.
    long faults[2];
    for (int round = 0; round < 2; ++round) {
      const long before = ThreadPageFaults();
      volatile char* block = static_cast<volatile char*>(std::malloc(kBytes));
      ASSERT_NE(block, nullptr);
      for (size_t i = 0; i < kBytes; i += 4096) block[i] = static_cast<char>(round + 1);
      faults[round] = ThreadPageFaults() - before;
      std::free(const_cast<char*>(block));
    }
    // The first round faults the pages in (kPages of them, or fewer with transparent huge pages):
    // the probe works. The second reuses them.
    EXPECT_GT(faults[0], 0);
    EXPECT_LE(faults[0], kPages + 64);
    EXPECT_LT(faults[1] * 10, faults[0]);
  })
      .join();
}

}  // namespace
}  // namespace hyrec::dense_worker
