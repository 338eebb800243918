// The simulator's predicted samples/s against measured `hyrec train --processes` runs on this
// machine, for two model shapes and ten configurations each (shards 1-4, workers 1-2, staleness
// 0 and 4, added PS round trip 0-20 ms). The floor of each prediction is the measured run itself:
// the ratio is predicted / measured (docs/benchmarks.md, docs/capacity.md).
//
//   build/benchmarks/simulator_benchmark [--shape=small|heavy] [--rounds=3] [--record=DIR]
// Each round measures the step costs (one calibration run) and then runs every configuration
// once; the table shows the medians over the rounds and each round's ratio. --record writes the
// step costs and the measured rates to DIR (simulator_validation.h says how), as
// tests/data/simulator/ holds them for simulator_recorded_test.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "benchmarks/simulator_validation.h"

namespace {

using namespace hyrec;

int Run(const std::string& only, int rounds, const std::string& record) {
  const std::string dir = absl::StrCat("/tmp/hyrec_simulator_benchmark_", ::getpid());
  std::filesystem::create_directories(dir);
  absl::StatusOr<planner::Calibration> machine = planner::Calibrate(HYREC_PS_BINARY, dir);
  if (!machine.ok()) {
    std::fprintf(stderr, "simulator_benchmark: %s\n", machine.status().ToString().c_str());
    return 1;
  }
  const std::vector<bench::ModelShape> shapes = {{"small", 16, 1, 512, "[64, 32]", 300},
                                                 {"heavy", 64, 4, 256, "[64, 32]", 300}};
  const std::vector<bench::RunConfig> configs = {{2, 1, 4, 0},  {1, 1, 4, 0}, {4, 1, 4, 0},  {2, 1, 0, 0},
                                                 {2, 2, 4, 0},  {2, 2, 0, 0}, {2, 1, 4, 10}, {2, 1, 0, 10},
                                                 {1, 1, 0, 20}, {4, 2, 4, 5}};
  int worst = 0;
  double worst_error = 0;
  std::vector<bench::RecordedRun> recorded;
  std::vector<bench::ModelShape> recorded_shapes;
  if (!record.empty()) std::filesystem::create_directories(record);
  for (const bench::ModelShape& shape : shapes) {
    if (!only.empty() && shape.name != only) continue;
    recorded_shapes.push_back(shape);
    // Per configuration and round: measured and predicted samples/s. Each round calibrates anew:
    // a shared machine's speed drifts over minutes (docs/benchmarks.md).
    std::vector<std::vector<double>> measured(configs.size()), predicted(configs.size());
    std::vector<bench::Measured> last(configs.size());
    std::vector<planner::SimulationResult> last_prediction(configs.size());
    for (int round = 0; round < rounds; ++round) {
      absl::StatusOr<bench::CalibratedShape> c = bench::CalibrateShape(HYREC_TRAIN_BINARY, shape, *machine, dir, 1);
      if (!c.ok()) {
        std::fprintf(stderr, "simulator_benchmark: %s\n", c.status().ToString().c_str());
        return 1;
      }
      std::printf(
          "%s, round %d: a batch here: training thread %.2f ms, worker's other threads %.2f ms, PS %.2f ms, "
          "loader %.2f ms, relays %.2f ms (CPU); %.2f cores busy (usable: %.2f)\n",
          shape.name.c_str(), round + 1, c->costs.train_ms, c->costs.lookup_client_ms + c->costs.update_client_ms,
          c->costs.lookup_server_ms + c->costs.update_server_ms, c->costs.loader_ms, c->costs.relay_ms,
          c->costs.cores_used, c->usable_cores);
      std::fflush(stdout);
      if (!record.empty()) {
        planner::Calibration calibration = *machine;
        calibration.machine = "recording";
        calibration.job = c->job.substr(c->job.rfind('/') + 1);
        calibration.step = c->costs;
        const absl::Status written =
            planner::WriteCalibration(calibration, bench::RecordedCalibrationPath(record, shape.name, round + 1));
        if (!written.ok()) {
          std::fprintf(stderr, "simulator_benchmark: %s\n", written.ToString().c_str());
          return 1;
        }
      }
      for (size_t k = 0; k < configs.size(); ++k) {
        absl::StatusOr<bench::Measured> m = bench::MeasureRun(HYREC_TRAIN_BINARY, c->job, configs[k]);
        if (!m.ok()) {
          std::fprintf(stderr, "simulator_benchmark: %s\n", m.status().ToString().c_str());
          return 1;
        }
        last_prediction[k] = bench::Predict(*c, configs[k], shape.batches);
        last[k] = *m;
        measured[k].push_back(m->samples_per_second);
        recorded.push_back({shape.name, round + 1, configs[k], m->samples_per_second});
        predicted[k].push_back(last_prediction[k].samples_per_second);
      }
    }
    std::printf("%s: dim %d, %d ids a feature, batch %d, MLPs %s; %d round(s)\n", shape.name.c_str(), shape.dim,
                shape.ids_per_sample, shape.batch, shape.mlp.c_str(), rounds);
    std::printf(
        "| configuration | measured samples/s | predicted | predicted / measured (rounds) | waited ms meas. / "
        "pred. | staleness meas. / pred. | bound by (predicted) |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t k = 0; k < configs.size(); ++k) {
      std::vector<double> ratios;
      for (size_t r = 0; r < measured[k].size(); ++r) ratios.push_back(predicted[k][r] / measured[k][r]);
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double ratio = median(ratios);
      std::string each;
      for (double r : ratios) each += absl::StrFormat(" %.2f", r);
      const planner::SimulationResult& p = last_prediction[k];
      std::printf("| %s%s | %.0f | %.0f | **%.2f** (%s) | %.2f / %.2f | %.2f / %.2f | %s |\n",
                  configs[k].Name().c_str(), k == 0 ? " (the calibration's)" : "", median(measured[k]),
                  median(predicted[k]), ratio, each.substr(1).c_str(), last[k].waited_ms, p.wait_for_rows_ms,
                  last[k].observed_staleness, p.observed_staleness, ResourceName(p.bottleneck));
      if (k == 0) continue;
      worst_error = std::max(worst_error, std::abs(ratio - 1));
      worst += std::abs(ratio - 1) > 0.15;
    }
    std::fflush(stdout);
  }
  std::printf(
      "%d configuration(s) besides the calibration's off by more than 15%% (median of the rounds); the worst "
      "off by %.0f%%\n",
      worst, worst_error * 100);
  if (!record.empty()) {
    std::ofstream(record + "/runs.yaml") << bench::RecordedRunsYaml(static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)),
                                                                    recorded_shapes, recorded);
    std::printf("recorded in %s\n", record.c_str());
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only, record;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0 && std::atoi(argv[i] + 9) >= 1) {
      rounds = std::atoi(argv[i] + 9);
      continue;
    }
    if (std::strncmp(argv[i], "--record=", 9) == 0 && argv[i][9] != '\0') {
      record = argv[i] + 9;
      continue;
    }
    if (std::strncmp(argv[i], "--shape=", 8) == 0 &&
        (std::strcmp(argv[i] + 8, "small") == 0 || std::strcmp(argv[i] + 8, "heavy") == 0)) {
      only = argv[i] + 8;
      continue;
    }
    std::fprintf(stderr,
                 "simulator_benchmark: %s: not --shape=small, --shape=heavy, --rounds=N (N >= 1) or --record=DIR\n",
                 argv[i]);
    return 2;
  }
  return Run(only, rounds, record);
}
