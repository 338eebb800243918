// hyrec-train (`hyrec train --config=FILE`): one command, one machine. PS shards, the loader and
// the dense workers run in this process (the embedded default); prints progress, then the final
// AUC and log loss beside the synthetic teacher's AUC, and samples/s.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/dense_worker/train_job.h"

ABSL_FLAG(std::string, config, "", "YAML job configuration (docs/configuration.md).");

namespace {

absl::Status Run() {
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) return absl::InvalidArgumentError("--config is required");
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, hyrec::LoadYamlFile(path));
  HYREC_ASSIGN_OR_RETURN(auto config, hyrec::dense_worker::ParseTrainJobConfig(root, path));
  std::printf("hyrec train: %s, %d worker(s), %d PS shard(s), embedding staleness %d, batch %d\n",
              config.model.c_str(), config.workers, config.ps_shards, config.embedding_staleness,
              config.loader.batch_size);
  std::fflush(stdout);
  HYREC_ASSIGN_OR_RETURN(auto report, hyrec::dense_worker::RunTrainJob(config, &std::cout, isatty(1) != 0));
  std::printf("\nsummary: %llu samples, %.0f samples/s\n", static_cast<unsigned long long>(report.samples),
              report.samples_per_second);
  std::printf("  held-out AUC %.4f, log loss %.4f (%llu samples)\n", report.final_eval.auc,
              report.final_eval.log_loss, static_cast<unsigned long long>(report.final_eval.samples));
  if (report.teacher_auc > 0) {
    std::printf("  teacher AUC  %.4f (the best any model can reach on this data); gap %.4f\n",
                report.teacher_auc, report.teacher_auc - report.final_eval.auc);
  }
  std::printf("  PS lookup %.2f ms, update %.2f ms per batch; waited %.2f ms per batch for rows; "
              "observed staleness %.2f batches\n",
              report.stats.lookup_ms, report.stats.update_ms, report.stats.wait_for_rows_ms,
              report.stats.observed_staleness);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("hyrec train --config=FILE: train on one machine");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "hyrec train: unexpected argument '" << rest[1] << "'\n";
    return 2;
  }
  absl::Status status = Run();
  if (!status.ok()) {
    std::cerr << "hyrec train: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
