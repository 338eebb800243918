#include "hyrec/job/capacity.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/optimizer.h"

namespace hyrec::job {
namespace {

std::string ThroughputJson(const ThroughputPlan& t);

constexpr double kGiB = 1024.0 * 1024 * 1024;
// The logical rows of a table with no size of its own in a store bounded as a whole: as many as
// the bound holds.
constexpr uint64_t kUnknownRows = uint64_t{1} << 62;
constexpr double kPodHeadroom = 1.2;

}  // namespace

double AllocatableGiB(const MachineType& machine) { return machine.memory_gib * 0.9 - 1; }

const std::vector<MachineType>& GkeMachineTypes() {
  // Published vCPUs, memory and default egress bandwidth (without Tier_1 networking).
  static const auto* types = new std::vector<MachineType>{
      {"m3-megamem-64", 64, 976, 32, 0, 0, ""},
      {"m3-megamem-128", 128, 1952, 32, 0, 0, ""},
      {"m3-ultramem-32", 32, 976, 32, 0, 0, ""},
      {"m3-ultramem-64", 64, 1952, 32, 0, 0, ""},
      {"m3-ultramem-128", 128, 3904, 32, 0, 0, ""},
      {"m2-megamem-416", 416, 5888, 32, 0, 0, ""},
      {"m2-ultramem-208", 208, 5888, 32, 0, 0, ""},
      {"m2-ultramem-416", 416, 11776, 32, 0, 0, ""},
      {"n2-highmem-32", 32, 256, 32, 0, 0, ""},
      {"c3-standard-22", 22, 88, 23, 0, 0, ""},
      {"c3-standard-44", 44, 176, 32, 0, 0, ""},
      {"c3-standard-88", 88, 352, 62, 0, 0, ""},
      {"c2-standard-30", 30, 120, 32, 0, 0, ""},
      {"c2-standard-60", 60, 240, 32, 0, 0, ""},
      {"e2-standard-8", 8, 32, 16, 0, 0, ""},
      {"a2-highgpu-1g", 12, 85, 24, 0, 1, "nvidia-tesla-a100"},
      {"a2-highgpu-8g", 96, 680, 100, 0, 8, "nvidia-tesla-a100"},
      {"a2-ultragpu-8g", 96, 1360, 100, 0, 8, "nvidia-a100-80gb"},
      {"a3-highgpu-8g", 208, 1872, 200, 0, 8, "nvidia-h100-80gb"},
      {"a3-megagpu-8g", 208, 1872, 200, 0, 8, "nvidia-h100-mega-80gb"},
  };
  return *types;
}

absl::StatusOr<MachineType> FindMachineType(const std::vector<MachineType>& types, const std::string& name,
                                            absl::string_view key) {
  std::vector<std::string> known;
  for (const MachineType& m : types) {
    if (m.name == name) return m;
    known.push_back(m.name);
  }
  const std::string close = ClosestWord(name, known);
  return absl::InvalidArgumentError(absl::StrCat(key, "=", name, ": not a machine type hyrec knows",
                                                 close.empty() ? "" : absl::StrCat(" (did you mean ", close, "?)"),
                                                 "; known: ", absl::StrJoin(known, ", ")));
}

absl::StatusOr<std::vector<MachineType>> LoadMachineTypes(const std::string& path) {
  HYREC_ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlFile(path));
  std::vector<MachineType> types;
  HYREC_RETURN_IF_ERROR(CatchYamlErrors(path, [&]() -> absl::Status {
    if (!root.IsSequence() || root.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": expected a list of machine types"));
    }
    for (size_t i = 0; i < root.size(); ++i) {
      const YAML::Node& node = root[i];
      const std::string at = absl::StrCat(path, ": [", i, "]");
      HYREC_RETURN_IF_ERROR(
          CheckKeys(node, at, {"name", "cpus", "memory_gib", "network_gbps", "price_per_hour", "gpus", "accelerator"}));
      MachineType m;
      for (const char* required : {"name", "cpus", "memory_gib"}) {
        if (!node[required]) {
          return absl::InvalidArgumentError(absl::StrCat(at, ".", required, " (", YamlWhere(node), "): required"));
        }
      }
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "name", at, &m.name));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "cpus", at, &m.cpus));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "memory_gib", at, &m.memory_gib));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "network_gbps", at, &m.network_gbps));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "price_per_hour", at, &m.price_per_hour));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "gpus", at, &m.gpus));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "accelerator", at, &m.accelerator));
      if (m.name.empty() || m.cpus < 1 || !(m.memory_gib > 1) || m.network_gbps < 0 || m.price_per_hour < 0 ||
          m.gpus < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, " (", YamlWhere(node),
            "): a machine type needs a name, cpus >= 1 and memory_gib > 1; bandwidth, price and gpus >= 0"));
      }
      types.push_back(m);
    }
    return absl::OkStatus();
  }));
  return types;
}

absl::StatusOr<double> ParseCount(absl::string_view text, absl::string_view key, double max) {
  std::string s(absl::StripAsciiWhitespace(text));
  double scale = 1;
  if (!s.empty()) {
    switch (absl::ascii_toupper(s.back())) {
      case 'K':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'G':
        scale = 1e9;
        break;
      case 'T':
        scale = 1e12;
        break;
      case 'P':
        scale = 1e15;
        break;
      default:
        scale = 0;
    }
    if (scale != 0) s.pop_back();
    if (scale == 0) scale = 1;
  }
  double value = 0;
  if (!absl::SimpleAtod(s, &value) || !std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, "=", text, ": expected a positive count, with an optional K, M, G, T or P (1e3 .. 1e15)"));
  }
  if (value * scale > max) {
    return absl::InvalidArgumentError(absl::StrCat(key, "=", text, ": more than ", max, ", the most it may be"));
  }
  return value * scale;
}

namespace {

// What the store charges a row of `table` against capacity_bytes: its slot and 8 bytes of index.
uint64_t Charge(const embedding_ps::TableConfig& table) {
  return 16 +
         4 * static_cast<uint64_t>(table.dim + embedding_ps::OptimizerStateFloats(table.optimizer.kind, table.dim)) + 8;
}

}  // namespace

std::vector<uint64_t> RowsAtCapacity(const embedding_ps::StoreOptions& store) {
  struct Entry {
    size_t table;
    uint64_t charge;  // The store's charge per row: its slot and 8 bytes of index.
    uint64_t capacity;
  };
  std::vector<Entry> entries;
  for (size_t t = 0; t < store.tables.size(); ++t) {
    entries.push_back({t, Charge(store.tables[t]), store.tables[t].capacity_rows});
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.charge > b.charge; });
  std::optional<uint64_t> rows_left;
  if (store.capacity_rows > 0) rows_left = store.capacity_rows;
  std::optional<uint64_t> bytes_left;
  if (store.capacity_bytes > 0) bytes_left = store.capacity_bytes;
  std::vector<uint64_t> rows(store.tables.size(), 0);
  for (const Entry& e : entries) {
    std::optional<uint64_t> n;
    if (e.capacity > 0) n = e.capacity;
    if (rows_left.has_value()) n = n.has_value() ? std::min(*n, *rows_left) : *rows_left;
    if (bytes_left.has_value()) {
      const uint64_t fit = *bytes_left / e.charge;
      n = n.has_value() ? std::min(*n, fit) : fit;
    }
    if (!n.has_value()) return {};  // Unbounded.
    rows[e.table] = *n;
    if (rows_left.has_value()) *rows_left -= *n;
    if (bytes_left.has_value()) *bytes_left -= *n * e.charge;
  }
  return rows;
}

namespace {

// What the job's own data says of each table: ids per sample and the unique share of a batch's.
struct IdsMeasure {
  std::vector<double> ids_per_sample;  // Per loader table.
  std::vector<double> dedup;
  std::string source;
};

IdsMeasure MeasureIds(const JobPlan& plan, int batch_size, const CapacityOptions& options) {
  const WorkerPlan& w = plan.workers[0];
  IdsMeasure m;
  m.ids_per_sample.assign(w.table_names.size(), 0);
  m.dedup.assign(w.table_names.size(), options.dedup_ratio > 0 ? options.dedup_ratio : 1.0);
  data_loader::LoaderOptions o = plan.loader.options;
  o.batch_size = batch_size;
  o.num_workers = 1;
  o.epochs = 1;
  absl::StatusOr<std::unique_ptr<data_loader::Loader>> loader =
      options.measure_batches > 0
          ? data_loader::Loader::Start(o, {})
          : absl::StatusOr<std::unique_ptr<data_loader::Loader>>(absl::FailedPreconditionError("not asked to read it"));
  std::vector<double> ids(w.table_names.size(), 0), unique(w.table_names.size(), 0);
  uint64_t samples = 0;
  int batches = 0;
  absl::Status status = loader.status();
  for (; status.ok() && batches < options.measure_batches; ++batches) {
    data_loader::Batch batch;
    status = (*loader)->stream(0)->Next(&batch, absl::Seconds(60));
    if (!status.ok()) break;
    samples += static_cast<uint64_t>(batch.batch_size);
    for (size_t k = 0; k < batch.slots.size() && k < w.slot_tables.size(); ++k) {
      ids[w.slot_tables[k]] += static_cast<double>(batch.slots[k].ids.size());
    }
    for (size_t t = 0; t < batch.tables.size() && t < unique.size(); ++t) {
      unique[t] += static_cast<double>(batch.tables[t].unique_ids.size());
    }
  }
  if (samples == 0) {
    // Without data, each feature is taken to look up one id a sample.
    for (int table : w.slot_tables) m.ids_per_sample[table] += 1;
    m.source = absl::StrCat("one id a feature assumed; the job's data was not read (",
                            status.ok() ? "no batch" : status.message(), ")",
                            options.dedup_ratio > 0 ? "; deduplication given" : "; no deduplication assumed");
    return m;
  }
  for (size_t t = 0; t < ids.size(); ++t) {
    m.ids_per_sample[t] = ids[t] / static_cast<double>(samples);
    if (options.dedup_ratio <= 0 && ids[t] > 0) m.dedup[t] = unique[t] / ids[t];
  }
  m.source = absl::StrCat("measured on ", batches, " batches of ", batch_size, " of the job's data",
                          options.dedup_ratio > 0 ? " (deduplication given)" : "");
  return m;
}

// The job re-planned at the scale the options ask for (workers, batch size, shards).
absl::StatusOr<JobPlan> Rescaled(const JobPlan& plan, const CapacityOptions& options) {
  if (options.workers == 0 && options.batch_size == 0 && options.ps_shards == 0) return plan;
  JobSpec spec = plan.spec;
  if (options.workers > 0) spec.train.workers = options.workers;
  if (options.batch_size > 0) spec.loader.batch_size = options.batch_size;
  if (options.ps_shards > 0) spec.ps.shards = options.ps_shards;
  return Plan(spec);
}

// Fills `bound` (rows, or bytes at cost[t] a row) with rows[t] at most of each table, in
// proportion to weights[t] rows: water-filling, a table that needs less than its share giving the
// rest to the others. Leaves rows as they are when they fit.
void ShareBound(double bound, const std::vector<double>& weights, const std::vector<double>& cost,
                std::vector<uint64_t>* rows) {
  double needed = 0;
  for (size_t t = 0; t < rows->size(); ++t) needed += static_cast<double>((*rows)[t]) * cost[t];
  if (needed <= bound) return;
  std::vector<bool> settled(rows->size(), false);
  double left = bound;
  for (bool changed = true; changed;) {
    changed = false;
    double weight = 0;
    for (size_t t = 0; t < rows->size(); ++t) {
      if (!settled[t]) weight += weights[t] * cost[t];
    }
    if (weight <= 0) break;
    for (size_t t = 0; t < rows->size(); ++t) {
      if (settled[t]) continue;
      const double share = left * weights[t] / weight;  // Rows.
      if (static_cast<double>((*rows)[t]) <= share) {
        settled[t] = true;
        left -= static_cast<double>((*rows)[t]) * cost[t];
        changed = true;
      }
    }
  }
  double weight = 0;
  for (size_t t = 0; t < rows->size(); ++t) {
    if (!settled[t]) weight += weights[t] * cost[t];
  }
  for (size_t t = 0; t < rows->size(); ++t) {
    if (!settled[t]) (*rows)[t] = weight > 0 ? static_cast<uint64_t>(std::floor(left * weights[t] / weight)) : 0;
  }
}

}  // namespace

namespace {

// PlanCapacity's steps over one re-planned job.
class Planner {
 public:
  Planner(const JobPlan& plan, const CapacityOptions& options)
      : plan_(plan), options_(options), configs_(plan.ps[0].store.tables), shards_(static_cast<int>(plan.ps.size())) {
    c_.workers = plan.workers[0].world_size;
    c_.batch_size = plan.loader.options.batch_size;
  }

  absl::StatusOr<CapacityPlan> Run() {
    const std::vector<MachineType>& machines = options_.machines.empty() ? GkeMachineTypes() : options_.machines;
    HYREC_ASSIGN_OR_RETURN(c_.ps_machine, FindMachineType(machines, options_.ps_machine, "--ps_machine"));
    HYREC_RETURN_IF_ERROR(SizeTables());
    MeasureTraffic();
    for (const PsShardPlan& s : plan_.ps) AddShard(s, ShardRows(s));
    for (CapacityPlan::Table& t : c_.tables) {
      if (t.logical_rows == kUnknownRows) t.logical_rows = 0;  // Unknown: the plan shows what the bound holds.
      c_.logical_parameters += static_cast<double>(t.logical_rows) * t.dim;
      c_.resident_parameters += static_cast<double>(t.resident_rows) * t.dim;
    }
    HYREC_RETURN_IF_ERROR(FitMachines());
    CountStepBytes();
    return std::move(c_);
  }

 private:
  // Each table's logical rows: given, from the parameters, its capacity, the vocabulary of a
  // synthetic source's features, or (in a store with a bound of its own) as many as the bound
  // holds.
  absl::Status SizeTables() {
    uint64_t dims = 0;
    for (const embedding_ps::TableConfig& t : configs_) dims += static_cast<uint64_t>(t.dim);
    const bool store_bound = plan_.ps[0].store.capacity_rows > 0 || plan_.ps[0].store.capacity_bytes > 0;
    const data_loader::SourceConfig& source = plan_.loader.options.source;
    for (size_t t = 0; t < configs_.size(); ++t) {
      CapacityPlan::Table table;
      table.name = configs_[t].name;
      table.dim = configs_[t].dim;
      table.optimizer = std::string(embedding_ps::OptimizerName(configs_[t].optimizer.kind));
      table.eviction = std::string(embedding_ps::EvictionPolicyName(configs_[t].eviction.policy));
      bool bounded = true;
      for (const PsShardPlan& s : plan_.ps) {
        if (s.store.tables[t].capacity_rows == 0) bounded = false;
        table.capacity_rows += s.store.tables[t].capacity_rows;
      }
      if (!bounded) table.capacity_rows = 0;
      if (options_.rows_per_table > 0) {
        table.logical_rows = options_.rows_per_table;
      } else if (options_.parameters > 0) {
        table.logical_rows = static_cast<uint64_t>(std::ceil(options_.parameters / static_cast<double>(dims)));
      } else if (table.capacity_rows > 0) {
        table.logical_rows = table.capacity_rows;
      } else if (source.format == data_loader::Format::kSynthetic) {
        const WorkerPlan& w = plan_.workers[0];
        for (size_t slot = 0; slot < w.slot_tables.size(); ++slot) {
          const int lt = w.slot_tables[slot];
          if (lt >= 0 && static_cast<size_t>(lt) < w.table_names.size() && w.table_names[lt] == table.name) {
            table.logical_rows += source.synthetic.vocabulary;  // Each feature's ids are its own.
          }
        }
      } else if (store_bound) {
        table.logical_rows = kUnknownRows;
      }
      if (table.logical_rows == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tables[", table.name, "].capacity_rows: table '", table.name,
            "' has no size; give it a capacity_rows (or the PS a ps.capacity_rows), or plan with --rows_per_table "
            "or --parameters"));
      }
      c_.tables.push_back(table);
    }
    return absl::OkStatus();
  }

  // Ids per sample and their deduplication, from the job's data: each table's weight in a shared
  // bound, and the responses of one batch of every worker.
  void MeasureTraffic() {
    ids_ = MeasureIds(plan_, c_.batch_size, options_);
    c_.ids_source = ids_.source;
    weights_.assign(configs_.size(), 0);
    const WorkerPlan& w = plan_.workers[0];
    for (size_t lt = 0; lt < w.table_names.size(); ++lt) {
      for (size_t t = 0; t < configs_.size(); ++t) {
        if (configs_[t].name != w.table_names[lt]) continue;
        weights_[t] += ids_.ids_per_sample[lt];
        response_bytes_ += static_cast<double>(c_.workers) * c_.batch_size * ids_.ids_per_sample[lt] * ids_.dedup[lt] *
                           4.0 * configs_[t].dim;
      }
    }
    if (std::all_of(weights_.begin(), weights_.end(), [](double x) { return x <= 0; })) {
      weights_.assign(configs_.size(), 1);
    }
  }

  // Shard s's rows of each table: its share of the logical rows, bounded by its capacities.
  std::vector<uint64_t> ShardRows(const PsShardPlan& s) {
    const embedding_ps::StoreOptions& store = s.store;
    std::vector<uint64_t> rows(configs_.size());
    for (size_t t = 0; t < configs_.size(); ++t) {
      rows[t] = (c_.tables[t].logical_rows + shards_ - 1) / shards_;
      if (store.tables[t].capacity_rows > 0) rows[t] = std::min(rows[t], store.tables[t].capacity_rows);
    }
    const uint64_t unbounded_rows = std::accumulate(rows.begin(), rows.end(), uint64_t{0});
    // A store-wide bound is shared as an LRU across tables shares it: in proportion to each
    // table's ids a sample, a table held to fewer rows leaving the rest to the others.
    std::vector<double> charge(rows.size());
    for (size_t t = 0; t < rows.size(); ++t) charge[t] = static_cast<double>(Charge(configs_[t]));
    if (store.capacity_rows > 0) {
      ShareBound(static_cast<double>(store.capacity_rows), weights_, std::vector<double>(rows.size(), 1.0), &rows);
    }
    if (store.capacity_bytes > 0) ShareBound(static_cast<double>(store.capacity_bytes), weights_, charge, &rows);
    for (size_t t = 0; t < rows.size(); ++t) {
      if (store.tables[t].capacity_rows > 0 && rows[t] == store.tables[t].capacity_rows) capacity_bound_ = true;
    }
    if (std::accumulate(rows.begin(), rows.end(), uint64_t{0}) < unbounded_rows) capacity_bound_ = true;
    for (size_t t = 0; t < rows.size() && stripes_error_.ok(); ++t) {
      if (embedding_ps::StripesHoldRows(rows[t], static_cast<uint64_t>(store.num_stripes))) continue;
      const uint64_t stripes = embedding_ps::StripesForRows(rows[t]);
      stripes_error_ = absl::InvalidArgumentError(absl::StrCat(
          "ps.num_stripes: PS shard ", s.shard_index, " would hold ", rows[t], " rows of table '", configs_[t].name,
          "', more than ", store.num_stripes, " stripes hold (", embedding_ps::kMaxRowsPerStripeAndTable / 2,
          " rows of a table each, with room for the hash's spread); raise ps.num_stripes to ", stripes,
          " or more, or ps.shards"));
    }
    return rows;
  }

  // Shard s's memory with `rows`, by the store's accounting, and its pod's request.
  void AddShard(const PsShardPlan& s, const std::vector<uint64_t>& rows) {
    const embedding_ps::StoreOptions& store = s.store;
    const embedding_ps::StoreMemoryPlan memory = embedding_ps::PlanStoreMemory(store, rows);
    CapacityPlan::Shard shard;
    shard.index = s.shard_index;
    shard.resident_rows = memory.rows;
    shard.store_bytes = memory.bytes;
    shard.process_bytes = options_.process_bytes;
    shard.response_bytes = static_cast<uint64_t>(response_bytes_ / shards_);
    shard.serving_bytes = options_.serving_fixed_bytes +
                          static_cast<uint64_t>(options_.serving_per_byte * static_cast<double>(shard.response_bytes));
    shard.memory_bytes = memory.bytes + options_.process_bytes + shard.serving_bytes;
    const std::vector<uint64_t> at_capacity = RowsAtCapacity(store);
    const uint64_t worst = at_capacity.empty() ? shard.memory_bytes
                                               : embedding_ps::PlanStoreMemory(store, at_capacity).bytes +
                                                     options_.process_bytes + shard.serving_bytes;
    shard.request_bytes =
        static_cast<uint64_t>(static_cast<double>(std::max(worst, shard.memory_bytes)) * kPodHeadroom);
    c_.shards.push_back(shard);
    for (size_t t = 0; t < rows.size(); ++t) c_.tables[t].resident_rows += rows[t];
    if (s.shard_index != 0) return;
    for (size_t t = 0; t < rows.size(); ++t) {  // Bytes per row, as shard 0's accounting spreads them.
      CapacityPlan::Table& table = c_.tables[t];
      const embedding_ps::StoreMemoryPlan::Table& m = memory.tables[t];
      table.value_bytes = m.value_bytes;
      table.state_bytes = m.state_bytes;
      table.index_bytes = memory.rows > 0 ? static_cast<double>(memory.index_bytes) / memory.rows : 0;
      const double slack = rows[t] > 0 ? static_cast<double>(m.slab_bytes - rows[t] * m.slot_bytes) / rows[t] : 0;
      table.bytes_per_row = m.slot_bytes + table.index_bytes + slack;
    }
  }

  // The PS machines: PlacePsShards.
  absl::Status FitMachines() {
    uint64_t largest = 0;
    int largest_shard = 0;
    for (const CapacityPlan::Shard& s : c_.shards) {
      if (s.request_bytes > largest) {
        largest = s.request_bytes;
        largest_shard = s.index;
      }
    }
    const double allocatable = AllocatableGiB(c_.ps_machine);
    if (static_cast<double>(largest) / kGiB > allocatable) {
      // More shards help only where a shard holds its share of the logical rows; a shard held to
      // a capacity holds as much however many there are.
      const std::string more_shards =
          capacity_bound_
              ? "the shards are held to their capacities, so more shards do not shrink them: lower ps.capacity_rows "
                "or the tables' capacity_rows"
              : absl::StrFormat(
                    "about %.0f shards would fit (ps.shards, or --ps_shards), or lower the tables' capacity_rows",
                    std::ceil(static_cast<double>(largest) / kGiB * shards_ / (0.9 * allocatable)));
      return absl::InvalidArgumentError(absl::StrFormat(
          "ps.shards: PS shard %d needs %.1f GiB (its rows at capacity with 20%% headroom), more than a %s node "
          "offers (%.0f GiB); %s, or choose a larger --ps_machine",
          largest_shard, static_cast<double>(largest) / kGiB, c_.ps_machine.name, allocatable, more_shards));
    }
    HYREC_RETURN_IF_ERROR(stripes_error_);
    c_.placement = PlacePsShards(c_.ps_machine, shards_, largest, PsMinCpus(plan_));
    c_.shards_per_machine = c_.placement.shards_per_machine;
    c_.ps_machines = c_.placement.machines;
    return absl::OkStatus();
  }

  // What one batch on every worker moves.
  void CountStepBytes() {
    const WorkerPlan& w = plan_.workers[0];
    double ids_per_sample_total = 0;
    for (size_t lt = 0; lt < w.table_names.size(); ++lt) {
      ids_per_sample_total += ids_.ids_per_sample[lt];
      for (CapacityPlan::Table& table : c_.tables) {
        if (table.name != w.table_names[lt]) continue;
        table.ids_per_sample = ids_.ids_per_sample[lt];
        table.dedup_ratio = ids_.dedup[lt];
        const double unique = table.ids_per_sample * c_.batch_size * table.dedup_ratio * c_.workers;
        c_.id_bytes_per_step += unique * 8;
        c_.row_bytes_per_step_fp32 += unique * 4 * table.dim;
        c_.gradient_bytes_per_step_fp32 += unique * (8 + 4 * table.dim);
      }
    }
    c_.loader_bytes_per_step =
        static_cast<double>(c_.workers) * c_.batch_size * (4.0 * (w.num_dense + 1) + 8.0 * ids_per_sample_total);
  }

  const JobPlan& plan_;
  const CapacityOptions& options_;
  const std::vector<embedding_ps::TableConfig>& configs_;
  const int shards_;
  CapacityPlan c_;
  IdsMeasure ids_;
  std::vector<double> weights_;  // Per PS table: its ids a sample.
  double response_bytes_ = 0;    // Of one batch of every worker, over all shards.
  bool capacity_bound_ = false;  // Some shard holds fewer rows of a table than its share.
  absl::Status stripes_error_;   // Said after the machines' fit, the larger question.
};

}  // namespace

absl::StatusOr<CapacityPlan> PlanCapacity(const JobPlan& original, const CapacityOptions& options) {
  HYREC_ASSIGN_OR_RETURN(const JobPlan plan, Rescaled(original, options));
  return Planner(plan, options).Run();
}

double AllocatableCpus(const MachineType& machine) { return std::max(1.0, std::floor(machine.cpus * 0.9)); }

double PsMinCpus(const JobPlan& plan) {
  return !plan.ps.empty() && plan.ps[0].threads > 0 ? plan.ps[0].threads : kPsMinCpus;
}

PsPlacement PlacePsShards(const MachineType& machine, int shards, uint64_t largest_request_bytes, double min_cpus) {
  PsPlacement p;
  const double cpus = AllocatableCpus(machine);
  const double memory = AllocatableGiB(machine) * static_cast<double>(kGiB);
  const double by_memory = largest_request_bytes > 0 ? std::floor(memory / static_cast<double>(largest_request_bytes))
                                                     : static_cast<double>(shards);
  const double by_cpu = std::floor(cpus / std::max(min_cpus, 0.001));
  p.shards_per_machine = static_cast<int>(std::max(1.0, std::min({by_memory, by_cpu, static_cast<double>(shards)})));
  p.machines = (shards + p.shards_per_machine - 1) / p.shards_per_machine;
  p.pods_per_machine = (shards + p.machines - 1) / p.machines;
  p.cpus_per_pod = std::floor(cpus * 1000 / p.pods_per_machine) / 1000;
  p.memory_per_pod = largest_request_bytes;
  return p;
}

uint64_t PodRequestBytes(const JobPlan& plan, int shard) {
  if (shard < 0 || shard >= static_cast<int>(plan.ps.size()) || RowsAtCapacity(plan.ps[shard].store).empty()) {
    return 0;
  }
  CapacityOptions o;
  o.rows_per_table = uint64_t{1} << 62;  // Past every capacity: each shard at its bound.
  o.measure_batches = 0;
  o.dedup_ratio = 1;
  o.machines = {MachineType{"any", 1 << 20, 1e12, 0, 0, 0, ""}};
  o.ps_machine = "any";
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  return c.ok() ? c->shards[shard].request_bytes : 0;
}

namespace {

std::string Bytes(double bytes) {
  if (bytes >= kGiB * 1024) return absl::StrFormat("%.2f TiB", bytes / (kGiB * 1024));
  if (bytes >= kGiB) return absl::StrFormat("%.2f GiB", bytes / kGiB);
  if (bytes >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024));
  return absl::StrFormat("%.0f B", bytes);
}

std::string Count(double n) {
  if (n >= 1e12) return absl::StrFormat("%.3gT", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.3gG", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.3gM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.3gK", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", ch);
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}

std::string Num(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

absl::StatusOr<uint64_t> ResidentBytes(int pid) { return ProcessStatusBytes(pid, "VmRSS"); }

namespace {

// A PS process of a one-table store (dim 64): its resident memory once it listens, and its growth
// beyond its rows while it serves responses of 1 MiB and then 4 MiB.
absl::Status MeasurePsProcess(const std::string& ps_binary, const std::string& dir, Calibration* c) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string job = absl::StrCat(dir, "/calibrate.yaml");
  std::ofstream(job) << "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n"
                     << "features: [f]\ntables: [{name: t, features: [f], dim: 64}]\n"
                     << "ps: {shards: 1}\nsecurity: {mode: none}\n";
  HYREC_ASSIGN_OR_RETURN(auto ps, Subprocess::Spawn({ps_binary, "--config=" + job, "--shard_index=0", "--port=0"}));
  auto measure = [&]() -> absl::Status {
    HYREC_ASSIGN_OR_RETURN(const int port, WaitForListeningPort(*ps, absl::Seconds(60)));
    HYREC_ASSIGN_OR_RETURN(c->process_bytes, ResidentBytes(ps->pid()));
    HYREC_ASSIGN_OR_RETURN(auto client, embedding_ps::ConnectEmbeddingClient({absl::StrCat("127.0.0.1:", port)}, {}));
    double serving[2] = {0, 0};
    const size_t sizes[2] = {4096, 16384};  // Rows a response: 1 MiB and 4 MiB at dim 64.
    for (int k = 0; k < 2; ++k) {
      std::vector<uint64_t> ids(sizes[k]);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = i + 1;
      std::vector<float> rows(ids.size() * 64);
      for (int call = 0; call < 30; ++call) HYREC_RETURN_IF_ERROR(client->Lookup("t", ids, absl::MakeSpan(rows)));
      HYREC_ASSIGN_OR_RETURN(const uint64_t rss, ResidentBytes(ps->pid()));
      HYREC_ASSIGN_OR_RETURN(const std::vector<embedding_ps::ShardStats> stats, client->Stats());
      serving[k] =
          static_cast<double>(rss) - static_cast<double>(c->process_bytes) - static_cast<double>(stats[0].store.bytes);
    }
    HYREC_RETURN_IF_ERROR(MeasureRpcCosts(*client, "t", 64, ps->pid(), c));
    const double mib = 1024.0 * 1024;
    c->serving_per_byte = std::max(0.0, (serving[1] - serving[0]) / (3 * mib));
    c->serving_fixed_bytes = static_cast<uint64_t>(std::max(0.0, serving[0] - c->serving_per_byte * mib));
    return absl::OkStatus();
  };
  const absl::Status status = measure();
  ps->Signal(SIGKILL);
  (void)ps->Wait(absl::Seconds(10));
  std::filesystem::remove(job, error);
  if (!status.ok()) return absl::UnavailableError(absl::StrCat(ps_binary, ": ", status.message()));
  return absl::OkStatus();
}

// The one list of a calibration file's fields: visit(key, member, digits) for each, in the order
// written, `digits` the decimals a double is written with. `C` is Calibration or its const, so
// that the writer, the reader and its key check share the list.
template <typename C, typename Visit>
void MachineFields(C& c, Visit&& visit) {
  visit("machine", c.machine, 0);
  visit("cpus", c.cpus, 0);
  visit("process_bytes", c.process_bytes, 0);
  visit("serving_fixed_bytes", c.serving_fixed_bytes, 0);
  visit("serving_per_byte", c.serving_per_byte, 3);
  visit("lookup_ns_per_row", c.lookup_ns_per_row, 2);
  visit("update_ns_per_row", c.update_ns_per_row, 2);
  visit("rpc_dim", c.rpc_dim, 0);
  visit("rpc_client_us", c.rpc_client_us, 2);
  visit("rpc_server_us", c.rpc_server_us, 2);
  visit("lookup_client_ns_per_row", c.lookup_client_ns_per_row, 2);
  visit("lookup_server_ns_per_row", c.lookup_server_ns_per_row, 2);
  visit("update_client_ns_per_row", c.update_client_ns_per_row, 2);
  visit("update_server_ns_per_row", c.update_server_ns_per_row, 2);
}
// The `step` mapping's: StepCosts.
template <typename S, typename Visit>
void StepFields(S& s, Visit&& visit) {
  visit("batch_size", s.batch_size, 0);
  visit("shards", s.shards, 0);
  visit("train_ms", s.train_ms, 4);
  visit("lookup_client_ms", s.lookup_client_ms, 4);
  visit("update_client_ms", s.update_client_ms, 4);
  visit("lookup_server_ms", s.lookup_server_ms, 4);
  visit("update_server_ms", s.update_server_ms, 4);
  visit("loader_ms", s.loader_ms, 4);
  visit("rpc_client_ms", s.rpc_client_ms, 4);
  visit("rpc_server_ms", s.rpc_server_ms, 4);
  visit("id_bytes", s.id_bytes, 4);
  visit("row_bytes", s.row_bytes, 4);
  visit("batch_bytes", s.batch_bytes, 4);
  visit("dense_bytes", s.dense_bytes, 4);
  visit("relay_ms", s.relay_ms, 4);
  visit("cores_used", s.cores_used, 4);
  visit("samples_per_second", s.samples_per_second, 4);
}

// Writes "<indent>key: value" lines for each field `fields` visits.
template <typename Fields>
void WriteFields(std::ostream& out, const char* indent, Fields&& fields) {
  fields([&](const char* key, const auto& value, int digits) {
    out << indent << key << ": ";
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(value)>>) {
      out << absl::StrFormat("%.*f", digits, value);
    } else {
      out << value;
    }
    out << "\n";
  });
}

// Checks `node`'s keys against the fields `fields` visits, then reads each one present.
template <typename Fields>
absl::Status ReadFields(const YAML::Node& node, const std::string& at, Fields&& fields,
                        std::vector<std::string> also_allowed = {}) {
  std::vector<std::string> keys = std::move(also_allowed);
  fields([&](const char* key, auto&, int) { keys.push_back(key); });
  HYREC_RETURN_IF_ERROR(CheckKeys(node, at, keys));
  absl::Status status;
  fields([&](const char* key, auto& value, int) {
    if (status.ok()) status = ReadScalar(node, key, at, &value);
  });
  return status;
}

}  // namespace

absl::StatusOr<Calibration> Calibrate(const std::string& ps_binary, const std::string& scratch_dir) {
  Calibration c;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  c.machine = host;
  c.cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  HYREC_RETURN_IF_ERROR(MeasurePsProcess(ps_binary, scratch_dir, &c));
  embedding_ps::TableConfig table;
  table.name = "t";
  table.dim = 16;
  table.optimizer.kind = embedding_ps::OptimizerKind::kAdagrad;
  embedding_ps::StoreOptions options;
  options.tables = {table};
  HYREC_ASSIGN_OR_RETURN(auto store, embedding_ps::EmbeddingShardStore::Create(options));
  constexpr uint64_t kRows = 1 << 20;
  constexpr size_t kBatch = 4096;
  std::vector<uint64_t> ids(kBatch);
  std::vector<float> rows(kBatch * 16), grads(kBatch * 16, 0.01f);
  for (uint64_t begin = 0; begin < kRows; begin += kBatch) {
    for (size_t i = 0; i < kBatch; ++i) ids[i] = begin + i;
    HYREC_RETURN_IF_ERROR(store->Lookup(0, ids, absl::MakeSpan(rows), nullptr));
  }
  std::mt19937_64 rng(1);
  absl::Duration lookup, update;
  constexpr int kBatches = 200;
  for (int b = 0; b < kBatches; ++b) {
    for (uint64_t& id : ids) id = rng() % kRows;
    absl::Time start = absl::Now();
    HYREC_RETURN_IF_ERROR(store->Lookup(0, ids, absl::MakeSpan(rows), nullptr));
    lookup += absl::Now() - start;
    start = absl::Now();
    HYREC_RETURN_IF_ERROR(store->Update(0, ids, grads, {}, nullptr));
    update += absl::Now() - start;
  }
  c.lookup_ns_per_row = absl::ToDoubleNanoseconds(lookup) / (kBatches * kBatch);
  c.update_ns_per_row = absl::ToDoubleNanoseconds(update) / (kBatches * kBatch);
  return c;
}

absl::Status WriteCalibration(const Calibration& c, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << "# hyrec plan --calibrate: measured on this machine; hyrec plan --calibration=" << path << "\n";
  WriteFields(out, "", [&](auto&& visit) { MachineFields(c, visit); });
  if (!c.job.empty()) {
    out << "# A batch of " << c.job << " here, one worker, in CPU ms (docs/capacity.md).\njob: " << c.job
        << "\nstep:\n";
    WriteFields(out, "  ", [&](auto&& visit) { StepFields(c.step, visit); });
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<Calibration> ReadCalibration(const std::string& path) {
  HYREC_ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlFile(path));
  Calibration c;
  HYREC_RETURN_IF_ERROR(CatchYamlErrors(path, [&]() -> absl::Status {
    HYREC_RETURN_IF_ERROR(ReadFields(root, path, [&](auto&& visit) { MachineFields(c, visit); }, {"job", "step"}));
    HYREC_RETURN_IF_ERROR(ReadScalar(root, "job", path, &c.job));
    if (const YAML::Node step = root["step"]) {
      const std::string at = JoinKey(path, "step");
      if (c.job.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": needs the job it was measured on (job)"));
      }
      HYREC_RETURN_IF_ERROR(ReadFields(step, at, [&](auto&& visit) { StepFields(c.step, visit); }));
      if (c.step.batch_size <= 0 || c.step.shards <= 0 || c.step.train_ms <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": batch_size, shards and train_ms are required and must be > 0"));
      }
    } else if (!c.job.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, "job"), ": without its step costs (step)"));
    }
    if (c.process_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, "process_bytes"), ": required, > 0"));
    }
    return absl::OkStatus();
  }));
  return c;
}

std::string FormatCapacityPlan(const CapacityPlan& c) {
  std::string out = absl::StrFormat("parameters: %s logical, %s resident; %d worker(s), batch %d; %zu PS shard(s)\n\n",
                                    Count(c.logical_parameters), Count(c.resident_parameters), c.workers, c.batch_size,
                                    c.shards.size());
  absl::StrAppendFormat(&out, "%-20s %5s %-8s %-5s %10s %10s %10s  %s\n", "table", "dim", "optim", "evict", "logical",
                        "capacity", "resident", "bytes/row = key + evict + values + state + index (+ slab)");
  for (const CapacityPlan::Table& t : c.tables) {
    absl::StrAppendFormat(
        &out, "%-20s %5d %-8s %-5s %10s %10s %10s  %.1f = %u + %u + %u + %u + %.1f (+ %.1f)\n", t.name, t.dim,
        t.optimizer, t.eviction, t.logical_rows > 0 ? Count(t.logical_rows) : "-",
        t.capacity_rows > 0 ? Count(t.capacity_rows) : "-", Count(t.resident_rows), t.bytes_per_row, t.key_bytes,
        t.eviction_bytes, t.value_bytes, t.state_bytes, t.index_bytes,
        t.bytes_per_row - (t.key_bytes + t.eviction_bytes + t.value_bytes + t.state_bytes) - t.index_bytes);
  }
  absl::StrAppendFormat(&out, "\n%-6s %12s %12s %12s %12s %12s %14s\n", "shard", "rows", "store", "process", "serving",
                        "resident", "pod request");
  for (const CapacityPlan::Shard& s : c.shards) {
    absl::StrAppendFormat(&out, "%-6d %12s %12s %12s %12s %12s %14s\n", s.index, Count(s.resident_rows),
                          Bytes(s.store_bytes), Bytes(s.process_bytes), Bytes(s.serving_bytes), Bytes(s.memory_bytes),
                          Bytes(s.request_bytes));
  }
  absl::StrAppendFormat(&out,
                        "\nPS machines: %d x %s (%d cpus, %.0f GiB; %.0f cpus, %.0f GiB allocatable), %d shard(s) each "
                        "(at most %d); a PS pod requests %.3f cpus and %s (hyrec k8s render asks the same)\n",
                        c.ps_machines, c.ps_machine.name, c.ps_machine.cpus, c.ps_machine.memory_gib,
                        AllocatableCpus(c.ps_machine), AllocatableGiB(c.ps_machine), c.placement.pods_per_machine,
                        c.shards_per_machine, c.placement.cpus_per_pod, Bytes(c.placement.memory_per_pod));
  absl::StrAppendFormat(&out, "\nper step (a batch on each of %d worker(s)); ids per sample and dedup %s:\n", c.workers,
                        c.ids_source);
  for (const CapacityPlan::Table& t : c.tables) {
    if (t.ids_per_sample > 0) {
      absl::StrAppendFormat(&out, "  %-20s %.2f ids a sample, %.3f unique\n", t.name, t.ids_per_sample, t.dedup_ratio);
    }
  }
  absl::StrAppendFormat(&out,
                        "  workers -> PS: ids %s, gradients %s (fp16: %s)\n  PS -> workers: rows %s (fp16: %s)\n"
                        "  loader -> workers: %s\n",
                        Bytes(c.id_bytes_per_step), Bytes(c.gradient_bytes_per_step_fp32),
                        Bytes(c.id_bytes_per_step + (c.gradient_bytes_per_step_fp32 - c.id_bytes_per_step) / 2),
                        Bytes(c.row_bytes_per_step_fp32), Bytes(c.row_bytes_per_step_fp32 / 2),
                        Bytes(c.loader_bytes_per_step));
  return out;
}

std::string CapacityPlanJson(const CapacityPlan& c, const ThroughputPlan* t) {
  std::vector<std::string> tables;
  for (const CapacityPlan::Table& t : c.tables) {
    tables.push_back(absl::StrCat(
        "{\"name\":", Quote(t.name), ",\"dim\":", t.dim, ",\"optimizer\":", Quote(t.optimizer), ",\"eviction\":",
        Quote(t.eviction), ",\"logical_rows\":", t.logical_rows, ",\"capacity_rows\":", t.capacity_rows,
        ",\"resident_rows\":", t.resident_rows, ",\"bytes_per_row\":{\"total\":", Num(t.bytes_per_row),
        ",\"key\":", t.key_bytes, ",\"eviction\":", t.eviction_bytes, ",\"values\":", t.value_bytes,
        ",\"optimizer_state\":", t.state_bytes, ",\"index\":", Num(t.index_bytes),
        "},\"ids_per_sample\":", Num(t.ids_per_sample), ",\"dedup_ratio\":", Num(t.dedup_ratio), "}"));
  }
  std::vector<std::string> shards;
  for (const CapacityPlan::Shard& s : c.shards) {
    shards.push_back(absl::StrCat("{\"index\":", s.index, ",\"resident_rows\":", s.resident_rows,
                                  ",\"store_bytes\":", s.store_bytes, ",\"process_bytes\":", s.process_bytes,
                                  ",\"serving_bytes\":", s.serving_bytes, ",\"response_bytes\":", s.response_bytes,
                                  ",\"memory_bytes\":", s.memory_bytes, ",\"request_bytes\":", s.request_bytes, "}"));
  }
  return absl::StrCat(
      "{\"logical_parameters\":", Num(c.logical_parameters), ",\"resident_parameters\":", Num(c.resident_parameters),
      ",\"workers\":", c.workers, ",\"batch_size\":", c.batch_size, ",\"tables\":[", absl::StrJoin(tables, ","),
      "],\"shards\":[", absl::StrJoin(shards, ","), "],\"ps_machine\":{\"name\":", Quote(c.ps_machine.name),
      ",\"cpus\":", c.ps_machine.cpus, ",\"memory_gib\":", Num(c.ps_machine.memory_gib),
      ",\"allocatable_gib\":", Num(AllocatableGiB(c.ps_machine)), ",\"network_gbps\":", Num(c.ps_machine.network_gbps),
      "},\"shards_per_machine\":", c.shards_per_machine, ",\"ps_machines\":", c.ps_machines,
      ",\"ps_pod\":{\"cpus\":", c.placement.cpus_per_pod, ",\"memory_bytes\":", c.placement.memory_per_pod,
      ",\"pods_per_machine\":", c.placement.pods_per_machine, "}",
      ",\"per_step\":{\"id_bytes\":", Num(c.id_bytes_per_step), ",\"row_bytes_fp32\":", Num(c.row_bytes_per_step_fp32),
      ",\"gradient_bytes_fp32\":", Num(c.gradient_bytes_per_step_fp32),
      ",\"loader_bytes\":", Num(c.loader_bytes_per_step), ",\"ids_source\":", Quote(c.ids_source),
      "},\"throughput\":", t == nullptr ? "null" : ThroughputJson(*t), "}\n");
}

namespace {

std::string ThroughputJson(const ThroughputPlan& t) {
  const SimulationResult& r = t.cluster;
  const SimulationOptions& o = t.cluster_options;
  std::vector<std::string> uses;
  for (const SimulationResult::Use& u : r.utilization) {
    uses.push_back(absl::StrCat("{\"resource\":", Quote(ResourceName(u.resource)), ",\"busy\":", Num(u.busy), "}"));
  }
  return absl::StrCat(
      "{\"samples_per_second\":", Num(r.samples_per_second), ",\"bottleneck\":", Quote(ResourceName(r.bottleneck)),
      ",\"utilization\":[", absl::StrJoin(uses, ","), "],\"wait_for_rows_ms\":", Num(r.wait_for_rows_ms),
      ",\"observed_staleness\":", Num(r.observed_staleness), ",\"lookup_ms\":", Num(r.lookup_ms),
      ",\"update_ms\":", Num(r.update_ms), ",\"staleness\":", o.staleness,
      ",\"worker_machine\":", Quote(t.worker_machine.name), ",\"loader_machine\":", Quote(t.loader_machine.name),
      ",\"loader_machines\":", o.loader_machines, ",\"step_ms\":{\"train\":", Num(t.costs.train_ms),
      ",\"ps\":", Num(t.costs.lookup_server_ms + t.costs.update_server_ms),
      ",\"worker_other\":", Num(t.costs.lookup_client_ms + t.costs.update_client_ms),
      ",\"loader\":", Num(t.costs.loader_ms), "}}");
}

}  // namespace

}  // namespace hyrec::job
