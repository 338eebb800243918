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
//   libsvm / libFM: label idx:val ... ; by default the whole line is one multi-hot slot: each
//     idx is an id (idx hashed with the slot) weighted by its val. With index_ranges, the indices
//     in range k are slot k, and an index in no range is an error. Labels 0/1 or -1/+1.
//   libffm: label field:idx:val ... ; field - field_base is the slot (fields number from 0, or
//     from 1 with field_base 1), and must be below num_slots; ids weighted by val.
//   With use_values false the values are checked but not used (every id weighs 1).
//   csv: delimited text (any one-byte delimiter; RFC 4180 quoting; a header line or not) whose
//     columns the job declares (CsvOptions): the label, dense columns with a transform,
//     categorical, multi-value and weighted multi-value columns (sparse slots, in declared
//     order), and columns to ignore. A quoted field may not span lines.
#ifndef HYREC_DATA_LOADER_PARSERS_H_
#define HYREC_DATA_LOADER_PARSERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "hyrec/data_loader/sample.h"

namespace hyrec::data_loader {

enum class Format { kCriteo, kLibsvm, kLibffm, kCsv, kSynthetic };
// "criteo", "libsvm", "libffm", "csv", "synthetic": the name loader.source.format takes.
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
  // Scoring: a line of 39 fields has no label (I1..I13, C1..C26); its label is NaN.
  bool label_optional = false;
  HashSlots hash_slots;
};

// The indices [first, last] of one libsvm feature.
struct IndexRange {
  uint64_t first = 0;
  uint64_t last = 0;
};

struct LibsvmOptions {
  int num_slots = 39;  // libffm: fields; a field beyond the last is an error.
  int field_base = 0;  // libffm: the number of the first field (0 or 1).
  // libsvm: one feature per range, in increasing order, not overlapping; empty: one feature of
  // every index.
  std::vector<IndexRange> index_ranges;
  // libsvm / libFM with one field per position (source.fields): N > 0 makes the k-th idx:val of
  // a line feature k, and a line must have exactly N of them. 0: index_ranges, or one feature.
  int positional_fields = 0;
  bool use_values = true;  // Ids weighted by their values; false: every id weighs 1.
  // Scoring: a line whose first token is a feature (holds ':') has no label; its label is NaN.
  bool label_optional = false;
  HashSlots hash_slots;

  // Slots of a line: libsvm's features (positional_fields, index_ranges, or 1), libffm's
  // num_slots.
  int LibsvmSlots() const {
    if (positional_fields > 0) return positional_fields;
    return index_ranges.empty() ? 1 : static_cast<int>(index_ranges.size());
  }
  // InvalidArgument naming the key when a setting is out of range or the ranges overlap.
  absl::Status Validate(bool ffm) const;
};

// One column of a csv source, as the job declares it (loader.source.csv.columns).
struct CsvColumn {
  // kTime: when the sample happened, whole seconds (Sample::time); empty is 0 (unknown).
  enum class Kind { kLabel, kDense, kCategorical, kMulti, kWeighted, kIgnore, kTime };
  enum class Transform { kNone, kLog1p, kStandardize };
  std::string name;  // The header's name for it; empty: `index` places it.
  int index = -1;    // 0-based field of the line; for a named column, set from the header.
  // A sparse column's feature name (what the job's `features` and tables call it); empty: its
  // `name`, or "c<index>" for a column declared by position.
  std::string feature;
  Kind kind = Kind::kIgnore;
  // kLabel: the values meaning a positive and a negative; any other value is a bad line.
  std::vector<std::string> positives = {"1"};
  std::vector<std::string> negatives = {"0"};
  // kDense: none: x; log1p: log(1 + max(x, 0)); standardize: (x - mean) / stddev. An empty
  // value is 0 (after the transform).
  Transform transform = Transform::kNone;
  double mean = 0;
  double stddev = 1;
  // kMulti, kWeighted: ids are separated by `separator`; kWeighted's are id<weight_separator>weight.
  char separator = '|';
  char weight_separator = ':';
};
absl::string_view CsvKindName(CsvColumn::Kind kind);

struct CsvOptions {
  char delimiter = ',';
  char quote = '"';                // '\0': fields are never quoted.
  bool header = true;              // Every file's first line names its columns.
  bool ignore_undeclared = false;  // false: a field no column declares is an error.
  std::vector<CsvColumn> columns;
  bool missing_id_for_empty = false;  // An empty categorical value gets the slot's "missing" id.
  HashSlots hash_slots;
  // With header: where the header comes from when the first file has none (its first line parses
  // as data): the plan names the training data's first file for held-out and test files. Empty:
  // the first file's first line is the header. A file whose first line is not the header but
  // parses as data has none.
  std::string header_file;
  // Set by the loader's check of the files (with header): per file, whether its first line is
  // the header (false: it has none, its first line is data).
  std::vector<bool> file_has_header;
  // Scoring: with a header, a label column the header does not name is absent (index -1) and
  // every label is NaN.
  bool label_optional = false;
  // Columns whose raw values the loader passes through (LoaderOptions' SourceConfig::keep):
  // names of the header's fields, or without a header "c<index>" (0-based). Resolve places them
  // in keep_index, InvalidArgument naming one that is not there.
  std::vector<std::string> keep;
  std::vector<int> keep_index;

  int num_dense() const;
  int num_slots() const;  // Categorical, multi and weighted columns, in declared order.
  bool weighted() const;  // Some column is weighted: every id then carries a weight.
  // The names of the sparse columns (a positional one is "c<index>").
  std::vector<std::string> SlotNames() const;
  // Checks the declarations (one label; names unique; names only with a header; ...).
  absl::Status Validate() const;
  // Places every column: named ones at their field of `header` (a file's first line, split as a
  // line is), which must hold each declared name; and, without ignore_undeclared, every field of
  // the header (or, without one, every position up to the last declared) must be declared.
  // InvalidArgument naming the column or field. ParseCsvLine needs it done.
  absl::Status Resolve(const std::vector<std::string>* header);
  // Set by Resolve: the fields a line has (with a header: its count; -1: at least
  // `min_fields`).
  int expected_fields = -1;
  int min_fields = 0;
  int resolved_slots = 0;  // num_slots() and weighted(), kept for the parser.
  bool resolved_weighted = false;
};

// Splits a csv line into its fields (unquoting them); InvalidArgument for a bad quote.
absl::Status SplitCsvLine(absl::string_view line, const CsvOptions& options, std::vector<std::string>* fields);

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
// `options` must be resolved (CsvOptions::Resolve).
absl::Status ParseCsvLine(absl::string_view line, const CsvOptions& options, Sample* out);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_PARSERS_H_
