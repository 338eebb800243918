// The simulator against measured runs, without running anything: tests/data/simulator/ holds what
// `simulator_benchmark --record` measured on one machine (2 cores): for two model shapes and
// three rounds, the step costs each round measured (as `hyrec plan --calibrate --config` measures
// them) and then ten configurations of `hyrec train --processes` (shards 1-4, workers 1-2,
// staleness 0 and 4, added PS round trip 0-20 ms) run for real. Each configuration's prediction
// from its round's step costs, the median over the rounds, is within 15% of the measured rate,
// but for four known misses, which may not get worse.
// Whatever this machine's speed or load, the verdict is the same: the live comparison is
// simulator_benchmark's (docs/benchmarks.md).
#include <algorithm>
#include <cmath>
#include <map>

#include "benchmarks/simulator_validation.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace hyrec::bench {
namespace {

const std::string kDir = HYREC_SOURCE_DIR "/tests/data/simulator";

struct Recording {
  int machine_cores = 0;
  std::vector<ModelShape> shapes;
  std::vector<RecordedRun> runs;
};

Recording Load() {
  Recording r;
  const YAML::Node root = YAML::LoadFile(kDir + "/runs.yaml");
  r.machine_cores = root["machine_cores"].as<int>();
  for (const YAML::Node& s : root["shapes"]) {
    r.shapes.push_back({s["name"].as<std::string>(), s["dim"].as<int>(), s["ids_per_sample"].as<int>(),
                        s["batch"].as<int>(), s["mlp"].as<std::string>(), s["batches"].as<int>()});
  }
  for (const YAML::Node& run : root["runs"]) {
    RecordedRun x;
    x.shape = run["shape"].as<std::string>();
    x.round = run["round"].as<int>();
    x.config = {run["shards"].as<int>(), run["workers"].as<int>(), run["staleness"].as<int>(),
                run["added_rtt_ms"].as<double>()};
    x.samples_per_second = run["samples_per_second"].as<double>();
    r.runs.push_back(x);
  }
  return r;
}

// The shape as simulator_benchmark calibrated it in `round`: its job's plan and the step costs read
// back from the recording.
CalibratedShape Recorded(const ModelShape& shape, int round, int machine_cores) {
  CalibratedShape c;
  absl::StatusOr<job::JobSpec> spec = job::ParseJobSpecText(ShapeJobYaml(shape), shape.name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<job::JobPlan> plan = job::Plan(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  c.plan = *plan;
  absl::StatusOr<planner::Calibration> calibration =
      planner::ReadCalibration(RecordedCalibrationPath(kDir, shape.name, round));
  EXPECT_TRUE(calibration.ok()) << calibration.status();
  c.costs = calibration->step;
  EXPECT_EQ(calibration->cpus, machine_cores);
  c.usable_cores = planner::UsableCores(c.costs, Options(c.plan, kCalibration, shape.batches, machine_cores));
  return c;
}

// The configurations the simulator misses by more than 15% on this recording, with the median
// ratio it gives them (docs/capacity.md says why: the heavy shape's synchronous runs leave cores
// idle between round trips, and the same work then takes less CPU than the calibration, where
// every role is busy at once, measured; the small shape's 4 shards are 0.03% over). These may not
// get worse; any other configuration must be within 15%.
const std::map<std::string, double> kKnownMisses = {
    {"small, 4 shard(s), 1 worker(s), staleness 4, +0 ms", 1.150},
    {"heavy, 2 shard(s), 1 worker(s), staleness 0, +0 ms", 0.824},
    {"heavy, 2 shard(s), 2 worker(s), staleness 0, +0 ms", 0.750},
    {"heavy, 1 shard(s), 1 worker(s), staleness 0, +20 ms", 0.759},
};

TEST(SimulatorRecordedTest, PredictsTheRecordedRunsWithinFifteenPercent) {
  const Recording r = Load();
  ASSERT_EQ(r.shapes.size(), 2u);
  int configurations = 0, within = 0;
  for (const ModelShape& shape : r.shapes) {
    std::map<std::string, std::vector<double>> ratios;  // Configuration -> predicted / measured, per round.
    for (const RecordedRun& run : r.runs) {
      if (run.shape != shape.name) continue;
      const CalibratedShape c = Recorded(shape, run.round, r.machine_cores);
      const planner::SimulationResult predicted = Predict(c, run.config, shape.batches, r.machine_cores);
      ratios[run.config.Name()].push_back(predicted.samples_per_second / run.samples_per_second);
    }
    for (auto& [name, v] : ratios) {
      std::sort(v.begin(), v.end());
      const double median = v[v.size() / 2];
      const std::string which = shape.name + ", " + name;
      std::printf("%s: predicted / measured %.3f (median of %zu rounds)\n", which.c_str(), median, v.size());
      ++configurations;
      if (const auto miss = kKnownMisses.find(which); miss != kKnownMisses.end()) {
        EXPECT_LE(std::abs(median - 1), std::abs(miss->second - 1) + 0.005) << which << ": worse than recorded";
        continue;
      }
      EXPECT_NEAR(median, 1, 0.15) << which;
      ++within;
    }
  }
  EXPECT_EQ(configurations, 20);
  EXPECT_EQ(within, 16);
}

// The same costs and options give the same prediction, to the bit: the simulation is a function
// of its inputs, never of the machine it runs on.
TEST(SimulatorRecordedTest, PredictionsAreDeterministic) {
  const Recording r = Load();
  const CalibratedShape c = Recorded(r.shapes[1], 1, r.machine_cores);
  for (const RunConfig& config : {RunConfig{4, 2, 4, 5}, RunConfig{1, 1, 0, 20}}) {
    const planner::SimulationResult a = Predict(c, config, r.shapes[1].batches, r.machine_cores);
    const planner::SimulationResult b = Predict(c, config, r.shapes[1].batches, r.machine_cores);
    EXPECT_EQ(a.samples_per_second, b.samples_per_second);
    EXPECT_EQ(a.wait_for_rows_ms, b.wait_for_rows_ms);
    EXPECT_EQ(a.bottleneck, b.bottleneck);
  }
}

}  // namespace
}  // namespace hyrec::bench
