// The store's parts on their own: the row arena and slabs, the eviction scores, the count-min
// sketch and the deduplication windows (the index has row_index_test.cc; the whole store
// embedding_store_test.cc and eviction_policy_test.cc).
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "src/embedding_ps/count_min_sketch.h"
#include "src/embedding_ps/row_scores.h"
#include "src/embedding_ps/sequence_window.h"
#include "src/embedding_ps/slab.h"

namespace hyrec::embedding_ps {
namespace {

// Slots hold their ids and floats apart from each other, freed slots are reused before new ones,
// and a slab stops at its bound.
TEST(Slab, SlotsKeepTheirRowsAndAreReused) {
  RowArena arena(64 << 20);
  Slab a(/*slot_bytes=*/8 + 4 * 3, /*chunk_shift=*/4, /*max_slots=*/100);
  Slab b(8 + 4 * 5, 4, 1000);
  absl::flat_hash_map<uint64_t, SlotHandle> held;
  for (uint64_t id = 1; id <= 100; ++id) {
    const SlotHandle slot = a.Allocate(arena, id);
    ASSERT_NE(slot, kNoSlot);
    for (int j = 0; j < 3; ++j) Slab::floats(arena.base(), slot)[j] = static_cast<float>(id * 10 + j);
    held[id] = slot;
    ASSERT_NE(b.Allocate(arena, id + 1000), kNoSlot);  // Another slab's chunks in between.
  }
  EXPECT_EQ(a.Allocate(arena, 101), kNoSlot);  // At max_slots.
  for (const auto& [id, slot] : held) {
    ASSERT_EQ(Slab::id(arena.base(), slot), id);
    for (int j = 0; j < 3; ++j) ASSERT_EQ(Slab::floats(arena.base(), slot)[j], static_cast<float>(id * 10 + j));
  }
  std::set<SlotHandle> freed;
  for (uint64_t id = 1; id <= 10; ++id) {
    a.Free(arena.base(), held[id]);
    freed.insert(held[id]);
  }
  for (uint64_t id = 201; id <= 210; ++id) {
    const SlotHandle slot = a.Allocate(arena, id);
    ASSERT_EQ(freed.count(slot), 1u) << "a freed slot comes back first";
    EXPECT_EQ(Slab::id(arena.base(), slot), id);
  }
  EXPECT_EQ(a.Allocate(arena, 211), kNoSlot);
  EXPECT_EQ(a.bytes(), 7u * 16 * (8 + 4 * 3));  // 100 slots in chunks of 16.
}

TEST(RowArena, RefusesPastItsReservation) {
  RowArena arena(2 << 20);  // One huge page.
  EXPECT_EQ(arena.Allocate(1 << 20), 0u);
  EXPECT_EQ(arena.Allocate(1 << 20), (1u << 20) / RowArena::kUnit);
  EXPECT_EQ(arena.Allocate(4), kNoSlot);
  EXPECT_EQ(arena.allocated_bytes(), 2u << 20);
  Slab slab(16, 4, 100);
  EXPECT_EQ(slab.Allocate(arena, 1), kNoSlot);  // No room for a chunk: an error, not a crash.
}

// lru: the clock ticks once every max(1, rows / 4096) uses and ranks rows by age; past 16,384
// ticks it asks for the ages to be clamped, after which no rank exceeds 32,768.
TEST(RowScores, LruRanksByAgeAndAsksForClamping) {
  RowScores scores(EvictionPolicy::kLru, 0, 0);
  RowScores::Upkeep upkeep = RowScores::Upkeep::kNone;
  const uint16_t first = scores.New(10, 0, &upkeep);
  uint16_t last = first;
  for (int i = 0; i < 100; ++i) last = scores.Use(last, 10, 0, &upkeep);
  EXPECT_EQ(scores.Rank(last, 0), 0u);
  EXPECT_EQ(scores.Rank(first, 0), 100u);
  // With 8,192 rows the clock ticks every second use.
  RowScores big(EvictionPolicy::kLru, 0, 0);
  uint16_t s = big.New(8192, 0, &upkeep);
  for (int i = 0; i < 10; ++i) s = big.Use(s, 8192, 0, &upkeep);
  EXPECT_EQ(big.Rank(0, 0), 5u);
  int clamps = 0;
  for (int i = 0; i < 70000; ++i) {
    upkeep = RowScores::Upkeep::kNone;
    (void)scores.Use(0, 10, 0, &upkeep);
    if (upkeep == RowScores::Upkeep::kClampAges) {
      ++clamps;
      EXPECT_LE(scores.Rank(scores.ClampedAge(first), 0), RowScores::kLruMaxAge);
    }
  }
  EXPECT_EQ(clamps, 4);  // Ticks 16,384, 32,768, 49,152 and 65,536.
}

// lfu: counts from 1, saturating; a lower count ranks higher; aging asks for halving after
// `aging` uses per row.
TEST(RowScores, LfuCountsAndAges) {
  RowScores scores(EvictionPolicy::kLfu, /*lfu_aging=*/3, 0);
  RowScores::Upkeep upkeep = RowScores::Upkeep::kNone;
  uint16_t count = scores.New(4, 0, &upkeep);
  EXPECT_EQ(count, 1);
  int halvings = 0;
  for (int i = 0; i < 24; ++i) {
    upkeep = RowScores::Upkeep::kNone;
    count = scores.Use(count, 4, 0, &upkeep);
    halvings += upkeep == RowScores::Upkeep::kHalve;
  }
  EXPECT_EQ(count, 25);
  EXPECT_EQ(halvings, 2);  // Every 3 x 4 uses.
  EXPECT_GT(scores.Rank(1, 0), scores.Rank(25, 0));
  EXPECT_EQ(scores.Use(UINT16_MAX, 4, 0, &upkeep), UINT16_MAX);
  EXPECT_EQ(RowScores::Halved(25), 12);
}

// ttl: scores are data-time granules; rows older than the TTL are expired, across the 16-bit wrap;
// the oldest-score bound says when a sweep may find one.
TEST(RowScores, TtlExpiresByAgeAcrossTheWrap) {
  RowScores scores(EvictionPolicy::kTtl, 0, /*ttl_granules=*/100);
  RowScores::Upkeep upkeep = RowScores::Upkeep::kNone;
  const uint16_t now = 65500;
  EXPECT_EQ(scores.New(1, now, &upkeep), now);
  EXPECT_FALSE(scores.Expired(now, static_cast<uint16_t>(now + 100)));
  EXPECT_TRUE(scores.Expired(now, static_cast<uint16_t>(now + 101)));  // Wraps past 65535.
  EXPECT_FALSE(scores.MayHaveExpired(now));
  scores.Note(now, now);
  scores.Note(static_cast<uint16_t>(now + 50), static_cast<uint16_t>(now + 50));  // Newer: the bound stays.
  EXPECT_FALSE(scores.MayHaveExpired(static_cast<uint16_t>(now + 100)));
  EXPECT_TRUE(scores.MayHaveExpired(static_cast<uint16_t>(now + 101)));
  scores.Swept(false, 0);
  EXPECT_FALSE(scores.MayHaveExpired(static_cast<uint16_t>(now + 500)));
  RowScores lru(EvictionPolicy::kLru, 0, 0);
  EXPECT_FALSE(lru.Expired(0, 60000));
}

// Counts never fall below the sightings (before aging), saturate at 255, and age by halving.
TEST(CountMinSketch, OverestimatesNeverUnderAndAges) {
  CountMinSketch sketch(1024);
  std::mt19937_64 rng(3);
  absl::flat_hash_map<uint64_t, uint32_t> truth;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t key = rng() % 300;
    const uint32_t estimate = sketch.Increment(key);
    ASSERT_GE(estimate, std::min<uint32_t>(255, ++truth[key]));
  }
  CountMinSketch small(64);
  for (int i = 0; i < 639; ++i) (void)small.Increment(7);
  EXPECT_EQ(small.Increment(7), 255u);  // Saturated; and the 640th increment (10 x 64) halves.
  EXPECT_EQ(small.Increment(7), 128u);
  EXPECT_FALSE(CountMinSketch(0).used());
}

TEST(SequenceWindow, NewRepeatAndTooOld) {
  SequenceWindow w;
  EXPECT_EQ(w.Mark(5), SequenceWindow::kNew);
  EXPECT_EQ(w.Mark(5), SequenceWindow::kRepeat);
  EXPECT_EQ(w.Mark(3), SequenceWindow::kNew);  // Out of order, within the window.
  EXPECT_EQ(w.Peek(3), SequenceWindow::kRepeat);
  EXPECT_EQ(w.Mark(5 + kDedupWindow), SequenceWindow::kNew);
  EXPECT_EQ(w.Mark(5), SequenceWindow::kTooOld);
  EXPECT_EQ(w.Peek(6), SequenceWindow::kNew);
  EXPECT_EQ(w.applied(), 3u);
  SequenceWindow copy;
  copy.Merge(w.highest(), w.Words(), w.applied());
  EXPECT_EQ(copy.Peek(5 + kDedupWindow), SequenceWindow::kRepeat);
  EXPECT_EQ(copy.Peek(6), SequenceWindow::kNew);
  EXPECT_EQ(copy.applied(), 3u);
}

// One window per (worker, table); one worker past kMaxDedupWorkers is refused the same way
// whether it comes with an update or a restore.
TEST(DedupWindows, BoundsTheWorkers) {
  DedupWindows windows(2);
  for (uint32_t worker = 0; worker < kMaxDedupWorkers; ++worker) ASSERT_TRUE(windows.Window(worker, 1).ok());
  absl::Status refusal;
  EXPECT_EQ(windows.Find(kMaxDedupWorkers, 0, &refusal), nullptr);
  EXPECT_EQ(refusal.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(windows.Window(kMaxDedupWorkers, 0).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(windows.Window(7, 0).ok());  // A known worker's other table.
  (void)(*windows.Window(7, 0))->Mark(9);
  int visited = 0;
  windows.ForEach([&](uint32_t worker, size_t table, const SequenceWindow& w) {
    ++visited;
    EXPECT_EQ(worker, 7u);
    EXPECT_EQ(table, 0u);
    EXPECT_EQ(w.highest(), 9u);
  });
  EXPECT_EQ(visited, 1);  // Windows that applied nothing are not listed.
}

}  // namespace
}  // namespace hyrec::embedding_ps
