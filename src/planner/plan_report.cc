// A capacity and throughput plan as text and as JSON.
#include "hyrec/planner/capacity.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hyrec::planner {
namespace {

std::string ThroughputJson(const ThroughputPlan& t);

}  // namespace

namespace {

std::string Bytes(double bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
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

std::string FormatCapacityPlan(const CapacityPlan& c) {
  std::string out = absl::StrFormat("parameters: %s logical, %s resident; %d worker(s), batch %d; %zu PS shard(s)\n\n",
                                    Count(c.logical_parameters), Count(c.resident_parameters), c.workers, c.batch_size,
                                    c.shards.size());
  absl::StrAppendFormat(&out, "%-20s %5s %-4s %-15s %-5s %10s %10s %10s  %s\n", "table", "dim", "prec", "optim",
                        "evict", "logical", "capacity", "resident",
                        "bytes/row = key + evict + values + state + index (+ slab)");
  for (const CapacityPlan::Table& t : c.tables) {
    absl::StrAppendFormat(
        &out, "%-20s %5d %-4s %-15s %-5s %10s %10s %10s  %.1f = %u + %u + %u + %u + %.1f (+ %.1f)\n", t.name, t.dim,
        t.precision, t.optimizer, t.eviction, t.logical_rows > 0 ? Count(t.logical_rows) : "-",
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
  if (!c.shards.empty() && c.shards[0].disk_bytes > 0) {
    absl::StrAppendFormat(&out, "\ndisk tier (ps.disk): %-6s %12s %12s %14s\n", "shard", "disk rows", "file",
                          "index in DRAM");
    for (const CapacityPlan::Shard& s : c.shards) {
      absl::StrAppendFormat(&out, "                     %-6d %12s %12s %14s\n", s.index, Count(s.disk_rows),
                            Bytes(s.disk_bytes), Bytes(s.disk_index_bytes));
    }
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
    tables.push_back(
        absl::StrCat("{\"name\":", Quote(t.name), ",\"dim\":", t.dim, ",\"optimizer\":", Quote(t.optimizer),
                     ",\"precision\":", Quote(t.precision), ",\"eviction\":", Quote(t.eviction),
                     ",\"logical_rows\":", t.logical_rows, ",\"capacity_rows\":", t.capacity_rows,
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
                                  ",\"memory_bytes\":", s.memory_bytes, ",\"request_bytes\":", s.request_bytes,
                                  ",\"disk_rows\":", s.disk_rows, ",\"disk_bytes\":", s.disk_bytes,
                                  ",\"disk_index_bytes\":", s.disk_index_bytes, "}"));
  }
  return absl::StrCat(
      "{\"logical_parameters\":", Num(c.logical_parameters), ",\"resident_parameters\":", Num(c.resident_parameters),
      ",\"workers\":", c.workers, ",\"batch_size\":", c.batch_size, ",\"tables\":[", absl::StrJoin(tables, ","),
      "],\"shards\":[", absl::StrJoin(shards, ","), "],\"ps_machine\":{\"name\":", Quote(c.ps_machine.name),
      ",\"cpus\":", c.ps_machine.cpus, ",\"memory_gib\":", Num(c.ps_machine.memory_gib),
      ",\"local_ssd_gib\":", Num(c.ps_machine.local_ssd_gib),
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

}  // namespace hyrec::planner
