// A job across hosts whose links are narrow, beside `hyrec plan`'s prediction for the same
// bandwidth: the planner's network model checked for its rate (docs/capacity.md). Each host is a
// network namespace on a bridge (tests/netns_cluster.h) whose egress is limited by tc tbf; the job
// (2 PS shards, the loader, 2 workers, each on a host of its own) runs to its end, and worker 0's
// report gives its steady samples/s. The floor is the prediction: `hyrec plan --calibrate` on this
// machine for the step costs, then `hyrec plan` with every machine's egress at the link's rate
// (each role a machine of its own, one loader machine for both workers, as the hosts are). The ratio is measured /
// predicted. Each rate runs with rows and gradients in fp32 and in fp16 on the wire (ps.wire_precision): fp16's gain,
// measured and predicted.
//
//   sudo build/benchmarks/link_benchmark [--mbit=5,10,20]
// Needs root for the namespaces. The hosts share this machine's cores, which the prediction
// gives each machine alone: at rates the links bound, the cores are mostly idle.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hyrec/common/subprocess.h"
#include "json_fields.h"
#include "netns_cluster.h"
#include "run_command.h"

namespace {

using namespace hyrec;

const std::vector<std::string> kHosts = {"ps-0", "ps-1", "loader", "worker-0", "worker-1"};

using testing::JsonNumber;
using testing::JsonString;

// Runs the job's roles on their hosts to the end; worker 0's steady samples/s, or -1.
double RunAcross(testing::NetnsCluster& cluster, const std::string& job, const std::string& report) {
  const std::map<std::string, std::vector<std::string>> argv = {
      {"ps-0", {HYREC_BINARY, "ps", "--config=" + job, "--shard_index=0", "--log_level=warn"}},
      {"ps-1", {HYREC_BINARY, "ps", "--config=" + job, "--shard_index=1", "--log_level=warn"}},
      {"loader", {HYREC_BINARY, "loader", "--config=" + job, "--log_level=warn"}},
      {"worker-0",
       {HYREC_BINARY, "worker", "--config=" + job, "--rank=0", "--progress=none", "--plot=", "--report=" + report,
        "--log_level=warn"}},
      {"worker-1",
       {HYREC_BINARY, "worker", "--config=" + job, "--rank=1", "--progress=none", "--plot=", "--log_level=warn"}},
  };
  std::map<std::string, std::unique_ptr<Subprocess>> roles;
  for (const std::string& host : kHosts) {
    auto p = Subprocess::Spawn(cluster.On(host, argv.at(host)));
    if (!p.ok()) {
      std::fprintf(stderr, "link_benchmark: %s: %s\n", host.c_str(), p.status().ToString().c_str());
      return -1;
    }
    roles[host] = std::move(*p);
  }
  bool ok = true;
  for (const char* host : {"worker-0", "worker-1", "ps-0", "ps-1", "loader"}) {
    absl::StatusOr<int> code = roles.at(host)->Wait(absl::Seconds(600));
    if (!code.ok() || *code != 0) {
      std::fprintf(stderr, "link_benchmark: %s ended with %s\n", host,
                   code.ok() ? std::to_string(*code).c_str() : code.status().ToString().c_str());
      ok = false;
    }
  }
  if (!ok) return -1;
  std::ifstream in(report);
  for (std::string line; std::getline(in, line);) {
    double rate = -1;
    if (line.rfind("samples_per_second: ", 0) == 0 && absl::SimpleAtod(line.substr(20), &rate)) return rate;
  }
  return -1;
}

int Run(const std::vector<int>& mbits) {
  const std::string dir = absl::StrCat("/tmp/hyrec_link_benchmark_", ::getpid());
  std::filesystem::create_directories(dir);
  // The job, with rows and gradients on the wire in `wire` precision.
  const auto write_job = [&dir](const std::string& wire) {
    const std::string path = dir + "/job-" + wire + ".yaml";
    std::ofstream(path) << "loader:\n  source:\n    format: synthetic\n"
                        << "    synthetic: {num_samples: 76800, num_slots: 4, num_dense: 4, vocabulary: 20000, "
                           "ids_per_sample: 2, seed: 11}\n"
                        << "  batch_size: 256\n  threads: 1\n"
                        << "eval: {samples: 0}\n"
                        << "model: {embedding_dim: 16, bottom: [16], top: [16]}\n"
                        << "ps: {shards: 2, wire_precision: " << wire << "}\n"
                        << "train: {workers: 2, seed: 3}\n"
                        << "security: {mode: none}\n"
                        << "cluster:\n  ps: [ps-0:7000, ps-1:7000]\n  loader: loader:7100\n"
                        << "  master: worker-0:29500\n  services_exit_when_done: true\n";
    return path;
  };
  const std::string job = write_job("fp32");
  const std::string job16 = write_job("fp16");
  const std::string calibration = dir + "/calibration.yaml";
  std::printf("calibrating the step costs on this machine (hyrec plan --calibrate)...\n");
  std::fflush(stdout);
  const testing::CommandResult calibrated =
      testing::RunCommand({HYREC_BINARY, "plan", "--config=" + job, "--calibrate", "--out=" + calibration});
  if (calibrated.code != 0) {
    std::fprintf(stderr, "link_benchmark: hyrec plan --calibrate: %s\n", calibrated.err.c_str());
    return 1;
  }
  std::ofstream machines(dir + "/machines.yaml");
  for (int mbit : mbits) {
    machines << "- {name: host" << mbit << ", cpus: 2, memory_gib: 24, network_gbps: " << mbit / 1000.0
             << ", price_per_hour: 0}\n";
  }
  machines.close();

  std::printf("%8s %5s %12s %12s %7s %11s %11s  %s\n", "link", "wire", "measured/s", "predicted/s", "ratio",
              "fp16 gain", "predicted", "predicted bottleneck");
  int number = 0;
  for (int mbit : mbits) {
    const std::string type = absl::StrCat("host", mbit);
    double fp32_measured = 0, fp32_predicted = 0;
    for (const std::string& wire : {std::string("fp32"), std::string("fp16")}) {
      const std::string config = wire == "fp16" ? job16 : job;
      const testing::CommandResult plan = testing::RunCommand(
          {HYREC_BINARY, "plan", "--config=" + config, "--calibration=" + calibration,
           "--machines=" + dir + "/machines.yaml", "--ps_machine=" + type, "--worker_machine=" + type,
           "--loader_machine=" + type, "--loader_machines=1", "--json"});
      const size_t throughput = plan.out.find("\"throughput\":{");
      const double predicted =
          throughput == std::string::npos ? -1 : JsonNumber(plan.out, "samples_per_second", throughput);
      if (plan.code != 0 || predicted <= 0) {
        std::fprintf(stderr, "link_benchmark: hyrec plan: %s%s\n", plan.err.c_str(), plan.out.c_str());
        return 1;
      }
      auto cluster = testing::NetnsCluster::Create(absl::StrCat("lb", ::getpid()), 200 + number++, kHosts);
      if (!cluster.ok()) {
        std::fprintf(stderr, "link_benchmark: %s\n", cluster.status().ToString().c_str());
        return 1;
      }
      for (const std::string& host : kHosts) {
        if (absl::Status s = (*cluster)->Limit(host, mbit); !s.ok()) {
          std::fprintf(stderr, "link_benchmark: %s\n", s.ToString().c_str());
          return 1;
        }
      }
      const double measured = RunAcross(**cluster, config, absl::StrCat(dir, "/report-", mbit, "-", wire));
      if (measured <= 0) return 1;
      std::string gain = "", gain_predicted = "";
      if (wire == "fp32") {
        fp32_measured = measured;
        fp32_predicted = predicted;
      } else {
        gain = absl::StrFormat("%.3f", measured / fp32_measured);
        gain_predicted = absl::StrFormat("%.3f", predicted / fp32_predicted);
      }
      std::printf("%5d Mb %5s %12.0f %12.0f %7.3f %11s %11s  %s (%.0f PS machine(s))\n", mbit, wire.c_str(), measured,
                  predicted, measured / predicted, gain.c_str(), gain_predicted.c_str(),
                  JsonString(plan.out, "bottleneck", throughput).c_str(), JsonNumber(plan.out, "ps_machines"));
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> mbits = {5, 10, 20};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--mbit=", 0) == 0) {
      mbits.clear();
      for (absl::string_view m : absl::StrSplit(arg.substr(7), ',')) {
        int mbit = 0;
        if (!absl::SimpleAtoi(m, &mbit) || mbit < 1 || mbit > 10000) {
          std::fprintf(stderr, "link_benchmark: --mbit=%s: each rate is a whole Mbit/s in [1, 10000]\n",
                       arg.substr(7).c_str());
          return 2;
        }
        mbits.push_back(mbit);
      }
    } else {
      std::fprintf(stderr, "usage: link_benchmark [--mbit=5,10,20]\n");
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "link_benchmark: needs root (network namespaces)\n");
    return 2;
  }
  return Run(mbits);
}
