// RowIndex: the hash index of one store stripe, mapping (table, id) to a 32-bit slot handle.
//
// Open addressing over 64-byte buckets, each one cache line: 12 handles, 12 one-byte tags (7
// hash bits with the high bit set; 0 marks an empty entry) and an overflow count. A key lives in
// its home bucket or, when that is full, in the next bucket with room; every bucket passed on the
// way counts the overflow, so a lookup stops at the first bucket whose overflow count is zero and
// an erase needs no tombstones (the scheme of folly's F14 tables). One lookup costs one cache
// line of index plus the row it finds; tag collisions cost 1/128 of a row read per occupied entry.
//
// Not thread-safe: the owning stripe's lock guards it. The index never reads rows itself: the
// caller passes a predicate that recognizes a handle's key and a function that rehashes a handle.
#ifndef HYREC_EMBEDDING_PS_ROW_INDEX_H_
#define HYREC_EMBEDDING_PS_ROW_INDEX_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "hyrec/common/hash.h"
#include "src/embedding_ps/huge_page_arena.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hyrec::embedding_ps {

inline constexpr uint32_t kNoHandle = 0xffffffffu;

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
  static constexpr int kEntriesPerBucket = 12;
  static constexpr double kMaxLoad = 0.9;

  // Sized so that `expected_entries` fill it to at most ~85%.
  explicit RowIndex(uint64_t expected_entries) { Allocate(BucketsFor(expected_entries)); }
  ~RowIndex() { FreeLargeArray(buckets_, num_buckets_ * sizeof(Bucket)); }
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  uint64_t size() const { return size_; }
  uint64_t bytes() const { return num_buckets_ * sizeof(Bucket); }
  // bytes() of an index sized for `expected_entries` once it holds `entries`.
  static uint64_t BytesHolding(uint64_t expected_entries, uint64_t entries) {
    uint64_t buckets = BucketsFor(expected_entries);
    while (static_cast<double>(entries) > kMaxLoad * static_cast<double>(buckets * kEntriesPerBucket)) buckets *= 2;
    return buckets * 64;
  }

  // Prefetches the home bucket of `hash` (a hint; safe to call with a stale index).
  void Prefetch(uint64_t hash) const { PrefetchLine(&buckets_[Home(hash)]); }

  // The first handle of the home bucket of `hash` whose tag matches, unverified (kNoHandle when
  // none does): a hint of where the key's row lies, to prefetch it before Find confirms it.
  uint32_t Candidate(uint64_t hash) const {
    const Bucket& bucket = buckets_[Home(hash)];
    const uint32_t mask = MatchTag(bucket, Tag(hash));
    return mask == 0 ? kNoHandle : bucket.handles[__builtin_ctz(mask)];
  }

  // Returns the handle h with matches(h), or kNoHandle.
  template <typename Matches>
  uint32_t Find(uint64_t hash, Matches&& matches) const {
    const uint8_t tag = Tag(hash);
    uint64_t b = Home(hash);
    // Every bucket may carry overflow after heavy churn; a full circle means "absent".
    for (uint64_t visited = 0; visited < num_buckets_; ++visited) {
      const Bucket& bucket = buckets_[b];
      uint32_t mask = MatchTag(bucket, tag);
      while (mask != 0) {
        const int e = __builtin_ctz(mask);
        mask &= mask - 1;
        if (matches(bucket.handles[e])) return bucket.handles[e];
      }
      if (bucket.overflow == 0) return kNoHandle;
      b = Next(b);
    }
    return kNoHandle;
  }

  // Adds a handle that is not present. `rehash(handle)` returns the hash of any stored handle and
  // `prefetch_key(handle)` starts fetching what rehash(handle) reads; both are called only when
  // the index grows (doubling), which rehashes every stored handle.
  template <typename Rehash, typename PrefetchKey>
  void Insert(uint64_t hash, uint32_t handle, Rehash&& rehash, PrefetchKey&& prefetch_key) {
    if (static_cast<double>(size_ + 1) > kMaxLoad * static_cast<double>(num_buckets_ * kEntriesPerBucket)) {
      Grow(2 * num_buckets_, rehash, prefetch_key);
    }
    Place(hash, handle);
    ++size_;
  }
  template <typename Rehash>
  void Insert(uint64_t hash, uint32_t handle, Rehash&& rehash) {
    Insert(hash, handle, rehash, [](uint32_t) {});
  }

  // Removes a handle that is present, given its hash.
  void Erase(uint64_t hash, uint32_t handle) {
    const uint8_t tag = Tag(hash);
    uint64_t b = Home(hash);
    for (;;) {
      Bucket& bucket = buckets_[b];
      uint32_t mask = MatchTag(bucket, tag);
      while (mask != 0) {
        const int e = __builtin_ctz(mask);
        mask &= mask - 1;
        if (bucket.handles[e] == handle) {
          bucket.tags[e] = 0;
          --size_;
          return;
        }
      }
      --bucket.overflow;
      b = Next(b);
    }
  }

 private:
  struct alignas(64) Bucket {
    uint32_t handles[kEntriesPerBucket];
    uint8_t tags[kEntriesPerBucket];
    uint32_t overflow;
  };
  static_assert(sizeof(Bucket) == 64, "a bucket is one cache line");

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

  static uint32_t MatchTag(const Bucket& bucket, uint8_t tag) {
#if defined(__SSE2__)
    // Loads tags[0..11] plus the overflow count; the high 4 bits of the mask are dropped.
    const __m128i tags = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bucket.tags));
    const __m128i eq = _mm_cmpeq_epi8(tags, _mm_set1_epi8(static_cast<char>(tag)));
    return static_cast<uint32_t>(_mm_movemask_epi8(eq)) & 0xfffu;
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

  void Place(uint64_t hash, uint32_t handle) {
    uint64_t b = Home(hash);
    for (;;) {
      Bucket& bucket = buckets_[b];
      for (int e = 0; e < kEntriesPerBucket; ++e) {
        if (bucket.tags[e] == 0) {
          bucket.tags[e] = Tag(hash);
          bucket.handles[e] = handle;
          return;
        }
      }
      ++bucket.overflow;
      b = Next(b);
    }
  }

  // Moves every entry into a new array of `buckets` buckets. Rehashing reads each handle's key, a
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
      uint32_t handle;
      uint64_t hash;
    };
    Entry ring[kRing];
    // Steps i's later stages for the first `known` entries.
    const auto advance = [&](uint64_t i, uint64_t known) {
      if (i >= kAhead && i - kAhead < known) {
        Entry& e = ring[(i - kAhead) % kRing];
        e.hash = rehash(e.handle);
        Prefetch(e.hash);
      }
      if (i >= 2 * kAhead && i - 2 * kAhead < known) {
        const Entry& e = ring[(i - 2 * kAhead) % kRing];
        Place(e.hash, e.handle);
      }
    };
    uint64_t n = 0;
    for (uint64_t b = 0; b < old_count; ++b) {
      for (int e = 0; e < kEntriesPerBucket; ++e) {
        if (old[b].tags[e] == 0) continue;
        ring[n % kRing].handle = old[b].handles[e];
        prefetch_key(old[b].handles[e]);
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
