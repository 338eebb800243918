// How a store lays out its tables: each table's slot size, hash salt and eviction parameters,
// and how many rows each (stripe, table) is sized for. EmbeddingShardStore builds its stripes
// from it and PlanStoreMemory predicts a store's bytes from the same numbers.
#ifndef HYREC_EMBEDDING_PS_STORE_LAYOUT_H_
#define HYREC_EMBEDDING_PS_STORE_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/table_config.h"

namespace hyrec::embedding_ps {

struct TableLayout {
  int dim = 0;
  int state_floats = 0;
  RowPrecision precision = RowPrecision::kFp32;
  uint32_t weight_bytes = 0;  // WeightBytes(precision, dim) (row_codec.h).
  uint32_t slot_bytes = 0;    // Slab::kHeaderBytes + weight_bytes + 4 * state_floats.
  uint64_t charge = 0;        // Bytes charged against capacity_bytes per row.
  uint64_t salt = 0;          // Mixed into the ids' hashes, so tables spread independently.
  EvictionPolicy policy = EvictionPolicy::kLru;
  uint64_t ttl_granule = 1;      // kTtl: seconds of data time per score step.
  uint32_t ttl_granules = 0;     // kTtl: the TTL in granules (at most 1024).
  uint32_t lfu_aging = 0;        // kLfu: uses per row between halvings.
  uint64_t rows_per_stripe = 0;  // The rows its index in each stripe is sized for (0: grows).
  int chunk_shift = 4;           // log2 of the slots of one slab chunk.
};

// Index bytes charged per row against capacity_bytes.
inline constexpr uint64_t kIndexChargePerRow = 8;

// The layouts of options.tables, in order. The options must be valid (Create checks them).
std::vector<TableLayout> MakeLayouts(const StoreOptions& options);

// The bytes of a store's fixed parts: the store and its stripes' headers (StoreStats::bytes and
// StoreMemoryPlan::fixed_bytes count them).
uint64_t FixedStoreBytes(int num_stripes, int num_tables);

// Count-min sketch counters per (stripe, table) row of a sketch.
uint32_t SketchWidth(const StoreOptions& options);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_STORE_LAYOUT_H_
