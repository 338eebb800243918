// Training with a disk tier: the embedded synthetic job (DLRM with MLPs of 512-256 as
// train_benchmark's default shape, 26 slots of Zipf ids, fp16 rows with row-wise Adagrad, 2 PS
// shards) whose tables end ten times larger than the shards' DRAM, against the same job with
// every row in DRAM, in the same binary, on the same batches.
// Floor: the job's steady samples/s with no capacity (every row in DRAM). Figure: the job's
// steady samples/s with ps.capacity_rows a tenth of the rows the floor's run ended with and a
// disk tier (ps.disk) under it; also DRAM's hit rate (hyrec_ps_dram_hits_total over
// hyrec_ps_lookups_total: the ids looked up that were in DRAM, neither read back nor new) and the
// rows on disk at the end. Rounds of the two in turn; the figure is the median round's.
// Target: >= 0.7 with a hit rate >= 90%.
//
// The default workload (Zipf 1.6, 4.8M samples) is one where DRAM's hit rate reaches 90% at a
// tenth of the rows; a lookup asks for a batch's distinct ids, so that a hot id is one lookup a
// batch, and every new id is a miss.
//
//   build/benchmarks/disk_tier_train_benchmark [--dir=/tmp] [--samples=4800000] [--vocabulary=200000]
//                                              [--zipf=1.6] [--batch=512] [--mlp=512,256] [--rounds=1]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/metrics.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/job/job_spec.h"

namespace {

struct Flags {
  std::string dir = "/tmp";
  uint64_t samples = 4800000;
  uint64_t vocabulary = 200000;
  double zipf = 1.6;
  std::string mlp = "512, 256";  // The bottom and top MLPs' layers.
  int batch = 512;
  int rounds = 1;  // Floor and tiered runs, in turn.
};

struct Run {
  double samples_per_second = 0;
  double lookups = 0;
  double dram_hits = 0;
  double dram_rows = 0;
  double disk_rows = 0;
  double disk_reads = 0;
  double lookup_ms = 0;
  double update_ms = 0;
  double wait_ms = 0;
};

// The sum of every sample of `family` in a rendered registry.
double Sum(const std::string& rendered, const std::string& family) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(rendered, '\n')) {
    if (!absl::StartsWith(line, family + "{")) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
  }
  return sum;
}

// The job; `dram_rows` > 0 bounds each shard's DRAM with a disk tier under it.
absl::StatusOr<Run> Train(const Flags& f, uint64_t dram_rows) {
  std::string yaml =
      absl::StrCat("loader:\n  source:\n    format: synthetic\n    synthetic: {num_samples: ", f.samples,
                   ", vocabulary: ", f.vocabulary, ", zipf: ", f.zipf, ", seed: 1}\n  batch_size: ", f.batch,
                   "\n  threads: 1\n  epochs: 1\n  shuffle_window: 65536\n",
                   "model: {kind: dlrm, embedding_dim: 16, bottom: [", f.mlp, "], top: [", f.mlp,
                   "], pooling: sum}\n"
                   "train: {workers: 1, embedding_staleness: 4, dense_optimizer: adam, dense_learning_rate: 0.002}\n"
                   "ps:\n  shards: 2\n  optimizer: adagrad_rowwise\n  precision: fp16\n");
  const std::string tier = f.dir + "/hyrec_disk_tier_train_benchmark";
  if (dram_rows > 0) {
    std::filesystem::create_directories(tier);
    absl::StrAppend(&yaml, "  capacity_rows: ", dram_rows, "\n  disk: {dir: ", tier, ", capacity_bytes: 1073741824}\n");
  }
  auto spec = hyrec::job::ParseJobSpecText(yaml, "disk_tier_train_benchmark");
  if (!spec.ok()) return spec.status();
  auto plan = hyrec::job::Plan(*spec);
  if (!plan.ok()) return plan.status();
  hyrec::MetricsRegistry metrics;
  hyrec::dense_worker::TrainJobOptions options;
  options.metrics = &metrics;
  auto report = hyrec::dense_worker::RunTrainJob(*plan, options);
  std::filesystem::remove_all(tier);
  if (!report.ok()) return report.status();
  const std::string rendered = metrics.Render();
  Run run;
  run.samples_per_second = report->steady_samples_per_second;
  run.lookups = Sum(rendered, "hyrec_ps_lookups_total");
  run.dram_hits = Sum(rendered, "hyrec_ps_dram_hits_total");
  run.dram_rows = Sum(rendered, "hyrec_ps_rows");
  run.disk_rows = Sum(rendered, "hyrec_ps_disk_rows");
  run.disk_reads = Sum(rendered, "hyrec_ps_disk_reads_total");
  run.lookup_ms = report->stats.lookup_ms;
  run.update_ms = report->stats.update_ms;
  run.wait_ms = report->stats.wait_for_rows_ms;
  return run;
}

bool Parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = false;
    if (absl::StartsWith(a, "--dir=")) ok = !(f->dir = a.substr(6)).empty();
    if (absl::StartsWith(a, "--samples=")) ok = absl::SimpleAtoi(a.substr(10), &f->samples) && f->samples >= 10000;
    if (absl::StartsWith(a, "--vocabulary=")) {
      ok = absl::SimpleAtoi(a.substr(13), &f->vocabulary) && f->vocabulary >= 100;
    }
    if (absl::StartsWith(a, "--zipf=")) ok = absl::SimpleAtod(a.substr(7), &f->zipf) && f->zipf > 0 && f->zipf < 10;
    if (absl::StartsWith(a, "--rounds=")) ok = absl::SimpleAtoi(a.substr(9), &f->rounds) && f->rounds >= 1;
    if (absl::StartsWith(a, "--batch=")) ok = absl::SimpleAtoi(a.substr(8), &f->batch) && f->batch >= 1;
    if (absl::StartsWith(a, "--mlp=")) {
      int layer = 0;
      ok = true;
      for (absl::string_view l : absl::StrSplit(a.substr(6), ',')) ok = ok && absl::SimpleAtoi(l, &layer) && layer >= 1;
      if (ok) f->mlp = a.substr(6);
    }
    if (!ok) {
      std::fprintf(stderr, "disk_tier_train_benchmark: bad argument %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, &f)) return 2;
  // Rounds of the floor and the tiered job in turn, so that the machine's drift between runs
  // reaches both; the figure is the median round's ratio.
  std::vector<double> ratios;
  uint64_t dram_rows = 0;
  for (int round = 1; round <= f.rounds; ++round) {
    auto floor = Train(f, 0);
    if (!floor.ok()) {
      std::fprintf(stderr, "disk_tier_train_benchmark: %s\n", floor.status().ToString().c_str());
      return 1;
    }
    // A tenth of the rows, per shard (the rows spread evenly over the two shards).
    if (dram_rows == 0) dram_rows = static_cast<uint64_t>(floor->dram_rows / 10 / 2);
    auto tiered = Train(f, dram_rows);
    if (!tiered.ok()) {
      std::fprintf(stderr, "disk_tier_train_benchmark: %s\n", tiered.status().ToString().c_str());
      return 1;
    }
    ratios.push_back(tiered->samples_per_second / floor->samples_per_second);
    std::printf("round %d: floor, every row in DRAM: %.0f rows, %.0f samples/s\n", round, floor->dram_rows,
                floor->samples_per_second);
    std::printf(
        "round %d: disk tier, %llu rows a shard in DRAM: %.0f in DRAM, %.0f on disk (%.1f x DRAM), "
        "%.0f samples/s\n",
        round, static_cast<unsigned long long>(dram_rows), tiered->dram_rows, tiered->disk_rows,
        (tiered->dram_rows + tiered->disk_rows) / std::max(1.0, tiered->dram_rows), tiered->samples_per_second);
    std::printf(
        "round %d: a batch's lookup, update, wait for rows: floor %.2f, %.2f, %.2f ms; disk tier %.2f, %.2f, %.2f ms\n",
        round, floor->lookup_ms, floor->update_ms, floor->wait_ms, tiered->lookup_ms, tiered->update_ms,
        tiered->wait_ms);
    const double lookups = std::max(1.0, tiered->lookups);
    std::printf(
        "round %d: %.0f rows looked up: DRAM's hit rate %.3f; %.0f rows read back from disk (for lookups and "
        "updates); samples/s %.2f of the floor\n",
        round, tiered->lookups, tiered->dram_hits / lookups, tiered->disk_reads, ratios.back());
  }
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  std::printf("samples/s with the disk tier over the floor: median %.2f of %zu rounds (%.2f to %.2f)\n",
              sorted[sorted.size() / 2], sorted.size(), sorted.front(), sorted.back());
  return 0;
}
