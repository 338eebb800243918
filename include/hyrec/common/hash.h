// Hashing primitives shared by every tier.
//
// Placement of a feature id on a parameter-server shard must be the same function everywhere
// (the PS client, the data loader's per-shard partitioning, checkpoint re-sharding), so it lives
// here and nowhere else:
//
//   const uint64_t id = hyrec::Mix64(12345);
//   const int32_t shard = hyrec::ShardForId(id, /*num_shards=*/4);   // in [0, 4)
//
// ShardForId is Lamping & Veach's jump consistent hash over a 64-bit mix of the id: when the
// shard count grows from n to n+1, only ~1/(n+1) of the ids move, all of them to the new shard.
#ifndef HYREC_COMMON_HASH_H_
#define HYREC_COMMON_HASH_H_

#include <cstdint>

namespace hyrec {

// SplitMix64 finalizer: a bijective, well-mixed 64-bit permutation.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Combines two 64-bit values into one well-mixed value (not commutative).
inline uint64_t HashCombine(uint64_t a, uint64_t b) { return Mix64(a ^ Mix64(b + 0x632be59bd9b4e019ULL)); }

// Jump consistent hash (Lamping & Veach, 2014). Requires num_buckets >= 1.
inline int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets) {
  int64_t b = -1;
  int64_t j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>((b + 1) * (static_cast<double>(1LL << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int32_t>(b);
}

// The parameter-server shard that owns `id`. Requires num_shards >= 1.
inline int32_t ShardForId(uint64_t id, int32_t num_shards) {
  if (num_shards <= 1) return 0;
  return JumpConsistentHash(Mix64(id ^ 0x5bd1e9955bd1e995ULL), num_shards);
}

// Maps a 64-bit hash uniformly onto [0, n) without division (Lemire's multiply-shift).
inline uint64_t FastRange64(uint64_t hash, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * n) >> 64);
}

}  // namespace hyrec

#endif  // HYREC_COMMON_HASH_H_
