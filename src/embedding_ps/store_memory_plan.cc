// PlanStoreMemory: what a store of given options takes for given rows, by the store's own
// accounting (EmbeddingShardStore::Stats), from the same layouts the store is built from.
#include <algorithm>
#include <cmath>

#include "hyrec/embedding_ps/embedding_store.h"
#include "src/embedding_ps/count_min_sketch.h"
#include "src/embedding_ps/disk_tier.h"
#include "src/embedding_ps/row_index.h"
#include "src/embedding_ps/store_layout.h"
#include "src/embedding_ps/stripe.h"

namespace hyrec::embedding_ps {

uint64_t FixedStoreBytes(int num_stripes, int num_tables) {
  constexpr uint64_t kStoreObjectBytes = 1024;  // The store's own members, rounded up.
  return kStoreObjectBytes +
         static_cast<uint64_t>(num_stripes) * (sizeof(Stripe) + static_cast<uint64_t>(num_tables) * sizeof(TablePart));
}

StoreMemoryPlan PlanStoreMemory(const StoreOptions& options, const std::vector<uint64_t>& rows_per_table) {
  StoreMemoryPlan plan;
  StoreOptions sized = options;
  sized.num_stripes = std::max(options.num_stripes, 1);
  const uint64_t stripes = static_cast<uint64_t>(sized.num_stripes);
  const std::vector<TableLayout> layouts = MakeLayouts(sized);
  for (size_t t = 0; t < layouts.size(); ++t) {
    const TableLayout& layout = layouts[t];
    StoreMemoryPlan::Table table;
    table.rows = t < rows_per_table.size() ? rows_per_table[t] : 0;
    table.slot_bytes = layout.slot_bytes;
    table.value_bytes = layout.weight_bytes;
    table.state_bytes = static_cast<uint32_t>(4 * layout.state_floats);
    const uint64_t per_stripe = (table.rows + stripes - 1) / stripes;
    const uint64_t chunk_rows = uint64_t{1} << layout.chunk_shift;
    table.slab_bytes = stripes * ((per_stripe + chunk_rows - 1) / chunk_rows) * (table.slot_bytes * chunk_rows);
    plan.index_bytes += stripes * RowIndex::BytesHolding(layout.rows_per_stripe, per_stripe);
    plan.rows += table.rows;
    plan.payload_bytes += table.rows * (table.value_bytes + table.state_bytes);
    if (options.tables[t].admission.min_count > 1) {
      plan.sketch_bytes += stripes * CountMinSketch::kDepth * SketchWidth(sized);
    }
    plan.tables.push_back(table);
  }
  plan.fixed_bytes = FixedStoreBytes(sized.num_stripes, static_cast<int>(layouts.size()));
  plan.bytes = plan.index_bytes + plan.sketch_bytes + plan.fixed_bytes;
  for (const StoreMemoryPlan::Table& t : plan.tables) plan.bytes += t.slab_bytes;
  return plan;
}

DiskTierPlan PlanDiskTier(const StoreOptions& options, const std::vector<uint64_t>& rows_per_table) {
  const std::vector<TableLayout> layouts = MakeLayouts(options);
  DiskTierPlan plan;
  double pages = static_cast<double>(layouts.size() + 1);  // Each table's open page, the cleaner's.
  for (size_t t = 0; t < layouts.size() && t < rows_per_table.size(); ++t) {
    const uint32_t payload = layouts[t].weight_bytes + 4 * layouts[t].state_floats;
    pages += static_cast<double>(rows_per_table[t]) / DiskTier::RecordsPerPage(payload) / DiskTier::kMostFill;
    plan.index_bytes += DiskTier::IndexBytes(rows_per_table[t]);
    plan.rows += rows_per_table[t];
  }
  plan.file_bytes = static_cast<uint64_t>(std::ceil(pages)) * DiskTier::kPageBytes;
  plan.index_bytes += options.disk.capacity_bytes / DiskTier::kPageBytes * DiskTier::kPageStateBytes;
  return plan;
}

std::vector<uint64_t> DiskTierRows(const StoreOptions& options, const std::vector<double>& weights) {
  const std::vector<TableLayout> layouts = MakeLayouts(options);
  std::vector<uint64_t> rows(layouts.size(), 0);
  const double pages =
      static_cast<double>(options.disk.capacity_bytes / DiskTier::kPageBytes) - static_cast<double>(layouts.size() + 1);
  double pages_per_weight = 0;  // Pages a unit of weight's rows take.
  for (size_t t = 0; t < layouts.size() && t < weights.size(); ++t) {
    const uint32_t payload = layouts[t].weight_bytes + 4 * layouts[t].state_floats;
    pages_per_weight += weights[t] / DiskTier::RecordsPerPage(payload) / DiskTier::kMostFill;
  }
  if (pages <= 0 || pages_per_weight <= 0) return rows;
  for (size_t t = 0; t < layouts.size() && t < weights.size(); ++t) {
    rows[t] = static_cast<uint64_t>(std::floor(pages / pages_per_weight * weights[t]));
  }
  return rows;
}

}  // namespace hyrec::embedding_ps
