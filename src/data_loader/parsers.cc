#include "hyrec/data_loader/parsers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "src/data_loader/parse_util.h"
// Inlined: short tokens hash several times faster than through the shared library, with the
// same values.
#define XXH_INLINE_ALL
#include "xxhash.h"

namespace hyrec::data_loader {
namespace {

// log(1 + x) for the small non-negative integers that make up most Criteo counts.
constexpr int kLogTableSize = 1 << 14;
const float* LogTable() {
  static const float* table = [] {
    auto* t = new float[kLogTableSize];
    for (int i = 0; i < kLogTableSize; ++i) t[i] = static_cast<float>(std::log1p(static_cast<double>(i)));
    return t;
  }();
  return table;
}

inline float DenseTransform(int64_t x) {
  if (x <= 0) return 0.0f;
  if (x < kLogTableSize) return LogTable()[x];
  return static_cast<float>(std::log1p(static_cast<double>(x)));
}

// Strict signed decimal integer (no spaces, no sign-only, no overflow).
bool ParseInt(absl::string_view s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = 0;
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    i = 1;
    if (s.size() == 1) return false;
  }
  uint64_t value = 0;
  for (; i < s.size(); ++i) {
    const unsigned d = static_cast<unsigned char>(s[i]) - '0';
    if (d > 9) return false;
    if (value > (uint64_t{1} << 62)) return false;
    value = value * 10 + d;
  }
  *out = negative ? -static_cast<int64_t>(value) : static_cast<int64_t>(value);
  return true;
}

// 1 for hex digits, 0 otherwise.
struct HexTable {
  uint8_t is_hex[256] = {};
  HexTable() {
    for (int c = '0'; c <= '9'; ++c) is_hex[c] = 1;
    for (int c = 'a'; c <= 'f'; ++c) is_hex[c] = 1;
    for (int c = 'A'; c <= 'F'; ++c) is_hex[c] = 1;
  }
};
const HexTable kHex;

// Labels: 1 / +1 -> 1; 0 / -1 -> 0 (also written as 1.0, 0.0, -1.0).
bool ParseLabel(absl::string_view s, float* out) {
  double v = 0;
  if (!absl::SimpleAtod(s, &v)) return false;
  if (v == 1.0) {
    *out = 1.0f;
  } else if (v == 0.0 || v == -1.0) {
    *out = 0.0f;
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::string_view FormatName(Format format) {
  switch (format) {
    case Format::kCriteo:
      return "criteo";
    case Format::kLibsvm:
      return "libsvm";
    case Format::kLibffm:
      return "libffm";
    case Format::kCsv:
      return "csv";
    case Format::kSynthetic:
      return "synthetic";
  }
  return "unknown";
}

uint64_t HashToken(int slot, absl::string_view token) {
  return XXH3_64bits_withSeed(token.data(), token.size(), Mix64(static_cast<uint64_t>(slot) + 1));
}

float CriteoDense(int64_t x) { return DenseTransform(x); }

uint64_t MissingId(int slot) { return Mix64(0x6d697373696e6700ULL ^ static_cast<uint64_t>(slot)); }

absl::Status ParseCriteoLine(absl::string_view line, const CriteoOptions& options, Sample* out) {
  line = StripCr(line);
  if (line.size() > kMaxLineBytes) return LineTooLong(line);
  out->Clear(kCriteoSlots);
  out->dense.resize(kCriteoDense);
  const char* p = line.data();
  const char* end = p + line.size();
  int field = 0;
  if (options.label_optional && std::count(line.begin(), line.end(), '\t') == kCriteoDense + kCriteoSlots - 1) {
    out->label = std::numeric_limits<float>::quiet_NaN();
    field = 1;  // The line starts at I1.
  }
  for (;; ++field) {
    // Fields are short: a plain scan beats a memchr call per field; it checks hex digits on the way.
    const char* field_end = p;
    unsigned hex = 1;
    while (field_end < end && *field_end != '\t') {
      hex &= kHex.is_hex[static_cast<unsigned char>(*field_end)];
      ++field_end;
    }
    const char* tab = field_end < end ? field_end : nullptr;
    const absl::string_view value(p, field_end - p);
    if (field == 0) {
      if (value.size() == 1 && (value[0] == '0' || value[0] == '1')) {
        out->label = value[0] == '1' ? 1.0f : 0.0f;  // The common case, without float parsing.
      } else if (!ParseLabel(value, &out->label)) {
        return absl::InvalidArgumentError(absl::StrCat("field 1 (label): '", Printable(value), "' is not 0 or 1"));
      }
    } else if (field <= kCriteoDense) {
      int64_t x = 0;
      if (!value.empty() && !ParseInt(value, &x)) {
        return absl::InvalidArgumentError(
            absl::StrCat("field ", field + 1, " (I", field, "): '", Printable(value), "' is not an integer"));
      }
      out->dense[field - 1] = DenseTransform(x);
    } else if (field <= kCriteoDense + kCriteoSlots) {
      const int slot = field - kCriteoDense - 1;
      if (value.empty()) {
        if (options.missing_id_for_empty) out->ids.push_back(MissingId(HashSlot(options.hash_slots, slot)));
      } else if (value.size() > 16 || hex == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("field ", field + 1, " (C", slot + 1, "): '", Printable(value), "' is not a hex token"));
      } else {
        out->ids.push_back(HashToken(HashSlot(options.hash_slots, slot), value));
      }
      out->slot_offsets[slot + 1] = static_cast<uint32_t>(out->ids.size());
    }
    if (tab == nullptr) break;
    p = tab + 1;
    if (field + 1 >= 1 + kCriteoDense + kCriteoSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", 1 + kCriteoDense + kCriteoSlots, " tab-separated fields"));
    }
  }
  if (field + 1 != 1 + kCriteoDense + kCriteoSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", 1 + kCriteoDense + kCriteoSlots, " tab-separated fields, found ", field + 1));
  }
  return absl::OkStatus();
}

namespace {

// Splits on runs of spaces/tabs; calls fn(token, index) for each token; false stops.
template <typename Fn>
void ForEachToken(absl::string_view line, Fn&& fn) {
  size_t i = 0;
  int index = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i >= line.size()) break;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (!fn(line.substr(i, j - i), index++)) return;
    i = j;
  }
}

// The slot of libsvm index `feature`: its range's, or -1 when it is in none.
int RangeSlot(const std::vector<IndexRange>& ranges, uint64_t feature) {
  if (ranges.empty()) return 0;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), feature,
                             [](uint64_t f, const IndexRange& r) { return f < r.first; });
  if (it == ranges.begin()) return -1;
  --it;
  return feature <= it->last ? static_cast<int>(it - ranges.begin()) : -1;
}

struct SparseFeature {
  uint32_t slot;
  uint64_t id;
  float weight;
};

// A feature token split into its parts: libffm's field (0 for libsvm), the index and the value.
struct TokenParts {
  uint64_t field = 0;
  absl::string_view idx;
  absl::string_view val;
};

absl::Status BadToken(int token_index, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("token ", token_index + 1, ": ", what));
}

// libsvm's (and libFM's) "idx:val" tokens: a token's slot is its position (fields), the index
// range holding its index (index_ranges), or the one slot.
class LibsvmTokens {
 public:
  explicit LibsvmTokens(const LibsvmOptions& o) : o_(o) {}
  int num_slots() const { return o_.LibsvmSlots(); }
  absl::Status Split(absl::string_view token, int token_index, TokenParts* parts) const {
    const size_t colon = token.find(':');
    if (colon == absl::string_view::npos || token.find(':', colon + 1) != absl::string_view::npos) {
      return BadToken(token_index, absl::StrCat("'", Printable(token), "' is not idx:val"));
    }
    parts->idx = token.substr(0, colon);
    parts->val = token.substr(colon + 1);
    return absl::OkStatus();
  }
  // `index`: the token's place among the line's features and label (the label is 0).
  absl::Status Slot(int token_index, int index, const TokenParts&, uint64_t feature, int* slot) const {
    if (o_.positional_fields > 0) {
      *slot = index - 1;
      if (*slot >= o_.positional_fields) {
        return BadToken(token_index, absl::StrCat("more than fields: ", o_.positional_fields, " idx:val tokens"));
      }
      return absl::OkStatus();
    }
    *slot = RangeSlot(o_.index_ranges, feature);
    if (*slot < 0) return BadToken(token_index, absl::StrCat("index ", feature, " is in none of the index_ranges"));
    return absl::OkStatus();
  }
  absl::Status End(size_t features) const {
    if (o_.positional_fields > 0 && features != static_cast<size_t>(o_.positional_fields)) {
      return absl::InvalidArgumentError(
          absl::StrCat(features, " idx:val tokens; fields: ", o_.positional_fields, " needs one per field"));
    }
    return absl::OkStatus();
  }

 private:
  const LibsvmOptions& o_;
};

// libffm's "field:idx:val" tokens: a token's slot is its field, less field_base.
class LibffmTokens {
 public:
  explicit LibffmTokens(const LibsvmOptions& o) : o_(o) {}
  int num_slots() const { return o_.num_slots; }
  absl::Status Split(absl::string_view token, int token_index, TokenParts* parts) const {
    const size_t c1 = token.find(':');
    const size_t c2 = c1 == absl::string_view::npos ? c1 : token.find(':', c1 + 1);
    if (c2 == absl::string_view::npos || token.find(':', c2 + 1) != absl::string_view::npos) {
      return BadToken(token_index, absl::StrCat("'", Printable(token), "' is not field:idx:val"));
    }
    if (!absl::SimpleAtoi(token.substr(0, c1), &parts->field)) {
      return BadToken(token_index, absl::StrCat("field '", Printable(token.substr(0, c1)), "' is not an integer"));
    }
    parts->idx = token.substr(c1 + 1, c2 - c1 - 1);
    parts->val = token.substr(c2 + 1);
    return absl::OkStatus();
  }
  absl::Status Slot(int token_index, int, const TokenParts& parts, uint64_t, int* slot) const {
    const uint64_t base = static_cast<uint64_t>(o_.field_base);
    const int n = num_slots();
    if (parts.field < base || parts.field - base >= static_cast<uint64_t>(n)) {
      return BadToken(token_index, absl::StrCat("field ", parts.field, " is outside the fields ", base, "..",
                                                base + n - 1, " (num_slots ", n, ", field_base ", base, ")"));
    }
    *slot = static_cast<int>(parts.field - base);
    return absl::OkStatus();
  }
  absl::Status End(size_t) const { return absl::OkStatus(); }

 private:
  const LibsvmOptions& o_;
};

// A line of label and feature tokens, each read as `Tokens` says (LibsvmTokens, LibffmTokens).
template <typename Tokens>
absl::Status ParseSparseLine(absl::string_view line, const LibsvmOptions& options, const Tokens& tokens, Sample* out) {
  line = StripCr(line);
  if (line.size() > kMaxLineBytes) return LineTooLong(line);
  const int num_slots = tokens.num_slots();
  if (num_slots < 1) return absl::InvalidArgumentError("num_slots must be >= 1");
  out->Clear(num_slots);
  thread_local std::vector<SparseFeature> features;
  features.clear();
  absl::Status status;
  bool saw_label = false;
  int shift = 0;  // 1 for a line without its label: its first token is feature 1.
  ForEachToken(line, [&](absl::string_view token, int token_index) {
    if (token_index == 0 && options.label_optional && token.find(':') != absl::string_view::npos) {
      saw_label = true;
      out->label = std::numeric_limits<float>::quiet_NaN();
      shift = 1;
    }
    const int index = token_index + shift;  // Messages name the line's own tokens (token_index).
    if (index == 0) {
      saw_label = true;
      if (!ParseLabel(token, &out->label)) {
        status =
            absl::InvalidArgumentError(absl::StrCat("token 1 (label): '", Printable(token), "' is not 0/1 or -1/+1"));
        return false;
      }
      return true;
    }
    TokenParts parts;
    status = tokens.Split(token, token_index, &parts);
    if (!status.ok()) return false;
    uint64_t feature = 0;
    float value = 0;
    if (!absl::SimpleAtoi(parts.idx, &feature) || !absl::SimpleAtof(parts.val, &value) || !std::isfinite(value)) {
      status = BadToken(token_index, absl::StrCat("'", Printable(token), "' has a bad index or value"));
      return false;
    }
    int slot = 0;
    status = tokens.Slot(token_index, index, parts, feature, &slot);
    if (!status.ok()) return false;
    features.push_back(SparseFeature{static_cast<uint32_t>(slot),
                                     HashToken(HashSlot(options.hash_slots, slot), parts.idx),
                                     options.use_values ? value : 1.0f});
    return true;
  });
  if (!status.ok()) return status;
  if (!saw_label) return absl::InvalidArgumentError("empty line");
  HYREC_RETURN_IF_ERROR(tokens.End(features.size()));
  // Group by slot, keeping the line's order within a slot.
  for (const SparseFeature& f : features) ++out->slot_offsets[f.slot + 1];
  for (int s = 0; s < num_slots; ++s) out->slot_offsets[s + 1] += out->slot_offsets[s];
  out->ids.resize(features.size());
  if (options.use_values) out->weights.resize(features.size());
  thread_local std::vector<uint32_t> fill;
  fill.assign(out->slot_offsets.begin(), out->slot_offsets.end() - 1);
  for (const SparseFeature& f : features) {
    const uint32_t at = fill[f.slot]++;
    out->ids[at] = f.id;
    if (options.use_values) out->weights[at] = f.weight;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LibsvmOptions::Validate(bool ffm) const {
  if (ffm) {
    if (num_slots < 1 || num_slots > 65536) return absl::InvalidArgumentError("num_slots must be in [1, 65536]");
    if (field_base != 0 && field_base != 1) return absl::InvalidArgumentError("field_base must be 0 or 1");
    if (!index_ranges.empty()) return absl::InvalidArgumentError("index_ranges are for libsvm, not libffm");
    if (positional_fields != 0) return absl::InvalidArgumentError("fields is for libsvm, not libffm (num_slots)");
    return absl::OkStatus();
  }
  if (positional_fields < 0 || positional_fields > 65536) {
    return absl::InvalidArgumentError("fields must be in [0, 65536]");
  }
  if (positional_fields > 0 && !index_ranges.empty()) {
    return absl::InvalidArgumentError("fields and index_ranges are two ways to say the features: give one");
  }
  if (index_ranges.size() > 65536) return absl::InvalidArgumentError("index_ranges: more than 65536 ranges");
  for (size_t k = 0; k < index_ranges.size(); ++k) {
    const IndexRange& r = index_ranges[k];
    if (r.first > r.last) {
      return absl::InvalidArgumentError(
          absl::StrCat("index_ranges[", k, "]: [", r.first, ", ", r.last, "] ends before it starts"));
    }
    if (k > 0 && r.first <= index_ranges[k - 1].last) {
      return absl::InvalidArgumentError(absl::StrCat("index_ranges[", k, "] starts at ", r.first,
                                                     ", not after the previous range's end ", index_ranges[k - 1].last,
                                                     " (ranges go in increasing order)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseLibsvmLine(absl::string_view line, const LibsvmOptions& options, Sample* out) {
  return ParseSparseLine(line, options, LibsvmTokens(options), out);
}

absl::Status ParseLibffmLine(absl::string_view line, const LibsvmOptions& options, Sample* out) {
  return ParseSparseLine(line, options, LibffmTokens(options), out);
}

std::string ReaderPosition::DebugString() const {
  return absl::StrCat("next batch ", next_batch, " in the window of epoch ", epoch, " batch ", window_batch,
                      " (global ", window_global, ") at file ", file_index, " byte ", byte_offset, " line ",
                      line_number, partitions.empty() ? "" : " partitions ", FormatPartitionRanges(partitions));
}

}  // namespace hyrec::data_loader
