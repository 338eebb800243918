// RowScores: one table's eviction policy in one store stripe, as a 16-bit score per row (kept in
// the row's index entry) and one comparator.
//
// Eviction compares the scores of the rows in one index bucket (RowIndex::Victim) and evicts the
// one whose Rank is highest; no list links rows to each other, so a use writes its own score and
// nothing else.
//   kLru: the score is a clock that ticks once every max(1, rows / 4096) uses of the table's rows
//         in the stripe; the rank is the age (clock - score). Every 16,384 ticks the store clamps
//         ages to 32,768 (ClampAges), so that no age wraps around the 16 bits.
//   kLfu: the score is the use count (new rows 1, saturating at 65,535); the rank is 65,535 -
//         count. After `lfu_aging` uses per row held, the store halves every count (Halve).
//   kTtl: the score is the data time of the last use in granules of the TTL / 1024 (at least a
//         second), modulo 2^16; the rank is the age. A row older than the TTL is expired: the store
//         treats it as absent when it meets it and sweeps the rest (SweepExpired) as data time
//         advances.
//
// Not thread-safe: the owning stripe's lock guards it.
#ifndef HYREC_EMBEDDING_PS_ROW_SCORES_H_
#define HYREC_EMBEDDING_PS_ROW_SCORES_H_

#include <algorithm>
#include <cstdint>

#include "hyrec/embedding_ps/table_config.h"

namespace hyrec::embedding_ps {

class RowScores {
 public:
  // What a use asks of the store besides the score: nothing, or one pass over the table's rows
  // in the stripe.
  enum class Upkeep { kNone, kClampAges, kHalve };
  static constexpr uint32_t kLruClampTicks = 1u << 14;
  static constexpr uint16_t kLruMaxAge = 1u << 15;

  RowScores(EvictionPolicy policy, uint32_t lfu_aging, uint32_t ttl_granules)
      : policy_(policy), lfu_aging_(lfu_aging), ttl_granules_(ttl_granules) {}

  // The score of a row created now, with `rows` rows of the table in the stripe; `ttl_now`: the
  // table's data time in granules (kTtl).
  uint16_t New(uint64_t rows, uint16_t ttl_now, Upkeep* upkeep) {
    switch (policy_) {
      case EvictionPolicy::kLru:
        return Tick(rows, upkeep);
      case EvictionPolicy::kLfu:
        return 1;
      case EvictionPolicy::kTtl:
        return ttl_now;
    }
    return 0;
  }

  // The score of a row of score `old` used now.
  uint16_t Use(uint16_t old, uint64_t rows, uint16_t ttl_now, Upkeep* upkeep) {
    switch (policy_) {
      case EvictionPolicy::kLru:
        return Tick(rows, upkeep);
      case EvictionPolicy::kLfu:
        if (++uses_ >= static_cast<uint64_t>(lfu_aging_) * std::max<uint64_t>(1, rows)) {
          uses_ = 0;
          *upkeep = Upkeep::kHalve;
        }
        return old == UINT16_MAX ? old : static_cast<uint16_t>(old + 1);
      case EvictionPolicy::kTtl:
        return ttl_now;
    }
    return old;
  }

  // The higher, the sooner a row of this score is evicted.
  uint32_t Rank(uint16_t score, uint16_t ttl_now) const {
    switch (policy_) {
      case EvictionPolicy::kLru:
        return static_cast<uint16_t>(clock_ - score);
      case EvictionPolicy::kLfu:
        return UINT16_MAX - score;
      case EvictionPolicy::kTtl:
        return static_cast<uint16_t>(ttl_now - score);
    }
    return 0;
  }

  // kTtl: a bound on the oldest score of the table's rows in the stripe, so that the store sweeps
  // a stripe's expired rows (SweepExpired) when it uses the stripe and one may have expired, and
  // not otherwise. Noted for every score set; Swept after a sweep with the oldest score left.
  void Note(uint16_t score, uint16_t ttl_now) {
    if (!any_ || static_cast<uint16_t>(ttl_now - score) > static_cast<uint16_t>(ttl_now - oldest_)) oldest_ = score;
    any_ = true;
  }
  void Swept(bool any, uint16_t oldest) {
    any_ = any;
    oldest_ = oldest;
  }
  bool MayHaveExpired(uint16_t ttl_now) const { return any_ && Expired(oldest_, ttl_now); }

  // kTtl: whether a row of this score is unused for longer than the TTL.
  bool Expired(uint16_t score, uint16_t ttl_now) const {
    return policy_ == EvictionPolicy::kTtl && static_cast<uint16_t>(ttl_now - score) > ttl_granules_;
  }

  // The upkeep passes, score by score.
  uint16_t ClampedAge(uint16_t score) const {
    return static_cast<uint16_t>(clock_ - score) > kLruMaxAge ? static_cast<uint16_t>(clock_ - kLruMaxAge) : score;
  }
  static uint16_t Halved(uint16_t score) { return static_cast<uint16_t>(score >> 1); }

  // kLfu: uses since the counts were last halved (checkpointed: StoreSnapshot::Table::lfu_uses).
  uint64_t uses() const { return uses_; }
  void set_uses(uint64_t uses) { uses_ = uses; }

 private:
  uint16_t Tick(uint64_t rows, Upkeep* upkeep) {
    if (++uses_ >= std::max<uint64_t>(1, rows >> 12)) {
      uses_ = 0;
      ++clock_;
      if (clock_ % kLruClampTicks == 0) *upkeep = Upkeep::kClampAges;
    }
    return clock_;
  }

  EvictionPolicy policy_;
  uint32_t lfu_aging_;
  uint32_t ttl_granules_;
  uint16_t clock_ = 0;
  uint64_t uses_ = 0;
  bool any_ = false;     // kTtl: whether oldest_ bounds any row.
  uint16_t oldest_ = 0;  // kTtl: no row has an older score.
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_ROW_SCORES_H_
