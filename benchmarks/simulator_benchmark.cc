// The simulator's predicted samples/s against measured `hyrec train --processes` runs on this
// machine, for two model shapes and ten configurations each (shards 1-4, workers 1-2, staleness
// 0 and 4, added PS round trip 0-20 ms). The floor of each prediction is the measured run itself:
// the ratio is predicted / measured (docs/benchmarks.md, docs/capacity.md).
//
//   build/benchmarks/simulator_benchmark [--shape=small|heavy] [--rounds=3]
// Each configuration runs `rounds` times; the table shows the median and the range. The step
// costs are the mean of two calibration runs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "benchmarks/simulator_validation.h"

namespace {

using namespace hyrec;

int Run(const std::string& only, int rounds) {
  const std::string dir = absl::StrCat("/tmp/hyrec_simulator_benchmark_", ::getpid());
  std::filesystem::create_directories(dir);
  absl::StatusOr<job::Calibration> machine = job::Calibrate(HYREC_PS_BINARY, dir);
  if (!machine.ok()) {
    std::fprintf(stderr, "simulator_benchmark: %s\n", machine.status().ToString().c_str());
    return 1;
  }
  const std::vector<bench::ModelShape> shapes = {{"small", 16, 1, 512, "[64, 32]", 300},
                                                 {"heavy", 64, 4, 256, "[64, 32]", 300}};
  const std::vector<bench::RunConfig> configs = {{2, 1, 4, 0}, {1, 1, 4, 0}, {4, 1, 4, 0},  {2, 1, 0, 0},
                                                 {2, 2, 4, 0}, {2, 2, 0, 0}, {2, 1, 4, 10}, {2, 1, 0, 10},
                                                 {1, 1, 0, 20}, {4, 2, 4, 5}};
  int worst = 0;
  double worst_error = 0;
  for (const bench::ModelShape& shape : shapes) {
    if (!only.empty() && shape.name != only) continue;
    absl::StatusOr<bench::CalibratedShape> c = bench::CalibrateShape(HYREC_TRAIN_BINARY, shape, *machine, dir);
    if (!c.ok()) {
      std::fprintf(stderr, "simulator_benchmark: %s\n", c.status().ToString().c_str());
      return 1;
    }
    std::printf("%s: dim %d, %d ids a feature, batch %d, MLPs %s; a batch here: training thread %.2f ms, worker's "
                "other threads %.2f ms, PS %.2f ms, loader %.2f ms, relays %.2f ms (CPU); %.2f cores busy (usable: %.2f)\n",
                shape.name.c_str(), shape.dim, shape.ids_per_sample, shape.batch, shape.mlp.c_str(), c->costs.train_ms,
                c->costs.lookup_client_ms + c->costs.update_client_ms,
                c->costs.lookup_server_ms + c->costs.update_server_ms, c->costs.loader_ms, c->costs.relay_ms,
                c->costs.cores_used, c->usable_cores);
    std::printf("| configuration | measured samples/s (range) | predicted | predicted / measured | waited ms meas. / pred. | "
                "staleness meas. / pred. | lookup, update ms meas. / pred. | bound by (predicted) |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const bench::RunConfig& config : configs) {
      double low = 0, high = 0;
      absl::StatusOr<bench::Measured> m = bench::MeasureMedian(HYREC_TRAIN_BINARY, c->job, config, rounds, &low, &high);
      if (!m.ok()) {
        std::fprintf(stderr, "simulator_benchmark: %s\n", m.status().ToString().c_str());
        return 1;
      }
      const job::SimulationResult p = bench::Predict(*c, config, shape.batches);
      const double ratio = p.samples_per_second / m->samples_per_second;
      std::printf("| %s | %.0f (%.0f-%.0f) | %.0f | %.2f | %.2f / %.2f | %.2f / %.2f | %.1f, %.1f / %.1f, %.1f | %s |\n",
                  config.Name().c_str(), m->samples_per_second, low, high, p.samples_per_second, ratio, m->waited_ms,
                  p.wait_for_rows_ms, m->observed_staleness, p.observed_staleness, m->lookup_ms, m->update_ms,
                  p.lookup_ms, p.update_ms, p.bottleneck.c_str());
      std::fflush(stdout);
      worst_error = std::max(worst_error, std::abs(ratio - 1));
      worst += std::abs(ratio - 1) > 0.15;
    }
  }
  std::printf("%d configuration(s) off by more than 15%%; the worst off by %.0f%%\n", worst, worst_error * 100);
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0 && std::atoi(argv[i] + 9) >= 1) {
      rounds = std::atoi(argv[i] + 9);
      continue;
    }
    if (std::strncmp(argv[i], "--shape=", 8) == 0 && (std::strcmp(argv[i] + 8, "small") == 0 ||
                                                       std::strcmp(argv[i] + 8, "heavy") == 0)) {
      only = argv[i] + 8;
      continue;
    }
    std::fprintf(stderr, "simulator_benchmark: %s: not --shape=small, --shape=heavy or --rounds=N (N >= 1)\n",
                 argv[i]);
    return 2;
  }
  return Run(only, rounds);
}
