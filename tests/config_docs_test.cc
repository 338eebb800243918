// docs/configuration.md against the code: every key the job parser accepts and every metric
// family the code describes has a row there (or, for a key, is named in its parent key's row).
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/job/job_spec.h"

namespace hyrec {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// configuration.md's table rows: the full key (or metric) each row's first cell names, mapped to
// the row. A cell "a.b, c" names a.b and a.c; a row under "## loader" names loader.<cell>.
std::map<std::string, std::string> DocumentedRows(const std::string& doc) {
  std::map<std::string, std::string> rows;
  std::string prefix;
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    if (absl::ConsumePrefix(&line, "## ")) {
      const std::string word(line.substr(0, line.find(' ')));
      const bool key_section = !word.empty() && absl::ascii_islower(word[0]);
      prefix = key_section ? word + "." : "";
      if (key_section) rows[word] = std::string(line);  // "## checkpoint" documents the mapping.
      continue;
    }
    if (!absl::StartsWith(line, "| ") || absl::StartsWith(line, "| key ") || absl::StartsWith(line, "| ---") ||
        absl::StartsWith(line, "| family ")) {
      continue;
    }
    const std::string cell(absl::StripAsciiWhitespace(line.substr(2, line.find(" |", 1) - 2)));
    std::string first;
    for (absl::string_view name : absl::StrSplit(cell, ", ")) {
      std::string full(absl::StripAsciiWhitespace(name));
      if (first.empty()) {
        first = full;
      } else if (full.find('.') == std::string::npos && first.find('.') != std::string::npos) {
        full = first.substr(0, first.rfind('.') + 1) + full;  // "a.b, c": a.c
      }
      rows[prefix + full] = std::string(line);
      if (!prefix.empty() && full.rfind("--", 0) != 0) rows[full] = std::string(line);
    }
  }
  return rows;
}

bool MentionsWord(const std::string& text, const std::string& word) {
  const std::regex whole("(^|[^a-z_])" + word + "([^a-z_]|$)");
  return std::regex_search(text, whole);
}

// A job that reaches every mapping the parser checks (with the csv source; the synthetic one is
// a second job).
constexpr char kEveryMapping[] = R"(
features: [a, b]
tables:
  - name: t
    features: [a, {name: b, pooling: mean}]
    dim: 8
    optimizer: {kind: adagrad, learning_rate: 0.05}
    initializer: {kind: normal, stddev: 0.02}
    admission: {min_count: 2}
    eviction: {policy: ttl, ttl_seconds: 60}
    capacity_rows: 1000
loader:
  source:
    format: csv
    files: [x.csv]
    csv:
      columns: [{name: y, type: label}, {name: a, type: categorical}, {name: b, type: categorical},
                {name: when, type: time}]
  batch_size: 16
eval: {samples: 10}
model: {kind: dlrm, bottom: [8], top: [8]}
ps: {shards: 1, optimizer: {kind: adagrad}, update_log: {enabled: true}}
train: {dense_optimizer: {kind: adam, schedule: {kind: cosine, decay_steps: 10}}}
cluster: {startup_timeout_seconds: 10}
checkpoint: {dir: /tmp/x}
export: {dir: /tmp/y}
security: {mode: none}
)";

constexpr char kSynthetic[] = R"(
loader: {source: {format: synthetic, synthetic: {num_samples: 100}}}
)";

TEST(ConfigurationDoc, NamesEveryKeyTheJobParserAccepts) {
  for (const char* text : {kEveryMapping, kSynthetic}) {
    auto spec = job::ParseJobSpecText(text, "job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
  }
  const std::vector<std::string> keys = AllowedKeysSeen();
  // The jobs above reached every section.
  for (const char* reached : {"tables[].optimizer.kind", "tables[].eviction.ttl_seconds", "tables[].features[].pooling",
                              "loader.source.csv.columns[].type", "loader.source.synthetic.zipf", "ps.update_log.sync",
                              "train.dense_optimizer.schedule.kind", "model.kind", "eval.metric", "cluster.ps",
                              "checkpoint.dir", "export.dir", "security.mode"}) {
    EXPECT_TRUE(std::find(keys.begin(), keys.end(), reached) != keys.end()) << reached;
  }
  const std::map<std::string, std::string> rows =
      DocumentedRows(ReadFile(std::filesystem::path(HYREC_SOURCE_DIR) / "docs/configuration.md"));
  const std::string doc = ReadFile(std::filesystem::path(HYREC_SOURCE_DIR) / "docs/configuration.md");
  auto documented = [&](const std::string& key) {
    // A row, or the key named in full in the text ("`loader.num_workers` ... is not a job key").
    if (rows.count(key) > 0 || doc.find("`" + key + "`") != std::string::npos) return true;
    // A mapping whose keys have rows ("loader.source" for "loader.source.format").
    for (auto it = rows.lower_bound(key); it != rows.end() && absl::StartsWith(it->first, key); ++it) {
      if (it->first.size() > key.size() && (it->first[key.size()] == '.' || it->first[key.size()] == '[')) return true;
    }
    return false;
  };
  const std::regex alias(R"re(as in `?([a-z_\[\].]*[a-z_\]])`?)re");
  for (const std::string& key : keys) {
    if (documented(key)) continue;
    // Else its parent's row names it ("tables[].features" describes `{name, pooling}`) or points
    // to a key documented for both ("ps.optimizer": "a mapping as in tables[].optimizer").
    std::string parent = key.substr(0, key.rfind('.'));
    if (absl::EndsWith(parent, "[]")) parent.resize(parent.size() - 2);
    const std::string leaf = key.substr(key.rfind('.') + 1);
    const auto row = rows.find(parent);
    if (row != rows.end() && MentionsWord(row->second, leaf)) continue;
    std::smatch to;
    if (row != rows.end() && std::regex_search(row->second, to, alias) && documented(to[1].str() + "." + leaf)) {
      continue;
    }
    ADD_FAILURE() << "docs/configuration.md has no row for " << key;
  }
}

TEST(ConfigurationDoc, NamesEveryMetricFamilyTheCodeDescribes) {
  const std::regex describe(R"re(Describe\(\s*"(hyrec_[a-z0-9_]+)")re");
  std::set<std::string> families;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(std::filesystem::path(HYREC_SOURCE_DIR) / "src")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cc" && ext != ".h") continue;
    const std::string text = ReadFile(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), describe), end; it != end; ++it) families.insert((*it)[1]);
  }
  EXPECT_GT(families.size(), 20u) << "the scan found the code's Describe calls";
  const std::map<std::string, std::string> rows =
      DocumentedRows(ReadFile(std::filesystem::path(HYREC_SOURCE_DIR) / "docs/configuration.md"));
  for (const std::string& family : families) {
    EXPECT_EQ(rows.count(family), 1u) << "docs/configuration.md's Metrics has no row for " << family;
  }
}

}  // namespace
}  // namespace hyrec
