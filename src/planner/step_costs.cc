// Measuring what a training step costs on this machine (capacity.h: MeasureRpcCosts,
// MeasureStepCosts), from the CPU time Linux accounts to each process and thread.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/planner/capacity.h"

namespace hyrec::planner {

using job::JobPlan;
namespace {

double SelfCpuMs() {
  rusage u = {};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

// CPU milliseconds by what spends them, at one moment of a run.
struct CpuSnapshot {
  absl::Time time;
  double batches = 0;
  double launcher = 0;  // hyrec train itself (and its relays, with --ps_latency_ms).
  double train = 0;     // The worker's main (training) thread.
  double worker = 0;    // The worker process, all threads.
  double ps = 0;
  double loader = 0;
  int ps_processes = 0;
  bool complete = false;  // Every role read.
};

CpuSnapshot Snapshot(int launcher, double batches) {
  CpuSnapshot s;
  s.time = absl::Now();
  s.batches = batches;
  s.launcher = CpuMilliseconds(launcher).value_or(0);
  bool worker = false, loader = false;
  for (const ChildProcess& child : ChildProcesses(launcher)) {
    const std::string& name = child.name;
    const absl::StatusOr<double> cpu = CpuMilliseconds(child.pid);
    if (!cpu.ok()) continue;
    if (name == "hyrec-ps") {
      s.ps += *cpu;
      ++s.ps_processes;
    } else if (name == "hyrec-loader") {
      s.loader += *cpu;
      loader = true;
    } else if (name == "hyrec-worker") {
      const absl::StatusOr<double> main = CpuMilliseconds(child.pid, child.pid);
      if (!main.ok()) continue;
      s.worker += *cpu;
      s.train += *main;
      worker = true;
    }
  }
  s.complete = worker && loader && s.ps_processes > 0;
  return s;
}

// "samples 10240/61440 ..." (or "samples 10240 ..." when the job has no planned end): the
// samples trained so far.
std::optional<double> ProgressSamples(const std::string& line) {
  if (line.rfind("samples ", 0) != 0) return std::nullopt;
  const size_t end = line.find_first_of("/ ", 8);
  double samples = 0;
  if (end == std::string::npos || !absl::SimpleAtod(line.substr(8, end - 8), &samples)) return std::nullopt;
  return samples;
}

}  // namespace

absl::Status MeasureRpcCosts(embedding_ps::EmbeddingClient& client, const std::string& table, int dim, int ps_pid,
                             Calibration* c) {
  // A call of `rows` ids, repeated for about half a second: CPU microseconds a call on each side.
  struct Cost {
    double client_us = 0, server_us = 0;
  };
  uint64_t sequence = 1;
  auto measure = [&](size_t rows, bool update) -> absl::StatusOr<Cost> {
    std::vector<uint64_t> ids(rows);
    for (size_t i = 0; i < rows; ++i) ids[i] = i * 7919 + 1;
    std::vector<float> values(rows * dim, 0.01f);
    auto call = [&]() -> absl::Status {
      if (update) return client.Update(table, ids, values, embedding_ps::UpdateId{1, sequence++});
      return client.Lookup(table, ids, absl::MakeSpan(values));
    };
    for (int i = 0; i < 20; ++i) HYREC_RETURN_IF_ERROR(call());
    HYREC_ASSIGN_OR_RETURN(const double server_start, CpuMilliseconds(ps_pid));
    const double client_start = SelfCpuMs();
    const absl::Time start = absl::Now();
    int calls = 0;
    while (absl::Now() - start < absl::Milliseconds(500) || calls < 50) {
      HYREC_RETURN_IF_ERROR(call());
      ++calls;
    }
    HYREC_ASSIGN_OR_RETURN(const double server_end, CpuMilliseconds(ps_pid));
    return Cost{(SelfCpuMs() - client_start) * 1e3 / calls, (server_end - server_start) * 1e3 / calls};
  };
  constexpr size_t kFew = 16, kMany = 4096;
  Cost fixed[2], per_row[2];
  for (int update = 0; update < 2; ++update) {
    HYREC_ASSIGN_OR_RETURN(const Cost few, measure(kFew, update));
    HYREC_ASSIGN_OR_RETURN(const Cost many, measure(kMany, update));
    per_row[update].client_us = std::max(0.0, (many.client_us - few.client_us) / (kMany - kFew));
    per_row[update].server_us = std::max(0.0, (many.server_us - few.server_us) / (kMany - kFew));
    fixed[update].client_us = std::max(0.0, few.client_us - per_row[update].client_us * kFew);
    fixed[update].server_us = std::max(0.0, few.server_us - per_row[update].server_us * kFew);
  }
  c->rpc_client_us = (fixed[0].client_us + fixed[1].client_us) / 2;
  c->rpc_server_us = (fixed[0].server_us + fixed[1].server_us) / 2;
  c->lookup_client_ns_per_row = per_row[0].client_us * 1e3;
  c->lookup_server_ns_per_row = per_row[0].server_us * 1e3;
  c->update_client_ns_per_row = per_row[1].client_us * 1e3;
  c->update_server_ns_per_row = per_row[1].server_us * 1e3;
  c->rpc_dim = dim;
  return absl::OkStatus();
}

namespace {

// CPU milliseconds a batch of one run, by who spends them.
struct RunCpu {
  double train = 0, client = 0, server = 0, loader = 0, launcher = 0;
  double cores_used = 0;
  double samples_per_second = 0;
  double dense_parameters = 0;
  int ps_processes = 0;
};

// Runs `argv` (hyrec train --processes with one worker and its progress every few batches) and
// reads the roles' CPU over `batches` batches after `warmup`, then stops it.
absl::StatusOr<RunCpu> TimeRun(std::vector<std::string> argv, int batch_size, int warmup, int batches) {
  const std::string report = absl::StrCat("/tmp/hyrec-step-costs-", ::getpid(), ".yaml");
  argv.push_back("--report=" + report);
  HYREC_ASSIGN_OR_RETURN(auto run, Subprocess::Spawn(argv));
  std::optional<CpuSnapshot> first, last;
  std::vector<std::string> tail;
  for (;;) {
    absl::StatusOr<std::string> line = run->ReadLine(absl::Minutes(10));
    if (!line.ok()) break;
    tail.push_back(*line);
    if (tail.size() > 5) tail.erase(tail.begin());
    const std::optional<double> samples = ProgressSamples(*line);
    if (!samples) continue;
    const CpuSnapshot snap = Snapshot(run->pid(), *samples / batch_size);
    if (!snap.complete) continue;
    if (!first && snap.batches >= warmup) {
      first = snap;
    } else if (first) {
      last = snap;
      if (last->batches >= first->batches + batches) break;
    }
  }
  const bool measured = first && last && last->batches - first->batches >= 10;
  run->Signal(SIGINT);
  absl::StatusOr<int> code = run->Wait(absl::Seconds(60));
  if (!code.ok()) {
    run->Signal(SIGKILL);
    (void)run->Wait(absl::Seconds(10));
  }
  if (!measured) {
    return absl::FailedPreconditionError(
        absl::StrCat(absl::StrJoin(argv.begin(), argv.begin() + 3, " "), " ended (",
                     code.ok() ? absl::StrCat("exit code ", *code) : std::string(code.status().message()), ") before ",
                     warmup, " batches of warm-up and 10 timed ones",
                     tail.empty() ? "" : absl::StrCat("; its last lines: ", absl::StrJoin(tail, " | "))));
  }
  RunCpu r;
  {  // The dense parameters (the allreduce's gradients), from the report of the stopped run.
    std::ifstream in(report);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("dense_parameters: ", 0) == 0) (void)absl::SimpleAtod(line.substr(18), &r.dense_parameters);
    }
    std::error_code error;
    std::filesystem::remove(report, error);
  }
  const double n = last->batches - first->batches;
  r.ps_processes = last->ps_processes;
  r.train = (last->train - first->train) / n;
  r.client = (last->worker - last->train - (first->worker - first->train)) / n;
  r.server = (last->ps - first->ps) / n;
  r.loader = (last->loader - first->loader) / n;
  r.launcher = (last->launcher - first->launcher) / n;
  const double all = last->launcher + last->worker + last->ps + last->loader -
                     (first->launcher + first->worker + first->ps + first->loader);
  r.cores_used = all / absl::ToDoubleMilliseconds(last->time - first->time);
  r.samples_per_second = n * batch_size / absl::ToDoubleSeconds(last->time - first->time);
  return r;
}

}  // namespace

absl::StatusOr<StepCosts> MeasureStepCosts(const std::string& train_binary, const std::string& config,
                                           const std::vector<std::string>& overrides, const JobPlan& plan,
                                           const CapacityPlan& capacity, const Calibration& machine,
                                           const StepMeasureOptions& options) {
  const int batches = options.batches;
  const int batch_size = plan.loader.options.batch_size;
  std::vector<std::string> argv = {train_binary, "--processes", "--config=" + config, "--plot=", "--progress=lines"};
  for (const std::string& o : overrides) argv.push_back("--set=" + o);
  // One worker on the data over and over, without the evaluations, checkpoints and exports
  // that would take their share of the time measured or write where the job writes.
  for (const char* o : {"train.workers=1", "loader.epochs=1000", "eval.every_batches=0", "eval.every_epoch=false",
                        "eval.patience=0", "checkpoint.dir=", "checkpoint.every_steps=0", "checkpoint.every_seconds=0",
                        "export.dir=", "export.delta_every_steps=0", "export.delta_every_seconds=0"}) {
    argv.push_back(absl::StrCat("--set=", o));
  }
  argv.push_back(absl::StrCat("--set=train.log_every_batches=", std::max(5, batches / 20)));
  if (options.relay) argv.push_back("--ps_latency_ms=0");
  HYREC_ASSIGN_OR_RETURN(const RunCpu run, TimeRun(argv, batch_size, std::max(10, batches / 5), batches));
  StepCosts s;
  s.batch_size = batch_size;
  s.shards = run.ps_processes;
  s.train_ms = run.train;
  const double client_ms = run.client;
  const double server_ms = run.server;
  s.loader_ms = run.loader;
  s.relay_ms = options.relay ? run.launcher : 0;
  s.cores_used = run.cores_used;
  s.samples_per_second = run.samples_per_second;
  const double dense_parameters = run.dense_parameters;
  // Lookup against update, by the shares the calibration's calls give at this job's rows.
  double rows = 0;
  for (const CapacityPlan::Table& t : capacity.tables) {
    rows += t.ids_per_sample * t.dedup_ratio * batch_size * t.dim / std::max(1, machine.rpc_dim);
  }
  const double rows_per_rpc = rows / std::max(1, s.shards);
  auto split = [&](double total, double fixed_us, double lookup_ns, double update_ns, double* lookup, double* update) {
    const double l = fixed_us * 1e3 + lookup_ns * rows_per_rpc, u = fixed_us * 1e3 + update_ns * rows_per_rpc;
    const double share = l + u > 0 ? l / (l + u) : 0.5;
    *lookup = total * share;
    *update = total - *lookup;
  };
  split(client_ms, machine.rpc_client_us, machine.lookup_client_ns_per_row, machine.update_client_ns_per_row,
        &s.lookup_client_ms, &s.update_client_ms);
  split(server_ms, machine.rpc_server_us, machine.lookup_server_ns_per_row, machine.update_server_ns_per_row,
        &s.lookup_server_ms, &s.update_server_ms);
  s.rpc_client_ms = machine.rpc_client_us / 1e3;
  s.rpc_server_ms = machine.rpc_server_us / 1e3;
  const double workers = std::max(1, capacity.workers);
  s.id_bytes = capacity.id_bytes_per_step / workers;
  s.row_bytes = capacity.row_bytes_per_step_fp32 / workers;
  s.batch_bytes = capacity.loader_bytes_per_step / workers;
  s.dense_bytes = 4 * dense_parameters;
  return s;
}

}  // namespace hyrec::planner

namespace hyrec::planner {

StepCosts ScaleStepCosts(const StepCosts& c, int batch_size, double id_bytes, double row_bytes) {
  StepCosts s = c;
  if (c.batch_size <= 0 || batch_size <= 0) return s;
  const double k = static_cast<double>(batch_size) / c.batch_size;
  // The rows a batch looks up: as the plan counts them, else in proportion to the batch.
  const double r = id_bytes > 0 && c.id_bytes > 0 ? id_bytes / c.id_bytes : k;
  s.batch_size = batch_size;
  s.train_ms *= k;
  s.loader_ms *= k;
  // The per-call part stays; the rest grows with the rows.
  auto rows = [&](double all, double per_call) {
    const double fixed = c.shards * per_call;
    return fixed + std::max(0.0, all - fixed) * r;
  };
  s.lookup_client_ms = rows(c.lookup_client_ms, c.rpc_client_ms);
  s.update_client_ms = rows(c.update_client_ms, c.rpc_client_ms);
  s.lookup_server_ms = rows(c.lookup_server_ms, c.rpc_server_ms);
  s.update_server_ms = rows(c.update_server_ms, c.rpc_server_ms);
  s.id_bytes = id_bytes > 0 ? id_bytes : c.id_bytes * k;
  s.row_bytes = row_bytes > 0 ? row_bytes : c.row_bytes * k;
  s.relay_ms *= r;
  s.batch_bytes *= k;
  return s;
}

absl::StatusOr<ThroughputPlan> PlanThroughput(const JobPlan& plan, const CapacityPlan& capacity,
                                              const ThroughputOptions& o) {
  ThroughputPlan t;
  const double workers = std::max(1, capacity.workers);
  t.costs = ScaleStepCosts(o.costs, capacity.batch_size, capacity.id_bytes_per_step / workers,
                           capacity.row_bytes_per_step_fp32 / workers);
  if (o.dense_step_ms > 0) t.costs.train_ms = o.dense_step_ms;
  if (o.fp16) t.costs.row_bytes /= 2;
  const std::vector<MachineType>& types = o.machines.empty() ? GkeMachineTypes() : o.machines;
  HYREC_ASSIGN_OR_RETURN(const MachineType worker, FindMachineType(types, o.worker_machine, "--worker_machine"));
  HYREC_ASSIGN_OR_RETURN(const MachineType loader, FindMachineType(types, o.loader_machine, "--loader_machine"));
  SimulationOptions& s = t.cluster_options;
  s.workers = capacity.workers;
  s.shards = static_cast<int>(capacity.shards.size());
  s.staleness = o.staleness >= 0 ? o.staleness : plan.workers[0].embedding_staleness;
  s.batches = o.batches;
  s.added_rtt_ms = o.added_rtt_ms;
  s.prefetch_batches = plan.loader.options.prefetch_batches;
  s.one_machine = false;
  s.worker_cores = worker.cpus;
  s.ps_machines = capacity.ps_machines;
  s.ps_cores = capacity.ps_machine.cpus;
  s.loader_machines = o.loader_machines > 0 ? o.loader_machines : capacity.workers;
  s.loader_cores = loader.cpus;
  s.loader_threads = loader.cpus;
  // The slowest link of the three machine types bounds every transfer it takes part in; each
  // machine's egress is modelled at the PS machine's bandwidth when the types differ.
  s.network_gbps = capacity.ps_machine.network_gbps;
  t.worker_machine = worker;
  t.fp16 = o.fp16;
  t.loader_machine = loader;
  t.cluster = Simulate(t.costs, s);
  return t;
}

}  // namespace hyrec::planner

namespace hyrec::planner {

std::string FormatSimulationResult(const SimulationResult& r) {
  std::string out =
      absl::StrFormat("%.0f samples/s, bound by %s\n  busy:", r.samples_per_second, ResourceName(r.bottleneck));
  for (const SimulationResult::Use& u : r.utilization)
    absl::StrAppendFormat(&out, " %s %.0f%%,", ResourceName(u.resource), u.busy * 100);
  out.back() = '\n';
  absl::StrAppendFormat(&out,
                        "  a batch waits %.2f ms for its rows, %.2f ms for acknowledgements, %.2f ms for the loader; "
                        "lookup %.1f ms, update %.1f ms; observed staleness %.2f\n",
                        r.wait_for_rows_ms, r.wait_for_acks_ms, r.wait_for_loader_ms, r.lookup_ms, r.update_ms,
                        r.observed_staleness);
  return out;
}

std::string FormatThroughputPlan(const ThroughputPlan& t, const Calibration& c) {
  const SimulationOptions& s = t.cluster_options;
  std::string out = absl::StrFormat(
      "\nthroughput (simulated, docs/capacity.md): a batch of %s measured on %s (%d cores), at batch %d: training "
      "thread %.2f ms%s, PS %.2f ms, worker's other threads %.2f ms, loader %.2f ms (CPU, all shards)\n",
      c.job, c.machine, c.cpus, t.costs.batch_size, t.costs.train_ms,
      t.costs.train_ms == ScaleStepCosts(c.step, t.costs.batch_size, 0, 0).train_ms ? " (this machine's CPU)"
                                                                                    : " (given)",
      t.costs.lookup_server_ms + t.costs.update_server_ms, t.costs.lookup_client_ms + t.costs.update_client_ms,
      t.costs.loader_ms);
  absl::StrAppendFormat(&out,
                        "  %d worker(s) on %s, %d shard(s) on %d %s, %d loader machine(s) %s, egress %.0f Gb/s, "
                        "added round trip %.1f ms, staleness %d, rows and gradients in %s\n  expected: ",
                        s.workers, t.worker_machine.name, s.shards, s.ps_machines, "PS machine(s)", s.loader_machines,
                        t.loader_machine.name, s.network_gbps, s.added_rtt_ms, s.staleness, t.fp16 ? "fp16" : "fp32");
  out += FormatSimulationResult(t.cluster);
  return out;
}

}  // namespace hyrec::planner

namespace hyrec::planner {

std::vector<ScalingPoint> ScalingCurve(const JobPlan& plan, const CapacityPlan& capacity, const ThroughputOptions& o,
                                       bool weak, const std::vector<int>& workers) {
  std::vector<ScalingPoint> out;
  const int global = capacity.batch_size * std::max(1, capacity.workers);
  double first = 0;
  for (const int w : workers) {
    CapacityPlan at = capacity;
    at.workers = w;
    at.batch_size = weak ? capacity.batch_size : std::max(1, global / w);
    // A step's bytes for these workers and batch, in proportion to the plan's.
    const double k = static_cast<double>(at.batch_size) * w /
                     (static_cast<double>(capacity.batch_size) * std::max(1, capacity.workers));
    at.id_bytes_per_step *= k;
    at.row_bytes_per_step_fp32 *= k;
    at.gradient_bytes_per_step_fp32 *= k;
    at.loader_bytes_per_step *= k;
    ThroughputOptions to = o;
    if (to.dense_step_ms > 0) to.dense_step_ms *= static_cast<double>(at.batch_size) / capacity.batch_size;
    absl::StatusOr<ThroughputPlan> t = PlanThroughput(plan, at, to);
    if (!t.ok()) return out;
    ScalingPoint p;
    p.workers = w;
    p.batch_size = at.batch_size;
    p.result = t->cluster;
    if (out.empty()) first = p.result.samples_per_second / w;
    p.efficiency = first > 0 ? p.result.samples_per_second / (first * w) : 0;
    out.push_back(p);
  }
  return out;
}

std::string FormatScaling(const std::vector<ScalingPoint>& weak, const std::vector<ScalingPoint>& strong) {
  std::string out = "\nscaling (simulated; efficiency: samples/s over the first point's per worker x workers)\n";
  absl::StrAppendFormat(&out, "%8s | %-44s | %-44s\n", "workers", "weak (batch a worker fixed)",
                        "strong (global batch fixed)");
  for (size_t i = 0; i < std::max(weak.size(), strong.size()); ++i) {
    auto cell = [](const std::vector<ScalingPoint>& v, size_t k) {
      if (k >= v.size()) return std::string();
      return absl::StrFormat("b %6d %10.0f/s %4.2f %-14s", v[k].batch_size, v[k].result.samples_per_second,
                             v[k].efficiency, ResourceName(v[k].result.bottleneck));
    };
    absl::StrAppendFormat(&out, "%8d | %-44s | %-44s\n", i < weak.size() ? weak[i].workers : strong[i].workers,
                          cell(weak, i), cell(strong, i));
  }
  return out;
}

}  // namespace hyrec::planner
