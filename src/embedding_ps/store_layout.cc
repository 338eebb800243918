#include "src/embedding_ps/store_layout.h"

#include <algorithm>
#include <cmath>

#include "hyrec/common/hash.h"
#include "hyrec/embedding_ps/optimizer.h"
#include "src/embedding_ps/count_min_sketch.h"
#include "src/embedding_ps/row_codec.h"
#include "src/embedding_ps/row_index.h"
#include "src/embedding_ps/slab.h"

namespace hyrec::embedding_ps {
namespace {

// A TTL of `ttl` seconds kept in steps of ttl / 1024 (rounded up, at least a second): the 16-bit
// score spans 64 TTLs or more, and expiry sweeps keep every row younger than that.
void SetTtlLayout(uint64_t ttl, TableLayout* layout) {
  layout->ttl_granule = std::max<uint64_t>(1, (ttl + 1023) / 1024);
  layout->ttl_granules = static_cast<uint32_t>((ttl + layout->ttl_granule - 1) / layout->ttl_granule);
}

int ChunkShiftFor(uint64_t expected_rows_per_stripe) {
  // About 1/1024 of a stripe's expected rows per chunk: under 0.1% waste, few allocations.
  const uint64_t target = std::clamp<uint64_t>(expected_rows_per_stripe / 1024, 16, 4096);
  int shift = 4;
  while ((1ull << (shift + 1)) <= target) ++shift;
  return shift;
}

// A stripe's share of `rows`, with a margin of three standard deviations for the hash's uneven
// spread (0 for 0).
uint64_t PerStripe(uint64_t rows, int stripes) {
  uint64_t per_stripe = rows / stripes;
  if (per_stripe > 0) per_stripe += static_cast<uint64_t>(3.0 * std::sqrt(static_cast<double>(per_stripe))) + 8;
  return per_stripe;
}

}  // namespace

uint64_t RowChargeBytes(const TableConfig& table) {
  StoreOptions options;
  options.tables = {table};
  return MakeLayouts(options)[0].charge;
}

std::vector<TableLayout> MakeLayouts(const StoreOptions& options) {
  std::vector<TableLayout> layouts;
  const int stripes = std::max(options.num_stripes, 1);
  for (size_t t = 0; t < options.tables.size(); ++t) {
    const TableConfig& config = options.tables[t];
    TableLayout layout;
    layout.dim = config.dim;
    layout.state_floats = OptimizerStateFloats(config.optimizer.kind, config.dim);
    layout.precision = config.precision;
    layout.weight_bytes = WeightBytes(config.precision, config.dim);
    layout.slot_bytes =
        static_cast<uint32_t>(Slab::kHeaderBytes + layout.weight_bytes + sizeof(float) * layout.state_floats);
    layout.charge = layout.slot_bytes + kIndexChargePerRow;
    layout.salt = Mix64(0xa0761d6478bd642fULL * (t + 1));
    layout.policy = config.eviction.policy;
    if (layout.policy == EvictionPolicy::kTtl) SetTtlLayout(config.eviction.ttl_seconds, &layout);
    layout.lfu_aging = config.eviction.lfu_aging_touches;
    layouts.push_back(layout);
  }
  // A table's index is sized for its own bound, or, when it is the store's only table, for the
  // store's. A table that shares the store's bound with others starts small and grows with its
  // rows: sizing each for a share would leave the indexes of tables that stay small empty, and
  // sizing each for the whole bound would multiply the index by the number of tables.
  for (TableLayout& layout : layouts) {
    const size_t t = &layout - layouts.data();
    uint64_t store_rows = options.capacity_rows;
    if (options.capacity_bytes > 0) {
      const uint64_t by_bytes = options.capacity_bytes / layout.charge;
      store_rows = store_rows == 0 ? by_bytes : std::min(store_rows, by_bytes);
    }
    uint64_t rows = layouts.size() == 1 ? store_rows : 0;
    if (options.tables[t].capacity_rows > 0) {
      rows = store_rows == 0 ? options.tables[t].capacity_rows : std::min(options.tables[t].capacity_rows, store_rows);
    }
    layout.rows_per_stripe = PerStripe(rows, stripes);
    layout.chunk_shift = ChunkShiftFor(layout.rows_per_stripe);
  }
  return layouts;
}

uint32_t SketchWidth(const StoreOptions& options) {
  return std::max<uint32_t>(
      64, options.admission_sketch_counters / (CountMinSketch::kDepth * static_cast<uint32_t>(options.num_stripes)));
}

}  // namespace hyrec::embedding_ps
