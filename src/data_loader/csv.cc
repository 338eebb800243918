// The csv format: declared columns (CsvOptions) over RFC 4180 lines.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hyrec/common/data_time.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/data_loader/parsers.h"
#include "src/data_loader/parse_util.h"

namespace hyrec::data_loader {
namespace {

using Kind = CsvColumn::Kind;

bool IsSparse(Kind kind) { return kind == Kind::kCategorical || kind == Kind::kMulti || kind == Kind::kWeighted; }

// A column as the job declares it: by name, or by its 0-based index (said as such, since fields
// are counted from 1).
std::string ColumnLabel(const CsvColumn& c) {
  return c.name.empty() ? absl::StrCat("at index ", c.index) : absl::StrCat("'", c.name, "'");
}

// Splits `line` into views of its fields. Unquoted fields are views of `line`; quoted ones are
// unquoted into `scratch`, which is reserved to the line's size first so that no view moves.
absl::Status SplitFields(absl::string_view line, char delimiter, char quote, std::vector<absl::string_view>* fields,
                         std::string* scratch) {
  fields->clear();
  scratch->clear();
  scratch->reserve(line.size());
  const size_t n = line.size();
  size_t i = 0;
  for (;;) {
    if (quote != '\0' && i < n && line[i] == quote) {
      const size_t start = scratch->size();
      size_t j = i + 1;
      for (;;) {
        const size_t q = line.find(quote, j);
        if (q == absl::string_view::npos) {
          return absl::InvalidArgumentError(absl::StrCat(
              "field ", fields->size() + 1, ": a quote is never closed (a quoted field cannot span lines)"));
        }
        scratch->append(line.data() + j, q - j);
        if (q + 1 < n && line[q + 1] == quote) {  // "" is one quote.
          scratch->push_back(quote);
          j = q + 2;
          continue;
        }
        j = q + 1;
        break;
      }
      fields->emplace_back(scratch->data() + start, scratch->size() - start);
      if (j == n) return absl::OkStatus();
      if (line[j] != delimiter) {
        return absl::InvalidArgumentError(
            absl::StrCat("field ", fields->size(), ": '", Printable(line.substr(j)), "' follows its closing quote"));
      }
      i = j + 1;
      continue;
    }
    // Fields are short: a plain scan beats a memchr call per field.
    size_t end = i;
    while (end < n && line[end] != delimiter) ++end;
    fields->push_back(line.substr(i, end - i));
    if (end == n) return absl::OkStatus();
    i = end + 1;
  }
}

absl::Status FieldError(const CsvColumn& c, absl::string_view value, absl::string_view what) {
  // A column declared by index is named by it alone, not also by its 1-based field number.
  const std::string where = c.name.empty() ? absl::StrCat("the column at index ", c.index)
                                           : absl::StrCat("field ", c.index + 1, " (", ColumnLabel(c), ")");
  return absl::InvalidArgumentError(absl::StrCat(where, ": '", Printable(value), "' ", what));
}

absl::Status ParseLabelField(const CsvColumn& c, absl::string_view v, float* label) {
  for (const std::string& p : c.positives) {
    if (v == p) {
      *label = 1.0f;
      return absl::OkStatus();
    }
  }
  for (const std::string& p : c.negatives) {
    if (v == p) {
      *label = 0.0f;
      return absl::OkStatus();
    }
  }
  return FieldError(c, v,
                    absl::StrCat("is neither a positive (", absl::StrJoin(c.positives, ", "), ") nor a negative (",
                                 absl::StrJoin(c.negatives, ", "), ") label"));
}

// A plain decimal ("-12", "3.25"; at most 15 digits, no exponent) as the correctly rounded
// double strtod would give: the digits (below 2^53) and 10^k for k <= 15 are exact doubles, so
// the one division rounds once. False for anything else (the caller falls back to the general parser).
bool ParsePlainDecimal(absl::string_view v, double* out, bool* integral) {
  size_t i = 0;
  const bool negative = !v.empty() && v[0] == '-';
  if (negative) ++i;
  uint64_t digits = 0;
  int count = 0, fraction = -1;
  for (; i < v.size(); ++i) {
    const char ch = v[i];
    if (ch == '.' && fraction < 0) {
      fraction = 0;
      continue;
    }
    const unsigned d = static_cast<unsigned char>(ch) - '0';
    if (d > 9 || ++count > 15) return false;
    digits = digits * 10 + d;
    if (fraction >= 0) ++fraction;
  }
  if (count == 0) return false;
  static constexpr double kPow10[] = {1e0, 1e1, 1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                      1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
  *integral = fraction <= 0;
  double x = static_cast<double>(digits);
  if (fraction > 0) x /= kPow10[fraction];
  *out = negative ? -x : x;
  return true;
}

absl::Status ParseTimeField(const CsvColumn& c, absl::string_view v, uint64_t* out) {
  *out = 0;
  if (v.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, out) || *out > (1ull << 62)) {
    return FieldError(c, v, "is not a time in whole seconds (a non-negative integer)");
  }
  if (const uint64_t now = UnixSecondsNow(); DataTimeTooFarAhead(*out, now)) {
    return FieldError(c, v,
                      absl::StrCat("is more than ", kMaxDataTimeAheadSeconds, " s after this machine's clock (", now,
                                   "): a bad line, so that one wrong time cannot expire a ttl table's rows"));
  }
  return absl::OkStatus();
}

absl::Status ParseDenseField(const CsvColumn& c, absl::string_view v, float* out) {
  if (v.empty()) {
    *out = 0.0f;
    return absl::OkStatus();
  }
  double x = 0;
  bool integral = false;
  if (!ParsePlainDecimal(v, &x, &integral) && (!absl::SimpleAtod(v, &x) || !std::isfinite(x))) {
    return FieldError(c, v, "is not a finite number");
  }
  switch (c.transform) {
    case CsvColumn::Transform::kNone:
      break;
    case CsvColumn::Transform::kLog1p:
      if (integral && x < 16384) {  // Criteo-style counts: the shared table of log(1 + n).
        *out = CriteoDense(static_cast<int64_t>(x));
        return absl::OkStatus();
      }
      x = std::log1p(std::max(x, 0.0));
      break;
    case CsvColumn::Transform::kStandardize:
      x = (x - c.mean) / c.stddev;
      break;
  }
  *out = static_cast<float>(x);
  if (!std::isfinite(*out)) return FieldError(c, v, "is out of float range after its transform");
  return absl::OkStatus();
}

// Appends a sparse column's ids (and weights, when the sample is weighted) to `out`.
absl::Status ParseSparseField(const CsvColumn& c, absl::string_view v, int slot, const CsvOptions& o, bool weighted,
                              Sample* out) {
  const int seed = HashSlot(o.hash_slots, slot);
  auto add = [&](absl::string_view token, float weight) {
    out->ids.push_back(HashToken(seed, token));
    if (weighted) out->weights.push_back(weight);
  };
  if (c.kind == Kind::kCategorical) {
    if (!v.empty()) {
      add(v, 1.0f);
    } else if (o.missing_id_for_empty) {
      out->ids.push_back(MissingId(seed));
      if (weighted) out->weights.push_back(1.0f);
    }
    return absl::OkStatus();
  }
  size_t i = 0;
  while (i <= v.size()) {
    size_t end = v.find(c.separator, i);
    if (end == absl::string_view::npos) end = v.size();
    const absl::string_view item = v.substr(i, end - i);
    i = end + 1;
    if (item.empty()) continue;
    if (c.kind == Kind::kMulti) {
      add(item, 1.0f);
      continue;
    }
    const size_t w = item.rfind(c.weight_separator);
    float weight = 0;
    if (w == absl::string_view::npos || w == 0 || !absl::SimpleAtof(item.substr(w + 1), &weight) ||
        !std::isfinite(weight)) {
      return FieldError(c, item, absl::StrCat("is not id", std::string(1, c.weight_separator), "weight"));
    }
    add(item.substr(0, w), weight);
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view CsvKindName(CsvColumn::Kind kind) {
  switch (kind) {
    case Kind::kLabel:
      return "label";
    case Kind::kDense:
      return "dense";
    case Kind::kCategorical:
      return "categorical";
    case Kind::kMulti:
      return "multi";
    case Kind::kWeighted:
      return "weighted";
    case Kind::kIgnore:
      return "ignore";
    case Kind::kTime:
      return "time";
  }
  return "unknown";
}

int CsvOptions::num_dense() const {
  return static_cast<int>(
      std::count_if(columns.begin(), columns.end(), [](const CsvColumn& c) { return c.kind == Kind::kDense; }));
}

int CsvOptions::num_slots() const {
  return static_cast<int>(
      std::count_if(columns.begin(), columns.end(), [](const CsvColumn& c) { return IsSparse(c.kind); }));
}

bool CsvOptions::weighted() const {
  return std::any_of(columns.begin(), columns.end(), [](const CsvColumn& c) { return c.kind == Kind::kWeighted; });
}

std::vector<std::string> CsvOptions::SlotNames() const {
  std::vector<std::string> names;
  for (const CsvColumn& c : columns) {
    if (!IsSparse(c.kind)) continue;
    names.push_back(!c.feature.empty() ? c.feature : c.name.empty() ? absl::StrCat("c", c.index) : c.name);
  }
  return names;
}

absl::Status CsvOptions::Validate() const {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (delimiter == '\n' || delimiter == '\r' || delimiter == '\0') return bad("csv.delimiter cannot be a line break");
  if (quote != '\0' && quote == delimiter) return bad("csv.quote cannot be the delimiter");
  if (columns.empty()) return bad("csv.columns: no column is declared");
  int labels = 0, inputs = 0, times = 0;
  std::unordered_map<std::string, int> names;
  std::unordered_map<int, int> positions;
  for (size_t k = 0; k < columns.size(); ++k) {
    const CsvColumn& c = columns[k];
    const std::string key = absl::StrCat("csv.columns[", k, "]");
    if (c.name.empty() == (c.index < 0)) return bad(key, ": give a column a name or an index, one of them");
    if (!c.name.empty() && !header) return bad(key, ": the column is named '", c.name, "' but csv.header is false");
    if (c.index >= 65536) return bad(key, ": index ", c.index, " is beyond 65535");
    if (!c.feature.empty() && !IsSparse(c.kind)) {
      return bad(key, ": feature names a sparse (categorical, multi or weighted) column's feature");
    }
    if (!c.name.empty() && !names.emplace(c.name, static_cast<int>(k)).second) {
      return bad(key, ": '", c.name, "' is declared twice");
    }
    if (c.index >= 0 && !positions.emplace(c.index, static_cast<int>(k)).second) {
      return bad(key, ": position ", c.index, " is declared twice");
    }
    labels += c.kind == Kind::kLabel ? 1 : 0;
    times += c.kind == Kind::kTime ? 1 : 0;
    inputs += c.kind == Kind::kDense || IsSparse(c.kind) ? 1 : 0;
    if (c.kind == Kind::kLabel) {
      if (c.positives.empty() || c.negatives.empty()) return bad(key, ": a label needs positives and negatives");
      for (const std::string& p : c.positives) {
        if (std::find(c.negatives.begin(), c.negatives.end(), p) != c.negatives.end()) {
          return bad(key, ": '", p, "' is both a positive and a negative");
        }
      }
    }
    if (c.kind == Kind::kDense && c.transform == CsvColumn::Transform::kStandardize &&
        !(std::isfinite(c.mean) && std::isfinite(c.stddev) && c.stddev > 0)) {
      return bad(key, ": standardize needs a finite mean and a stddev > 0");
    }
    if (c.kind == Kind::kMulti || c.kind == Kind::kWeighted) {
      if (c.separator == delimiter || c.separator == '\0') return bad(key, ": the separator cannot be the delimiter");
      if (c.kind == Kind::kWeighted && (c.weight_separator == c.separator || c.weight_separator == delimiter)) {
        return bad(key, ": weight_separator must differ from the separator and the delimiter");
      }
    }
  }
  if (labels != 1) return bad("csv.columns: exactly one column must be the label (", labels, " are)");
  if (times > 1) return bad("csv.columns: at most one column may be the time (", times, " are)");
  if (inputs == 0) return bad("csv.columns: no dense, categorical, multi or weighted column is declared");
  if (num_slots() > 65536) return bad("csv.columns: more than 65536 sparse columns");
  return absl::OkStatus();
}

namespace {

// For a header that parsed as one field although several columns are declared: which other
// common delimiter splits it, said as a hint ("" when none does).
std::string DelimiterHint(const std::vector<std::string>& header, char delimiter, size_t declared) {
  if (header.size() != 1 || declared < 2) return "";
  for (const auto& [c, name] : {std::pair<char, const char*>{'\t', "\\t"}, {',', ","}, {';', ";"}, {'|', "|"}}) {
    if (c == delimiter) continue;
    const size_t fields = static_cast<size_t>(std::count(header[0].begin(), header[0].end(), c)) + 1;
    if (fields >= 2) {
      return absl::StrCat("; the header parsed as one field with the delimiter '",
                          delimiter == '\t' ? std::string("\\t") : std::string(1, delimiter), "', and '", name,
                          "' splits it into ", fields, " fields: csv.delimiter is probably \"", name, "\"");
    }
  }
  return "";
}

}  // namespace

absl::Status CsvOptions::Resolve(const std::vector<std::string>* header_fields) {
  HYREC_RETURN_IF_ERROR(Validate());
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  std::vector<bool> declared;
  if (header_fields != nullptr) {
    const std::vector<std::string>& h = *header_fields;
    std::unordered_map<std::string, int> where;
    for (size_t f = 0; f < h.size(); ++f) where.emplace(h[f], static_cast<int>(f));
    for (CsvColumn& c : columns) {
      if (c.name.empty()) {
        if (c.index >= static_cast<int>(h.size())) {
          return bad("csv column at index ", c.index, ": the header has ", h.size(), " fields",
                     DelimiterHint(h, delimiter, columns.size()));
        }
        continue;
      }
      auto it = where.find(c.name);
      if (it == where.end() && c.kind == Kind::kLabel && label_optional) {
        c.index = -1;  // Data to score, without its label.
        continue;
      }
      if (it == where.end()) {
        std::vector<std::string> shown(h.begin(), h.begin() + std::min<size_t>(h.size(), 20));
        return bad("csv column '", c.name, "' is not in the header (", absl::StrJoin(shown, ", "),
                   h.size() > 20 ? ", ..." : "", ")", DelimiterHint(h, delimiter, columns.size()));
      }
      if (std::count(h.begin(), h.end(), c.name) > 1) return bad("the header names '", c.name, "' more than once");
      c.index = it->second;
    }
    declared.assign(h.size(), false);
  }
  int last = -1;
  for (const CsvColumn& c : columns) last = std::max(last, c.index);
  std::vector<int> owner(static_cast<size_t>(last) + 1, -1);
  for (size_t k = 0; k < columns.size(); ++k) {
    if (columns[k].index < 0) continue;  // An absent label (label_optional).
    int& o = owner[columns[k].index];
    if (o >= 0) return bad("csv columns ", ColumnLabel(columns[o]), " and ", ColumnLabel(columns[k]), " are one field");
    o = static_cast<int>(k);
  }
  if (header_fields == nullptr) declared.assign(owner.size(), false);
  for (size_t f = 0; f < owner.size(); ++f) declared[f] = owner[f] >= 0;
  if (!ignore_undeclared) {
    for (size_t f = 0; f < declared.size(); ++f) {
      if (declared[f]) continue;
      return bad("csv field ", f + 1,
                 header_fields != nullptr ? absl::StrCat(" ('", Printable((*header_fields)[f]), "')") : std::string(),
                 " is not declared: declare it (type: ignore to skip it) or set csv.ignore_undeclared");
    }
  }
  keep_index.clear();
  for (const std::string& name : keep) {
    int at = -1;
    if (header_fields != nullptr) {
      auto it = std::find(header_fields->begin(), header_fields->end(), name);
      if (it != header_fields->end()) at = static_cast<int>(it - header_fields->begin());
    } else if (absl::StartsWith(name, "c") && absl::SimpleAtoi(name.substr(1), &at) && at >= 0) {
      if (at > last && !ignore_undeclared) at = -1;  // Past the declared fields: no line has it.
    } else {
      at = -1;
    }
    if (at < 0) {
      return bad(
          "kept column '", name, "' is not ",
          header_fields != nullptr ? "in the header" : "a field of the lines (without a header: c<index>, from c0)");
    }
    keep_index.push_back(at);
  }
  expected_fields = header_fields != nullptr ? static_cast<int>(header_fields->size()) : -1;
  min_fields = last + 1;
  resolved_slots = num_slots();
  resolved_weighted = weighted();
  return absl::OkStatus();
}

absl::Status SplitCsvLine(absl::string_view line, const CsvOptions& options, std::vector<std::string>* fields) {
  std::vector<absl::string_view> views;
  std::string scratch;
  HYREC_RETURN_IF_ERROR(SplitFields(StripCr(line), options.delimiter, options.quote, &views, &scratch));
  fields->clear();
  for (absl::string_view v : views) fields->emplace_back(v);
  return absl::OkStatus();
}

absl::Status ParseCsvLine(absl::string_view line, const CsvOptions& o, Sample* out) {
  line = StripCr(line);
  if (line.size() > kMaxLineBytes) return LineTooLong(line);
  if (o.min_fields == 0) return absl::FailedPreconditionError("the csv columns were not resolved");
  thread_local std::vector<absl::string_view> fields;
  thread_local std::string scratch;
  HYREC_RETURN_IF_ERROR(SplitFields(line, o.delimiter, o.quote, &fields, &scratch));
  const int n = static_cast<int>(fields.size());
  if (o.expected_fields >= 0 ? n != o.expected_fields
                             : n < o.min_fields || (n > o.min_fields && !o.ignore_undeclared)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "found ", n, " fields, expected ", o.expected_fields >= 0 ? o.expected_fields : o.min_fields,
        o.expected_fields >= 0 ? " (the header's)" : (o.ignore_undeclared ? " or more" : " (the declared columns)")));
  }
  out->Clear(o.resolved_slots);
  const bool weighted = o.resolved_weighted;
  int slot = 0;
  for (const CsvColumn& c : o.columns) {
    if (c.index < 0) {  // An absent label (label_optional).
      out->label = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const absl::string_view v = fields[c.index];
    switch (c.kind) {
      case Kind::kLabel:
        HYREC_RETURN_IF_ERROR(ParseLabelField(c, v, &out->label));
        break;
      case Kind::kDense:
        out->dense.push_back(0.0f);
        HYREC_RETURN_IF_ERROR(ParseDenseField(c, v, &out->dense.back()));
        break;
      case Kind::kCategorical:
      case Kind::kMulti:
      case Kind::kWeighted:
        HYREC_RETURN_IF_ERROR(ParseSparseField(c, v, slot, o, weighted, out));
        out->slot_offsets[++slot] = static_cast<uint32_t>(out->ids.size());
        break;
      case Kind::kTime:
        HYREC_RETURN_IF_ERROR(ParseTimeField(c, v, &out->time));
        break;
      case Kind::kIgnore:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace hyrec::data_loader
