// The simulator (include/hyrec/planner/simulator.h) against measured runs: `hyrec train --processes`
// on this machine for a configuration (shards, workers, staleness, added PS latency) of a model
// shape, beside Simulate's prediction for it from the step costs `hyrec plan --calibrate
// --config` measures on the shape's own job. simulator_benchmark prints the table and records
// it; simulator_recorded_test checks the simulator against the recording.
#ifndef HYREC_BENCHMARKS_SIMULATOR_VALIDATION_H_
#define HYREC_BENCHMARKS_SIMULATOR_VALIDATION_H_

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/job/job_spec.h"
#include "hyrec/planner/capacity.h"

namespace hyrec::bench {

// A model and data shape: a synthetic job of `batches` batches on one worker.
struct ModelShape {
  std::string name;
  int dim;
  int ids_per_sample;
  int batch;
  std::string mlp;  // Bottom and top MLP widths, as YAML.
  int batches;
};

inline std::string ShapeJobYaml(const ModelShape& s) {
  return absl::StrCat("loader:\n  source:\n    format: synthetic\n    synthetic: {num_samples: ",
                      static_cast<uint64_t>(s.batches) * s.batch,
                      ", vocabulary: 100000, ids_per_sample: ", s.ids_per_sample, ", seed: 1}\n  batch_size: ", s.batch,
                      "\n  threads: 1\neval: {samples: 1024}\nmodel: {kind: dlrm, embedding_dim: ", s.dim,
                      ", bottom: ", s.mlp, ", top: ", s.mlp,
                      "}\nps: {shards: 2, optimizer: adagrad}\n"
                      "train: {workers: 1, embedding_staleness: 4, log_every_batches: 100000}\n");
}

struct RunConfig {
  int shards = 2;
  int workers = 1;
  int staleness = 4;
  double added_rtt_ms = 0;
  std::string Name() const {
    return absl::StrFormat("%d shard(s), %d worker(s), staleness %d, +%.0f ms", shards, workers, staleness,
                           added_rtt_ms);
  }
};

struct Measured {
  double samples_per_second = 0;  // The steady rate hyrec train reports.
  double waited_ms = 0;           // Worker 0's wait for rows a batch.
  double observed_staleness = 0;
  double lookup_ms = 0;  // A batch's lookups and update, until acknowledged (worker 0).
  double update_ms = 0;
};

// One `hyrec train --processes` run of `job` in `config`.
inline absl::StatusOr<Measured> MeasureRun(const std::string& train_binary, const std::string& job,
                                           const RunConfig& config) {
  std::vector<std::string> argv = {train_binary,
                                   "--processes",
                                   "--config=" + job,
                                   "--plot=",
                                   "--progress=lines",
                                   absl::StrCat("--set=ps.shards=", config.shards),
                                   absl::StrCat("--set=train.workers=", config.workers),
                                   absl::StrCat("--set=train.embedding_staleness=", config.staleness)};
  // Always through the relays (at 0 ms too), as the calibration ran.
  argv.push_back(absl::StrCat("--ps_latency_ms=", config.added_rtt_ms));
  HYREC_ASSIGN_OR_RETURN(auto p, Subprocess::Spawn(argv));
  Measured m;
  std::string last;
  for (;;) {
    absl::StatusOr<std::string> line = p->ReadLine(absl::Minutes(10));
    if (!line.ok()) break;
    last = *line;
    const size_t steady = line->find("(steady: ");
    if (line->rfind("summary:", 0) == 0 && steady != std::string::npos) {
      (void)absl::SimpleAtod(line->substr(steady + 9, line->find(' ', steady + 9) - steady - 9), &m.samples_per_second);
    }
    const size_t waited = line->find("; waited ");
    const size_t observed = line->find("observed staleness ");
    if (line->find("  PS lookup") == 0 && waited != std::string::npos && observed != std::string::npos) {
      (void)absl::SimpleAtod(line->substr(12, line->find(' ', 12) - 12), &m.lookup_ms);
      const size_t update = line->find("update ");
      if (update != std::string::npos) {
        (void)absl::SimpleAtod(line->substr(update + 7, line->find(' ', update + 7) - update - 7), &m.update_ms);
      }
      (void)absl::SimpleAtod(line->substr(waited + 9, line->find(' ', waited + 9) - waited - 9), &m.waited_ms);
      (void)absl::SimpleAtod(line->substr(observed + 19, line->find(' ', observed + 19) - observed - 19),
                             &m.observed_staleness);
    }
  }
  HYREC_ASSIGN_OR_RETURN(const int code, p->Wait(absl::Minutes(1)));
  if (code != 0 || m.samples_per_second <= 0) {
    return absl::InternalError(absl::StrCat(train_binary, " on ", job, " (", config.Name(), ") exited with ", code,
                                            "; its last line: ", last));
  }
  return m;
}

// `config` of the job `plan` (`batches` in all), every role on one machine of `machine_cores`
// cores (0: this one's), through the relays.
inline planner::SimulationOptions Options(const job::JobPlan& plan, const RunConfig& config, int batches,
                                          int machine_cores = 0) {
  planner::SimulationOptions o;
  o.workers = config.workers;
  o.shards = config.shards;
  o.staleness = config.staleness;
  o.added_rtt_ms = config.added_rtt_ms;
  o.batches = batches / config.workers;
  o.loader_threads = plan.loader.options.threads;
  o.prefetch_batches = plan.loader.options.prefetch_batches;
  o.one_machine = true;
  o.machine_cores = machine_cores > 0 ? machine_cores : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  o.relay = true;
  return o;
}

// The shape's job written under `dir`, its plan, its step costs measured here (in kCalibration,
// the mean of `runs` runs: one run's rate varies from the next on a shared machine) and
// the cores its roles could use together then.
struct CalibratedShape {
  std::string job;
  job::JobPlan plan;
  planner::StepCosts costs;
  double usable_cores = 0;
};
// The configuration the step costs are measured in: the job's own (2 shards, one worker,
// staleness 4), through the relays at 0 ms.
inline const RunConfig kCalibration = {2, 1, 4, 0};
inline absl::StatusOr<CalibratedShape> CalibrateShape(const std::string& train_binary, const ModelShape& shape,
                                                      const planner::Calibration& machine, const std::string& dir,
                                                      int runs = 2) {
  CalibratedShape c;
  c.job = absl::StrCat(dir, "/", shape.name, ".yaml");
  std::ofstream(c.job) << ShapeJobYaml(shape);
  HYREC_ASSIGN_OR_RETURN(const job::JobSpec spec, job::LoadJobSpec(c.job, {}));
  HYREC_ASSIGN_OR_RETURN(c.plan, job::Plan(spec));
  planner::CapacityOptions own;
  own.process_bytes = machine.process_bytes;
  HYREC_ASSIGN_OR_RETURN(const planner::CapacityPlan capacity, planner::PlanCapacity(c.plan, own));
  planner::StepMeasureOptions measure;
  measure.batches = std::min(200, shape.batches / 2);
  measure.relay = true;
  // The measured figures, averaged over the runs.
  auto measured = [](planner::StepCosts& s) {
    return std::vector<double*>{&s.train_ms,         &s.lookup_client_ms, &s.update_client_ms,
                                &s.lookup_server_ms, &s.update_server_ms, &s.loader_ms,
                                &s.relay_ms,         &s.cores_used,       &s.samples_per_second};
  };
  for (int run = 0; run < runs; ++run) {
    HYREC_ASSIGN_OR_RETURN(planner::StepCosts s,
                           planner::MeasureStepCosts(train_binary, c.job, {}, c.plan, capacity, machine, measure));
    if (run == 0) {
      c.costs = s;
      continue;
    }
    const std::vector<double*> sum = measured(c.costs), add = measured(s);
    for (size_t k = 0; k < sum.size(); ++k) *sum[k] += *add[k];
  }
  for (double* v : measured(c.costs)) *v /= runs;
  planner::SimulationOptions at = Options(c.plan, kCalibration, shape.batches);
  c.usable_cores = planner::UsableCores(c.costs, at);
  return c;
}

// The median of `runs` measured runs of `config` (their rates, waits and staleness, each the
// median of its own), and in *low, *high the slowest and fastest rate.
inline absl::StatusOr<Measured> MeasureMedian(const std::string& train_binary, const std::string& job,
                                              const RunConfig& config, int runs, double* low = nullptr,
                                              double* high = nullptr) {
  std::vector<Measured> all;
  for (int r = 0; r < runs; ++r) {
    HYREC_ASSIGN_OR_RETURN(Measured m, MeasureRun(train_binary, job, config));
    all.push_back(m);
  }
  auto median = [&](double Measured::*field) {
    std::vector<double> v;
    for (const Measured& m : all) v.push_back(m.*field);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Measured m;
  m.samples_per_second = median(&Measured::samples_per_second);
  m.waited_ms = median(&Measured::waited_ms);
  m.observed_staleness = median(&Measured::observed_staleness);
  m.lookup_ms = median(&Measured::lookup_ms);
  m.update_ms = median(&Measured::update_ms);
  if (low != nullptr) *low = all[0].samples_per_second;
  if (high != nullptr) *high = all[0].samples_per_second;
  for (const Measured& a : all) {
    if (low != nullptr) *low = std::min(*low, a.samples_per_second);
    if (high != nullptr) *high = std::max(*high, a.samples_per_second);
  }
  return m;
}

// What Simulate predicts for `config` of the calibrated shape.
inline planner::SimulationResult Predict(const CalibratedShape& shape, const RunConfig& config, int batches,
                                         int machine_cores = 0) {
  planner::SimulationOptions o = Options(shape.plan, config, batches, machine_cores);
  o.usable_cores = shape.usable_cores;
  return planner::Simulate(shape.costs, o);
}

// A recording of simulator_benchmark's runs (--record=DIR), which simulator_recorded_test checks
// the simulator against without running anything: DIR/<shape>-<round>.yaml, the step costs each
// round measured (a calibration file: WriteCalibration, with its job's step), and DIR/runs.yaml,
// the machine's cores, the shapes and every measured run:
//   machine_cores: 2
//   shapes:
//     - {name: small, dim: 16, ids_per_sample: 1, batch: 512, mlp: "[64, 32]", batches: 300}
//   runs:
//     - {shape: small, round: 1, shards: 2, workers: 1, staleness: 4, added_rtt_ms: 0,
//        samples_per_second: 5123.4}
inline std::string RecordedCalibrationPath(const std::string& dir, const std::string& shape, int round) {
  return absl::StrCat(dir, "/", shape, "-", round, ".yaml");
}
struct RecordedRun {
  std::string shape;
  int round = 0;
  RunConfig config;
  double samples_per_second = 0;
};
inline std::string RecordedRunsYaml(int machine_cores, const std::vector<ModelShape>& shapes,
                                    const std::vector<RecordedRun>& runs) {
  std::string out = absl::StrCat(
      "# simulator_benchmark --record: hyrec train --processes runs measured on one machine, and the step costs\n"
      "# each round measured before them (<shape>-<round>.yaml). simulator_recorded_test predicts these runs.\n",
      "machine_cores: ", machine_cores, "\nshapes:\n");
  for (const ModelShape& s : shapes) {
    absl::StrAppend(&out, "  - {name: ", s.name, ", dim: ", s.dim, ", ids_per_sample: ", s.ids_per_sample,
                    ", batch: ", s.batch, ", mlp: \"", s.mlp, "\", batches: ", s.batches, "}\n");
  }
  out += "runs:\n";
  for (const RecordedRun& r : runs) {
    absl::StrAppend(&out, "  - {shape: ", r.shape, ", round: ", r.round, ", shards: ", r.config.shards,
                    ", workers: ", r.config.workers, ", staleness: ", r.config.staleness,
                    ", added_rtt_ms: ", r.config.added_rtt_ms,
                    ", samples_per_second: ", absl::StrFormat("%.1f", r.samples_per_second), "}\n");
  }
  return out;
}

}  // namespace hyrec::bench

#endif  // HYREC_BENCHMARKS_SIMULATOR_VALIDATION_H_
