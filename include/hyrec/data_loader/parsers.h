// Line parsers for the formats hyrec reads. Each parses one line (without its newline; a trailing
// '\r' is accepted) into a Sample, or returns InvalidArgument saying what is wrong and at which
// field. They never crash on arbitrary bytes (each has a libFuzzer target in tests/fuzz).
//
//   Criteo (Kaggle DAC, Terabyte): label \t I1..I13 \t C1..C26, any field may be empty.
//     dense  k = log(1 + max(I_k, 0)); a missing integer is 0.
//     slot   k = the 26 categorical hex tokens, each hashed with xxhash64 (seeded by the slot,
//            or by hash_slots[k]), so the same token in two slots gives two ids unless the two
//            share a table. An empty token is skipped (the slot
//            has no id) or becomes the slot's "missing" id, per CriteoOptions.
//   libsvm / libFM: label idx:val ... ; the k-th feature on a line is slot k, its id is
//     idx hashed with the slot, its value is ignored (one-hot features); labels 0/1 or -1/+1.
//   libffm: label field:idx:val ... ; the field is the slot.
#ifndef HYREC_DATA_LOADER_PARSERS_H_
#define HYREC_DATA_LOADER_PARSERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "hyrec/data_loader/sample.h"

namespace hyrec::data_loader {

enum class Format { kCriteo, kLibsvm, kLibffm, kSynthetic };
// "criteo", "libsvm", "libffm", "synthetic": the name loader.source.format takes.
absl::string_view FormatName(Format format);

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoSlots = 26;
inline constexpr size_t kMaxLineBytes = 1 << 16;

// Per slot, the slot whose seed hashes its tokens into ids: features that share an embedding
// table give the same token the same id. Empty: every slot hashes with its own seed. A slot
// beyond the list hashes with its own. Set by the job plan (include/hyrec/job/job_plan.h).
using HashSlots = std::vector<int>;

struct CriteoOptions {
  bool missing_id_for_empty = false;  // false: an empty token adds no id to its slot.
  HashSlots hash_slots;
};

struct LibsvmOptions {
  int num_slots = 39;  // Features beyond the last slot are an error.
  HashSlots hash_slots;
};

// The id of `token` in `slot`: xxhash64(token, seed = Mix64(slot + 1)). Shared by the parsers
// and by the synthetic source's Criteo writer.
uint64_t HashToken(int slot, absl::string_view token);
// The id a Criteo slot uses for an empty token when missing_id_for_empty is set.
uint64_t MissingId(int slot);
// The dense transform of a Criteo integer: log(1 + max(x, 0)) as float.
float CriteoDense(int64_t x);

absl::Status ParseCriteoLine(absl::string_view line, const CriteoOptions& options, Sample* out);
absl::Status ParseLibsvmLine(absl::string_view line, const LibsvmOptions& options, Sample* out);
absl::Status ParseLibffmLine(absl::string_view line, const LibsvmOptions& options, Sample* out);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_PARSERS_H_
