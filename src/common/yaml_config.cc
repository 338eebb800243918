#include "hyrec/common/yaml_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string YamlWhere(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return "--set";  // Not from a file: a job's --set override.
  return absl::StrCat("line ", mark.line + 1);
}

std::string JoinKey(absl::string_view path, absl::string_view key) {
  if (path.empty()) return std::string(key);
  return absl::StrCat(path, ".", key);
}

std::string ClosestWord(absl::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    const size_t d = EditDistance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

namespace {

absl::Mutex allowed_keys_mu(absl::kConstInit);
std::set<std::string>* allowed_keys ABSL_GUARDED_BY(allowed_keys_mu) = nullptr;

// `path` with each list index ("[3]") written "[]".
std::string WithoutIndexes(absl::string_view path) {
  std::string out;
  bool in_index = false;
  for (char c : path) {
    if (c == '[') {
      in_index = true;
      out += "[]";
    } else if (c == ']') {
      in_index = false;
    } else if (!in_index) {
      out.push_back(c);
    }
  }
  return out;
}

void NoteAllowedKeys(absl::string_view path, const std::vector<std::string>& allowed) {
  const std::string base = WithoutIndexes(path);
  absl::MutexLock lock(&allowed_keys_mu);
  if (allowed_keys == nullptr) allowed_keys = new std::set<std::string>();
  for (const std::string& key : allowed) allowed_keys->insert(JoinKey(base, key));
}

}  // namespace

std::vector<std::string> AllowedKeysSeen() {
  absl::MutexLock lock(&allowed_keys_mu);
  if (allowed_keys == nullptr) return {};
  return std::vector<std::string>(allowed_keys->begin(), allowed_keys->end());
}

absl::Status CheckKeys(const YAML::Node& node, absl::string_view path, const std::vector<std::string>& allowed) {
  NoteAllowedKeys(path, allowed);
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? "config" : path, " (", YamlWhere(node), "): expected a mapping"));
  }
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(path.empty() ? "config" : path, " (", YamlWhere(entry.first),
                                                     "): a key must be a plain word, not a list or mapping"));
    }
    const std::string key = entry.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string message = absl::StrCat(JoinKey(path, key), " (", YamlWhere(entry.first), "): unknown key");
    const std::string suggestion = ClosestWord(key, allowed);
    if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean '", suggestion, "'?");
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

namespace {

// The element of a list, as a string; InvalidArgument unless it is a non-empty scalar.
absl::Status ListElement(const YAML::Node& list, size_t i, absl::string_view where, std::string* out) {
  const YAML::Node element = list[i];
  const std::string at = absl::StrCat(where, "[", i, "] (", YamlWhere(element), ")");
  if (element.IsNull()) return absl::InvalidArgumentError(absl::StrCat(at, ": empty entry (~ or nothing)"));
  if (!element.IsScalar()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, ": expected a plain value, found a ", element.IsSequence() ? "list" : "mapping"));
  }
  *out = element.Scalar();
  if (out->empty()) return absl::InvalidArgumentError(absl::StrCat(at, ": empty string"));
  return absl::OkStatus();
}

// map[key] when it is a list or absent (an invalid node); InvalidArgument otherwise. (A yaml-cpp
// Node is a reference: assigning an absent one to another throws, so it is returned by value.)
absl::StatusOr<YAML::Node> ListNode(const YAML::Node& map, absl::string_view key, absl::string_view path) {
  const YAML::Node list = map[std::string(key)];
  if (list && !list.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, key), " (", YamlWhere(list), "): expected a list"));
  }
  return list;
}

}  // namespace

absl::Status ReadStringList(const YAML::Node& map, absl::string_view key, absl::string_view path,
                            std::vector<std::string>* out) {
  absl::StatusOr<YAML::Node> list = ListNode(map, key, path);
  if (!list.ok()) return list.status();
  if (!*list) return absl::OkStatus();
  std::vector<std::string> values(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    absl::Status s = ListElement(*list, i, JoinKey(path, key), &values[i]);
    if (!s.ok()) return s;
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status ReadIntList(const YAML::Node& map, absl::string_view key, absl::string_view path, int min, int max,
                         std::vector<int>* out) {
  absl::StatusOr<YAML::Node> list = ListNode(map, key, path);
  if (!list.ok()) return list.status();
  if (!*list) return absl::OkStatus();
  std::vector<int> values(list->size());
  const std::string where = JoinKey(path, key);
  for (size_t i = 0; i < list->size(); ++i) {
    std::string text;
    absl::Status s = ListElement(*list, i, where, &text);
    if (!s.ok()) return s;
    int64_t v = 0;
    const std::string at = absl::StrCat(where, "[", i, "] (", YamlWhere((*list)[i]), ")");
    if (!absl::SimpleAtoi(text, &v))
      return absl::InvalidArgumentError(absl::StrCat(at, ": '", text, "' is not an integer"));
    if (v < min || v > max) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": ", v, " is not in [", min, ", ", max, "]"));
    }
    values[i] = static_cast<int>(v);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status CatchYamlErrors(absl::string_view what, const std::function<absl::Status()>& read) {
  try {
    return read();
  } catch (const YAML::Exception& e) {
    const std::string where = e.mark.line >= 0 ? absl::StrCat(" (line ", e.mark.line + 1, ")") : "";
    return absl::InvalidArgumentError(absl::StrCat(what, where, ": unexpected shape: ", e.msg));
  }
}

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, absl::string_view source_name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg));
  }
}

absl::StatusOr<std::string> ReadConfigText(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path, "' is a directory, not a YAML file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file '", path, "'"));
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read config file '", path, "'"));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path, "' holds more than ", kMaxConfigBytes,
                                                   " bytes; a job file is a few KB: is it the right file?"));
  }
  return text;
}

absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path) {
  HYREC_ASSIGN_OR_RETURN(const std::string text, ReadConfigText(path));
  return ParseYaml(text, path);
}

}  // namespace hyrec
