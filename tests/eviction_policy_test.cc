// The store's eviction policies (lru, lfu, ttl) against reference implementations that state
// each policy directly: an ordered set of (count, stamp) for lfu, last-use times for ttl. One
// stripe, so the store's per-stripe lists are the whole table's.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "hyrec/common/metrics.h"
#include "hyrec/embedding_ps/embedding_store.h"

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

// LFU as its definition: evict the least count, ties to the least recently used; a use counts
// one (saturating at 65535); after `aging` uses of existing rows per row held, every count is
// halved, rows whose halved counts tie keeping the order they had.
class ReferenceLfu {
 public:
  ReferenceLfu(size_t capacity, uint32_t aging) : capacity_(capacity), aging_(aging) {}

  // Returns the id evicted, or 0 for none.
  uint64_t Use(uint64_t id) {
    auto it = rows_.find(id);
    if (it != rows_.end()) {
      Row& r = it->second;
      order_.erase({r.count, r.stamp, id});
      r.count = std::min<uint32_t>(r.count + 1, 65535);
      r.stamp = ++clock_;
      order_.insert({r.count, r.stamp, id});
      if (++uses_ >= static_cast<uint64_t>(aging_) * std::max<size_t>(1, rows_.size())) Halve();
      return 0;
    }
    uint64_t evicted = 0;
    if (rows_.size() == capacity_) {
      const Key victim = *order_.begin();
      order_.erase(order_.begin());
      evicted = std::get<2>(victim);
      rows_.erase(evicted);
    }
    rows_[id] = Row{1, ++clock_};
    order_.insert({1, clock_, id});
    return evicted;
  }

  std::set<uint64_t> Resident() const {
    std::set<uint64_t> ids;
    for (const auto& [id, r] : rows_) ids.insert(id);
    return ids;
  }

 private:
  using Key = std::tuple<uint32_t, uint64_t, uint64_t>;  // (count, stamp, id)
  struct Row {
    uint32_t count;
    uint64_t stamp;
  };
  void Halve() {
    std::set<Key> halved;
    for (const Key& k : order_) {  // In eviction order: new stamps keep it among ties.
      Row& r = rows_[std::get<2>(k)];
      r.count >>= 1;
      r.stamp = ++clock_;
      halved.insert({r.count, r.stamp, std::get<2>(k)});
    }
    order_ = std::move(halved);
    uses_ = 0;
  }

  size_t capacity_;
  uint32_t aging_;
  uint64_t clock_ = 0;
  uint64_t uses_ = 0;
  absl::flat_hash_map<uint64_t, Row> rows_;
  std::set<Key> order_;
};

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

TEST(EvictionPolicy, LfuMatchesTheReference) {
  for (const uint32_t aging : {1u, 3u, 1000000u}) {
    SCOPED_TRACE(testing::Message() << "aging " << aging);
    auto store = MakeStore(PolicyTable(EvictionPolicy::kLfu, 50, 0, aging));
    ReferenceLfu reference(50, aging);
    std::mt19937_64 rng(aging);
    uint64_t evicted = 0;
    for (int step = 0; step < 20000; ++step) {
      const uint64_t id = DrawId(rng);
      Use(*store, id);
      evicted += reference.Use(id) != 0;
      if (step % 97 == 0) ASSERT_EQ(Resident(*store), reference.Resident()) << "step " << step;
    }
    EXPECT_EQ(Resident(*store), reference.Resident());
    const StoreStats stats = store->Stats();
    EXPECT_EQ(stats.tables[0].evictions, evicted);
    EXPECT_EQ(stats.tables[0].rows, 50u);
    EXPECT_EQ(stats.tables[0].eviction_policy, "lfu");
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
    SCOPED_TRACE(testing::Message() << "capacity " << capacity);
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

// A snapshot restored into a new store continues exactly as the original: the same rows evicted
// by the same later uses.
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
