#include "src/deploy/k8s_value.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace hyrec::deploy {
namespace {

bool PlainSafeChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '@' || c == '$' ||
         c == '(' || c == ')' || c == '=' || c == '+' || c == '-' || c == ':';
}

// Whether `s` reads back as this same string when written without quotes, in YAML 1.1 and 1.2
// parsers alike: no indicator or space, no word YAML takes for a boolean or null, nothing that
// starts like a number or a date.
bool Plain(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!PlainSafeChar(c)) return false;
  }
  const char first = s[0];
  if (std::isdigit(static_cast<unsigned char>(first)) || first == '.' || first == ':') return false;
  if ((first == '-' || first == '+') && s.size() > 1 &&
      (std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.')) {
    return false;
  }
  if (s == "-" || s.back() == ':') return false;
  const std::string lower = absl::AsciiStrToLower(s);
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"}) {
    if (lower == word) return false;
  }
  return true;
}

std::string DoubleQuoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

KValue& KValue::Set(const std::string& key, KValue value) {
  if (kind_ == Kind::kNull) kind_ = Kind::kMap;
  for (auto& e : entries_) {
    if (e.first == key) {
      e.second = std::move(value);
      return *this;
    }
  }
  entries_.emplace_back(key, std::move(value));
  return *this;
}

KValue& KValue::operator[](const std::string& key) {
  if (kind_ == Kind::kNull) kind_ = Kind::kMap;
  for (auto& e : entries_) {
    if (e.first == key) return e.second;
  }
  entries_.emplace_back(key, KValue());
  return entries_.back().second;
}

KValue& KValue::Append(KValue value) {
  if (kind_ == Kind::kNull) kind_ = Kind::kList;
  items_.push_back(std::move(value));
  return *this;
}

// A scalar (or an empty collection) after "key:" or "- ": " value\n", or a literal block whose
// lines are indented by `indent`.
void KValue::EmitScalar(int indent, std::string* out) const {
  switch (kind_) {
    case Kind::kNull:
      *out += " null\n";
      return;
    case Kind::kInt:
      absl::StrAppend(out, " ", int_, "\n");
      return;
    case Kind::kBool:
      absl::StrAppend(out, int_ != 0 ? " true\n" : " false\n");
      return;
    case Kind::kMap:
      *out += " {}\n";
      return;
    case Kind::kList:
      *out += " []\n";
      return;
    case Kind::kString:
      break;
  }
  if (text_.find('\n') == std::string::npos || text_.find_first_of("\t\r") != std::string::npos) {
    absl::StrAppend(out, " ", Plain(text_) ? text_ : DoubleQuoted(text_), "\n");
    return;
  }
  // A literal block: "|" keeps one final newline, "|-" none; more than one is quoted instead.
  const bool final_newline = text_.back() == '\n';
  if (final_newline && text_.size() > 1 && text_[text_.size() - 2] == '\n') {
    absl::StrAppend(out, " ", DoubleQuoted(text_), "\n");
    return;
  }
  *out += final_newline ? " |\n" : " |-\n";
  const std::string body = final_newline ? text_.substr(0, text_.size() - 1) : text_;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.empty()) {
      *out += "\n";
    } else {
      absl::StrAppend(out, std::string(indent, ' '), line, "\n");
    }
  }
}

void KValue::Emit(int indent, std::string* out) const {
  const std::string pad(indent, ' ');
  const auto collection = [](const KValue& v) {
    return (v.kind_ == Kind::kMap && !v.entries_.empty()) || (v.kind_ == Kind::kList && !v.items_.empty());
  };
  if (kind_ == Kind::kMap) {
    for (const auto& [key, value] : entries_) {
      absl::StrAppend(out, pad, Plain(key) ? key : DoubleQuoted(key), ":");
      if (!collection(value)) {
        value.EmitScalar(indent + 2, out);
        continue;
      }
      *out += "\n";
      value.Emit(value.kind_ == Kind::kMap ? indent + 2 : indent, out);
    }
    return;
  }
  for (const KValue& item : items_) {
    if (!collection(item)) {
      absl::StrAppend(out, pad, "-");
      item.EmitScalar(indent + 2, out);
      continue;
    }
    // "- " takes the place of the first line's indentation.
    std::string nested;
    item.Emit(indent + 2, &nested);
    nested.replace(indent, 2, "- ");
    *out += nested;
  }
}

std::string KValue::Yaml() const {
  std::string out;
  Emit(0, &out);
  return out;
}

}  // namespace hyrec::deploy
