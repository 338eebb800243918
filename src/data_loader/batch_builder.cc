// BuildBatch (loader.h): a batch from parsed samples, its tables' ids deduplicated by shard; and
// ParseSourceLine, the line parser of a source.
#include "hyrec/data_loader/loader.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "hyrec/common/hash.h"

namespace hyrec::data_loader {

namespace {

// The batch's labels, dense values and per-slot ids (and weights) of samples[0, count); slots
// past the source's are copies (slot_copies).
void FillSlots(const std::vector<Sample>& samples, size_t count, int num_dense, int source_slots,
               const std::vector<int>& slot_copies, Batch* batch) {
  const int num_slots = source_slots + static_cast<int>(slot_copies.size());
  auto source_slot = [&](int s) { return s < source_slots ? s : slot_copies[s - source_slots]; };
  batch->batch_size = static_cast<int>(count);
  batch->num_dense = num_dense;
  batch->labels.resize(count);
  batch->dense.assign(count * num_dense, 0.0f);
  batch->slots.resize(num_slots);
  for (int s = 0; s < num_slots; ++s) {
    batch->slots[s].offsets.assign(count + 1, 0);
    batch->slots[s].ids.clear();
    batch->slots[s].weights.clear();
  }
  // Weights for every slot as soon as one sample has any; 1 for the ids of those without.
  bool weighted = false;
  for (size_t i = 0; i < count && !weighted; ++i) weighted = !samples[i].weights.empty();
  batch->data_time = 0;
  for (size_t i = 0; i < count; ++i) {
    const Sample& sample = samples[i];
    batch->labels[i] = sample.label;
    batch->data_time = std::max(batch->data_time, sample.time);
    std::copy(sample.dense.begin(), sample.dense.end(), batch->dense.begin() + i * num_dense);
    for (int s = 0; s < num_slots; ++s) {
      SlotIds& slot = batch->slots[s];
      const int from = source_slot(s);
      const uint32_t begin = sample.slot_offsets[from], end = sample.slot_offsets[from + 1];
      slot.ids.insert(slot.ids.end(), sample.ids.begin() + begin, sample.ids.begin() + end);
      slot.offsets[i + 1] = static_cast<uint32_t>(slot.ids.size());
      if (!weighted) continue;
      if (sample.weights.empty()) {
        slot.weights.resize(slot.ids.size(), 1.0f);
      } else {
        slot.weights.insert(slot.weights.end(), sample.weights.begin() + begin, sample.weights.begin() + end);
      }
    }
  }
}

// Per table: the batch's unique ids, grouped by shard, and each slot's index into them.
void DedupTables(const std::vector<int>& slot_tables, int num_tables, int num_shards, Batch* batch) {
  const int num_slots = static_cast<int>(batch->slots.size());
  // Per table: unique ids in first-seen order, then grouped by shard (stable counting sort).
  batch->tables.assign(num_tables, TableIds());
  std::vector<absl::flat_hash_map<uint64_t, uint32_t>> first(num_tables);
  std::vector<std::vector<uint64_t>> unique(num_tables);
  {
    // Sized for every id distinct, so that no map rehashes while it fills.
    std::vector<size_t> table_ids(num_tables, 0);
    for (int s = 0; s < num_slots; ++s)
      table_ids[slot_tables.empty() ? s : slot_tables[s]] += batch->slots[s].ids.size();
    for (int t = 0; t < num_tables; ++t) {
      first[t].reserve(table_ids[t]);
      unique[t].reserve(table_ids[t]);
    }
  }
  for (int s = 0; s < num_slots; ++s) {
    const int t = slot_tables.empty() ? s : slot_tables[s];
    TableIds& table = batch->tables[t];
    table.inverse.resize(num_slots);
    std::vector<uint32_t>& inverse = table.inverse[s];
    const std::vector<uint64_t>& ids = batch->slots[s].ids;
    inverse.resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      auto [it, inserted] = first[t].try_emplace(ids[j], static_cast<uint32_t>(unique[t].size()));
      if (inserted) unique[t].push_back(ids[j]);
      inverse[j] = it->second;
    }
  }
  for (int t = 0; t < num_tables; ++t) {
    TableIds& table = batch->tables[t];
    table.inverse.resize(num_slots);
    const std::vector<uint64_t>& ids = unique[t];
    std::vector<int32_t> shard(ids.size());
    table.shard_offsets.assign(num_shards + 1, 0);
    for (size_t u = 0; u < ids.size(); ++u) {
      shard[u] = ShardForId(ids[u], num_shards);
      ++table.shard_offsets[shard[u] + 1];
    }
    for (int k = 0; k < num_shards; ++k) table.shard_offsets[k + 1] += table.shard_offsets[k];
    std::vector<uint32_t> fill(table.shard_offsets.begin(), table.shard_offsets.end() - 1);
    std::vector<uint32_t> new_index(ids.size());
    table.unique_ids.resize(ids.size());
    for (size_t u = 0; u < ids.size(); ++u) {
      new_index[u] = fill[shard[u]]++;
      table.unique_ids[new_index[u]] = ids[u];
    }
    for (auto& inverse : table.inverse) {
      for (uint32_t& v : inverse) v = new_index[v];
    }
  }
}

}  // namespace

void BuildBatch(const std::vector<Sample>& samples, size_t count, int num_dense, int num_slots,
                const std::vector<int>& slot_tables, int num_tables, int num_shards, Batch* batch,
                const std::vector<int>& slot_copies) {
  FillSlots(samples, count, num_dense, num_slots, slot_copies, batch);
  DedupTables(slot_tables, num_tables, num_shards, batch);
}

absl::Status ParseSourceLine(const SourceConfig& source, absl::string_view line, Sample* out) {
  switch (source.format) {
    case Format::kCriteo:
      return ParseCriteoLine(line, source.criteo, out);
    case Format::kLibsvm:
      return ParseLibsvmLine(line, source.libsvm, out);
    case Format::kLibffm:
      return ParseLibffmLine(line, source.libsvm, out);
    case Format::kCsv:
      return ParseCsvLine(line, source.csv, out);
    case Format::kSynthetic:
      break;
  }
  return absl::InvalidArgumentError("a synthetic source has no lines to parse");
}

}  // namespace hyrec::data_loader
