// Sample, Batch and the per-table id partitioning that the loader hands to dense workers.
//
// A Batch is column-oriented, ready for the dense model and the PS client:
//   labels  [B]                  0 or 1
//   dense   [B x num_dense]      row-major floats
//   slots   per slot, CSR        ids of sample i are ids[offsets[i] .. offsets[i+1])
//   tables  per table            the batch's unique ids of every slot mapped to that table,
//                                grouped by PS shard (ShardForId), with `inverse` mapping each
//                                slot id occurrence to its unique index
// docs/data.md documents the layout.
#ifndef HYREC_DATA_LOADER_SAMPLE_H_
#define HYREC_DATA_LOADER_SAMPLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hyrec::data_loader {

// One parsed record. Slot k's ids are ids[slot_offsets[k] .. slot_offsets[k+1]).
struct Sample {
  float label = 0.0f;
  std::vector<float> dense;
  std::vector<uint32_t> slot_offsets;  // num_slots + 1
  std::vector<uint64_t> ids;
  std::vector<float> weights;  // Empty (every id weighs 1), or one per id.
  // When it happened, in seconds (a csv `time` column); 0: the source has no time.
  uint64_t time = 0;

  void Clear(int num_slots) {
    label = 0.0f;
    time = 0;
    dense.clear();
    ids.clear();
    weights.clear();
    slot_offsets.assign(num_slots + 1, 0);
  }
};

struct SlotIds {
  std::vector<uint32_t> offsets;  // batch_size + 1
  std::vector<uint64_t> ids;
  // Empty (every id weighs 1), or one per id: the factor of its row in its bag's pooling (a
  // libsvm value, a weighted CSV column's weight), which also scales the row's gradient.
  std::vector<float> weights;
};

// The unique ids of one table in one batch, grouped by PS shard: shard s owns
// unique_ids[shard_offsets[s] .. shard_offsets[s+1]). For slot k mapped to this table,
// inverse[k][j] is the index in unique_ids of slots[k].ids[j].
struct TableIds {
  std::vector<uint64_t> unique_ids;
  std::vector<uint32_t> shard_offsets;         // num_shards + 1
  std::vector<std::vector<uint32_t>> inverse;  // per slot of the batch (empty for other tables)
};

// A stream source's records of one partition in a window: offsets [start, end).
struct PartitionRange {
  int32_t partition = 0;
  int64_t start = 0;
  int64_t end = 0;
  bool operator==(const PartitionRange& o) const {
    return partition == o.partition && start == o.start && end == o.end;
  }
};

// "P:S-E,P:S-E" (the positions text of config.h), and back; INVALID_ARGUMENT names a bad item.
std::string FormatPartitionRanges(const std::vector<PartitionRange>& ranges);
absl::StatusOr<std::vector<PartitionRange>> ParsePartitionRanges(absl::string_view text);

// Where a worker's stream stands: enough to resume it exactly, as a small value
// (docs/data.md, "Resume"). It names the shuffle window that holds the worker's next batch and
// the global id of that batch; the loader re-reads and re-shuffles that window and skips what the
// worker already had.
struct ReaderPosition {
  uint64_t epoch = 0;
  uint64_t window_batch = 0;   // Index within the epoch of the window's first batch.
  uint64_t window_global = 0;  // Global id of the window's first batch.
  uint32_t file_index = 0;     // Where the window starts (file sources).
  uint64_t byte_offset = 0;    // In the uncompressed stream of that file.
  uint64_t line_number = 1;    // 1-based line of the window's first line in that file.
  uint64_t next_batch = 0;     // Global id of the next batch this worker should receive.
  // Stream sources (Kafka): the window's records, per partition, so that it is read again exactly;
  // empty for files and the synthetic source.
  std::vector<PartitionRange> partitions;

  bool operator==(const ReaderPosition& o) const {
    return epoch == o.epoch && window_batch == o.window_batch && window_global == o.window_global &&
           file_index == o.file_index && byte_offset == o.byte_offset && line_number == o.line_number &&
           next_batch == o.next_batch && partitions == o.partitions;
  }
  std::string DebugString() const;
};

struct Batch {
  uint64_t batch_id = 0;  // Global batch id (over epochs).
  uint64_t epoch = 0;
  int batch_size = 0;
  int num_dense = 0;
  std::vector<float> labels;
  std::vector<float> dense;
  std::vector<SlotIds> slots;
  std::vector<TableIds> tables;
  // Resume point of the worker's stream after this batch.
  ReaderPosition next_position;
  // File sources: the bytes on disk (compressed, for gzip) of this epoch's files read when the
  // batch was cut, and their total; 0 and 0 for a synthetic source. For progress and ETA.
  uint64_t bytes_read = 0;
  uint64_t bytes_total = 0;
  // The newest sample time in the batch (Sample::time); 0 when its source has none. The PS keeps
  // it per table as the data time of TTL eviction.
  uint64_t data_time = 0;
  // With SourceConfig::keep (k columns): sample i's raw value of kept column j at i * k + j (a
  // field the line does not have: empty). Not sent over the wire.
  std::vector<std::string> kept;
};

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_SAMPLE_H_
