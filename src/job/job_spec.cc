#include "hyrec/job/job_spec.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/enum_names.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/data_loader/config.h"

namespace hyrec::job {
namespace {

constexpr int kMaxLayerWidth = 1 << 16;

absl::Status Invalid(absl::string_view key, const YAML::Node& node, absl::string_view what) {
  const std::string where = YamlWhere(node);
  return absl::InvalidArgumentError(absl::StrCat(key, where.empty() ? "" : absl::StrCat(" (", where, ")"), ": ", what));
}

// The shorthand keys of model, ps and train that give every table its defaults.
struct TableDefaults {
  int dim = 16;
  Pooling pooling = Pooling::kSum;
  embedding_ps::OptimizerConfig optimizer;
  embedding_ps::InitializerConfig initializer;
  embedding_ps::RowPrecision precision = embedding_ps::RowPrecision::kFp32;
};

absl::Status ReadPooling(const YAML::Node& map, absl::string_view key, absl::string_view path, Pooling* out) {
  std::string name(PoolingName(*out));
  HYREC_RETURN_IF_ERROR(ReadScalar(map, key, path, &name));
  auto parsed = ParsePooling(name);
  if (!parsed.ok()) return Invalid(JoinKey(path, key), map[std::string(key)], parsed.status().message());
  *out = *parsed;
  return absl::OkStatus();
}

absl::Status ReadModel(const YAML::Node& node, ModelSpec* model, TableDefaults* defaults) {
  HYREC_RETURN_IF_ERROR(
      CheckKeys(node, "model",
                {"kind", "embedding_dim", "bottom", "top", "pooling", "cross_layers", "dropout", "options", "path"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "kind", "model", &model->kind));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "path", "model", &model->path));
  if (model->kind == "torchscript" && model->path.empty()) {
    return Invalid("model.path", node["kind"],
                   "model.kind torchscript needs model.path: the TorchScript file of the module (torch.jit.save)");
  }
  if (model->kind != "torchscript" && !model->path.empty()) {
    return Invalid("model.path", node["path"], "is read only with model.kind: torchscript");
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "embedding_dim", "model", &model->embedding_dim));
  HYREC_RETURN_IF_ERROR(ReadIntList(node, "bottom", "model", 1, kMaxLayerWidth, &model->bottom));
  HYREC_RETURN_IF_ERROR(ReadIntList(node, "top", "model", 1, kMaxLayerWidth, &model->top));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "cross_layers", "model", &model->cross_layers));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dropout", "model", &model->dropout));
  if (!(model->dropout >= 0 && model->dropout < 1))
    return Invalid("model.dropout", node["dropout"], "must be in [0, 1)");
  HYREC_RETURN_IF_ERROR(ReadPooling(node, "pooling", "model", &defaults->pooling));
  if (const YAML::Node options = node["options"]) {
    if (!options.IsMap()) return Invalid("model.options", options, "expected a mapping (the model's own settings)");
    YAML::Emitter out;
    out << options;
    model->options_yaml = out.c_str();
  }
  if (model->kind.empty()) return Invalid("model.kind", node["kind"], "must not be empty");
  if (model->embedding_dim < 1 || model->embedding_dim > 4096) {
    return Invalid("model.embedding_dim", node["embedding_dim"], "must be in [1, 4096]");
  }
  if (model->top.empty()) return Invalid("model.top", node["top"], "needs at least one layer");
  if (model->cross_layers < 0 || model->cross_layers > 64) {
    return Invalid("model.cross_layers", node["cross_layers"], "must be in [0, 64]");
  }
  defaults->dim = model->embedding_dim;
  return absl::OkStatus();
}

// ps.update_log as a mapping: {enabled, dir, sync, sync_interval_seconds}.
absl::Status ReadUpdateLog(const YAML::Node& node, PsSpec* ps) {
  HYREC_RETURN_IF_ERROR(
      CheckKeys(node, "ps.update_log", {"enabled", "dir", "sync", "sync_interval_seconds", "max_bytes"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "enabled", "ps.update_log", &ps->update_log));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dir", "ps.update_log", &ps->update_log_dir));
  std::string sync = embedding_ps::LogSyncName(ps->update_log_sync);
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "sync", "ps.update_log", &sync));
  HYREC_RETURN_IF_ERROR(
      ReadScalar(node, "sync_interval_seconds", "ps.update_log", &ps->update_log_sync_interval_seconds));
  if (!FindName(embedding_ps::kLogSyncNames, sync, &ps->update_log_sync)) {
    return Invalid("ps.update_log.sync", node["sync"], absl::StrCat("must be ", NameList(embedding_ps::kLogSyncNames)));
  }
  if (!(ps->update_log_sync_interval_seconds > 0 && ps->update_log_sync_interval_seconds <= 3600)) {
    return Invalid("ps.update_log.sync_interval_seconds", node["sync_interval_seconds"], "must be in (0, 3600]");
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "max_bytes", "ps.update_log", &ps->update_log_max_bytes));
  if (ps->update_log_max_bytes != 0 && ps->update_log_max_bytes < (uint64_t{1} << 20)) {
    return Invalid("ps.update_log.max_bytes", node["max_bytes"], "must be 0 (no bound) or at least 1048576 (1 MiB)");
  }
  return absl::OkStatus();
}

absl::Status ReadDisk(const YAML::Node& node, PsSpec* ps) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, "ps.disk", {"dir", "capacity_bytes", "queue_depth"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dir", "ps.disk", &ps->disk_dir));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "capacity_bytes", "ps.disk", &ps->disk_capacity_bytes));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "queue_depth", "ps.disk", &ps->disk_queue_depth));
  // A key that is absent is named at its mapping.
  auto at = [&](const char* key) { return node[key] ? node[key] : node; };
  if (ps->disk_dir.empty()) return Invalid("ps.disk.dir", at("dir"), "must name the directory of the tier's files");
  if (ps->disk_capacity_bytes < (uint64_t{1} << 20)) {
    return Invalid("ps.disk.capacity_bytes", at("capacity_bytes"), "must be at least 1048576 (1 MiB)");
  }
  if (ps->disk_queue_depth < 1 || ps->disk_queue_depth > 4096) {
    return Invalid("ps.disk.queue_depth", node["queue_depth"], "must be in [1, 4096]");
  }
  return absl::OkStatus();
}

absl::Status ReadPs(const YAML::Node& node, PsSpec* ps, TableDefaults* defaults) {
  HYREC_RETURN_IF_ERROR(
      CheckKeys(node, "ps",
                {"shards", "capacity_rows", "capacity_bytes", "num_stripes", "admission_sketch_counters",
                 "max_ids_per_request", "threads", "optimizer", "learning_rate", "init_stddev", "precision",
                 "update_log", "recovery_timeout_seconds", "wire_precision", "disk"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "shards", "ps", &ps->shards));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "capacity_rows", "ps", &ps->capacity_rows));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "capacity_bytes", "ps", &ps->capacity_bytes));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "num_stripes", "ps", &ps->num_stripes));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "admission_sketch_counters", "ps", &ps->admission_sketch_counters));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "max_ids_per_request", "ps", &ps->max_ids_per_request));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "threads", "ps", &ps->threads));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "recovery_timeout_seconds", "ps", &ps->recovery_timeout_seconds));
  if (!(ps->recovery_timeout_seconds > 0 && ps->recovery_timeout_seconds <= 86400)) {
    return Invalid("ps.recovery_timeout_seconds", node["recovery_timeout_seconds"], "must be in (0, 86400]");
  }
  std::string wire = ps->wire_fp16 ? "fp16" : "fp32";
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "wire_precision", "ps", &wire));
  if (wire != "fp32" && wire != "fp16") {
    return Invalid("ps.wire_precision", node["wire_precision"], "must be fp32 or fp16");
  }
  ps->wire_fp16 = wire == "fp16";
  if (const YAML::Node log = node["update_log"]; log && log.IsMap()) {
    HYREC_RETURN_IF_ERROR(ReadUpdateLog(log, ps));
  } else {
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "update_log", "ps", &ps->update_log));  // true or false
  }
  if (const YAML::Node disk = node["disk"]) HYREC_RETURN_IF_ERROR(ReadDisk(disk, ps));
  if (const YAML::Node optimizer = node["optimizer"]) {
    HYREC_RETURN_IF_ERROR(embedding_ps::ReadOptimizerConfig(optimizer, "ps.optimizer", &defaults->optimizer));
  }
  HYREC_RETURN_IF_ERROR(embedding_ps::ReadRowPrecision(node, "ps", &defaults->precision));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "learning_rate", "ps", &defaults->optimizer.learning_rate));
  if (node["learning_rate"] &&
      !(defaults->optimizer.learning_rate > 0 && std::isfinite(defaults->optimizer.learning_rate))) {
    return Invalid("ps.learning_rate", node["learning_rate"], "must be finite and > 0");
  }
  if (node["init_stddev"]) {
    defaults->initializer.kind = embedding_ps::InitializerKind::kNormal;
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "init_stddev", "ps", &defaults->initializer.stddev));
  }
  if (ps->shards < 1 || ps->shards > 1024) return Invalid("ps.shards", node["shards"], "must be in [1, 1024]");
  if (ps->num_stripes < 1 || ps->num_stripes > 65536) {
    return Invalid("ps.num_stripes", node["num_stripes"], "must be in [1, 65536]");
  }
  if (ps->max_ids_per_request < 1)
    return Invalid("ps.max_ids_per_request", node["max_ids_per_request"], "must be >= 1");
  if (ps->threads < 0 || ps->threads > 1024) return Invalid("ps.threads", node["threads"], "must be in [0, 1024]");
  return absl::OkStatus();
}

absl::Status ReadSchedule(const YAML::Node& node, absl::string_view path, LrSchedule* schedule) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, path, {"kind", "warmup_steps", "decay_steps", "final_fraction"}));
  std::string kind(LrScheduleName(schedule->kind));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "kind", path, &kind));
  if (!FindName(kLrScheduleNames, kind, &schedule->kind)) {
    return Invalid(JoinKey(path, "kind"), node["kind"],
                   absl::StrCat("'", kind, "' is not ", NameList(kLrScheduleNames)));
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "warmup_steps", path, &schedule->warmup_steps));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "decay_steps", path, &schedule->decay_steps));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "final_fraction", path, &schedule->final_fraction));
  if (schedule->warmup_steps < 0) return Invalid(JoinKey(path, "warmup_steps"), node["warmup_steps"], "must be >= 0");
  if (schedule->decay_steps < 0) return Invalid(JoinKey(path, "decay_steps"), node["decay_steps"], "must be >= 0");
  if (!(schedule->final_fraction >= 0 && schedule->final_fraction <= 1)) {
    return Invalid(JoinKey(path, "final_fraction"), node["final_fraction"], "must be in [0, 1]");
  }
  if (schedule->kind != LrSchedule::Kind::kConstant && schedule->decay_steps > 0 &&
      schedule->decay_steps <= schedule->warmup_steps) {
    return Invalid(JoinKey(path, "decay_steps"), node["decay_steps"],
                   absl::StrCat("must be more than warmup_steps (", schedule->warmup_steps, ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadDenseOptimizer(const YAML::Node& train, DenseOptimizerSpec* opt) {
  const std::string path = "train.dense_optimizer";
  const YAML::Node node = train["dense_optimizer"];
  std::string kind = NameOf(kDenseOptimizerNames, opt->kind);
  bool rate_in_map = false;
  if (node && node.IsMap()) {
    HYREC_RETURN_IF_ERROR(CheckKeys(
        node, path, {"kind", "learning_rate", "weight_decay", "momentum", "beta1", "beta2", "epsilon", "schedule"}));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "kind", path, &kind));
    rate_in_map = static_cast<bool>(node["learning_rate"]);
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "learning_rate", path, &opt->learning_rate));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "weight_decay", path, &opt->weight_decay));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "momentum", path, &opt->momentum));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "beta1", path, &opt->beta1));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "beta2", path, &opt->beta2));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "epsilon", path, &opt->epsilon));
    if (const YAML::Node schedule = node["schedule"]) {
      HYREC_RETURN_IF_ERROR(ReadSchedule(schedule, JoinKey(path, "schedule"), &opt->schedule));
    }
  } else {
    HYREC_RETURN_IF_ERROR(ReadScalar(train, "dense_optimizer", "train", &kind));
  }
  if (train["dense_learning_rate"]) {
    if (rate_in_map) {
      return Invalid("train.dense_learning_rate", train["dense_learning_rate"],
                     "given twice (also train.dense_optimizer.learning_rate); keep one");
    }
    HYREC_RETURN_IF_ERROR(ReadScalar(train, "dense_learning_rate", "train", &opt->learning_rate));
  }
  const YAML::Node at = node ? node : train;
  if (!FindName(kDenseOptimizerNames, kind, &opt->kind)) {
    return Invalid(node && node.IsMap() ? JoinKey(path, "kind") : path, node && node.IsMap() ? node["kind"] : at,
                   absl::StrCat("'", kind, "' is not ", NameList(kDenseOptimizerNames)));
  }
  if (!(opt->learning_rate > 0) || !std::isfinite(opt->learning_rate)) {
    return Invalid("train.dense_optimizer.learning_rate", at, "must be finite and > 0");
  }
  if (!(opt->weight_decay >= 0) || !std::isfinite(opt->weight_decay)) {
    return Invalid("train.dense_optimizer.weight_decay", at, "must be finite and >= 0");
  }
  if (!(opt->momentum >= 0 && opt->momentum < 1))
    return Invalid("train.dense_optimizer.momentum", at, "must be in [0, 1)");
  if (!(opt->beta1 >= 0 && opt->beta1 < 1) || !(opt->beta2 >= 0 && opt->beta2 < 1)) {
    return Invalid("train.dense_optimizer.beta1/beta2", at, "must be in [0, 1)");
  }
  if (!(opt->epsilon > 0) || !std::isfinite(opt->epsilon))
    return Invalid("train.dense_optimizer.epsilon", at, "must be finite and > 0");
  return absl::OkStatus();
}

absl::Status ReadTrain(const YAML::Node& node, TrainSpec* train) {
  HYREC_RETURN_IF_ERROR(
      CheckKeys(node, "train",
                {"workers", "embedding_staleness", "dense_optimizer", "dense_learning_rate", "log_every_batches",
                 "seed", "device", "sync_timeout_seconds", "batch_timeout_seconds", "heal_timeout_seconds"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "workers", "train", &train->workers));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "embedding_staleness", "train", &train->embedding_staleness));
  HYREC_RETURN_IF_ERROR(ReadDenseOptimizer(node, &train->dense_optimizer));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "log_every_batches", "train", &train->log_every_batches));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "seed", "train", &train->seed));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "device", "train", &train->device));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "sync_timeout_seconds", "train", &train->sync_timeout_seconds));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "batch_timeout_seconds", "train", &train->batch_timeout_seconds));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "heal_timeout_seconds", "train", &train->heal_timeout_seconds));
  if (!(train->heal_timeout_seconds >= 0 && train->heal_timeout_seconds <= 86400)) {
    return Invalid("train.heal_timeout_seconds", node["heal_timeout_seconds"], "must be in [0, 86400]");
  }
  if (train->workers < 1 || train->workers > 1024)
    return Invalid("train.workers", node["workers"], "must be in [1, 1024]");
  if (train->embedding_staleness < 0 || train->embedding_staleness > 64) {
    return Invalid("train.embedding_staleness", node["embedding_staleness"], "must be in [0, 64]");
  }
  if (train->log_every_batches < 1)
    return Invalid("train.log_every_batches", node["log_every_batches"], "must be >= 1");
  if (train->device != "cpu" && train->device != "cuda" && train->device != "auto") {
    return Invalid("train.device", node["device"], absl::StrCat("'", train->device, "' is not cpu, cuda or auto"));
  }
  for (auto [key, value] : {std::pair<const char*, double>{"sync_timeout_seconds", train->sync_timeout_seconds},
                            {"batch_timeout_seconds", train->batch_timeout_seconds}}) {
    if (!(value > 0 && value <= 86400)) return Invalid(JoinKey("train", key), node[key], "must be in (0, 86400]");
  }
  return absl::OkStatus();
}

absl::Status ReadEval(const YAML::Node& node, EvalSpec* eval) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, "eval",
                                  {"samples", "files", "test_files", "test_samples", "every_batches", "every_epoch",
                                   "patience", "metric", "timeout_seconds", "progressive_window"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "samples", "eval", &eval->samples));
  HYREC_RETURN_IF_ERROR(ReadStringList(node, "files", "eval", &eval->files));
  HYREC_RETURN_IF_ERROR(ReadStringList(node, "test_files", "eval", &eval->test_files));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "test_samples", "eval", &eval->test_samples));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "every_batches", "eval", &eval->every_batches));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "every_epoch", "eval", &eval->every_epoch));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "patience", "eval", &eval->patience));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "metric", "eval", &eval->metric));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "timeout_seconds", "eval", &eval->timeout_seconds));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "progressive_window", "eval", &eval->progressive_window));
  if (eval->progressive_window > 100'000'000) {
    return Invalid("eval.progressive_window", node["progressive_window"], "must be at most 100000000 samples");
  }
  if (eval->every_batches < 0) return Invalid("eval.every_batches", node["every_batches"], "must be >= 0");
  if (eval->patience < 0) return Invalid("eval.patience", node["patience"], "must be >= 0");
  if (eval->metric != "auc" && eval->metric != "log_loss") {
    return Invalid("eval.metric", node["metric"], absl::StrCat("'", eval->metric, "' is not auc or log_loss"));
  }
  if (eval->patience > 0 && eval->every_batches == 0 && !eval->every_epoch) {
    return Invalid("eval.patience", node["patience"],
                   "needs evaluations during training: eval.every_batches or "
                   "eval.every_epoch");
  }
  if (!(eval->timeout_seconds > 0 && eval->timeout_seconds <= 86400)) {
    return Invalid("eval.timeout_seconds", node["timeout_seconds"], "must be in (0, 86400]");
  }
  return absl::OkStatus();
}

absl::Status ReadCluster(const YAML::Node& node, ClusterSpec* cluster) {
  HYREC_RETURN_IF_ERROR(
      CheckKeys(node, "cluster",
                {"ps", "loader", "master", "startup_timeout_seconds", "keepalive_seconds", "services_exit_when_done"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "services_exit_when_done", "cluster", &cluster->services_exit_when_done));
  HYREC_RETURN_IF_ERROR(ReadStringList(node, "ps", "cluster", &cluster->ps));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "loader", "cluster", &cluster->loader));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "master", "cluster", &cluster->master));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "startup_timeout_seconds", "cluster", &cluster->startup_timeout_seconds));
  if (!(cluster->startup_timeout_seconds > 0 && cluster->startup_timeout_seconds <= 86400)) {
    return Invalid("cluster.startup_timeout_seconds", node["startup_timeout_seconds"], "must be in (0, 86400]");
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "keepalive_seconds", "cluster", &cluster->keepalive_seconds));
  if (!(cluster->keepalive_seconds == 0 || (cluster->keepalive_seconds >= 1 && cluster->keepalive_seconds <= 3600))) {
    return Invalid("cluster.keepalive_seconds", node["keepalive_seconds"], "must be 0 (off) or in [1, 3600]");
  }
  return absl::OkStatus();
}

// One entry of a table's `features`: a name, or {name, pooling}.
absl::Status ReadTableFeature(const YAML::Node& node, const std::string& where, Pooling default_pooling,
                              TableFeature* out) {
  out->pooling = default_pooling;
  if (node.IsScalar()) {
    out->name = node.Scalar();
  } else if (node.IsMap()) {
    HYREC_RETURN_IF_ERROR(CheckKeys(node, where, {"name", "pooling"}));
    HYREC_RETURN_IF_ERROR(ReadScalar(node, "name", where, &out->name));
    HYREC_RETURN_IF_ERROR(ReadPooling(node, "pooling", where, &out->pooling));
  } else {
    return Invalid(where, node, "expected a feature name or {name, pooling}");
  }
  if (out->name.empty()) return Invalid(where, node, "a feature needs a name");
  return absl::OkStatus();
}

absl::Status ReadTable(const YAML::Node& node, const std::string& where, int index, const TableDefaults& defaults,
                       TableSpec* table) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, where,
                                  {"name", "features", "dim", "precision", "pooling", "optimizer", "initializer",
                                   "admission", "eviction", "capacity_rows", "seed"}));
  embedding_ps::TableConfig& c = table->config;
  c.dim = defaults.dim;
  c.seed = static_cast<uint64_t>(index);
  c.optimizer = defaults.optimizer;
  c.initializer = defaults.initializer;
  c.precision = defaults.precision;
  HYREC_RETURN_IF_ERROR(embedding_ps::ReadRowPrecision(node, where, &c.precision));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "name", where, &c.name));
  if (c.name.empty()) return Invalid(JoinKey(where, "name"), node, "every table needs a name");
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dim", where, &c.dim));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "seed", where, &c.seed));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "capacity_rows", where, &table->capacity_rows));
  Pooling pooling = defaults.pooling;
  HYREC_RETURN_IF_ERROR(ReadPooling(node, "pooling", where, &pooling));
  if (const YAML::Node opt = node["optimizer"]) {
    HYREC_RETURN_IF_ERROR(embedding_ps::ReadOptimizerConfig(opt, JoinKey(where, "optimizer"), &c.optimizer));
  }
  if (const YAML::Node init = node["initializer"]) {
    HYREC_RETURN_IF_ERROR(embedding_ps::ReadInitializerConfig(init, JoinKey(where, "initializer"), &c.initializer));
  }
  if (const YAML::Node adm = node["admission"]) {
    HYREC_RETURN_IF_ERROR(embedding_ps::ReadAdmissionConfig(adm, JoinKey(where, "admission"), &c.admission));
  }
  if (const YAML::Node ev = node["eviction"]) {
    HYREC_RETURN_IF_ERROR(embedding_ps::ReadEvictionConfig(ev, JoinKey(where, "eviction"), &c.eviction));
  }
  const YAML::Node features = node["features"];
  const std::string fpath = JoinKey(where, "features");
  if (!features) return Invalid(fpath, node, "missing: list the features this table serves");
  if (!features.IsSequence() || features.size() == 0) {
    return Invalid(fpath, features, "expected a non-empty list of feature names");
  }
  for (size_t i = 0; i < features.size(); ++i) {
    TableFeature f;
    HYREC_RETURN_IF_ERROR(ReadTableFeature(features[i], absl::StrCat(fpath, "[", i, "]"), pooling, &f));
    table->features.push_back(std::move(f));
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return Invalid(where, node, valid.message());
  return absl::OkStatus();
}

absl::Status ReadTables(const YAML::Node& node, const TableDefaults& defaults, std::vector<TableSpec>* tables) {
  if (!node.IsSequence() || node.size() == 0) return Invalid("tables", node, "expected a non-empty list of tables");
  for (size_t k = 0; k < node.size(); ++k) {
    TableSpec table;
    HYREC_RETURN_IF_ERROR(ReadTable(node[k], absl::StrCat("tables[", k, "]"), static_cast<int>(k), defaults, &table));
    tables->push_back(std::move(table));
  }
  return absl::OkStatus();
}

// The job's loader section: ParseLoaderConfig's keys, less those the plan sets.
absl::Status ReadLoader(const YAML::Node& node, data_loader::LoaderOptions* loader) {
  if (!node.IsMap()) return Invalid("loader", node, "expected a mapping");
  const std::pair<const char*, const char*> planned[] = {
      {"num_workers", "train.workers sets it"},
      {"num_shards", "ps.shards sets it"},
      {"slot_tables", "list each table's features under `tables` instead"}};
  for (const auto& [key, instead] : planned) {
    if (node[key]) return Invalid(JoinKey("loader", key), node[key], absl::StrCat("not a job key: ", instead));
  }
  HYREC_ASSIGN_OR_RETURN(*loader, data_loader::ParseLoaderConfig(node, "loader"));
  return absl::OkStatus();
}

absl::Status ReadCheckpoint(const YAML::Node& node, CheckpointSpec* c) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, "checkpoint",
                                  {"dir", "every_steps", "every_seconds", "keep_last", "at_end", "on_interrupt",
                                   "fail_on_error", "timeout_seconds"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dir", "checkpoint", &c->dir));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "every_steps", "checkpoint", &c->every_steps));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "every_seconds", "checkpoint", &c->every_seconds));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "keep_last", "checkpoint", &c->keep_last));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "at_end", "checkpoint", &c->at_end));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "on_interrupt", "checkpoint", &c->on_interrupt));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "fail_on_error", "checkpoint", &c->fail_on_error));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "timeout_seconds", "checkpoint", &c->timeout_seconds));
  if (c->every_steps < 0) return Invalid("checkpoint.every_steps", node["every_steps"], "must be >= 0");
  if (!(c->every_seconds >= 0 && c->every_seconds <= 1e7)) {
    return Invalid("checkpoint.every_seconds", node["every_seconds"], "must be in [0, 1e7]");
  }
  if (c->keep_last < 1 || c->keep_last > 10000)
    return Invalid("checkpoint.keep_last", node["keep_last"], "must be in [1, 10000]");
  if (!(c->timeout_seconds > 0 && c->timeout_seconds <= 86400)) {
    return Invalid("checkpoint.timeout_seconds", node["timeout_seconds"], "must be in (0, 86400]");
  }
  return absl::OkStatus();
}

absl::Status ReadExport(const YAML::Node& node, ExportSpec* e) {
  HYREC_RETURN_IF_ERROR(CheckKeys(
      node, "export", {"dir", "delta_every_steps", "delta_every_seconds", "base_every_deltas", "keep_bases"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dir", "export", &e->dir));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "delta_every_steps", "export", &e->delta_every_steps));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "delta_every_seconds", "export", &e->delta_every_seconds));
  if (e->delta_every_steps < 0) return Invalid("export.delta_every_steps", node["delta_every_steps"], "must be >= 0");
  if (!(e->delta_every_seconds >= 0 && e->delta_every_seconds <= 1e7)) {
    return Invalid("export.delta_every_seconds", node["delta_every_seconds"], "must be in [0, 1e7]");
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "base_every_deltas", "export", &e->base_every_deltas));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "keep_bases", "export", &e->keep_bases));
  if (e->base_every_deltas < 0) return Invalid("export.base_every_deltas", node["base_every_deltas"], "must be >= 0");
  if (e->keep_bases < 1 || e->keep_bases > 10000)
    return Invalid("export.keep_bases", node["keep_bases"], "must be in [1, 10000]");
  return absl::OkStatus();
}

absl::Status ReadSecurity(const YAML::Node& node, SecuritySpec* security) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, "security", {"mode", "dir", "tokens"}));
  std::string mode = security->mtls ? "mtls" : "none";
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "mode", "security", &mode));
  if (mode != "mtls" && mode != "none") return Invalid("security.mode", node["mode"], "must be mtls or none");
  security->mtls = mode == "mtls";
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "dir", "security", &security->dir));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "tokens", "security", &security->tokens));
  if (security->mtls && security->dir.empty()) return Invalid("security.dir", node["dir"], "must name a directory");
  if (!security->mtls && security->tokens) {
    return Invalid("security.tokens", node["tokens"], "needs mode mtls (a token is never sent in plaintext)");
  }
  return absl::OkStatus();
}

absl::Status ParseInto(const YAML::Node& root, JobSpec* spec) {
  HYREC_RETURN_IF_ERROR(CheckKeys(
      root, "",
      {"loader", "features", "tables", "eval", "model", "ps", "train", "cluster", "checkpoint", "export", "security"}));
  if (const YAML::Node s = root["security"]) HYREC_RETURN_IF_ERROR(ReadSecurity(s, &spec->security));
  if (const YAML::Node c = root["checkpoint"]) HYREC_RETURN_IF_ERROR(ReadCheckpoint(c, &spec->checkpoint));
  if (const YAML::Node e = root["export"]) HYREC_RETURN_IF_ERROR(ReadExport(e, &spec->serving));
  if (!spec->serving.dir.empty() && spec->checkpoint.dir.empty()) {
    return Invalid("export.dir", root["export"]["dir"], "needs checkpoint.dir (an export is made from a checkpoint)");
  }
  if (spec->serving.takes_deltas() && spec->serving.dir.empty()) {
    return Invalid("export", root["export"], "deltas need export.dir");
  }
  if (!root["loader"]) return absl::InvalidArgumentError("missing key 'loader' (the training data)");
  HYREC_RETURN_IF_ERROR(ReadLoader(root["loader"], &spec->loader));
  TableDefaults defaults;
  defaults.optimizer.kind = embedding_ps::OptimizerKind::kAdagrad;
  defaults.optimizer.learning_rate = 0.05f;
  if (const YAML::Node model = root["model"]) HYREC_RETURN_IF_ERROR(ReadModel(model, &spec->model, &defaults));
  if (const YAML::Node ps = root["ps"]) HYREC_RETURN_IF_ERROR(ReadPs(ps, &spec->ps, &defaults));
  if (!spec->ps.disk_dir.empty()) {
    const YAML::Node disk = root["ps"]["disk"];
    if (spec->ps.capacity_rows == 0 && spec->ps.capacity_bytes == 0) {
      return Invalid("ps.disk", disk,
                     "needs ps.capacity_rows or ps.capacity_bytes: the rows a shard keeps in DRAM above its disk tier");
    }
    if (spec->serving.takes_deltas()) {
      return Invalid("ps.disk", disk,
                     "is not yet supported with export deltas (export.delta_every_steps, export.delta_every_seconds)");
    }
  }
  if (const YAML::Node train = root["train"]) HYREC_RETURN_IF_ERROR(ReadTrain(train, &spec->train));
  if (const YAML::Node eval = root["eval"]) HYREC_RETURN_IF_ERROR(ReadEval(eval, &spec->eval));
  if (const YAML::Node cluster = root["cluster"]) HYREC_RETURN_IF_ERROR(ReadCluster(cluster, &spec->cluster));
  spec->features = DefaultFeatureNames(spec->loader.source);
  if (root["features"]) {
    HYREC_RETURN_IF_ERROR(ReadStringList(root, "features", "", &spec->features));
    const int slots = spec->loader.source.num_slots();
    if (static_cast<int>(spec->features.size()) != slots) {
      return Invalid("features", root["features"],
                     absl::StrCat(spec->features.size(), " names for the source's ", slots, " sparse features"));
    }
  }
  if (const YAML::Node tables = root["tables"]) {
    HYREC_RETURN_IF_ERROR(ReadTables(tables, defaults, &spec->tables));
  } else {
    for (size_t k = 0; k < spec->features.size(); ++k) {  // Shorthand: a table per feature, named after it.
      TableSpec table;
      table.config.name = spec->features[k];
      table.config.dim = defaults.dim;
      table.config.seed = k;
      table.config.optimizer = defaults.optimizer;
      table.config.initializer = defaults.initializer;
      table.config.precision = defaults.precision;
      table.features.push_back(TableFeature{spec->features[k], defaults.pooling});
      absl::Status valid = table.config.Validate();
      if (!valid.ok()) return Annotate(valid, "the tables made from model.embedding_dim and ps");
      spec->tables.push_back(std::move(table));
    }
  }
  return ValidateJobSpec(*spec);
}

}  // namespace

absl::string_view PoolingName(Pooling pooling) {
  switch (pooling) {
    case Pooling::kSum:
      return "sum";
    case Pooling::kMean:
      return "mean";
    case Pooling::kSqrtN:
      return "sqrtn";
  }
  return "unknown";
}

absl::StatusOr<Pooling> ParsePooling(absl::string_view name) {
  if (name == "sum") return Pooling::kSum;
  if (name == "mean") return Pooling::kMean;
  if (name == "sqrtn") return Pooling::kSqrtN;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not sum, mean or sqrtn"));
}

double LrSchedule::Factor(int64_t step) const {
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == Kind::kConstant || decay_steps <= warmup_steps) return 1.0;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps));
  const double shape = kind == Kind::kLinear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return final_fraction + (1.0 - final_fraction) * shape;
}

std::vector<std::string> DefaultFeatureNames(const data_loader::SourceConfig& source) {
  if (source.format == data_loader::Format::kCsv) return source.csv.SlotNames();
  std::vector<std::string> names;
  const int slots = source.num_slots();
  for (int s = 0; s < slots; ++s) {
    names.push_back(source.format == data_loader::Format::kCriteo ? absl::StrCat("C", s + 1) : absl::StrCat("f", s));
  }
  return names;
}

namespace {

// A stream's records carry their timestamps; a file source has times from a csv time column.
bool SourceHasTimes(const data_loader::SourceConfig& source) {
  if (source.kafka.has_value()) return true;
  return source.format == data_loader::Format::kCsv &&
         std::any_of(source.csv.columns.begin(), source.csv.columns.end(),
                     [](const data_loader::CsvColumn& c) { return c.kind == data_loader::CsvColumn::Kind::kTime; });
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  HYREC_RETURN_IF_ERROR(spec.loader.Validate());
  const int slots = spec.loader.source.num_slots();
  if (static_cast<int>(spec.features.size()) != slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("features: ", spec.features.size(), " names for the source's ", slots, " sparse features"));
  }
  std::set<std::string> feature_names;
  for (const std::string& f : spec.features) {
    if (f.empty()) return absl::InvalidArgumentError("features: a feature name is empty");
    if (!feature_names.insert(f).second) {
      return absl::InvalidArgumentError(absl::StrCat("features: '", f, "' is named twice"));
    }
  }
  if (spec.tables.empty() && !spec.features.empty()) {
    return absl::InvalidArgumentError("tables: the job has sparse features but no embedding table");
  }
  if (spec.tables.size() > 256) return absl::InvalidArgumentError("tables: at most 256 tables");
  std::set<std::string> table_names, served;
  for (size_t k = 0; k < spec.tables.size(); ++k) {
    const TableSpec& t = spec.tables[k];
    const std::string where = absl::StrCat("tables[", k, "] '", t.config.name, "'");
    HYREC_RETURN_IF_ERROR(Annotate(t.config.Validate(), where));
    if (t.config.eviction.policy == embedding_ps::EvictionPolicy::kTtl && !SourceHasTimes(spec.loader.source)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": eviction ttl goes by the samples' times, and this source has none; declare a csv column of "
                       "type time (docs/data.md)"));
    }
    if (!table_names.insert(t.config.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a table of that name is defined before"));
    }
    for (const TableFeature& f : t.features) {
      if (feature_names.count(f.name) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": feature '", f.name,
                                                       "' is not one of the job's features (",
                                                       absl::StrJoin(spec.features, ", "), ")"));
      }
      if (!served.insert(f.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": feature '", f.name, "' is already served by another table"));
      }
    }
  }
  std::vector<std::string> unserved;
  for (const std::string& f : spec.features) {
    if (served.count(f) == 0) unserved.push_back(f);
  }
  if (!unserved.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tables: no table serves feature(s) ", absl::StrJoin(unserved, ", "),
                                                   "; add each to one table's features"));
  }
  if (spec.eval.every_batches < 0) return absl::InvalidArgumentError("eval.every_batches must be >= 0");
  if (!spec.cluster.ps.empty() && static_cast<int>(spec.cluster.ps.size()) != spec.ps.shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.ps lists ", spec.cluster.ps.size(), " addresses for ps.shards ", spec.ps.shards));
  }
  if (spec.loader.source.format != data_loader::Format::kSynthetic) {
    for (const std::string& f : spec.eval.files) {
      if (f.empty()) return absl::InvalidArgumentError("eval.files: an empty file name");
    }
    for (const std::string& f : spec.eval.test_files) {
      if (f.empty()) return absl::InvalidArgumentError("eval.test_files: an empty file name");
    }
    if (spec.eval.test_samples > 0) {
      return absl::InvalidArgumentError(
          "eval.test_samples is for the synthetic source; a file source takes eval.test_files");
    }
  } else if (!spec.eval.test_files.empty()) {
    return absl::InvalidArgumentError(
        "eval.test_files is for file sources; the synthetic source takes eval.test_samples");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(const YAML::Node& root, absl::string_view source_name) {
  JobSpec spec;
  spec.source_name = std::string(source_name);
  absl::Status s = CatchYamlErrors("job", [&] { return ParseInto(root, &spec); });
  if (!s.ok()) return Annotate(s, source_name);
  return spec;
}

absl::StatusOr<JobSpec> ParseJobSpecText(const std::string& yaml, absl::string_view source_name) {
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml, source_name));
  HYREC_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(root, source_name));
  spec.text = yaml;
  return spec;
}

namespace {

// Applies one "key.path=value" to `root` (a mapping, or null for an empty file).
absl::Status ApplyOverride(const std::string& assignment, YAML::Node* root) {
  const size_t eq = assignment.find('=');
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": ", why));
  };
  if (eq == std::string::npos || eq == 0) return bad("expected key.path=value (for example train.workers=2)");
  const std::vector<std::string> keys = absl::StrSplit(assignment.substr(0, eq), '.');
  const std::string text = std::string(absl::StripAsciiWhitespace(assignment.substr(eq + 1)));
  for (const std::string& k : keys) {
    if (k.empty()) return bad("an empty key in the path");
  }
  YAML::Node value;
  if (absl::StartsWith(text, "[") || absl::StartsWith(text, "{")) {
    absl::StatusOr<YAML::Node> parsed = ParseYaml(text, "--set " + assignment);
    if (!parsed.ok()) return parsed.status();
    value = *parsed;
  } else {
    value = YAML::Node(text);  // A scalar, read as the key's type when the job is checked.
  }
  return CatchYamlErrors("--set " + assignment, [&]() -> absl::Status {
    YAML::Node node = *root;
    std::string path;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      path = path.empty() ? keys[i] : absl::StrCat(path, ".", keys[i]);
      if (!node.IsNull() && !node.IsMap()) return bad(absl::StrCat(path, " is not a mapping"));
      YAML::Node next = node[keys[i]];
      if (!next.IsDefined() || next.IsNull()) next = YAML::Node(YAML::NodeType::Map);
      if (!next.IsMap()) return bad(absl::StrCat(path, " is not a mapping"));
      node[keys[i]] = next;
      node.reset(next);
    }
    if (!node.IsNull() && !node.IsMap()) return bad(absl::StrCat(path.empty() ? "the job" : path, " is not a mapping"));
    node[keys.back()] = value;
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path, const std::vector<std::string>& overrides) {
  HYREC_ASSIGN_OR_RETURN(const std::string file_text, ReadConfigText(path));
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(file_text, path));
  if (!overrides.empty() && (!root.IsDefined() || root.IsNull())) root = YAML::Node(YAML::NodeType::Map);
  for (const std::string& o : overrides) HYREC_RETURN_IF_ERROR(ApplyOverride(o, &root));
  const std::string source =
      overrides.empty() ? path : absl::StrCat(path, " with --set ", absl::StrJoin(overrides, " --set "));
  HYREC_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(root, source));
  spec.overrides = overrides;
  if (overrides.empty()) {
    spec.text = file_text;
  } else {
    YAML::Emitter out;
    out << root;
    spec.text = absl::StrCat("# ", path, " with --set ", absl::StrJoin(overrides, " --set "), "\n", out.c_str(), "\n");
  }
  return spec;
}

}  // namespace hyrec::job
