// Loader configuration from YAML, and reader positions as text.
//
//   source:
//     format: criteo              # criteo | libsvm | libffm | synthetic
//     files: [day_0.gz, day_1.gz]
//     skip_bad_files: false       # true: a file that cannot be read whole is skipped, not fatal
//     missing_id_for_empty: false # criteo: an empty token gets a per-slot "missing" id
//     num_slots: 39               # libsvm / libffm
//     synthetic: {num_samples: 1000000, num_dense: 13, num_slots: 26, vocabulary: 100000,
//                 ids_per_sample: 1, zipf: 1.05, seed: 1, teacher_dim: 4,
//                 teacher_scale: 2.5, teacher_bias: -1.0}
//   batch_size: 4096
//   threads: 2
//   num_workers: 1
//   epochs: 1
//   shuffle: true
//   shuffle_window: 65536
//   seed: 1
//   num_shards: 1
//   slot_tables: []               # slot -> table; empty: one table per slot
//   max_bad_fraction: 0.001
//   min_lines_for_bad_check: 10000
//   prefetch_batches: 8
//   drop_last: false
//
// Unknown keys, wrong types and out-of-range values are errors naming the key and line.
#ifndef HYREC_DATA_LOADER_CONFIG_H_
#define HYREC_DATA_LOADER_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hyrec/data_loader/loader.h"

namespace YAML {
class Node;
}

namespace hyrec::data_loader {

absl::StatusOr<LoaderOptions> ParseLoaderConfig(const YAML::Node& node, absl::string_view path);

// One line per worker: "next_batch=N epoch=E window_batch=B window_global=G file_index=F
// byte_offset=O line_number=L", and for a stream source " partitions=P:S-E,...".
std::string FormatPositions(const std::vector<ReaderPosition>& positions);
absl::StatusOr<std::vector<ReaderPosition>> ParsePositions(absl::string_view text);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_CONFIG_H_
