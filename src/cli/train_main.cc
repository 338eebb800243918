// hyrec-train (`hyrec train --config=FILE`): one command, one machine. PS shards, the loader and
// the dense workers run in this process (the embedded default); prints progress, then the final
// AUC and log loss beside the synthetic teacher's AUC, and samples/s.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/latency_proxy.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/embedding_ps/ps_cluster.h"

ABSL_FLAG(std::string, config, "", "YAML job configuration (docs/configuration.md).");
ABSL_FLAG(double, ps_latency_ms, -1,
          "With --processes: milliseconds added to every PS round trip by a delaying TCP proxy in "
          "front of each PS (half each way); 0 puts the proxy in with no delay (the baseline of a "
          "latency sweep); -1: no proxy.");
ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics at http://<metrics_host>:<port>/metrics while training "
          "(0: any free port, printed; -1: off). Embedded mode.");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "Address the metrics endpoint binds.");
ABSL_FLAG(std::string, plot, "hyrec-train.png",
          "When gnuplot is installed: write held-out AUC and training loss against samples to this "
          "PNG at the end (empty: no plot). Embedded mode.");
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
    if (latency_ms >= 0) {
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

// gnuplot's path from $PATH, or empty.
std::string FindGnuplot() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Held-out AUC (left axis) and training loss (right axis) against samples trained, as a PNG.
absl::Status Plot(const hyrec::dense_worker::TrainReport& report, const std::string& png,
                  const std::string& gnuplot) {
  const std::string auc_data = png + ".auc.dat", loss_data = png + ".loss.dat", script = png + ".gp";
  {
    std::ofstream auc(auc_data), loss(loss_data);
    for (const auto& [samples, e] : report.evals) auc << samples << " " << e.auc << "\n";
    for (const auto& [samples, l] : report.losses) loss << samples << " " << l << "\n";
    if (!auc || !loss) return absl::UnavailableError(absl::StrCat("cannot write ", auc_data, " or ", loss_data));
  }
  std::ofstream gp(script);
  gp << "set terminal png size 960,600\nset output '" << png << "'\n"
     << "set title 'hyrec train: held-out AUC and training loss'\nset xlabel 'samples trained'\n"
     << "set format x '%.1s%c'\nset ylabel 'AUC'\nset y2label 'log loss'\nset ytics nomirror\nset y2tics\nset key bottom right\n"
     << "set grid\n";
  std::string plots = "plot '" + auc_data + "' using 1:2 axes x1y1 with linespoints title 'held-out AUC'";
  if (report.teacher_auc > 0) absl::StrAppend(&plots, ", ", report.teacher_auc, " axes x1y1 with lines dt 2 title 'teacher AUC'");
  if (!report.losses.empty()) absl::StrAppend(&plots, ", '", loss_data, "' using 1:2 axes x1y2 with lines title 'training loss'");
  gp << plots << "\n";
  gp.close();
  if (!gp) return absl::UnavailableError(absl::StrCat("cannot write ", script));
  HYREC_ASSIGN_OR_RETURN(auto p, hyrec::Subprocess::Spawn({gnuplot, script}));
  HYREC_ASSIGN_OR_RETURN(int code, p->Wait(absl::Seconds(60)));
  if (code != 0) return absl::InternalError(absl::StrCat("gnuplot exited with ", code, " on ", script));
  std::remove(auc_data.c_str());
  std::remove(loss_data.c_str());
  std::remove(script.c_str());
  return absl::OkStatus();
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
  hyrec::MetricsRegistry metrics;
  std::unique_ptr<hyrec::MetricsHttpServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    HYREC_ASSIGN_OR_RETURN(metrics_server, hyrec::MetricsHttpServer::Start(absl::GetFlag(FLAGS_metrics_host),
                                                                         absl::GetFlag(FLAGS_metrics_port), &metrics));
    std::printf("metrics: http://%s:%d/metrics\n", absl::GetFlag(FLAGS_metrics_host).c_str(), metrics_server->port());
    std::fflush(stdout);
  }
  HYREC_ASSIGN_OR_RETURN(auto report,
                         hyrec::dense_worker::RunTrainJob(config, &std::cout, isatty(1) != 0, &metrics));
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
  const std::string png = absl::GetFlag(FLAGS_plot);
  if (!png.empty()) {
    const std::string gnuplot = FindGnuplot();
    if (gnuplot.empty()) {
      std::printf("  (gnuplot is not installed: no plot)\n");
    } else {
      absl::Status plotted = Plot(report, png, gnuplot);
      if (plotted.ok()) {
        std::printf("  plot: %s (held-out AUC and training loss against samples)\n", png.c_str());
      } else {
        std::printf("  plot failed: %s\n", std::string(plotted.message()).c_str());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  hyrec::dense_worker::TuneTrainingProcess();  // Before any thread runs BLAS or allocates.
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
