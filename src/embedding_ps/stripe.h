// Stripe: the part of a store that one lock guards. The store spreads (table, id) over its
// stripes by hash; each stripe holds, per table, the rows of that table that fall in it (their
// slots, index, eviction scores, admission sketch and counters), so that requests touching
// different stripes proceed in parallel.
#ifndef HYREC_EMBEDDING_PS_STRIPE_H_
#define HYREC_EMBEDDING_PS_STRIPE_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "hyrec/embedding_ps/table_config.h"
#include "src/embedding_ps/count_min_sketch.h"
#include "src/embedding_ps/row_scores.h"
#include "src/embedding_ps/slab.h"
#include "src/embedding_ps/store_layout.h"
#include "src/embedding_ps/stripe_lock.h"

namespace hyrec::embedding_ps {

struct TableCounters {
  uint64_t lookups = 0;
  uint64_t updates = 0;
  uint64_t evictions = 0;
  uint64_t expirations = 0;
  uint64_t admission_rejections = 0;
  uint64_t dropped_updates = 0;
  uint64_t dram_hits = 0;    // Ids found in DRAM.
  uint64_t disk_writes = 0;  // Rows the store's capacity moved to the disk tier.
  uint64_t disk_reads = 0;   // Rows read back from it.
};

// One table's rows in one stripe, but for their index: the store keeps the indexes of a table's
// stripes side by side (StripedStore), so that a request's walk over the stripes reads them from
// a few lines.
struct TablePart {
  TablePart(const TableLayout& layout, uint32_t sketch_width)
      : slab(layout.slot_bytes, layout.chunk_shift, kMaxRowsPerStripeAndTable),
        sketch(sketch_width),
        scores(layout.policy, layout.lfu_aging, layout.ttl_granules) {}

  Slab slab;
  CountMinSketch sketch;  // Unused (width 0) unless the table admits by count.
  RowScores scores;
  TableCounters counters;
  std::vector<uint64_t> tombstones;  // With track_changes: the ids evicted since the last delta.
};

struct alignas(64) Stripe {
  // Stripe `number` of its store.
  Stripe(int number, const std::vector<TableLayout>& layouts, const std::vector<TableConfig>& configs,
         uint32_t sketch_width, uint64_t seed)
      : number(number), rng_state(seed) {
    parts.reserve(layouts.size());
    for (size_t t = 0; t < layouts.size(); ++t) {
      parts.emplace_back(layouts[t], configs[t].admission.min_count > 1 ? sketch_width : 0);
    }
  }

  mutable StripeMutex mu;
  const int number;
  std::vector<TablePart> parts ABSL_GUARDED_BY(mu);  // Per table.
  uint64_t rows ABSL_GUARDED_BY(mu) = 0;
  uint64_t rng_state ABSL_GUARDED_BY(mu);  // The admission coin.
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_STRIPE_H_
