// hyrec-train (`hyrec train --config=FILE`): one command, one machine. PS shards, the loader and
// the dense workers run in this process (the embedded default); prints progress, then the final
// AUC and log loss beside the synthetic teacher's AUC, and samples/s.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/latency_proxy.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/embedding_ps/ps_cluster.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/dense_worker/train_job.h"

ABSL_FLAG(std::string, config, "", "YAML job configuration (docs/configuration.md).");
ABSL_FLAG(double, ps_latency_ms, 0,
          "With --processes: milliseconds added to every PS round trip by a delaying TCP proxy in "
          "front of each PS (half each way).");
ABSL_FLAG(bool, processes, false,
          "Run every role as its own process on loopback (PS shards, the loader, the workers) "
          "with real gRPC and Gloo: the cluster topology on one machine.");

namespace {

// PS shards, the loader and the workers as processes; worker 0's report is relayed.
absl::Status RunProcesses(const std::string& path, const hyrec::dense_worker::TrainJobConfig& config) {
  using hyrec::Subprocess;
  const std::string dir = hyrec::ExecutableDirectory();
  hyrec::embedding_ps::PsClusterOptions ps_options;
  ps_options.binary = dir + "/hyrec-ps";
  ps_options.num_shards = config.ps_shards;
  std::string tables;
  for (int t = 0; t < config.loader.num_tables(); ++t) {
    absl::StrAppend(&tables, t == 0 ? "" : ",", "t", t, ":", config.embedding_dim, ":",
                    hyrec::embedding_ps::OptimizerName(config.embedding_optimizer.kind), ":",
                    config.embedding_optimizer.learning_rate);
  }
  ps_options.args = {"--tables=" + tables, absl::StrCat("--capacity_rows=", config.ps_capacity_rows),
                     "--log_level=warn"};
  HYREC_ASSIGN_OR_RETURN(auto ps, hyrec::embedding_ps::PsCluster::Launch(ps_options));
  HYREC_ASSIGN_OR_RETURN(auto loader, Subprocess::Spawn({dir + "/hyrec-loader", "--config=" + path,
                                                         "--section=loader", "--host=127.0.0.1", "--port=0",
                                                         absl::StrCat("--num_workers=", config.workers),
                                                         absl::StrCat("--num_shards=", config.ps_shards),
                                                         "--log_level=warn"}));
  HYREC_ASSIGN_OR_RETURN(int loader_port, hyrec::WaitForListeningPort(*loader, absl::Seconds(60)));
  std::string ps_list;
  std::vector<std::unique_ptr<hyrec::LatencyProxy>> proxies;
  const double latency_ms = absl::GetFlag(FLAGS_ps_latency_ms);
  for (const std::string& a : ps->addresses()) {
    std::string address = a;
    if (latency_ms > 0) {
      const int port = std::stoi(a.substr(a.rfind(':') + 1));
      HYREC_ASSIGN_OR_RETURN(auto proxy, hyrec::LatencyProxy::Start("127.0.0.1", port,
                                                                   absl::Microseconds(latency_ms * 500)));
      address = absl::StrCat("127.0.0.1:", proxy->port());
      proxies.push_back(std::move(proxy));
    }
    absl::StrAppend(&ps_list, ps_list.empty() ? "" : ",", address);
  }
  std::printf("processes: %d PS (%s), loader 127.0.0.1:%d, %d worker(s)\n", config.ps_shards, ps_list.c_str(),
              loader_port, config.workers);
  std::fflush(stdout);
  const int master_port = hyrec::PickFreeLoopbackPort();
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < config.workers; ++r) {
    HYREC_ASSIGN_OR_RETURN(auto w, Subprocess::Spawn({dir + "/hyrec-worker", "--config=" + path, "--ps=" + ps_list,
                                                      absl::StrCat("--loader=127.0.0.1:", loader_port),
                                                      absl::StrCat("--rank=", r),
                                                      absl::StrCat("--world_size=", config.workers),
                                                      "--master_addr=127.0.0.1",
                                                      absl::StrCat("--master_port=", master_port)}));
    workers.push_back(std::move(w));
  }
  for (;;) {  // Relay worker 0's lines until it closes its output.
    auto line = workers[0]->ReadLine(absl::Hours(24));
    if (!line.ok()) break;
    std::printf("%s\n", line->c_str());
    std::fflush(stdout);
  }
  absl::Status result;
  for (int r = 0; r < config.workers; ++r) {
    auto code = workers[r]->Wait(absl::Minutes(10));
    if (!code.ok() || *code != 0) {
      result = absl::InternalError(absl::StrCat("worker ", r, " failed (", code.ok() ? std::to_string(*code) : "running", ")"));
    }
  }
  loader->Signal(SIGTERM);
  (void)loader->Wait(absl::Seconds(10));
  (void)ps->Stop();
  return result;
}

absl::Status Run() {
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) return absl::InvalidArgumentError("--config is required");
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, hyrec::LoadYamlFile(path));
  HYREC_ASSIGN_OR_RETURN(auto config, hyrec::dense_worker::ParseTrainJobConfig(root, path));
  std::printf("hyrec train: %s, %d worker(s), %d PS shard(s), embedding staleness %d, batch %d\n",
              config.model.c_str(), config.workers, config.ps_shards, config.embedding_staleness,
              config.loader.batch_size);
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_processes)) return RunProcesses(path, config);
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
