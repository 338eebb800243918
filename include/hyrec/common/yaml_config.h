// Strict reading of YAML configuration files.
//
// Every hyrec config is validated strictly: an unknown key, a value of the wrong type or out of
// range is an error that names the key path and the line, with a suggestion for misspellings:
//
//   HYREC_ASSIGN_OR_RETURN(YAML::Node root, hyrec::ParseYaml("name: user\ndimm: 16\n", "table.yaml"));
//   HYREC_RETURN_IF_ERROR(hyrec::CheckKeys(root, "tables[0]", {"name", "dim", "optimizer"}));
//   int dim = 0;
//   HYREC_RETURN_IF_ERROR(hyrec::ReadScalar(root, "dim", "tables[0]", &dim));
//
// yields e.g. `tables[0].dimm (line 4): unknown key; did you mean 'dim'?`.
#ifndef HYREC_COMMON_YAML_CONFIG_H_
#define HYREC_COMMON_YAML_CONFIG_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace hyrec {

// "line N" (1-based) for a node read from text; "--set" for one built in code (a job's --set
// override, job::LoadJobSpec).
std::string YamlWhere(const YAML::Node& node);

// Joins a path and a key: JoinKey("tables[0]", "dim") == "tables[0].dim"; JoinKey("", "x") == "x".
std::string JoinKey(absl::string_view path, absl::string_view key);

// The closest of `candidates` to `word` by edit distance, or "" when none is close.
std::string ClosestWord(absl::string_view word, const std::vector<std::string>& candidates);

// OK when `node` is a map whose keys are all in `allowed`; otherwise InvalidArgument naming the
// first offending key, its line and the closest allowed key.
absl::Status CheckKeys(const YAML::Node& node, absl::string_view path, const std::vector<std::string>& allowed);

// Every key a CheckKeys call of this process has allowed, as full paths with list indexes
// written "[]" ("tables[].dim", "loader.source.format"), sorted: the keys a parser accepts, for
// the test that keeps docs/configuration.md complete.
std::vector<std::string> AllowedKeysSeen();

// Reads map[key] into *out when present (leaves *out untouched when absent). A value that does
// not convert to T is InvalidArgument naming the key path and line.
template <typename T>
absl::Status ReadScalar(const YAML::Node& map, absl::string_view key, absl::string_view path, T* out) {
  const YAML::Node value = map[std::string(key)];
  if (!value) return absl::OkStatus();
  if (!value.IsScalar()) {
    return absl::InvalidArgumentError(
        absl::StrCat(JoinKey(path, key), " (", YamlWhere(value), "): expected a scalar value"));
  }
  try {
    *out = value.as<T>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, key), " (", YamlWhere(value), "): cannot read '",
                                                   value.Scalar(), "' as the expected type"));
  }
  return absl::OkStatus();
}

// Reads map[key], a list of non-empty strings, into *out when present (replacing its contents);
// absent leaves *out untouched. Anything but a list of scalars (a nested list, a mapping, a null
// `~`, an empty string) is InvalidArgument naming the key path, the element and its line.
absl::Status ReadStringList(const YAML::Node& map, absl::string_view key, absl::string_view path,
                            std::vector<std::string>* out);

// Reads map[key], a list of integers each in [min, max], into *out when present (replacing its
// contents); otherwise as ReadStringList.
absl::Status ReadIntList(const YAML::Node& map, absl::string_view key, absl::string_view path, int min, int max,
                         std::vector<int>* out);

// Runs `read` (code that walks YAML nodes) and turns any yaml-cpp exception it lets escape into
// InvalidArgument naming `what` and the line, so that no document shape aborts a process.
absl::Status CatchYamlErrors(absl::string_view what, const std::function<absl::Status()>& read);

// Parses YAML text; a syntax error is InvalidArgument with `source_name:line`.
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, absl::string_view source_name);

// The most a config file may hold: reading one stops there (a path to /dev/zero or a data file
// by mistake is an error, not an exhausted memory).
inline constexpr size_t kMaxConfigBytes = 16 << 20;

// A config file's text: NotFound when it cannot be opened, InvalidArgument when it is a directory
// or holds more than kMaxConfigBytes, each naming it.
absl::StatusOr<std::string> ReadConfigText(const std::string& path);

// Reads (ReadConfigText) and parses a YAML file.
absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path);

}  // namespace hyrec

#endif  // HYREC_COMMON_YAML_CONFIG_H_
