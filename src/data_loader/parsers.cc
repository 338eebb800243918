#include "hyrec/data_loader/parsers.h"

#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/hash.h"
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

std::string Printable(absl::string_view field) {
  std::string out;
  for (char c : field.substr(0, 32)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    }
  }
  if (field.size() > 32) out += "...";
  return out;
}

absl::string_view StripCr(absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
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

absl::Status LineTooLong(absl::string_view line) {
  return absl::InvalidArgumentError(
      absl::StrCat("line of ", line.size(), " bytes exceeds the limit of ", kMaxLineBytes));
}

int HashSlot(const HashSlots& hash_slots, int slot) {
  return static_cast<size_t>(slot) < hash_slots.size() ? hash_slots[slot] : slot;
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

absl::Status ParseSparseLine(absl::string_view line, const LibsvmOptions& options, bool ffm, Sample* out) {
  line = StripCr(line);
  if (line.size() > kMaxLineBytes) return LineTooLong(line);
  if (options.num_slots < 1) return absl::InvalidArgumentError("num_slots must be >= 1");
  out->Clear(options.num_slots);
  std::vector<std::pair<uint32_t, uint64_t>> features;
  absl::Status status;
  bool saw_label = false;
  ForEachToken(line, [&](absl::string_view token, int index) {
    if (index == 0) {
      saw_label = true;
      if (!ParseLabel(token, &out->label)) {
        status =
            absl::InvalidArgumentError(absl::StrCat("token 1 (label): '", Printable(token), "' is not 0/1 or -1/+1"));
        return false;
      }
      return true;
    }
    const size_t c1 = token.find(':');
    const size_t c2 = c1 == absl::string_view::npos ? c1 : token.find(':', c1 + 1);
    const bool shape_ok = ffm ? (c2 != absl::string_view::npos && token.find(':', c2 + 1) == absl::string_view::npos)
                              : (c1 != absl::string_view::npos && c2 == absl::string_view::npos);
    if (!shape_ok) {
      status = absl::InvalidArgumentError(
          absl::StrCat("token ", index + 1, ": '", Printable(token), "' is not ", ffm ? "field:idx:val" : "idx:val"));
      return false;
    }
    uint64_t slot = static_cast<uint64_t>(index - 1);
    absl::string_view idx = token.substr(0, c1);
    absl::string_view val = token.substr(c1 + 1);
    if (ffm) {
      if (!absl::SimpleAtoi(token.substr(0, c1), &slot)) {
        status = absl::InvalidArgumentError(
            absl::StrCat("token ", index + 1, ": field '", Printable(token.substr(0, c1)), "' is not an integer"));
        return false;
      }
      idx = token.substr(c1 + 1, c2 - c1 - 1);
      val = token.substr(c2 + 1);
    }
    uint64_t feature = 0;
    float value = 0;
    if (!absl::SimpleAtoi(idx, &feature) || !absl::SimpleAtof(val, &value) || !std::isfinite(value)) {
      status = absl::InvalidArgumentError(
          absl::StrCat("token ", index + 1, ": '", Printable(token), "' has a bad index or value"));
      return false;
    }
    if (slot >= static_cast<uint64_t>(options.num_slots)) {
      status = absl::InvalidArgumentError(
          absl::StrCat("token ", index + 1, ": slot ", slot, " is beyond num_slots ", options.num_slots));
      return false;
    }
    features.emplace_back(static_cast<uint32_t>(slot),
                          HashToken(HashSlot(options.hash_slots, static_cast<int>(slot)), idx));
    return true;
  });
  if (!status.ok()) return status;
  if (!saw_label) return absl::InvalidArgumentError("empty line");
  // Group by slot, keeping the line's order within a slot.
  for (const auto& f : features) ++out->slot_offsets[f.first + 1];
  for (int s = 0; s < options.num_slots; ++s) out->slot_offsets[s + 1] += out->slot_offsets[s];
  out->ids.resize(features.size());
  std::vector<uint32_t> fill(out->slot_offsets.begin(), out->slot_offsets.end() - 1);
  for (const auto& f : features) out->ids[fill[f.first]++] = f.second;
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseLibsvmLine(absl::string_view line, const LibsvmOptions& options, Sample* out) {
  return ParseSparseLine(line, options, /*ffm=*/false, out);
}

absl::Status ParseLibffmLine(absl::string_view line, const LibsvmOptions& options, Sample* out) {
  return ParseSparseLine(line, options, /*ffm=*/true, out);
}

std::string ReaderPosition::DebugString() const {
  return absl::StrCat("next batch ", next_batch, " in the window of epoch ", epoch, " batch ", window_batch,
                      " (global ", window_global, ") at file ", file_index, " byte ", byte_offset, " line ",
                      line_number);
}

}  // namespace hyrec::data_loader
