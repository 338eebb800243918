#include "hyrec/embedding_ps/embedding_store.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/hash.h"
#include "hyrec/embedding_ps/client.h"

namespace hyrec::embedding_ps {
namespace {

TableConfig Table(const std::string& name, int dim, OptimizerKind kind = OptimizerKind::kSgd, float lr = 1.0f) {
  TableConfig t;
  t.name = name;
  t.dim = dim;
  t.seed = 42;
  t.optimizer.kind = kind;
  t.optimizer.learning_rate = lr;
  return t;
}

std::unique_ptr<EmbeddingShardStore> MakeStore(std::vector<TableConfig> tables, uint64_t capacity_rows = 0,
                                               int stripes = 8, uint64_t capacity_bytes = 0) {
  StoreOptions options;
  options.tables = std::move(tables);
  options.capacity_rows = capacity_rows;
  options.capacity_bytes = capacity_bytes;
  options.num_stripes = stripes;
  auto store = EmbeddingShardStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

std::vector<float> Row(EmbeddingShardStore& store, int table, uint64_t id) {
  std::vector<float> out(store.table(table).dim);
  EXPECT_TRUE(store.Lookup(table, {id}, absl::MakeSpan(out), nullptr).ok());
  return out;
}

absl::Status Push(EmbeddingShardStore& store, int table, uint64_t id, float g) {
  std::vector<float> grad(store.table(table).dim, g);
  return store.Update(table, {id}, grad, UpdateId{}, nullptr);
}

TEST(EmbeddingShardStore, InitIsDeterministicAcrossShardCounts) {
  TableConfig uniform = Table("u", 8);
  TableConfig normal = Table("n", 5);
  normal.initializer.kind = InitializerKind::kNormal;
  normal.initializer.stddev = 0.5f;
  std::vector<uint64_t> ids;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) ids.push_back(rng());
  std::vector<std::vector<float>> results;
  for (int shards : {1, 3, 7}) {
    std::vector<std::shared_ptr<EmbeddingShardStore>> stores;
    for (int s = 0; s < shards; ++s) stores.push_back(MakeStore({uniform, normal}, 0, 1 + s));
    auto client = NewInProcessEmbeddingClient(stores);
    ASSERT_TRUE(client.ok());
    std::vector<float> u(ids.size() * 8), n(ids.size() * 5);
    ASSERT_TRUE((*client)->Lookup("u", ids, absl::MakeSpan(u)).ok());
    ASSERT_TRUE((*client)->Lookup("n", ids, absl::MakeSpan(n)).ok());
    u.insert(u.end(), n.begin(), n.end());
    results.push_back(u);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  // And equal to the pure function.
  std::vector<float> expected(8);
  InitialRow(uniform, ids[17], expected.data());
  EXPECT_EQ(std::vector<float>(results[0].begin() + 17 * 8, results[0].begin() + 18 * 8), expected);
  // A different seed gives a different row.
  TableConfig reseeded = uniform;
  reseeded.seed = 43;
  std::vector<float> other(8);
  InitialRow(reseeded, ids[17], other.data());
  EXPECT_NE(other, expected);
}

TEST(EmbeddingShardStore, InitializersHaveTheConfiguredDistribution) {
  TableConfig u = Table("u", 64);
  u.initializer.low = -0.5f;
  u.initializer.high = 1.5f;
  TableConfig n = Table("n", 64);
  n.initializer.kind = InitializerKind::kNormal;
  n.initializer.mean = 0.25f;
  n.initializer.stddev = 0.1f;
  double su = 0, sn = 0, sn2 = 0, lo = 1e9, hi = -1e9;
  const int rows = 2000;
  std::vector<float> row(64);
  for (uint64_t id = 0; id < rows; ++id) {
    InitialRow(u, id, row.data());
    for (float v : row) {
      su += v;
      lo = std::min<double>(lo, v);
      hi = std::max<double>(hi, v);
    }
    InitialRow(n, id, row.data());
    for (float v : row) {
      sn += v;
      sn2 += v * v;
    }
  }
  const double count = rows * 64.0;
  EXPECT_NEAR(su / count, 0.5, 0.01);
  EXPECT_GE(lo, -0.5);
  EXPECT_LT(hi, 1.5);
  const double mean = sn / count;
  EXPECT_NEAR(mean, 0.25, 0.002);
  EXPECT_NEAR(std::sqrt(sn2 / count - mean * mean), 0.1, 0.002);
}

TEST(EmbeddingShardStore, EvictsLeastRecentlyUsedWhenFull) {
  TableConfig t = Table("t", 2);
  t.initializer.kind = InitializerKind::kZeros;
  auto store = MakeStore({t}, /*capacity_rows=*/4, /*stripes=*/1);
  // Rows 1..4, each marked by an update so that an evicted row is recognizable (back to zeros).
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(Push(*store, 0, id, -static_cast<float>(id)).ok());
  Row(*store, 0, 1);                           // 1 becomes most recently used; LRU is 2.
  ASSERT_TRUE(Push(*store, 0, 3, 0.0f).ok());  // 3 too; LRU order now 2, 4, 1, 3.
  Row(*store, 0, 5);                           // Evicts 2.
  Row(*store, 0, 6);                           // Evicts 4.
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.rows, 4u);
  EXPECT_EQ(stats.tables[0].evictions, 2u);
  EXPECT_EQ(Row(*store, 0, 1), (std::vector<float>{1, 1}));
  EXPECT_EQ(Row(*store, 0, 3), (std::vector<float>{3, 3}));
  EXPECT_EQ(Row(*store, 0, 2), (std::vector<float>{0, 0}));  // Re-created from init, evicting 5.
  EXPECT_EQ(store->Stats().tables[0].evictions, 3u);
  EXPECT_EQ(Row(*store, 0, 6), (std::vector<float>{0, 0}));
  EXPECT_EQ(Row(*store, 0, 1), (std::vector<float>{1, 1}));  // Still there.
  EXPECT_EQ(store->Stats().rows, 4u);
}

TEST(EmbeddingShardStore, CapacityBoundsRowsAcrossStripesAndTables) {
  auto store = MakeStore({Table("a", 4), Table("b", 16, OptimizerKind::kAdagrad)}, 1000, 16);
  std::vector<float> out4(4), out16(16);
  for (uint64_t id = 0; id < 20000; ++id) {
    ASSERT_TRUE(store->Lookup(id % 2, {id}, absl::MakeSpan(id % 2 ? out16 : out4), nullptr).ok());
    ASSERT_LE(store->Stats().rows, 1000u);
  }
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.rows, 1000u);
  EXPECT_EQ(stats.tables[0].evictions + stats.tables[1].evictions, 19000u);
}

TEST(EmbeddingShardStore, ATableCapacityEvictsOnlyThatTablesRows) {
  TableConfig bounded = Table("bounded", 2);
  bounded.capacity_rows = 3;
  bounded.initializer.kind = InitializerKind::kZeros;
  auto store = MakeStore({bounded, Table("free", 2)}, /*capacity_rows=*/0, /*stripes=*/1);
  for (uint64_t id = 1; id <= 50; ++id) Row(*store, 1, id);  // The unbounded table's rows stay.
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(Push(*store, 0, id, -static_cast<float>(id)).ok());
  Row(*store, 0, 1);  // LRU order of the bounded table: 2, 3, 1.
  Row(*store, 0, 4);  // Evicts 2, its own least recently used.
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.tables[0].rows, 3u);
  EXPECT_EQ(stats.tables[0].evictions, 1u);
  EXPECT_EQ(stats.tables[0].capacity_rows, 3u);
  EXPECT_EQ(stats.tables[1].rows, 50u);
  EXPECT_EQ(stats.tables[1].evictions, 0u);
  EXPECT_EQ(Row(*store, 0, 1), (std::vector<float>{1, 1}));
  EXPECT_EQ(Row(*store, 0, 3), (std::vector<float>{3, 3}));
  EXPECT_EQ(Row(*store, 0, 2), (std::vector<float>{0, 0}));  // Re-created from init.
}

TEST(EmbeddingShardStore, AFullStoreEvictsTheNewRowsOwnTableFirst) {
  TableConfig a = Table("a", 2), b = Table("b", 2);
  a.initializer.kind = b.initializer.kind = InitializerKind::kZeros;
  auto store = MakeStore({a, b}, /*capacity_rows=*/4, /*stripes=*/1);
  ASSERT_TRUE(Push(*store, 1, 100, -1.0f).ok());  // b's one row, the oldest of the store.
  for (uint64_t id = 1; id <= 3; ++id) Row(*store, 0, id);
  Row(*store, 0, 4);  // Full: a evicts its own LRU row (1), not b's.
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.rows, 4u);
  EXPECT_EQ(stats.tables[0].evictions, 1u);
  EXPECT_EQ(stats.tables[1].evictions, 0u);
  EXPECT_EQ(Row(*store, 1, 100), (std::vector<float>{1, 1}));
  // A table without a row in the stripe takes one from the stripe's largest table.
  auto empty_b = MakeStore({a, b}, /*capacity_rows=*/2, /*stripes=*/1);
  Row(*empty_b, 0, 1);
  Row(*empty_b, 0, 2);
  Row(*empty_b, 1, 7);
  EXPECT_EQ(empty_b->Stats().rows, 2u);
  EXPECT_EQ(empty_b->Stats().tables[0].evictions, 1u);
}

TEST(EmbeddingShardStore, CapacityBytesBoundsMemory) {
  TableConfig t = Table("t", 32, OptimizerKind::kAdagrad);  // 8 + 4 * 64 = 264 bytes a slot.
  auto store = MakeStore({t}, 0, 4, /*capacity_bytes=*/280 * 500);
  std::vector<float> out(32);
  for (uint64_t id = 0; id < 5000; ++id) ASSERT_TRUE(store->Lookup(0, {id}, absl::MakeSpan(out), nullptr).ok());
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.rows, 280u * 500 / (264 + 8));  // Each row is charged its slot and 8 bytes of index.
  EXPECT_EQ(stats.tables[0].row_bytes, 264u);
}

TEST(EmbeddingShardStore, OverheadPerRowAtFullCapacityIsAtMost20Bytes) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdagradRowwise}) {
    for (int dim : {16, 64}) {
      auto store = MakeStore({Table("t", dim, kind)}, 200000, 16);
      std::vector<uint64_t> ids(1000);
      std::vector<float> out(ids.size() * dim);
      for (uint64_t base = 0; base < 300000; base += ids.size()) {
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = (base + i) * 0x9E3779B97F4A7C15ULL;
        ASSERT_TRUE(store->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
      }
      StoreStats stats = store->Stats();
      EXPECT_EQ(stats.rows, 200000u);
      const double overhead = stats.OverheadBytesPerRow();
      std::printf("optimizer %s dim %d: %.2f bytes per row beyond the floats\n",
                  std::string(OptimizerName(kind)).c_str(), dim, overhead);
      EXPECT_LE(overhead, 20.0);
      EXPECT_GE(overhead, 8.0);  // At least the id.
    }
  }
}

// The planner's memory of a store (PlanStoreMemory) is what the store's accounting reports once
// it holds those rows, within 2%: unbounded and bounded stores, several tables of other dims and
// optimizers, an admission sketch, from a few rows to hundreds of thousands.
TEST(EmbeddingShardStore, PlannedMemoryIsWhatTheStoreReports) {
  struct Case {
    std::vector<TableConfig> tables;
    uint64_t capacity_rows;
    int stripes;
    std::vector<uint64_t> rows;
  };
  TableConfig admitted = Table("a", 8, OptimizerKind::kAdagrad);
  admitted.admission.min_count = 2;
  const std::vector<Case> cases = {
      {{Table("t", 16)}, 0, 8, {300000}},
      {{Table("t", 64, OptimizerKind::kAdagrad)}, 0, 64, {50000}},
      {{Table("u", 8, OptimizerKind::kAdagrad), Table("v", 32, OptimizerKind::kAdam), Table("w", 64)},
       400000,
       16,
       {200000, 120000, 80000}},
      {{admitted, Table("b", 16)}, 0, 4, {30000, 500}},
  };
  for (const Case& c : cases) {
    StoreOptions options;
    options.tables = c.tables;
    options.capacity_rows = c.capacity_rows;
    options.num_stripes = c.stripes;
    auto store = *EmbeddingShardStore::Create(options);
    for (size_t t = 0; t < c.tables.size(); ++t) {
      const size_t floats = c.tables[t].dim + OptimizerStateFloats(c.tables[t].optimizer.kind, c.tables[t].dim);
      std::vector<uint64_t> ids;
      for (uint64_t i = 0; i < c.rows[t]; ++i) ids.push_back(Mix64(i * 7919 + t + 1));
      ASSERT_TRUE(store->RestoreRows(static_cast<int>(t), ids, std::vector<float>(ids.size() * floats, 0.1f)).ok());
    }
    const StoreStats stats = store->Stats();
    const StoreMemoryPlan plan = PlanStoreMemory(options, c.rows);
    SCOPED_TRACE(absl::StrCat(c.tables.size(), " tables, ", stats.rows, " rows"));
    ASSERT_EQ(stats.rows, plan.rows);
    EXPECT_EQ(stats.payload_bytes, plan.payload_bytes);
    EXPECT_NEAR(static_cast<double>(plan.bytes), static_cast<double>(stats.bytes), 0.02 * stats.bytes);
    for (size_t t = 0; t < c.tables.size(); ++t) {
      EXPECT_EQ(plan.tables[t].slot_bytes, stats.tables[t].row_bytes);
      EXPECT_NEAR(static_cast<double>(plan.tables[t].slab_bytes), static_cast<double>(stats.tables[t].bytes),
                  0.02 * stats.tables[t].bytes + (uint64_t{plan.tables[t].slot_bytes} << 4) * c.stripes);
    }
  }
}

TEST(EmbeddingShardStore, AdmitsAfterMinCount) {
  TableConfig t = Table("t", 3);
  t.admission.min_count = 3;
  auto store = MakeStore({t});
  std::vector<float> out(3);
  LookupResult r;
  ASSERT_TRUE(store->Lookup(0, {7}, absl::MakeSpan(out), &r).ok());
  EXPECT_EQ(r.not_admitted, 1u);
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0}));
  UpdateResult u;
  ASSERT_TRUE(store->Update(0, {7}, std::vector<float>{1, 1, 1}, UpdateId{}, &u).ok());
  EXPECT_EQ(u.dropped, 1u);
  ASSERT_TRUE(store->Lookup(0, {7}, absl::MakeSpan(out), &r).ok());
  EXPECT_EQ(r.not_admitted, 1u);
  ASSERT_TRUE(store->Lookup(0, {7}, absl::MakeSpan(out), &r).ok());  // Third sighting.
  EXPECT_EQ(r.not_admitted, 0u);
  std::vector<float> init(3);
  InitialRow(t, 7, init.data());
  EXPECT_EQ(out, init);  // The dropped update left no trace.
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.tables[0].admission_rejections, 2u);
  EXPECT_EQ(stats.tables[0].dropped_updates, 1u);
  EXPECT_EQ(stats.rows, 1u);
}

TEST(EmbeddingShardStore, AdmitsWithProbability) {
  TableConfig t = Table("t", 1);
  t.admission.probability = 0.25;
  auto store = MakeStore({t});
  const int n = 20000;
  std::vector<uint64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  std::vector<float> out(n);
  LookupResult r;
  ASSERT_TRUE(store->Lookup(0, ids, absl::MakeSpan(out), &r).ok());
  EXPECT_NEAR(static_cast<double>(n - r.not_admitted) / n, 0.25, 0.015);
  EXPECT_EQ(store->Stats().rows, n - r.not_admitted);
}

TEST(EmbeddingShardStore, NonFiniteGradientIsRejectedAndNothingWritten) {
  auto store = MakeStore({Table("t", 2)});
  const std::vector<float> before1 = Row(*store, 0, 1), before2 = Row(*store, 0, 2);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    absl::Status s = store->Update(0, {1, 2}, std::vector<float>{1, 1, 1, bad}, UpdateId{3, 1}, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("id 2"), std::string::npos) << s;
  }
  EXPECT_EQ(Row(*store, 0, 1), before1);
  EXPECT_EQ(Row(*store, 0, 2), before2);
  EXPECT_EQ(store->Stats().tables[0].rejected_nonfinite, 2u);
  // The refused sequence number was not consumed: a good update with it applies.
  UpdateResult u;
  ASSERT_TRUE(store->Update(0, {1, 2}, std::vector<float>{1, 1, 1, 1}, UpdateId{3, 1}, &u).ok());
  EXPECT_FALSE(u.duplicate);
  EXPECT_EQ(u.applied, 2u);
}

TEST(EmbeddingShardStore, BadArgumentsAreErrors) {
  auto store = MakeStore({Table("t", 2)});
  std::vector<float> out(3);
  EXPECT_EQ(store->Lookup(0, {1, 2}, absl::MakeSpan(out), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Lookup(1, {1}, absl::MakeSpan(out).subspan(0, 2), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Update(0, {1}, std::vector<float>{1}, UpdateId{}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->TableIndex("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().rows, 0u);
}

TEST(EmbeddingShardStore, RepeatedUpdateIdAppliesOnce) {
  TableConfig t = Table("t", 1);
  t.initializer.kind = InitializerKind::kZeros;
  auto store = MakeStore({t});
  UpdateResult r;
  for (int repeat = 0; repeat < 3; ++repeat) {
    ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 5}, &r).ok());
    EXPECT_EQ(r.duplicate, repeat > 0);
  }
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{2, 5}, &r).ok());  // Other worker.
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 4}, &r).ok());  // Older, new.
  EXPECT_FALSE(r.duplicate);
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 0}, &r).ok());  // No identity.
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 0}, &r).ok());
  EXPECT_EQ(Row(*store, 0, 9), (std::vector<float>{-5}));
  EXPECT_EQ(store->Stats().tables[0].duplicate_updates, 2u);
}

// A worker sends every table of a batch the batch's sequence, and its updates race: the window is
// per (worker, table), and a late update within it applies however far the others ran ahead.
TEST(EmbeddingShardStore, UpdateIdsArePerTableAndMayArriveOutOfOrder) {
  TableConfig a = Table("a", 1), b = Table("b", 1);
  a.initializer.kind = b.initializer.kind = InitializerKind::kZeros;
  auto store = MakeStore({a, b});
  UpdateResult r;
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 7}, &r).ok());
  ASSERT_TRUE(store->Update(1, {9}, std::vector<float>{1}, UpdateId{1, 7}, &r).ok());  // Same batch.
  EXPECT_FALSE(r.duplicate);
  // Table a runs 1000 batches ahead of table b's batch 8, which still applies once.
  for (uint64_t seq = 9; seq <= 1008; ++seq) {
    ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, seq}, &r).ok());
  }
  ASSERT_TRUE(store->Update(1, {9}, std::vector<float>{1}, UpdateId{1, 1008}, &r).ok());
  ASSERT_TRUE(store->Update(1, {9}, std::vector<float>{1}, UpdateId{1, 8}, &r).ok());
  EXPECT_FALSE(r.duplicate);
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 8}, &r).ok());  // Late, in the window.
  EXPECT_FALSE(r.duplicate);
  ASSERT_TRUE(store->Update(0, {9}, std::vector<float>{1}, UpdateId{1, 8}, &r).ok());  // Now a repeat.
  EXPECT_TRUE(r.duplicate);
  EXPECT_EQ(Row(*store, 0, 9), (std::vector<float>{-1002}));
  EXPECT_EQ(Row(*store, 1, 9), (std::vector<float>{-3}));
  // Too far behind to tell whether it was applied: refused, named, nothing written.
  ASSERT_TRUE(store->Update(1, {9}, std::vector<float>{1}, UpdateId{1, 1100}, &r).ok());
  absl::Status old = store->Update(1, {9}, std::vector<float>{1}, UpdateId{1, 1100 - 1024}, &r);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;
  EXPECT_NE(old.message().find("table 'b': update sequence 76 of worker 1 is 1024 or more below its newest (1100)"),
            std::string::npos)
      << old;
  EXPECT_EQ(Row(*store, 1, 9), (std::vector<float>{-4}));
  EXPECT_EQ(store->Stats().tables[0].duplicate_updates, 1u);
  EXPECT_EQ(store->Stats().tables[1].duplicate_updates, 0u);
}

// Many threads mixing lookups and SGD updates of small integers: SGD with lr 1 adds, so the final
// rows must equal a sequential replay exactly, whatever the interleaving.
TEST(EmbeddingShardStore, ConcurrentHammerMatchesSequentialReplay) {
  TableConfig t = Table("t", 4);
  t.initializer.kind = InitializerKind::kZeros;
  auto store = MakeStore({t}, 0, 8);
  const int threads = 8, ops = 4000, keys = 300;
  std::vector<std::vector<std::pair<uint64_t, int>>> plan(threads);
  for (int th = 0; th < threads; ++th) {
    std::mt19937 rng(th);
    for (int i = 0; i < ops; ++i) plan[th].push_back({rng() % keys, static_cast<int>(rng() % 7) - 3});
  }
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (int th = 0; th < threads; ++th) {
    pool.emplace_back([&, th] {
      std::vector<float> row(4), grad(4);
      for (const auto& [id, g] : plan[th]) {
        if (g == 0) {
          if (!store->Lookup(0, {id}, absl::MakeSpan(row), nullptr).ok()) ++errors;
        } else {
          std::fill(grad.begin(), grad.end(), static_cast<float>(g));
          if (!store->Update(0, {id, id + keys}, std::vector<float>(8, static_cast<float>(g)), UpdateId{}, nullptr)
                   .ok())
            ++errors;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(errors.load(), 0);
  absl::flat_hash_map<uint64_t, float> expected;
  for (const auto& p : plan)
    for (const auto& [id, g] : p) {
      if (g == 0) continue;
      expected[id] -= g;
      expected[id + keys] -= g;
    }
  for (const auto& [id, value] : expected) {
    ASSERT_EQ(Row(*store, 0, id), std::vector<float>(4, value)) << "id " << id;
  }
  StoreStats stats = store->Stats();
  uint64_t updates = 0;
  for (const auto& p : plan)
    for (const auto& [id, g] : p) updates += g != 0 ? 2 : 0;
  EXPECT_EQ(stats.tables[0].updates, updates);
}

// The same hammer with a small capacity exercises eviction under contention: the bound holds and
// the structure stays consistent (every surviving row is found and reads back whole).
TEST(EmbeddingShardStore, ConcurrentHammerWithEvictionKeepsTheBound) {
  auto store = MakeStore({Table("a", 4), Table("b", 8, OptimizerKind::kAdam, 0.01f)}, 500, 4);
  std::vector<std::thread> pool;
  std::atomic<int> errors{0};
  for (int th = 0; th < 4; ++th) {
    pool.emplace_back([&, th] {
      std::mt19937 rng(100 + th);
      std::vector<float> row(8);
      for (int i = 0; i < 20000; ++i) {
        const int table = rng() % 2;
        const int dim = table ? 8 : 4;
        const uint64_t id = rng() % 3000;
        absl::Status s = (rng() % 2) ? store->Lookup(table, {id}, absl::MakeSpan(row).subspan(0, dim), nullptr)
                                     : store->Update(table, {id}, std::vector<float>(dim, 0.5f), UpdateId{}, nullptr);
        if (!s.ok()) ++errors;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(errors.load(), 0);
  StoreStats stats = store->Stats();
  EXPECT_LE(stats.rows, 500u);
  EXPECT_GT(stats.tables[0].evictions + stats.tables[1].evictions, 0u);
}

TEST(EmbeddingShardStore, CreateRejectsBadOptions) {
  StoreOptions o;
  // No table is a store that serves nothing (a job without sparse features); a lookup names it.
  auto empty = EmbeddingShardStore::Create(o);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->TableIndex("t").status().code(), absl::StatusCode::kNotFound);
  o.tables = {Table("t", 4), Table("t", 8)};
  EXPECT_NE(EmbeddingShardStore::Create(o).status().message().find("twice"), std::string::npos);
  o.tables = {Table("t", 0)};
  EXPECT_NE(EmbeddingShardStore::Create(o).status().message().find("dim"), std::string::npos);
  o.tables = {Table("t", 4)};
  o.num_stripes = 1;
  o.capacity_rows = 1ull << 30;
  EXPECT_NE(EmbeddingShardStore::Create(o).status().message().find("raise num_stripes"), std::string::npos);
}

TEST(EmbeddingShardStore, RepeatedIdsInOneUpdateGetOneStepOfTheirSummedGradient) {
  // Adagrad's step depends on the gradient non-linearly: two steps of g differ from one of 2g.
  auto summed = MakeStore({Table("t", 2, OptimizerKind::kAdagrad)});
  auto repeated = MakeStore({Table("t", 2, OptimizerKind::kAdagrad)});
  ASSERT_TRUE(summed->Update(0, {5, 9}, std::vector<float>{0.75f, -0.25f, 1, 1}, UpdateId{}, nullptr).ok());
  UpdateResult r;
  ASSERT_TRUE(
      repeated->Update(0, {5, 9, 5}, std::vector<float>{0.5f, -0.125f, 1, 1, 0.25f, -0.125f}, UpdateId{}, &r).ok());
  EXPECT_EQ(r.applied, 2u);
  EXPECT_EQ(Row(*repeated, 0, 5), Row(*summed, 0, 5));
  EXPECT_EQ(Row(*repeated, 0, 9), Row(*summed, 0, 9));
}

TEST(EmbeddingShardStore, AStepThatWouldMakeARowNonFiniteLeavesItUnchanged) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kAdagradRowwise, OptimizerKind::kAdamRowwise}) {
    auto store = MakeStore({Table("t", 2, kind, 1.0f)});
    // Finite gradients whose step overflows: g^2 at once for the Adagrad and Adam kinds (in
    // the accumulator, where the row-wise kinds leave the weights finite); for SGD the second of
    // two steps (w = -3e38, then -6e38).
    std::vector<float> before;
    UpdateResult r;
    for (int step = 0; step < 2 && r.nonfinite == 0; ++step) {
      before = Row(*store, 0, 1);
      ASSERT_TRUE(store->Update(0, {1}, std::vector<float>{3e38f, 3e38f}, UpdateId{}, &r).ok());
    }
    EXPECT_EQ(r.nonfinite, 1u) << static_cast<int>(kind);
    EXPECT_EQ(r.applied, 0u);
    EXPECT_EQ(Row(*store, 0, 1), before) << static_cast<int>(kind);
    EXPECT_EQ(store->Stats().tables[0].nonfinite_results, 1u);
    // The row still trains (SGD's weights are near -3e38: a step must be large to show).
    const float g = kind == OptimizerKind::kSgd ? -1e38f : -0.5f;
    ASSERT_TRUE(store->Update(0, {1}, std::vector<float>{g, g}, UpdateId{}, &r).ok());
    EXPECT_EQ(r.applied, 1u);
    EXPECT_NE(Row(*store, 0, 1), before);
  }
}

TEST(EmbeddingShardStore, ACapacityThisMachineCannotHoldIsAnErrorNotAnAbort) {
  StoreOptions o;
  o.tables = {Table("t", 4)};
  o.capacity_bytes = 1'000'000'000'000'000ull;
  auto store = EmbeddingShardStore::Create(o);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("memory"), std::string::npos) << store.status();
  o.capacity_bytes = 0;
  o.num_stripes = 65536;
  o.capacity_rows = 1ull << 40;
  store = EmbeddingShardStore::Create(o);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
}

}  // namespace
}  // namespace hyrec::embedding_ps
