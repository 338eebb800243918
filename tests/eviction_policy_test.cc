// The store's eviction policies (lru, lfu, ttl) against their definitions: last-use times for
// ttl, the least count for lfu, and exact LRU's hit rate for the per-bucket choice of large
// tables. Small tables (one stripe, a few index buckets) evict exactly by their policy.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/metrics.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "tests/exact_lru.h"

namespace hyrec::embedding_ps {
namespace {

TableConfig PolicyTable(EvictionPolicy policy, uint64_t capacity, uint64_t ttl = 0, uint32_t aging = 16) {
  TableConfig t;
  t.name = "t";
  t.dim = 4;
  t.seed = 7;
  t.optimizer.kind = OptimizerKind::kAdagrad;
  t.capacity_rows = capacity;
  t.eviction.policy = policy;
  t.eviction.ttl_seconds = ttl;
  t.eviction.lfu_aging_touches = aging;
  return t;
}

std::unique_ptr<EmbeddingShardStore> MakeStore(const TableConfig& table, int stripes = 1, bool track = false) {
  StoreOptions options;
  options.tables = {table};
  options.num_stripes = stripes;
  options.track_changes = track;
  auto store = EmbeddingShardStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

// The ids a store holds, from its snapshot.
std::set<uint64_t> Resident(const EmbeddingShardStore& store) {
  const StoreSnapshot snap = store.Snapshot();
  return std::set<uint64_t>(snap.tables[0].ids.begin(), snap.tables[0].ids.end());
}

void Use(EmbeddingShardStore& store, uint64_t id) {
  std::vector<float> out(store.table(0).dim);
  ASSERT_TRUE(store.Lookup(0, {id}, absl::MakeSpan(out), nullptr).ok());
}

// TTL by data time as its definition: a row unused for more than `ttl` seconds of data time
// is gone; within a capacity, the least recently used row is evicted.
class ReferenceTtl {
 public:
  ReferenceTtl(size_t capacity, uint64_t ttl) : capacity_(capacity), ttl_(ttl) {}

  // Data time `now` (never going back), then a use of `id`. Returns the ids expired or evicted.
  std::vector<uint64_t> Use(uint64_t now, uint64_t id) {
    now_ = std::max(now_, now);
    std::vector<uint64_t> gone;
    for (auto it = last_.begin(); it != last_.end();) {
      if (now_ - it->second.time > ttl_) {
        gone.push_back(it->first);
        last_.erase(it++);
      } else {
        ++it;
      }
    }
    auto it = last_.find(id);
    if (it == last_.end() && capacity_ > 0 && last_.size() == capacity_) {
      auto victim = std::min_element(last_.begin(), last_.end(), [](const auto& a, const auto& b) {
        return std::make_pair(a.second.time, a.second.stamp) < std::make_pair(b.second.time, b.second.stamp);
      });
      gone.push_back(victim->first);
      last_.erase(victim);
    }
    last_[id] = Last{now_, ++clock_};
    return gone;
  }

  std::set<uint64_t> Resident() const {
    std::set<uint64_t> ids;
    for (const auto& [id, l] : last_) ids.insert(id);
    return ids;
  }

 private:
  struct Last {
    uint64_t time;
    uint64_t stamp;
  };
  size_t capacity_;
  uint64_t ttl_;
  uint64_t now_ = 0;
  uint64_t clock_ = 0;
  std::map<uint64_t, Last> last_;
};

// Skewed ids: a few hot ones used often, a long tail seen once or twice.
uint64_t DrawId(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double x = u(rng);
  return 1 + static_cast<uint64_t>(std::pow(x, 3.0) * 400);
}

// LFU by its definition, on a table small enough that eviction compares all its rows: a new row
// evicts a row of the least count (ties to any of them), and every count is halved after
// `aging` uses per row held. The snapshot's scores are the counts.
TEST(EvictionPolicy, LfuEvictsARowOfTheLeastCount) {
  for (const uint32_t aging : {1u, 3u, 1000000u}) {
    SCOPED_TRACE(::testing::Message() << "aging " << aging);
    auto store = MakeStore(PolicyTable(EvictionPolicy::kLfu, 50, 0, aging));
    std::mt19937_64 rng(aging);
    uint64_t evictions = 0;
    for (int step = 0; step < 5000; ++step) {
      const uint64_t id = DrawId(rng);
      const StoreSnapshot before = store->Snapshot();
      absl::flat_hash_map<uint64_t, uint64_t> count;
      uint64_t least = UINT64_MAX;
      for (size_t k = 0; k < before.tables[0].ids.size(); ++k) {
        count[before.tables[0].ids[k]] = before.tables[0].scores[k];
        least = std::min(least, before.tables[0].scores[k]);
      }
      Use(*store, id);
      const std::set<uint64_t> after = Resident(*store);
      if (count.contains(id) || count.size() < 50) continue;
      ++evictions;
      for (const auto& [held, c] : count) {
        if (after.count(held) == 0) {
          ASSERT_EQ(c, least) << "step " << step << ": evicted " << held;
        }
      }
    }
    const StoreStats stats = store->Stats();
    EXPECT_EQ(stats.tables[0].evictions, evictions);
    EXPECT_EQ(stats.tables[0].rows, 50u);
    EXPECT_EQ(stats.tables[0].eviction_policy, "lfu");
  }
}

// Per-bucket eviction is not exact LRU; its hit rate at the same capacity is within a point of
// exact LRU's on skewed ids (Zipf 1.05 over a million ids, capacities of 5% and 20% of the ids
// seen), across stripes and large enough tables that every eviction is a bucket's choice.
TEST(EvictionPolicy, LruHitRateIsWithinAPointOfExactLru) {
  const ZipfDistribution zipf(1'000'000, 1.05);
  std::mt19937_64 rng(11);
  std::vector<uint64_t> ids(1'500'000);
  for (uint64_t& id : ids) id = Mix64(zipf(rng));
  absl::flat_hash_set<uint64_t> distinct(ids.begin(), ids.end());
  for (const double share : {0.05, 0.2}) {
    const uint64_t capacity = static_cast<uint64_t>(share * distinct.size());
    SCOPED_TRACE(::testing::Message() << "capacity " << capacity);
    TableConfig config = PolicyTable(EvictionPolicy::kLru, capacity);
    config.dim = 1;
    config.optimizer.kind = OptimizerKind::kSgd;
    auto store = MakeStore(config, 16);
    testing::ExactLru reference(capacity);
    uint64_t exact_hits = 0;
    std::vector<float> out(1024);
    for (size_t begin = 0; begin < ids.size(); begin += 1024) {  // Batches of unique ids, as a worker sends.
      const size_t end = std::min(ids.size(), begin + 1024);
      absl::flat_hash_set<uint64_t> seen;
      std::vector<uint64_t> batch;
      for (size_t k = begin; k < end; ++k) {
        if (seen.insert(ids[k]).second) batch.push_back(ids[k]);
      }
      for (uint64_t id : batch) exact_hits += reference.Use(id) ? 1 : 0;
      out.resize(batch.size());
      ASSERT_TRUE(store->Lookup(0, batch, absl::MakeSpan(out), nullptr).ok());
    }
    const StoreStats stats = store->Stats();
    const uint64_t uses = stats.tables[0].lookups;
    const uint64_t misses = stats.tables[0].rows + stats.tables[0].evictions;  // Rows ever created.
    const double hit_rate = 1.0 - static_cast<double>(misses) / static_cast<double>(uses);
    const double exact = static_cast<double>(exact_hits) / static_cast<double>(uses);
    std::printf("capacity %llu: hit rate %.4f, exact LRU %.4f\n", static_cast<unsigned long long>(capacity), hit_rate,
                exact);
    EXPECT_EQ(stats.tables[0].rows, capacity);
    EXPECT_NEAR(hit_rate, exact, 0.01);
  }
}

TEST(EvictionPolicy, LfuKeepsHotRowsThatLruWouldEvict) {
  // Ten hot ids used ten times each, then a scan of 100 new ids once each through a capacity of
  // 20: LRU ends holding the scan's last 20; LFU keeps the hot ten.
  for (const EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
    auto store = MakeStore(PolicyTable(policy, 20, 0, 1000));
    for (int round = 0; round < 10; ++round) {
      for (uint64_t id = 1; id <= 10; ++id) Use(*store, id);
    }
    for (uint64_t id = 1000; id < 1100; ++id) Use(*store, id);
    const std::set<uint64_t> held = Resident(*store);
    int hot = 0;
    for (uint64_t id = 1; id <= 10; ++id) hot += held.count(id);
    EXPECT_EQ(hot, policy == EvictionPolicy::kLfu ? 10 : 0) << EvictionPolicyName(policy);
  }
}

TEST(EvictionPolicy, TtlMatchesTheReference) {
  // A TTL of 1024 s keeps times to the second; the data time moves by 0-40 s a use, now and then
  // by more than the TTL, and once by more than 64 TTLs.
  for (const uint64_t capacity : {0ull, 60ull}) {
    SCOPED_TRACE(::testing::Message() << "capacity " << capacity);
    auto store = MakeStore(PolicyTable(EvictionPolicy::kTtl, capacity, 1024), 1, /*track=*/true);
    ReferenceTtl reference(capacity, 1024);
    std::mt19937_64 rng(capacity + 1);
    uint64_t now = 1'700'000'000;
    std::set<uint64_t> gone;
    for (int step = 0; step < 20000; ++step) {
      now += rng() % 41;
      if (step % 1500 == 0) now += 1100;
      if (step == 10000) now += 70 * 1024;
      const uint64_t id = DrawId(rng);
      store->AdvanceDataTime(0, now);
      Use(*store, id);
      for (uint64_t g : reference.Use(now, id)) gone.insert(g);
      if (step % 97 == 0) ASSERT_EQ(Resident(*store), reference.Resident()) << "step " << step;
    }
    EXPECT_EQ(Resident(*store), reference.Resident());
    const StoreStats stats = store->Stats();
    EXPECT_GT(stats.tables[0].expirations, 0u);
    EXPECT_EQ(stats.tables[0].data_time, now);
    // Every id that left is a tombstone of the delta (unless it came back since).
    auto delta = store->TakeDelta();
    ASSERT_TRUE(delta.ok());
    std::set<uint64_t> tombstones(delta->tables[0].tombstones.begin(), delta->tables[0].tombstones.end());
    const std::set<uint64_t> held = Resident(*store);
    for (uint64_t g : gone) {
      if (held.count(g) == 0) EXPECT_EQ(tombstones.count(g), 1u) << g;
    }
  }
}

TEST(EvictionPolicy, TtlGoesByDataTimeNotWallTime) {
  auto store = MakeStore(PolicyTable(EvictionPolicy::kTtl, 0, 3600), 4);
  store->AdvanceDataTime(0, 1'000'000);
  for (uint64_t id = 1; id <= 100; ++id) Use(*store, id);
  // Old data replayed: the data time does not go back, nothing expires.
  store->AdvanceDataTime(0, 10);
  Use(*store, 500);
  EXPECT_EQ(store->Stats().tables[0].rows, 101u);
  EXPECT_EQ(store->data_time(0), 1'000'000u);
  // Past the TTL, every row but the one used since is gone (a sweep of all stripes).
  store->AdvanceDataTime(0, 1'000'000 + 3000);
  Use(*store, 7);
  EXPECT_EQ(store->Stats().tables[0].expirations, 0u);
  store->AdvanceDataTime(0, 1'000'000 + 4000);
  EXPECT_EQ(Resident(*store), (std::set<uint64_t>{7}));
  EXPECT_EQ(store->Stats().tables[0].expirations, 100u);
}

// Rows used before a ttl table's first data time (here restored from a checkpoint of an lru
// table, which has no times) count as used at that first time: they are not all expired by it.
TEST(EvictionPolicy, RowsFromBeforeTheFirstDataTimeCountAsUsedThen) {
  auto lru = MakeStore(PolicyTable(EvictionPolicy::kLru, 0), 4);
  for (uint64_t id = 1; id <= 50; ++id) Use(*lru, id);
  const StoreSnapshot snap = lru->Snapshot();
  auto ttl = MakeStore(PolicyTable(EvictionPolicy::kTtl, 0, 3600), 4);
  ASSERT_TRUE(ttl->RestoreRows(0, snap.tables[0].ids, snap.tables[0].values).ok());
  ttl->AdvanceDataTime(0, 1'700'000'000);
  Use(*ttl, 1);
  EXPECT_EQ(ttl->Stats().tables[0].rows, 50u);
  ttl->AdvanceDataTime(0, 1'700'000'000 + 3000);
  Use(*ttl, 2);
  EXPECT_EQ(ttl->Stats().tables[0].rows, 50u);
  ttl->AdvanceDataTime(0, 1'700'000'000 + 6000);  // Only 2 was used within the TTL.
  EXPECT_EQ(Resident(*ttl), (std::set<uint64_t>{2}));
}

// A snapshot restored into a new store keeps each row's score: lru and ttl continue exactly as the
// original (the same rows evicted by the same later uses); lfu rows keep their counts (which of
// several rows of the least count goes first may differ).
TEST(EvictionPolicy, RestoredScoresKeepEvictionOrder) {
  for (const EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kTtl}) {
    SCOPED_TRACE(EvictionPolicyName(policy));
    const TableConfig config = PolicyTable(policy, 40, policy == EvictionPolicy::kTtl ? 2048 : 0, 4);
    auto original = MakeStore(config, 2);
    std::mt19937_64 rng(5);
    uint64_t now = 5'000'000;
    auto step = [&](EmbeddingShardStore& store, uint64_t id, uint64_t time) {
      store.AdvanceDataTime(0, time);
      Use(store, id);
    };
    for (int i = 0; i < 3000; ++i) step(*original, DrawId(rng), now += rng() % 5);
    const StoreSnapshot snap = original->Snapshot();
    auto restored = MakeStore(config, 2);
    restored->AdvanceDataTime(0, snap.tables[0].data_time);
    const size_t floats = snap.tables[0].values.size() / snap.tables[0].ids.size();
    // In two calls, the second first, as a reshard may bring them: the order comes from scores.
    const size_t half = snap.tables[0].ids.size() / 2;
    auto part = [&](size_t begin, size_t end) {
      const auto& t = snap.tables[0];
      return restored->RestoreRows(
          0, absl::MakeConstSpan(t.ids).subspan(begin, end - begin),
          absl::MakeConstSpan(t.values).subspan(begin * floats, (end - begin) * floats),
          t.scores.empty() ? absl::Span<const uint64_t>() : absl::MakeConstSpan(t.scores).subspan(begin, end - begin));
    };
    if (policy == EvictionPolicy::kLru) {
      ASSERT_TRUE(part(0, snap.tables[0].ids.size()).ok());  // LRU order is the restore order.
    } else {
      ASSERT_TRUE(part(half, snap.tables[0].ids.size()).ok());
      ASSERT_TRUE(part(0, half).ok());
    }
    ASSERT_TRUE(restored->RestoreCounters(snap, /*exact=*/true).ok());  // lfu: the aging clock.
    ASSERT_EQ(Resident(*restored), Resident(*original));
    if (policy == EvictionPolicy::kLfu) {
      const StoreSnapshot again = restored->Snapshot();
      std::map<uint64_t, uint64_t> before, after;
      for (size_t k = 0; k < snap.tables[0].ids.size(); ++k) before[snap.tables[0].ids[k]] = snap.tables[0].scores[k];
      for (size_t k = 0; k < again.tables[0].ids.size(); ++k) after[again.tables[0].ids[k]] = again.tables[0].scores[k];
      EXPECT_EQ(after, before);
      continue;
    }
    for (int i = 0; i < 3000; ++i) {
      const uint64_t id = DrawId(rng);
      now += rng() % 5;
      step(*original, id, now);
      step(*restored, id, now);
      if (i % 50 == 0) ASSERT_EQ(Resident(*restored), Resident(*original)) << "use " << i;
    }
  }
}

TEST(EvictionPolicy, EvictionsArePublishedPerPolicy) {
  auto store = MakeStore(PolicyTable(EvictionPolicy::kLfu, 5));
  for (uint64_t id = 1; id <= 8; ++id) Use(*store, id);
  MetricsRegistry metrics;
  PublishStoreMetrics(store->Stats(), {{"shard", "0"}}, &metrics);
  const std::string text = metrics.Render();
  EXPECT_NE(text.find("hyrec_ps_evictions_total{shard=\"0\",table=\"t\",policy=\"lfu\"} 3"), std::string::npos) << text;
}

TEST(EvictionPolicy, OverheadPerRowStaysWithin24Bytes) {
  for (const EvictionPolicy policy : {EvictionPolicy::kLfu, EvictionPolicy::kTtl}) {
    TableConfig config = PolicyTable(policy, 0, policy == EvictionPolicy::kTtl ? 86400 : 0);
    config.dim = 16;
    StoreOptions options;
    options.tables = {config};
    options.capacity_rows = 200000;
    options.num_stripes = 16;
    auto store = EmbeddingShardStore::Create(options);
    ASSERT_TRUE(store.ok());
    std::vector<uint64_t> ids(1000);
    std::vector<float> out(ids.size() * 16);
    for (uint64_t base = 0; base < 300000; base += ids.size()) {
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = (base + i) * 0x9E3779B97F4A7C15ULL;
      (*store)->AdvanceDataTime(0, 1'000'000 + base / 100);
      ASSERT_TRUE((*store)->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
    }
    const StoreStats stats = (*store)->Stats();
    EXPECT_EQ(stats.rows, 200000u);
    std::printf("%s: %.2f bytes per row beyond the floats\n", std::string(EvictionPolicyName(policy)).c_str(),
                stats.OverheadBytesPerRow());
    EXPECT_LE(stats.OverheadBytesPerRow(), 24.0);
  }
}

TEST(EvictionPolicy, BadConfigsNameTheField) {
  TableConfig ttl = PolicyTable(EvictionPolicy::kTtl, 0, 0);
  EXPECT_NE(ttl.Validate().message().find("eviction.ttl_seconds"), std::string::npos) << ttl.Validate();
  TableConfig lru = PolicyTable(EvictionPolicy::kLru, 0, 60);
  EXPECT_NE(lru.Validate().message().find("policy is not ttl"), std::string::npos) << lru.Validate();
  TableConfig lfu = PolicyTable(EvictionPolicy::kLfu, 0, 0, 0);
  EXPECT_NE(lfu.Validate().message().find("lfu_aging_touches"), std::string::npos) << lfu.Validate();
  EXPECT_FALSE(ParseEvictionPolicy("fifo").ok());
}

}  // namespace
}  // namespace hyrec::embedding_ps
