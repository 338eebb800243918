#include "hyrec/job/job_plan.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/env.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::job {
namespace {

constexpr uint64_t kEvalFirstIndex = 1ULL << 40;  // Held-out synthetic samples start here.
// Larger built-in dense models are refused before anything is allocated: with Adam's state they
// would need tens of GiB per worker.
constexpr uint64_t kMaxDenseParameters = 1ULL << 31;

uint64_t LinearParameters(uint64_t in, uint64_t out) { return in * out + out; }

uint64_t MlpParameters(uint64_t in, const std::vector<int>& hidden, uint64_t out) {
  uint64_t total = 0;
  for (int h : hidden) {
    total += LinearParameters(in, static_cast<uint64_t>(h));
    in = static_cast<uint64_t>(h);
  }
  return total + LinearParameters(in, out);
}

// Optimizer steps each worker takes and samples the job trains, for a synthetic source with a set
// number of epochs: the workers stop together when the first runs out of batches, so each takes
// floor(batches / workers) steps and the job trains the first steps x workers batches. 0, 0 when
// the source cannot say.
std::pair<int64_t, uint64_t> PlannedSteps(const data_loader::LoaderOptions& o, int workers) {
  if (o.source.format != data_loader::Format::kSynthetic || o.epochs == 0) return {0, 0};
  const uint64_t n = o.source.synthetic.num_samples;
  const uint64_t b = static_cast<uint64_t>(o.batch_size);
  const uint64_t tail = n % b;  // Samples of each epoch's last batch when it is partial.
  const uint64_t per_epoch = o.drop_last ? n / b : (n + b - 1) / b;
  if (per_epoch == 0) return {0, 0};
  const uint64_t batches = per_epoch * o.epochs;
  const uint64_t steps = batches / static_cast<uint64_t>(workers);
  const uint64_t trained = steps * static_cast<uint64_t>(workers);
  const uint64_t partials = (o.drop_last || tail == 0) ? 0 : trained / per_epoch;
  return {static_cast<int64_t>(steps), trained * b - partials * (b - tail)};
}

// The held-out split, or (`test`) the test split: synthetic test samples follow the held-out ones.
data_loader::LoaderOptions HeldOut(const JobSpec& spec, const data_loader::LoaderOptions& training, bool test) {
  data_loader::LoaderOptions o = training;
  o.source.kafka.reset();  // A stream job's held-out data is files (eval.files).
  o.source.synthetic.first_index = kEvalFirstIndex + (test ? spec.eval.samples : 0);
  o.source.synthetic.num_samples = test ? spec.eval.test_samples : spec.eval.samples;
  if (training.source.format != data_loader::Format::kSynthetic)
    o.source.files = test ? spec.eval.test_files : spec.eval.files;
  // A held-out csv file may have no header: the training data's names the columns.
  if (training.source.format == data_loader::Format::kCsv && training.source.csv.header &&
      !training.source.files.empty()) {
    o.source.csv.header_file = training.source.files[0];
  }
  o.num_workers = 1;
  o.epochs = 1;
  o.shuffle = false;
  o.drop_last = false;
  return o;
}

}  // namespace

absl::Status SplitHostPort(const std::string& address, absl::string_view what, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  int p = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 ||
      p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", address, "' is not host:port"));
  }
  *host = address.substr(0, colon);
  *port = p;
  return absl::OkStatus();
}

uint64_t DenseParameterCount(const WorkerPlan& w) {
  const uint64_t slots = w.slot_dims.size();
  if (w.model.kind == "dlrm") {
    const uint64_t d = static_cast<uint64_t>(w.model.embedding_dim);
    uint64_t total = 0;
    if (w.num_dense > 0) total += MlpParameters(static_cast<uint64_t>(w.num_dense), w.model.bottom, d);
    for (int dim : w.slot_dims) {
      if (static_cast<uint64_t>(dim) != d) total += static_cast<uint64_t>(dim) * d;  // Projection, no bias.
    }
    const uint64_t features = slots + (w.num_dense > 0 ? 1 : 0);
    const uint64_t pairs = features * (features - 1) / 2;
    return total + MlpParameters(d * (w.num_dense > 0 ? 1 : slots) + pairs, w.model.top, 1);
  }
  if (w.model.kind == "lr") return LinearParameters(static_cast<uint64_t>(w.num_dense), 1);
  if (UsesWideTables(w.model.kind)) {
    // A linear map of the dense features; deepfm and fm project the embeddings to embedding_dim
    // (when their dim differs) for the pairwise term; wide_deep and deepfm add a deep MLP.
    const uint64_t d = static_cast<uint64_t>(w.model.embedding_dim);
    const uint64_t deep_slots = slots - static_cast<uint64_t>(w.wide_slots);
    uint64_t total = LinearParameters(static_cast<uint64_t>(w.num_dense), 1);
    uint64_t width = static_cast<uint64_t>(w.num_dense);
    for (uint64_t s = 0; s < deep_slots; ++s) {
      const uint64_t dim = static_cast<uint64_t>(w.slot_dims[s]);
      width += dim;
      if (w.model.kind != "wide_deep" && dim != d) total += dim * d;
    }
    if (w.model.kind != "fm") total += MlpParameters(width, w.model.top, 1);
    return total;
  }
  if (w.model.kind == "dcn") {
    uint64_t width = static_cast<uint64_t>(w.num_dense);
    for (int dim : w.slot_dims) width += static_cast<uint64_t>(dim);
    const std::vector<int> hidden(w.model.top.begin(), w.model.top.end() - 1);
    const uint64_t deep_out = static_cast<uint64_t>(w.model.top.back());
    return static_cast<uint64_t>(w.model.cross_layers) * LinearParameters(width, width) +
           MlpParameters(width, hidden, deep_out) + LinearParameters(width + deep_out, 1);
  }
  return 0;
}

SecurityOptions RoleSecurity(const SecuritySpec& security, const Identity& identity, const std::string& certs_dir) {
  if (!security.mtls) return SecurityOptions();
  const std::string dir = certs_dir.empty() ? security.dir : certs_dir;
  SecurityOptions options = SecurityInDirectory(dir, identity);
  if (security.tokens && (identity.role == Role::kPs || identity.role == Role::kLoader)) {
    options.token_secret_file = JoinPath(dir, "token.secret");
  }
  return options;
}

bool UsesWideTables(const std::string& kind) { return kind == "wide_deep" || kind == "deepfm" || kind == "fm"; }

namespace {

// How the job's features reach its tables, in the batch and on the PS: per slot its table,
// pooling and hash namespace; the tables the PS serves (a wide model adds a dim-1 copy of each,
// read by a copy of each slot).
struct SlotLayout {
  std::vector<int> hash_slots;  // Per slot: the slot whose hash seeds its ids.
  bool shared = false;          // Some table serves several features.
  bool wide = false;
  std::vector<TableSpec> tables;  // The PS's: the job's, then the wide copies.
  std::vector<int> slot_tables;   // Per batch slot (the copies after the job's).
  std::vector<int> slot_copies;   // Per copy: the slot it copies.
  std::vector<Pooling> pooling;   // Per batch slot.
  std::vector<std::string> features;
};

absl::StatusOr<SlotLayout> LayOutSlots(const JobSpec& spec) {
  const int slots = static_cast<int>(spec.features.size());
  const int tables = static_cast<int>(spec.tables.size());
  SlotLayout l;
  // Per table: the slot whose hash seeds its ids (its first feature in slot order), so that the
  // features of a shared table give one token one id.
  std::map<std::string, int> slot_of;
  for (int s = 0; s < slots; ++s) slot_of[spec.features[s]] = s;
  l.slot_tables.assign(slots, -1);
  l.hash_slots.assign(slots, -1);
  l.pooling.assign(slots, Pooling::kSum);
  std::vector<int> namespace_of(tables, slots);
  for (int t = 0; t < tables; ++t) {
    for (const TableFeature& f : spec.tables[t].features) {
      const int s = slot_of.at(f.name);
      l.slot_tables[s] = t;
      l.pooling[s] = f.pooling;
      namespace_of[t] = std::min(namespace_of[t], s);
    }
  }
  for (int s = 0; s < slots; ++s) {
    l.hash_slots[s] = namespace_of[l.slot_tables[s]];
    l.shared = l.shared || l.hash_slots[s] != s;
  }
  l.tables = spec.tables;
  l.features = spec.features;
  l.wide = UsesWideTables(spec.model.kind);
  if (!l.wide) return l;
  for (const TableSpec& t : spec.tables) {
    TableSpec w = t;
    w.config.name = t.config.name + "_wide";
    for (const TableSpec& other : spec.tables) {
      if (other.config.name == w.config.name) {
        return absl::InvalidArgumentError(absl::StrCat(spec.source_name, ": table '", w.config.name,
                                                       "' is the name of table '", t.config.name,
                                                       "''s wide part (model.kind ", spec.model.kind, ")"));
      }
    }
    w.config.dim = 1;
    w.config.initializer.kind = embedding_ps::InitializerKind::kZeros;
    l.tables.push_back(w);
  }
  for (int s = 0; s < slots; ++s) {
    l.slot_copies.push_back(s);
    l.slot_tables.push_back(tables + l.slot_tables[s]);
    l.pooling.push_back(Pooling::kSum);
    l.features.push_back(spec.features[s] + "_wide");
  }
  return l;
}

absl::StatusOr<data_loader::LoaderOptions> PlanLoader(const JobSpec& spec, const SlotLayout& layout) {
  data_loader::LoaderOptions loader = spec.loader;
  loader.num_workers = spec.train.workers;
  loader.num_shards = spec.ps.shards;
  loader.slot_tables = layout.slot_tables;
  loader.slot_copies = layout.slot_copies;
  if (layout.shared) {
    loader.source.criteo.hash_slots = layout.hash_slots;
    loader.source.libsvm.hash_slots = layout.hash_slots;
    loader.source.csv.hash_slots = layout.hash_slots;
  }
  HYREC_RETURN_IF_ERROR(Annotate(loader.Validate(), spec.source_name));
  return loader;
}

PsShardPlan PlanPsShard(const JobSpec& spec, const std::vector<TableSpec>& tables, int index) {
  PsShardPlan shard;
  shard.shard_index = index;
  shard.num_shards = spec.ps.shards;
  shard.store.capacity_rows = spec.ps.capacity_rows;
  shard.store.capacity_bytes = spec.ps.capacity_bytes;
  shard.store.num_stripes = spec.ps.num_stripes;
  shard.store.admission_sketch_counters = spec.ps.admission_sketch_counters;
  shard.store.track_changes = spec.serving.takes_deltas();
  if (!spec.ps.disk_dir.empty()) {
    shard.store.disk.path = JoinPath(spec.ps.disk_dir, absl::StrCat("ps-", index, ".tier"));
    shard.store.disk.capacity_bytes = spec.ps.disk_capacity_bytes;
    shard.store.disk.queue_depth = spec.ps.disk_queue_depth;
  }
  shard.checkpoint_root = spec.checkpoint.dir;
  shard.export_root = spec.serving.dir;
  if (spec.ps.update_log && !spec.checkpoint.dir.empty()) {
    const std::string root =
        spec.ps.update_log_dir.empty() ? JoinPath(spec.checkpoint.dir, "update-log") : spec.ps.update_log_dir;
    shard.update_log_dir = JoinPath(root, absl::StrCat("ps-", shard.shard_index));
    shard.update_log_sync = spec.ps.update_log_sync;
    shard.update_log_sync_interval_seconds = spec.ps.update_log_sync_interval_seconds;
  }
  for (const TableSpec& t : tables) {
    embedding_ps::TableConfig config = t.config;
    // Each shard holds its share of the table's rows, rounded up.
    config.capacity_rows = (t.capacity_rows + spec.ps.shards - 1) / spec.ps.shards;
    shard.store.tables.push_back(config);
  }
  shard.max_ids_per_request = spec.ps.max_ids_per_request;
  shard.threads = spec.ps.threads;
  return shard;
}

// A learning-rate schedule without decay_steps decays over the job's steps, when they are known.
absl::Status PlanSchedule(const JobSpec& spec, int64_t steps, LrSchedule* schedule) {
  if (schedule->kind == LrSchedule::Kind::kConstant || schedule->decay_steps != 0) return absl::OkStatus();
  if (steps == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.source_name,
                     ": train.dense_optimizer.schedule.decay_steps must be set: the job's number of steps "
                     "is known in advance only for a synthetic source with loader.epochs > 0"));
  }
  schedule->decay_steps = steps;
  if (schedule->decay_steps <= schedule->warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat(spec.source_name, ": train.dense_optimizer.schedule.warmup_steps (",
                                                   schedule->warmup_steps, ") is not below the job's ", steps,
                                                   " steps per worker"));
  }
  return absl::OkStatus();
}

// Every worker's plan but its rank.
absl::StatusOr<WorkerPlan> PlanWorker(const JobSpec& spec, const SlotLayout& layout,
                                      const data_loader::LoaderOptions& loader) {
  const auto [steps, samples] = PlannedSteps(loader, spec.train.workers);
  WorkerPlan worker;
  worker.world_size = spec.train.workers;
  for (const TableSpec& t : layout.tables) {
    worker.table_names.push_back(t.config.name);
    worker.table_dims.push_back(t.config.dim);
  }
  worker.feature_names = layout.features;
  worker.slot_tables = layout.slot_tables;
  worker.pooling = layout.pooling;
  for (int t : layout.slot_tables) worker.slot_dims.push_back(layout.tables[t].config.dim);
  worker.wide_slots = layout.wide ? static_cast<int>(spec.features.size()) : 0;
  worker.num_dense = spec.loader.source.num_dense();
  worker.embedding_staleness = spec.train.embedding_staleness;
  worker.model = spec.model;
  worker.dense_optimizer = spec.train.dense_optimizer;
  worker.seed = spec.train.seed;
  worker.device = spec.train.device;
  worker.log_every_batches = spec.train.log_every_batches;
  worker.sync_timeout_seconds = spec.train.sync_timeout_seconds;
  worker.batch_timeout_seconds = spec.train.batch_timeout_seconds;
  worker.heal_timeout_seconds = spec.train.workers > 1 ? spec.train.heal_timeout_seconds : 0;
  worker.ps_wire_fp16 = spec.ps.wire_fp16;
  if (spec.ps.update_log && !spec.checkpoint.dir.empty()) {
    worker.ps_recovery_timeout_seconds = spec.ps.recovery_timeout_seconds;
    worker.update_log_max_bytes = spec.ps.update_log_max_bytes;
  }
  worker.planned_steps = steps;
  worker.planned_samples = samples;
  worker.epochs = spec.loader.epochs;
  worker.eval = spec.eval;
  worker.checkpoint = spec.checkpoint;
  worker.serving = spec.serving;
  worker.stream = spec.loader.source.kafka;
  worker.synthetic = spec.loader.source.format == data_loader::Format::kSynthetic;
  worker.has_eval_data = worker.synthetic ? spec.eval.samples > 0 : !spec.eval.files.empty();
  worker.eval_loader = HeldOut(spec, loader, /*test=*/false);
  worker.has_test_data = worker.synthetic ? spec.eval.test_samples > 0 : !spec.eval.test_files.empty();
  worker.test_loader = HeldOut(spec, loader, /*test=*/true);
  HYREC_RETURN_IF_ERROR(PlanSchedule(spec, steps, &worker.dense_optimizer.schedule));
  const uint64_t parameters = DenseParameterCount(worker);
  if (parameters > kMaxDenseParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.source_name, ": model (", spec.model.kind, ", model.bottom/top/embedding_dim) would have ",
                     parameters, " dense parameters, more than ", kMaxDenseParameters, "; make its layers narrower"));
  }
  return worker;
}

absl::StatusOr<Endpoints> PlanEndpoints(const JobSpec& spec) {
  Endpoints e;
  e.ps = spec.cluster.ps;
  for (int i = static_cast<int>(e.ps.size()); i < spec.ps.shards; ++i) {
    e.ps.push_back(absl::StrCat("127.0.0.1:", 7000 + i));
  }
  e.loader = spec.cluster.loader;
  e.startup_timeout_seconds = spec.cluster.startup_timeout_seconds;
  e.keepalive_seconds = spec.cluster.keepalive_seconds;
  std::string host;
  int port = 0;
  for (size_t i = 0; i < e.ps.size(); ++i) {
    HYREC_RETURN_IF_ERROR(SplitHostPort(e.ps[i], absl::StrCat("cluster.ps[", i, "]"), &host, &port));
  }
  HYREC_RETURN_IF_ERROR(SplitHostPort(e.loader, "cluster.loader", &host, &port));
  HYREC_RETURN_IF_ERROR(SplitHostPort(spec.cluster.master, "cluster.master", &e.master_addr, &e.master_port));
  return e;
}

}  // namespace

absl::StatusOr<JobPlan> Plan(const JobSpec& spec) {
  HYREC_RETURN_IF_ERROR(Annotate(ValidateJobSpec(spec), spec.source_name));
  JobPlan plan;
  plan.spec = spec;
  HYREC_ASSIGN_OR_RETURN(const SlotLayout layout, LayOutSlots(spec));
  HYREC_ASSIGN_OR_RETURN(plan.loader.options, PlanLoader(spec, layout));
  for (int i = 0; i < spec.ps.shards; ++i) plan.ps.push_back(PlanPsShard(spec, layout.tables, i));
  HYREC_ASSIGN_OR_RETURN(WorkerPlan worker, PlanWorker(spec, layout, plan.loader.options));
  for (int r = 0; r < spec.train.workers; ++r) {
    worker.rank = r;
    plan.workers.push_back(worker);
  }
  HYREC_ASSIGN_OR_RETURN(plan.endpoints, PlanEndpoints(spec));
  return plan;
}

absl::StatusOr<JobPlan> PlanJobFile(const std::string& path, const std::vector<std::string>& overrides) {
  HYREC_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(path, overrides));
  return Plan(spec);
}

absl::Status SetEndpoints(const std::vector<std::string>& ps, const std::string& loader, const std::string& master_addr,
                          int master_port, JobPlan* plan) {
  std::string host;
  int port = 0;
  if (!ps.empty()) {
    if (ps.size() != plan->ps.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ps.size(), " PS addresses given for the job's ", plan->ps.size(), " shards (ps.shards)"));
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      HYREC_RETURN_IF_ERROR(SplitHostPort(ps[i], absl::StrCat("PS address ", i), &host, &port));
    }
    plan->endpoints.ps = ps;
  }
  if (!loader.empty()) {
    HYREC_RETURN_IF_ERROR(SplitHostPort(loader, "loader address", &host, &port));
    plan->endpoints.loader = loader;
  }
  if (!master_addr.empty()) plan->endpoints.master_addr = master_addr;
  if (master_port != 0) {
    if (master_port < 1 || master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("master port ", master_port, " is not in [1, 65535]"));
    }
    plan->endpoints.master_port = master_port;
  }
  return absl::OkStatus();
}

}  // namespace hyrec::job
