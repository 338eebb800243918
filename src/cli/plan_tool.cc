// `hyrec plan`: what a job needs at a given scale (include/hyrec/planner/capacity.h, docs/capacity.md).
//
//   hyrec plan --config=job.yaml [--parameters=100T | --rows_per_table=N] [--workers=N] [--batch_size=N]
//              [--ps_shards=N] [--ps_machine=TYPE] [--machines=gke|FILE.yaml] [--dedup_ratio=R] [--json]
//              [--calibrate [--out=FILE] | --calibration=FILE]
#include <unistd.h>

#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/job/job_spec.h"
#include "hyrec/planner/capacity.h"
#include "src/cli/job_flags.h"
#include "src/cli/roles.h"

namespace hyrec::cli {
namespace {

struct PlanFlags {
  std::string config;
  std::vector<std::string> overrides;  // --set
  std::string parameters;
  std::string rows_per_table;
  std::string machines = "gke";
  bool json = false;
  bool calibrate = false;
  std::string calibration;  // --calibration: a file --calibrate wrote.
  std::string out = "hyrec-calibration.yaml";
  int calibrate_batches = 200;
  uint64_t process_bytes = 0;  // --process_bytes; 0: the calibration's, else CapacityOptions' default.
  bool scaling = false;
  planner::CapacityOptions options;
  planner::ThroughputOptions throughput;
};

// The prediction's options: the flags' with the calibration's step costs.
planner::ThroughputOptions ThroughputOptionsFor(const PlanFlags& f, const planner::Calibration& c) {
  planner::ThroughputOptions o = f.throughput;
  o.costs = c.step;
  o.machines = f.options.machines;
  return o;
}

// Prints what the calibration's step costs predict for the planned job (and its scaling with
// --scaling), or why there is no prediction.
void PrintThroughput(const PlanFlags& f, const planner::Calibration* c, const job::JobPlan& plan,
                     const planner::CapacityPlan& capacity, const absl::StatusOr<planner::ThroughputPlan>& t) {
  if (!t.ok()) {
    std::cout << "\nthroughput: " << t.status().message() << "\n";
    return;
  }
  if (c->job != f.config) {
    std::cout << "\nnote: the step costs were measured on " << c->job
              << ", another job file; its model and data set them\n";
  }
  std::cout << planner::FormatThroughputPlan(*t, *c);
  if (!f.scaling) return;
  const planner::ThroughputOptions o = ThroughputOptionsFor(f, *c);
  const std::vector<int> workers = {1, 2, 4, 8, 16, 32, 64};
  std::cout << planner::FormatScaling(planner::ScalingCurve(plan, capacity, o, true, workers),
                                      planner::ScalingCurve(plan, capacity, o, false, workers));
}

// The prediction from the calibration's step costs; FailedPrecondition saying how to get them
// when it has none.
absl::StatusOr<planner::ThroughputPlan> Throughput(const PlanFlags& f, const planner::Calibration* c,
                                                   const job::JobPlan& plan, const planner::CapacityPlan& capacity) {
  if (c == nullptr || c->job.empty()) {
    return absl::FailedPreconditionError(
        "not predicted; hyrec plan --calibrate --config=JOB measures what a batch costs here and predicts it "
        "(docs/capacity.md)");
  }
  return planner::PlanThroughput(plan, capacity, ThroughputOptionsFor(f, *c));
}

absl::Status RunPlan(PlanFlags& f) {
  std::optional<planner::Calibration> calibration;
  if (f.calibrate) {
    const std::string scratch = absl::StrCat("/tmp/hyrec-calibrate-", ::getpid());
    HYREC_ASSIGN_OR_RETURN(const planner::Calibration c,
                           planner::Calibrate(ExecutableDirectory() + "/hyrec-ps", scratch));
    HYREC_RETURN_IF_ERROR(planner::WriteCalibration(c, f.out));
    std::cerr << "hyrec plan: calibrated on " << c.machine << ": a PS process takes " << c.process_bytes
              << " bytes beside its store; store lookup " << c.lookup_ns_per_row << " ns, update "
              << c.update_ns_per_row << " ns a row; wrote " << f.out << "\n";
    calibration = c;
  } else if (!f.calibration.empty()) {
    HYREC_ASSIGN_OR_RETURN(calibration, planner::ReadCalibration(f.calibration));
  }
  if (calibration) {
    f.options.process_bytes = calibration->process_bytes;  // Unless --process_bytes says otherwise (below).
    f.options.serving_fixed_bytes = calibration->serving_fixed_bytes;
    f.options.serving_per_byte = calibration->serving_per_byte;
  }
  if (f.process_bytes > 0) f.options.process_bytes = f.process_bytes;
  if (f.calibrate && f.config.empty()) return absl::OkStatus();
  if (f.config.empty()) return absl::InvalidArgumentError("--config=JOB.yaml is required");
  if (!f.parameters.empty() && !f.rows_per_table.empty()) {
    return absl::InvalidArgumentError("--parameters and --rows_per_table: give one (both size every table)");
  }
  if (!f.parameters.empty()) {
    HYREC_ASSIGN_OR_RETURN(f.options.parameters, planner::ParseCount(f.parameters, "--parameters"));
  }
  if (!f.rows_per_table.empty()) {
    HYREC_ASSIGN_OR_RETURN(const double rows, planner::ParseCount(f.rows_per_table, "--rows_per_table", 0x1p62));
    f.options.rows_per_table = static_cast<uint64_t>(rows);
  }
  if (f.machines != "gke") {
    HYREC_ASSIGN_OR_RETURN(f.options.machines, planner::LoadMachineTypes(f.machines));
  }
  const std::vector<planner::MachineType>& types =
      f.options.machines.empty() ? planner::GkeMachineTypes() : f.options.machines;
  HYREC_RETURN_IF_ERROR(planner::FindMachineType(types, f.throughput.worker_machine, "--worker_machine").status());
  HYREC_RETURN_IF_ERROR(planner::FindMachineType(types, f.throughput.loader_machine, "--loader_machine").status());
  HYREC_ASSIGN_OR_RETURN(const job::JobSpec spec, job::LoadJobSpec(f.config, f.overrides));
  HYREC_ASSIGN_OR_RETURN(const job::JobPlan plan, job::Plan(spec));
  if (spec.ps.wire_fp16) f.throughput.fp16 = true;  // The job's own wire (ps.wire_precision).
  if (f.calibrate) {                                // What a batch of this job costs here, at the job's own scale.
    planner::CapacityOptions own = f.options;  // The tables' sizes as given; the job's own workers, batch and shards.
    own.workers = own.batch_size = own.ps_shards = 0;
    HYREC_ASSIGN_OR_RETURN(const planner::CapacityPlan at_own_scale, planner::PlanCapacity(plan, own));
    HYREC_ASSIGN_OR_RETURN(calibration->step,
                           planner::MeasureStepCosts(ExecutableDirectory() + "/hyrec-train", f.config, f.overrides,
                                                     plan, at_own_scale, *calibration, {f.calibrate_batches, false}));
    calibration->job = f.config;
    HYREC_RETURN_IF_ERROR(planner::WriteCalibration(*calibration, f.out));
    std::cerr << "hyrec plan: a batch of " << f.config << " takes " << calibration->step.train_ms
              << " ms of the worker's training thread here; wrote " << f.out << "\n";
  }
  HYREC_ASSIGN_OR_RETURN(const planner::CapacityPlan capacity, planner::PlanCapacity(plan, f.options));
  const planner::Calibration* c = calibration ? &*calibration : nullptr;
  const absl::StatusOr<planner::ThroughputPlan> throughput = Throughput(f, c, plan, capacity);
  if (f.json) {
    std::cout << planner::CapacityPlanJson(capacity, throughput.ok() ? &*throughput : nullptr);
    return absl::OkStatus();
  }
  std::cout << planner::FormatCapacityPlan(capacity);
  PrintThroughput(f, c, plan, capacity, throughput);
  return absl::OkStatus();
}

}  // namespace

int PlanMain(int argc, char** argv) {
  PlanFlags f;
  planner::CapacityOptions& o = f.options;
  FlagSet flags("hyrec plan",
                "What a job needs at a given scale: each table's rows and bytes per row, each PS shard's memory, the "
                "PS machines, and the bytes a training step moves (docs/capacity.md).");
  flags.String("config", &f.config, "FILE", "The job's YAML file (required).");
  AddSetFlag(flags, &f.overrides);
  flags.String("parameters", &f.parameters, "COUNT",
               "Logical parameters over every table (rows x dim), spread evenly in rows: 100T, 5G, 1e9.");
  flags.String("rows_per_table", &f.rows_per_table, "COUNT", "Every table's logical rows (default: its capacity).");
  flags.Int("workers", &o.workers, "Dense workers (default: the job's train.workers).", 0, 1 << 16);
  flags.Int("batch_size", &o.batch_size, "Samples a batch (default: the job's loader.batch_size).", 0, 1 << 24);
  flags.Int("ps_shards", &o.ps_shards, "PS shards (default: the job's ps.shards).", 0, 1 << 16);
  flags.String("ps_machine", &o.ps_machine, "TYPE", "The PS nodes' machine type (default m3-megamem-64).");
  flags.String("machines", &f.machines, "gke|FILE",
               "gke (published GKE machine types, assumptions) or a YAML list of {name, cpus, memory_gib, "
               "network_gbps, price_per_hour, gpus, accelerator}.");
  flags.Double("dedup_ratio", &o.dedup_ratio,
               "Unique ids a batch over its ids (default: measured on the job's first batches).", 0, 1);
  flags.Int("measure_batches", &o.measure_batches, "Batches of the job's data to measure ids on.", 1, 100000);
  flags.Uint64("process_bytes", &f.process_bytes,
               "A PS process's memory beside its store (default: the calibration's, else 256 MiB).");
  flags.Bool("json", &f.json, "Print JSON (for tools) instead of tables.");
  flags.Bool("calibrate", &f.calibrate,
             "Measure this machine (a PS process's memory, the store's costs) into --out, then plan with it.");
  flags.String("out", &f.out, "FILE", "Where --calibrate writes (default hyrec-calibration.yaml).");
  flags.String("calibration", &f.calibration, "FILE", "Plan with what --calibrate wrote.");
  flags.Int("calibrate_batches", &f.calibrate_batches, "Batches of the job --calibrate --config times.", 10, 100000);
  planner::ThroughputOptions& t = f.throughput;
  flags.String("worker_machine", &t.worker_machine, "TYPE", "The workers' machine type (default a2-highgpu-1g).");
  flags.String("loader_machine", &t.loader_machine, "TYPE", "The loaders' machine type (default c2-standard-30).");
  flags.Int("loader_machines", &t.loader_machines, "Loader machines (default: one a worker).", 0, 1 << 16);
  flags.Double("dense_step_ms", &t.dense_step_ms,
               "A batch's dense step on the workers' machines (default: as calibrated on this one).", 0, 1e6);
  flags.Int("staleness", &t.staleness, "train.embedding_staleness for the prediction (default: the job's).", -1, 1000);
  flags.Bool("fp16", &t.fp16,
             "Predict with rows and gradients in fp16 on the wire (half their bytes); the default for a job whose "
             "ps.wire_precision is fp16.");
  flags.Bool("scaling", &f.scaling,
             "Also predict weak and strong scaling over 1-64 workers (with step costs from --calibrate --config).");
  flags.Double("added_rtt_ms", &t.added_rtt_ms, "The network's round trip between workers and PS machines.", 0, 1e4);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  const absl::Status status = RunPlan(f);
  if (!status.ok()) std::cerr << "hyrec plan: " << status.message() << "\n";
  return ExitCodeFor(status);
}

}  // namespace hyrec::cli
