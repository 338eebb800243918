#include "hyrec/common/yaml_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

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
  if (mark.line < 0) return "";
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

absl::Status CheckKeys(const YAML::Node& node, absl::string_view path,
                       const std::vector<std::string>& allowed) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path.empty() ? "config" : path, " (",
                                                   YamlWhere(node), "): expected a mapping"));
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string message =
        absl::StrCat(JoinKey(path, key), " (", YamlWhere(entry.first), "): unknown key");
    const std::string suggestion = ClosestWord(key, allowed);
    if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean '", suggestion, "'?");
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, absl::string_view source_name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", e.mark.line + 1,
                                                   ": YAML syntax error: ", e.msg));
  }
}

absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read config file '", path, "'"));
  return ParseYaml(buffer.str(), path);
}

}  // namespace hyrec
