// A source's files, checked before a loader reads them: each exists, is readable and not empty,
// a csv's header resolves its columns by name, and Criteo's named columns map to fields.
// Internal to the loader tier (CheckSourceFiles in loader.h is the public check).
#ifndef HYREC_SRC_DATA_LOADER_SOURCE_FILES_H_
#define HYREC_SRC_DATA_LOADER_SOURCE_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/data_loader/loader.h"

namespace hyrec::data_loader {

// The fields of Criteo columns named label, I1..I13 and C1..C26; InvalidArgument naming another.
absl::StatusOr<std::vector<int>> CriteoFields(const std::vector<std::string>& names);

// Per file of `source_config`, its bytes on disk (0 for a file skipped under skip_bad_files);
// resolves a csv's columns from its header.
absl::StatusOr<std::vector<uint64_t>> CheckFiles(SourceConfig* source_config);

}  // namespace hyrec::data_loader

#endif  // HYREC_SRC_DATA_LOADER_SOURCE_FILES_H_
