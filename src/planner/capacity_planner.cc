// PlanCapacity: a job's tables, PS memory and machines at a given scale, from the store's accounting.
#include "hyrec/planner/capacity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/data_loader/loader.h"

namespace hyrec::planner {

using job::JobPlan;
using job::JobSpec;
using job::Plan;
using job::PsShardPlan;
using job::WorkerPlan;
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
// The logical rows of a table with no size of its own in a store bounded as a whole: as many as
// the bound holds.
constexpr uint64_t kUnknownRows = uint64_t{1} << 62;
constexpr double kPodHeadroom = 1.2;
// CapacityOptions::rows_per_table past every bound: each shard planned at its bounds
// (PodRequestBytes), its disk tier full.
constexpr uint64_t kAtBoundsRows = uint64_t{1} << 62;

}  // namespace

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

uint64_t Charge(const embedding_ps::TableConfig& table) { return embedding_ps::RowChargeBytes(table); }

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
    for (const PsShardPlan& s : plan_.ps) {
      const std::vector<uint64_t> dram = ShardRows(s);
      AddShard(s, dram, DiskRows(s, dram));
    }
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
      table.precision = std::string(embedding_ps::RowPrecisionName(configs_[t].precision));
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

  // Shard s's share of each table's logical rows, bounded by the table's capacity.
  std::vector<uint64_t> TableShares(const PsShardPlan& s) const {
    std::vector<uint64_t> rows(configs_.size());
    for (size_t t = 0; t < configs_.size(); ++t) {
      rows[t] = (c_.tables[t].logical_rows + shards_ - 1) / shards_;
      if (s.store.tables[t].capacity_rows > 0) rows[t] = std::min(rows[t], s.store.tables[t].capacity_rows);
    }
    return rows;
  }

  // With a disk tier: the rows of shard s's shares that its DRAM (`dram`) does not hold, at most
  // what the tier holds (a plan past it is refused in FitMachines, unless it plans the shards at
  // their bounds).
  std::vector<uint64_t> DiskRows(const PsShardPlan& s, const std::vector<uint64_t>& dram) {
    if (s.store.disk.path.empty()) return {};
    const std::vector<uint64_t> share = TableShares(s);
    const std::vector<uint64_t> fits = embedding_ps::DiskTierRows(s.store, weights_);
    std::vector<uint64_t> needed(share.size());  // The rows beyond DRAM.
    std::vector<uint64_t> rows(share.size());    // Those the tier holds.
    for (size_t t = 0; t < share.size(); ++t) {
      needed[t] = share[t] > dram[t] ? share[t] - dram[t] : 0;
      rows[t] = std::min(needed[t], fits[t]);
    }
    const uint64_t wanted = std::accumulate(needed.begin(), needed.end(), uint64_t{0});
    const uint64_t held = std::accumulate(rows.begin(), rows.end(), uint64_t{0});
    if (held < wanted && options_.rows_per_table < kAtBoundsRows && disk_error_.ok()) {
      disk_error_ = absl::InvalidArgumentError(absl::StrFormat(
          "ps.disk.capacity_bytes: PS shard %d would hold %d rows on disk, a tier of %d bytes; its %d bytes hold "
          "%d: raise it, or ps.shards",
          s.shard_index, wanted, embedding_ps::PlanDiskTier(s.store, needed).file_bytes, s.store.disk.capacity_bytes,
          held));
    }
    return rows;
  }

  // Shard s's rows of each table in DRAM: its share of the logical rows, bounded by its
  // capacities.
  std::vector<uint64_t> ShardRows(const PsShardPlan& s) {
    const embedding_ps::StoreOptions& store = s.store;
    std::vector<uint64_t> rows = TableShares(s);
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

  // Shard s's memory with `rows` in DRAM and `disk` on its disk tier (none without), by the
  // store's accounting, and its pod's request.
  void AddShard(const PsShardPlan& s, const std::vector<uint64_t>& rows, const std::vector<uint64_t>& disk) {
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
    uint64_t disk_index_at_capacity = 0;
    if (!disk.empty()) {
      const embedding_ps::DiskTierPlan tier = embedding_ps::PlanDiskTier(store, disk);
      shard.disk_rows = tier.rows;
      shard.disk_bytes = tier.file_bytes;
      shard.disk_index_bytes = tier.index_bytes;
      disk_index_at_capacity =
          embedding_ps::PlanDiskTier(store, embedding_ps::DiskTierRows(store, weights_)).index_bytes;
      shard.resident_rows += tier.rows;
      for (size_t t = 0; t < disk.size(); ++t) c_.tables[t].resident_rows += disk[t];
    }
    shard.memory_bytes = memory.bytes + options_.process_bytes + shard.serving_bytes + shard.disk_index_bytes;
    const std::vector<uint64_t> at_capacity = RowsAtCapacity(store);
    const uint64_t worst = at_capacity.empty()
                               ? shard.memory_bytes
                               : embedding_ps::PlanStoreMemory(store, at_capacity).bytes + options_.process_bytes +
                                     shard.serving_bytes + std::max(disk_index_at_capacity, shard.disk_index_bytes);
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
          "offers (%.0f GiB); %s%s, or choose a larger --ps_machine",
          largest_shard, static_cast<double>(largest) / kGiB, c_.ps_machine.name, allocatable, more_shards,
          plan_.ps[0].store.disk.path.empty()
              ? ""
              : ", or a smaller ps.disk.capacity_bytes (the DRAM index of a full disk tier is in the request)"));
    }
    HYREC_RETURN_IF_ERROR(stripes_error_);
    HYREC_RETURN_IF_ERROR(disk_error_);
    const uint64_t disk_per_shard = plan_.ps[0].store.disk.path.empty() ? 0 : plan_.ps[0].store.disk.capacity_bytes;
    if (disk_per_shard > 0 && static_cast<double>(disk_per_shard) / kGiB > c_.ps_machine.local_ssd_gib) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ps.disk.capacity_bytes: a PS shard's disk tier of %.1f GiB does not fit a %s node's %.0f GiB of local SSD; "
          "choose a --ps_machine with local SSD (z3-highmem-88, z3-highmem-176, or local_ssd_gib in a machine file)",
          static_cast<double>(disk_per_shard) / kGiB, c_.ps_machine.name, c_.ps_machine.local_ssd_gib));
    }
    c_.placement = PlacePsShards(c_.ps_machine, shards_, largest, PsMinCpus(plan_), disk_per_shard);
    c_.shards_per_machine = c_.placement.shards_per_machine;
    c_.ps_machines = c_.placement.machines;
    return absl::OkStatus();
  }

  // What one batch on every worker moves. A batch as the loader sends it (proto/data.proto's
  // BatchProto): labels and dense features (4 bytes each), each slot's offsets (4 bytes a sample,
  // and one) and ids (8 bytes each), and each table's unique ids (8 bytes each) with their shard
  // offsets and each slot id's index into them (4 bytes each); weighted slots' weights are not
  // counted.
  void CountStepBytes() {
    const WorkerPlan& w = plan_.workers[0];
    double ids_per_sample_total = 0;
    double unique_per_batch = 0;
    for (size_t lt = 0; lt < w.table_names.size(); ++lt) {
      ids_per_sample_total += ids_.ids_per_sample[lt];
      for (CapacityPlan::Table& table : c_.tables) {
        if (table.name != w.table_names[lt]) continue;
        table.ids_per_sample = ids_.ids_per_sample[lt];
        table.dedup_ratio = ids_.dedup[lt];
        const double unique = table.ids_per_sample * c_.batch_size * table.dedup_ratio * c_.workers;
        unique_per_batch += unique / c_.workers;
        c_.id_bytes_per_step += unique * 8;
        c_.row_bytes_per_step_fp32 += unique * 4 * table.dim;
        c_.gradient_bytes_per_step_fp32 += unique * (8 + 4 * table.dim);
      }
    }
    const double batch = c_.batch_size;
    const double slots = static_cast<double>(w.slot_tables.size());
    const double tables = static_cast<double>(w.table_names.size());
    c_.loader_bytes_per_step =
        c_.workers * (batch * 4.0 * (w.num_dense + 1) + slots * (batch + 1) * 4 + batch * ids_per_sample_total * 12 +
                      unique_per_batch * 8 + tables * (shards_ + 1) * 4);
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
  absl::Status disk_error_;      // A disk tier too small for its rows, said there too.
};

}  // namespace

absl::StatusOr<CapacityPlan> PlanCapacity(const JobPlan& original, const CapacityOptions& options) {
  HYREC_ASSIGN_OR_RETURN(const JobPlan plan, Rescaled(original, options));
  return Planner(plan, options).Run();
}
double PsMinCpus(const JobPlan& plan) {
  return !plan.ps.empty() && plan.ps[0].threads > 0 ? plan.ps[0].threads : kPsMinCpus;
}

PsPlacement PlacePsShards(const MachineType& machine, int shards, uint64_t largest_request_bytes, double min_cpus,
                          uint64_t disk_bytes_per_shard) {
  PsPlacement p;
  const double cpus = AllocatableCpus(machine);
  const double memory = AllocatableGiB(machine) * static_cast<double>(kGiB);
  const double by_memory = largest_request_bytes > 0 ? std::floor(memory / static_cast<double>(largest_request_bytes))
                                                     : static_cast<double>(shards);
  const double by_cpu = std::floor(cpus / std::max(min_cpus, 0.001));
  const double by_disk = disk_bytes_per_shard > 0
                             ? std::floor(machine.local_ssd_gib * kGiB / static_cast<double>(disk_bytes_per_shard))
                             : static_cast<double>(shards);
  p.shards_per_machine =
      static_cast<int>(std::max(1.0, std::min({by_memory, by_cpu, by_disk, static_cast<double>(shards)})));
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
  o.rows_per_table = kAtBoundsRows;  // Past every capacity: each shard at its bound.
  o.measure_batches = 0;
  o.dedup_ratio = 1;
  o.machines = {MachineType{"any", 1 << 20, 1e12, 0, 0, 0, "", 1e12}};
  o.ps_machine = "any";
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  return c.ok() ? c->shards[shard].request_bytes : 0;
}

}  // namespace hyrec::planner
