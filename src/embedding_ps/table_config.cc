#include "hyrec/embedding_ps/table_config.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "hyrec/common/enum_names.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"

namespace hyrec::embedding_ps {
namespace {

constexpr int kMaxDim = 1 << 16;

absl::Status FieldError(const TableConfig& t, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("table '", t.name, "': ", field, " ", what));
}

bool Finite(float x) { return std::isfinite(x); }

}  // namespace

namespace {

constexpr EnumName<OptimizerKind> kOptimizerNames[] = {{OptimizerKind::kSgd, "sgd"},
                                                       {OptimizerKind::kAdagrad, "adagrad"},
                                                       {OptimizerKind::kAdam, "adam"},
                                                       {OptimizerKind::kFtrl, "ftrl"},
                                                       {OptimizerKind::kAdagradRowwise, "adagrad_rowwise"},
                                                       {OptimizerKind::kAdamRowwise, "adam_rowwise"}};
constexpr EnumName<InitializerKind> kInitializerNames[] = {
    {InitializerKind::kUniform, "uniform"}, {InitializerKind::kNormal, "normal"}, {InitializerKind::kZeros, "zeros"}};
constexpr EnumName<RowPrecision> kRowPrecisionNames[] = {
    {RowPrecision::kFp32, "fp32"}, {RowPrecision::kFp16, "fp16"}, {RowPrecision::kInt8, "int8"}};
constexpr EnumName<EvictionPolicy> kEvictionPolicyNames[] = {
    {EvictionPolicy::kLru, "lru"}, {EvictionPolicy::kLfu, "lfu"}, {EvictionPolicy::kTtl, "ttl"}};

}  // namespace

absl::string_view OptimizerName(OptimizerKind kind) { return NameOf(kOptimizerNames, kind); }
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  return ParseName(kOptimizerNames, name, "optimizer");
}
absl::string_view InitializerName(InitializerKind kind) { return NameOf(kInitializerNames, kind); }
absl::StatusOr<InitializerKind> ParseInitializerKind(absl::string_view name) {
  return ParseName(kInitializerNames, name, "initializer");
}
absl::string_view EvictionPolicyName(EvictionPolicy policy) { return NameOf(kEvictionPolicyNames, policy); }
absl::string_view RowPrecisionName(RowPrecision precision) { return NameOf(kRowPrecisionNames, precision); }
absl::StatusOr<RowPrecision> ParseRowPrecision(absl::string_view name) {
  return ParseName(kRowPrecisionNames, name, "precision");
}
absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name) {
  return ParseName(kEvictionPolicyNames, name, "eviction policy");
}

int OptimizerStateFloats(OptimizerKind kind, int dim) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return dim;
    case OptimizerKind::kAdam:
      return 2 * dim + 1;
    case OptimizerKind::kFtrl:
      return 2 * dim;
    case OptimizerKind::kAdagradRowwise:
      return 1;
    case OptimizerKind::kAdamRowwise:
      return dim + 2;
  }
  return 0;
}

absl::Status TableConfig::Validate() const {
  if (name.empty()) return absl::InvalidArgumentError("table name must not be empty");
  if (dim < 1 || dim > kMaxDim) {
    return FieldError(*this, "dim", absl::StrCat("must be in [1, ", kMaxDim, "], got ", dim));
  }
  const InitializerConfig& i = initializer;
  if (!Finite(i.low) || !Finite(i.high) || !(i.low < i.high || i.kind != InitializerKind::kUniform)) {
    return FieldError(*this, "initializer", "needs finite low < high");
  }
  if (!Finite(i.mean) || !Finite(i.stddev) || i.stddev < 0) {
    return FieldError(*this, "initializer", "needs a finite mean and stddev >= 0");
  }
  const OptimizerConfig& o = optimizer;
  if (!Finite(o.learning_rate) || o.learning_rate <= 0) {
    return FieldError(*this, "optimizer.learning_rate", "must be finite and > 0");
  }
  for (auto [field, value] : {std::pair<const char*, float>{"weight_decay", o.weight_decay},
                              {"grad_clip", o.grad_clip},
                              {"value_clip", o.value_clip},
                              {"initial_accumulator", o.initial_accumulator},
                              {"ftrl_beta", o.ftrl_beta},
                              {"ftrl_l1", o.ftrl_l1},
                              {"ftrl_l2", o.ftrl_l2}}) {
    if (!Finite(value) || value < 0) {
      return FieldError(*this, absl::StrCat("optimizer.", field), "must be finite and >= 0");
    }
  }
  if (!Finite(o.epsilon) || o.epsilon <= 0) {
    return FieldError(*this, "optimizer.epsilon", "must be finite and > 0");
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
    return FieldError(*this, "optimizer.beta1/beta2", "must be in [0, 1)");
  }
  if (!(admission.probability > 0 && admission.probability <= 1)) {
    return FieldError(*this, "admission.probability", "must be in (0, 1]");
  }
  if (admission.min_count > 255) {
    return FieldError(*this, "admission.min_count", "must be at most 255");
  }
  if (eviction.policy == EvictionPolicy::kTtl && (eviction.ttl_seconds == 0 || eviction.ttl_seconds > (1ull << 40))) {
    return FieldError(*this, "eviction.ttl_seconds", "must be in [1, 2^40] for the ttl policy");
  }
  if (eviction.policy != EvictionPolicy::kTtl && eviction.ttl_seconds != 0) {
    return FieldError(*this, "eviction.ttl_seconds", "is set, but the policy is not ttl");
  }
  if (eviction.lfu_aging_touches == 0) {
    return FieldError(*this, "eviction.lfu_aging_touches", "must be at least 1");
  }
  return absl::OkStatus();
}

namespace {

// The kind of an initializer or optimizer: the node itself when it is a plain word (*word set),
// else its `kind` key after checking the mapping's keys against `allowed`; parsed by `parse`.
template <typename Kind, typename Parse>
absl::Status ReadKind(const YAML::Node& node, absl::string_view path, const std::vector<std::string>& allowed,
                      Parse&& parse, Kind* kind, bool* word) {
  std::string name;
  *word = node.IsScalar();
  if (*word) {
    name = node.Scalar();
  } else {
    HYREC_RETURN_IF_ERROR(CheckKeys(node, path, allowed));
    if (!node["kind"]) return absl::OkStatus();
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "kind", path, &name));
  }
  auto parsed = parse(name);
  if (!parsed.ok()) {
    return Annotate(parsed.status(), absl::StrCat(*word ? std::string(path) : JoinKey(path, "kind"), " (",
                                                  YamlWhere(*word ? node : node["kind"]), ")"));
  }
  *kind = *parsed;
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadInitializerConfig(const YAML::Node& node, absl::string_view path, InitializerConfig* out) {
  bool word = false;
  HYREC_RETURN_IF_ERROR(
      ReadKind(node, path, {"kind", "low", "high", "mean", "stddev"}, ParseInitializerKind, &out->kind, &word));
  if (word) return absl::OkStatus();
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "low", path, &out->low));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "high", path, &out->high));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "mean", path, &out->mean));
  return ReadScalar(node, "stddev", path, &out->stddev);
}

absl::Status ReadOptimizerConfig(const YAML::Node& node, absl::string_view path, OptimizerConfig* out) {
  bool word = false;
  HYREC_RETURN_IF_ERROR(ReadKind(node, path,
                                 {"kind", "learning_rate", "weight_decay", "grad_clip", "value_clip", "epsilon",
                                  "initial_accumulator", "beta1", "beta2", "ftrl_beta", "ftrl_l1", "ftrl_l2"},
                                 ParseOptimizerKind, &out->kind, &word));
  if (word) return absl::OkStatus();
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "learning_rate", path, &out->learning_rate));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "weight_decay", path, &out->weight_decay));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "grad_clip", path, &out->grad_clip));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "value_clip", path, &out->value_clip));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "epsilon", path, &out->epsilon));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "initial_accumulator", path, &out->initial_accumulator));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "beta1", path, &out->beta1));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "beta2", path, &out->beta2));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "ftrl_beta", path, &out->ftrl_beta));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "ftrl_l1", path, &out->ftrl_l1));
  return ReadScalar(node, "ftrl_l2", path, &out->ftrl_l2);
}

absl::Status ReadAdmissionConfig(const YAML::Node& node, absl::string_view path, AdmissionConfig* out) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, path, {"probability", "min_count"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "probability", path, &out->probability));
  return ReadScalar(node, "min_count", path, &out->min_count);
}

absl::Status ReadRowPrecision(const YAML::Node& map, absl::string_view path, RowPrecision* out) {
  std::string name(RowPrecisionName(*out));
  HYREC_RETURN_IF_ERROR(ReadScalar(map, "precision", path, &name));
  auto precision = ParseRowPrecision(name);
  if (!precision.ok()) {
    return Annotate(precision.status(),
                    absl::StrCat(JoinKey(path, "precision"), " (", YamlWhere(map["precision"]), ")"));
  }
  *out = *precision;
  return absl::OkStatus();
}

absl::Status ReadEvictionConfig(const YAML::Node& node, absl::string_view path, EvictionConfig* out) {
  std::string name;
  if (node.IsScalar()) {
    name = node.Scalar();
  } else {
    HYREC_RETURN_IF_ERROR(CheckKeys(node, path, {"policy", "ttl_seconds", "lfu_aging_touches"}));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "policy", path, &name));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "ttl_seconds", path, &out->ttl_seconds));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "lfu_aging_touches", path, &out->lfu_aging_touches));
  }
  if (name.empty()) return absl::OkStatus();
  auto policy = ParseEvictionPolicy(name);
  if (!policy.ok()) {
    const bool word = node.IsScalar();
    return Annotate(policy.status(), absl::StrCat(word ? std::string(path) : JoinKey(path, "policy"), " (",
                                                  YamlWhere(word ? node : node["policy"]), ")"));
  }
  out->policy = *policy;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TableConfig>> ParseTableConfigs(const YAML::Node& node, absl::string_view path) {
  if (!node.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " (", YamlWhere(node), "): expected a list of tables"));
  }
  std::vector<TableConfig> tables;
  for (size_t k = 0; k < node.size(); ++k) {
    const YAML::Node t = node[k];
    const std::string where = absl::StrCat(path, "[", k, "]");
    HYREC_RETURN_IF_ERROR(CheckKeys(
        t, where,
        {"name", "dim", "precision", "seed", "capacity_rows", "initializer", "optimizer", "admission", "eviction"}));
    TableConfig table;
    table.seed = k;
    HYREC_RETURN_IF_ERROR(ReadScalar(t, "name", where, &table.name));
    HYREC_RETURN_IF_ERROR(ReadScalar(t, "dim", where, &table.dim));
    HYREC_RETURN_IF_ERROR(ReadRowPrecision(t, where, &table.precision));
    HYREC_RETURN_IF_ERROR(ReadScalar(t, "seed", where, &table.seed));
    HYREC_RETURN_IF_ERROR(ReadScalar(t, "capacity_rows", where, &table.capacity_rows));
    if (const YAML::Node init = t["initializer"]) {
      HYREC_RETURN_IF_ERROR(ReadInitializerConfig(init, JoinKey(where, "initializer"), &table.initializer));
    }
    if (const YAML::Node opt = t["optimizer"]) {
      HYREC_RETURN_IF_ERROR(ReadOptimizerConfig(opt, JoinKey(where, "optimizer"), &table.optimizer));
    }
    if (const YAML::Node adm = t["admission"]) {
      HYREC_RETURN_IF_ERROR(ReadAdmissionConfig(adm, JoinKey(where, "admission"), &table.admission));
    }
    if (const YAML::Node ev = t["eviction"]) {
      HYREC_RETURN_IF_ERROR(ReadEvictionConfig(ev, JoinKey(where, "eviction"), &table.eviction));
    }
    absl::Status valid = table.Validate();
    if (!valid.ok()) return Annotate(valid, absl::StrCat(where, " (", YamlWhere(t), ")"));
    tables.push_back(std::move(table));
  }
  return tables;
}

absl::StatusOr<std::vector<TableConfig>> ParseTableSpecs(absl::string_view specs) {
  std::vector<TableConfig> tables;
  for (absl::string_view spec : absl::StrSplit(specs, ',', absl::SkipWhitespace())) {
    spec = absl::StripAsciiWhitespace(spec);
    std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
    if (parts.size() < 2 || parts.size() > 5) {
      return absl::InvalidArgumentError(
          absl::StrCat("table spec '", spec, "': expected name:dim[:optimizer[:learning_rate[:precision]]]"));
    }
    TableConfig table;
    table.name = std::string(parts[0]);
    table.seed = tables.size();
    if (!absl::SimpleAtoi(parts[1], &table.dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("table spec '", spec, "': dim '", parts[1], "' is not an integer"));
    }
    if (parts.size() >= 3) {
      auto kind = ParseOptimizerKind(parts[2]);
      if (!kind.ok()) return Annotate(kind.status(), absl::StrCat("table spec '", spec, "'"));
      table.optimizer.kind = *kind;
    }
    if (parts.size() >= 5) {
      auto precision = ParseRowPrecision(parts[4]);
      if (!precision.ok()) return Annotate(precision.status(), absl::StrCat("table spec '", spec, "'"));
      table.precision = *precision;
    }
    if (parts.size() >= 4 && !absl::SimpleAtof(parts[3], &table.optimizer.learning_rate)) {
      return absl::InvalidArgumentError(
          absl::StrCat("table spec '", spec, "': learning rate '", parts[3], "' is not a number"));
    }
    HYREC_RETURN_IF_ERROR(table.Validate());
    for (const TableConfig& other : tables) {
      if (other.name == table.name) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table.name, "' is defined twice"));
      }
    }
    tables.push_back(std::move(table));
  }
  if (tables.empty()) return absl::InvalidArgumentError("no tables given");
  return tables;
}

}  // namespace hyrec::embedding_ps
