// RowIndex: the hash index of one table's rows in one store stripe, mapping an id's hash to the
// row's slot and keeping each row's eviction score.
//
// Open addressing over 64-byte buckets, each one cache line: 7 entries, each a 40-bit slot
// handle, its 16-bit score and a one-byte tag (7 hash bits with the high bit set; 0 marks an empty
// entry), then a mark bit per entry and an overflow count. A key lives in its home bucket or, when that is full, in the
// next bucket with room; every bucket passed on the way counts the overflow, so a lookup stops at the first bucket
// whose overflow count is zero and an erase needs no tombstones (the scheme of folly's F14 tables).
//
// The scores live beside the slots, not in the rows: a use rewrites its own entry's score in the
// line the lookup has just read, and eviction (Victim) compares the scores of one bucket without
// reading a row. One lookup costs one cache line of index plus the row it finds; tag collisions
// cost 1/128 of a row read per occupied entry.
//
// Not thread-safe: the owning stripe's lock guards it. The index never reads rows itself: the
// caller passes a predicate that recognizes a slot's key and a function that rehashes a slot.
#ifndef HYREC_EMBEDDING_PS_ROW_INDEX_H_
#define HYREC_EMBEDDING_PS_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "hyrec/common/hash.h"
#include "src/embedding_ps/huge_page_arena.h"
#include "src/embedding_ps/slab.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hyrec::embedding_ps {

// Prefetches the cache line at `p` into all cache levels. An asm statement rather than
// __builtin_prefetch, which GCC 12 drops from loops whose only effect is the prefetch.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

class RowIndex {
 public:
  static constexpr int kEntriesPerBucket = 7;
  static constexpr double kMaxLoad = 0.9;
  static constexpr uint64_t kExactBuckets = 16;
  static constexpr int kVictimCandidates = 14;
  // An entry's place: bucket * 8 + entry. Valid until the next Insert or Erase.
  using Position = uint64_t;
  static uint64_t BucketOf(Position p) { return p >> 3; }
  static constexpr Position kNone = ~uint64_t{0};

  // Sized so that `expected_entries` fill it to at most ~85%.
  explicit RowIndex(uint64_t expected_entries) { Allocate(BucketsFor(expected_entries)); }
  ~RowIndex() {
    if (buckets_ != nullptr) FreeLargeArray(buckets_, num_buckets_ * sizeof(Bucket));
  }
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;
  RowIndex(RowIndex&& other) noexcept : buckets_(other.buckets_), num_buckets_(other.num_buckets_), size_(other.size_) {
    other.buckets_ = nullptr;
    other.num_buckets_ = 0;
    other.size_ = 0;
  }

  uint64_t size() const { return size_; }
  uint64_t bytes() const { return num_buckets_ * sizeof(Bucket); }
  // bytes() of an index sized for `expected_entries` once it holds `entries`.
  static uint64_t BytesHolding(uint64_t expected_entries, uint64_t entries) {
    uint64_t buckets = BucketsFor(expected_entries);
    while (static_cast<double>(entries) > kMaxLoad * static_cast<double>(buckets * kEntriesPerBucket)) {
      buckets = Grown(buckets);
    }
    return buckets * sizeof(Bucket);
  }

  // Prefetches the home bucket of `hash` (a hint).
  void Prefetch(uint64_t hash) const { PrefetchLine(&buckets_[Home(hash)]); }

  // The position of the first entry of the home bucket of `hash` whose tag matches, unverified
  // (kNone when none does): where the key most likely is, to prefetch its row and then check
  // (Holds, and the row's key) before falling back to Find.
  Position CandidatePosition(uint64_t hash) const {
    const uint64_t b = Home(hash);
    const uint32_t mask = MatchTag(buckets_[b], Tag(hash));
    return mask == 0 ? kNone : At(b, __builtin_ctz(mask));
  }
  // Whether `p` (any value a CandidatePosition returned, even before an Insert or Erase since)
  // holds an entry now; its slot is then slot(p).
  bool Holds(Position p) const { return (p >> 3) < num_buckets_ && buckets_[p >> 3].tags[p & 7] != 0; }

  // The position of the entry whose slot s has matches(s), or kNone.
  template <typename Matches>
  Position Find(uint64_t hash, Matches&& matches) const {
    const uint8_t tag = Tag(hash);
    uint64_t b = Home(hash);
    // Every bucket may carry overflow after heavy churn; a full circle means "absent".
    for (uint64_t visited = 0; visited < num_buckets_; ++visited) {
      const Bucket& bucket = buckets_[b];
      uint32_t mask = MatchTag(bucket, tag);
      while (mask != 0) {
        const int e = __builtin_ctz(mask);
        mask &= mask - 1;
        if (matches(bucket.slot(e))) return At(b, e);
      }
      if (bucket.overflow == 0) return kNone;
      b = Next(b);
    }
    return kNone;
  }

  SlotHandle slot(Position p) const { return buckets_[p >> 3].slot(p & 7); }
  uint16_t score(Position p) const { return buckets_[p >> 3].scores[p & 7]; }
  void set_score(Position p, uint16_t score) { buckets_[p >> 3].scores[p & 7] = score; }

  // A bit per entry for the caller (the store marks rows changed since its last delta); cleared
  // when the entry is made, carried when the index grows.
  bool marked(Position p) const { return (buckets_[p >> 3].marks >> (p & 7) & 1) != 0; }
  void set_mark(Position p, bool mark) {
    uint8_t& marks = buckets_[p >> 3].marks;
    const uint8_t bit = static_cast<uint8_t>(1u << (p & 7));
    marks = mark ? static_cast<uint8_t>(marks | bit) : static_cast<uint8_t>(marks & ~bit);
  }

  // Adds a slot whose key is not present, with its score; returns its position. `rehash(slot)`
  // returns the hash of any stored slot's key and `prefetch_key(slot)` starts fetching what
  // rehash(slot) reads; both are called only when the index grows (by half), which rehashes every
  // stored entry.
  template <typename Rehash, typename PrefetchKey>
  Position Insert(uint64_t hash, SlotHandle slot, uint16_t score, Rehash&& rehash, PrefetchKey&& prefetch_key) {
    if (static_cast<double>(size_ + 1) > kMaxLoad * static_cast<double>(num_buckets_ * kEntriesPerBucket)) {
      Grow(Grown(num_buckets_), rehash, prefetch_key);
    }
    ++size_;
    return Place(hash, slot, score, false);
  }
  template <typename Rehash>
  Position Insert(uint64_t hash, SlotHandle slot, uint16_t score, Rehash&& rehash) {
    return Insert(hash, slot, score, rehash, [](SlotHandle) {});
  }

  // Removes the entry at `p`, whose key has `hash`.
  void Erase(uint64_t hash, Position p) {
    const uint64_t at = p >> 3;
    for (uint64_t b = Home(hash); b != at; b = Next(b)) --buckets_[b].overflow;
    buckets_[at].tags[p & 7] = 0;
    --size_;
  }

  // The entry to evict for a new key of `hash`: of the entries of its home bucket and the buckets
  // after it, as many as hold kVictimCandidates entries between them, the one with the highest
  // rank(score), the first of equals; kNone when the index is empty. Rank is the eviction
  // policy's comparator: the higher, the sooner evicted. An index of at most kExactBuckets buckets
  // compares all its entries, so that small tables evict exactly by their policy.
  template <typename Rank>
  Position Victim(uint64_t hash, Rank&& rank) const {
    if (size_ == 0) return kNone;
    const bool all = num_buckets_ <= kExactBuckets;
    uint64_t b = all ? 0 : Home(hash);
    Position best = kNone;
    uint32_t best_rank = 0;
    int compared = 0;
    for (uint64_t visited = 0; visited < num_buckets_; ++visited, b = Next(b)) {
      const Bucket& bucket = buckets_[b];
      for (int e = 0; e < kEntriesPerBucket; ++e) {
        if (bucket.tags[e] == 0) continue;
        ++compared;
        const uint32_t r = rank(bucket.scores[e]);
        if (best == kNone || r > best_rank) {
          best = At(b, e);
          best_rank = r;
        }
      }
      if (!all && compared >= kVictimCandidates) break;
    }
    return best;
  }

  // Calls fn(position) for every entry, in bucket order. fn may change scores, not entries.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (uint64_t b = 0; b < num_buckets_; ++b) {
      for (int e = 0; e < kEntriesPerBucket; ++e) {
        if (buckets_[b].tags[e] != 0) fn(At(b, e));
      }
    }
  }

 private:
  struct alignas(64) Bucket {
    uint16_t scores[kEntriesPerBucket];
    uint8_t tags[kEntriesPerBucket];
    uint8_t marks;                         // Bit e: entry e's mark. After the tags: MatchTag reads it and drops it.
    uint8_t slots[5 * kEntriesPerBucket];  // 40-bit handles, little-endian.
    uint8_t unused[3];
    uint32_t overflow;

    // Reads 8 bytes from the handle's first: the last handle's are still within the bucket.
    SlotHandle slot(int e) const {
      uint64_t v;
      std::memcpy(&v, slots + 5 * e, sizeof(v));
      return v & kSlotMask;
    }
    void set_slot(int e, SlotHandle slot) {
      for (int k = 0; k < 5; ++k) slots[5 * e + k] = static_cast<uint8_t>(slot >> (8 * k));
    }
  };
  static_assert(sizeof(Bucket) == 64, "a bucket is one cache line");
  static_assert(offsetof(Bucket, slots) + 5 * (kEntriesPerBucket - 1) + 8 <= 64, "slot reads stay in the bucket");
  static constexpr uint64_t kSlotMask = (uint64_t{1} << 40) - 1;
  static_assert(kNoSlot > kSlotMask, "no handle is kNoSlot");

  static Position At(uint64_t bucket, int entry) { return bucket * 8 + static_cast<uint64_t>(entry); }

  // Growth by half: the load after growing is 0.6, so a grown index averages 0.75 (doubling
  // would average 0.68 and leave as little as 0.45).
  static uint64_t Grown(uint64_t buckets) { return buckets + buckets / 2 + 1; }

  static uint64_t BucketsFor(uint64_t entries) {
    const double buckets = static_cast<double>(entries) / (0.85 * kEntriesPerBucket);
    return buckets < 2 ? 2 : static_cast<uint64_t>(buckets) + 1;
  }
  // Bits 32-38 of the hash. The home bucket comes from the high bits (FastRange64) and the
  // store's stripe from the low 32, so the tag must come from neither: from the top byte, every
  // key of a bucket would have the same tag and each Find would compare the ids of half the
  // bucket's rows, a cache miss each.
  static uint8_t Tag(uint64_t hash) { return static_cast<uint8_t>(((hash >> 32) & 0x7f) | 0x80); }
  uint64_t Home(uint64_t hash) const { return FastRange64(hash, num_buckets_); }
  uint64_t Next(uint64_t b) const { return b + 1 == num_buckets_ ? 0 : b + 1; }

  // Bit e set when entry e's tag is `tag`.
  static uint32_t MatchTag(const Bucket& bucket, uint8_t tag) {
#if defined(__SSE2__)
    const __m128i tags = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bucket.tags));
    const __m128i eq = _mm_cmpeq_epi8(tags, _mm_set1_epi8(static_cast<char>(tag)));
    return static_cast<uint32_t>(_mm_movemask_epi8(eq)) & 0x7fu;
#else
    uint32_t mask = 0;
    for (int e = 0; e < kEntriesPerBucket; ++e) mask |= (bucket.tags[e] == tag ? 1u : 0u) << e;
    return mask;
#endif
  }

  void Allocate(uint64_t buckets) {
    // Zeroed pages, touched only when used; huge pages for large indexes.
    buckets_ = static_cast<Bucket*>(AllocateLargeArray(buckets * sizeof(Bucket)));
    num_buckets_ = buckets;
  }

  Position Place(uint64_t hash, SlotHandle slot, uint16_t score, bool mark) {
    uint64_t b = Home(hash);
    for (;;) {
      Bucket& bucket = buckets_[b];
      for (int e = 0; e < kEntriesPerBucket; ++e) {
        if (bucket.tags[e] == 0) {
          bucket.tags[e] = Tag(hash);
          bucket.set_slot(e, slot);
          bucket.scores[e] = score;
          const Position p = At(b, e);
          set_mark(p, mark);
          return p;
        }
      }
      ++bucket.overflow;
      b = Next(b);
    }
  }

  // Moves every entry into a new array of `buckets` buckets. Rehashing reads each slot's key, a
  // cache miss per entry (the rows lie all over the store), so the entries flow through a
  // pipeline in which the misses of many overlap: entry i's key is prefetched at step i, its hash
  // taken and its new home bucket prefetched at step i + kAhead, and it is placed at step
  // i + 2 kAhead, instead of one miss after another.
  template <typename Rehash, typename PrefetchKey>
  void Grow(uint64_t buckets, Rehash&& rehash, PrefetchKey&& prefetch_key) {
    Bucket* old = buckets_;
    const uint64_t old_count = num_buckets_;
    Allocate(buckets);
    constexpr uint64_t kAhead = 16;
    constexpr uint64_t kRing = 4 * kAhead;  // Holds entries i - 2 kAhead .. i.
    struct Entry {
      SlotHandle slot;
      uint16_t score;
      bool mark;
      uint64_t hash;
    };
    Entry ring[kRing];
    // Steps i's later stages for the first `known` entries.
    const auto advance = [&](uint64_t i, uint64_t known) {
      if (i >= kAhead && i - kAhead < known) {
        Entry& e = ring[(i - kAhead) % kRing];
        e.hash = rehash(e.slot);
        Prefetch(e.hash);
      }
      if (i >= 2 * kAhead && i - 2 * kAhead < known) {
        const Entry& e = ring[(i - 2 * kAhead) % kRing];
        Place(e.hash, e.slot, e.score, e.mark);
      }
    };
    uint64_t n = 0;
    for (uint64_t b = 0; b < old_count; ++b) {
      for (int e = 0; e < kEntriesPerBucket; ++e) {
        if (old[b].tags[e] == 0) continue;
        ring[n % kRing].slot = old[b].slot(e);
        ring[n % kRing].score = old[b].scores[e];
        ring[n % kRing].mark = (old[b].marks >> e & 1) != 0;
        prefetch_key(old[b].slot(e));
        advance(n, n + 1);
        ++n;
      }
    }
    for (uint64_t i = n; i < n + 2 * kAhead; ++i) advance(i, n);
    FreeLargeArray(old, old_count * sizeof(Bucket));
  }

  Bucket* buckets_ = nullptr;
  uint64_t num_buckets_ = 0;
  uint64_t size_ = 0;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_ROW_INDEX_H_
