#include "hyrec/embedding_ps/ps_cluster.h"

#include <csignal>

#include "absl/strings/str_cat.h"

namespace hyrec::embedding_ps {

absl::StatusOr<std::unique_ptr<PsCluster>> PsCluster::Launch(const PsClusterOptions& options) {
  if (options.num_shards < 1) return absl::InvalidArgumentError("num_shards must be >= 1");
  std::unique_ptr<PsCluster> cluster(new PsCluster(options));
  for (int s = 0; s < options.num_shards; ++s) {
    std::vector<std::string> argv = {options.binary, "--port=0", "--host=" + options.host,
                                     absl::StrCat("--shard_index=", s)};
    argv.push_back(options.job_config.empty() ? absl::StrCat("--num_shards=", options.num_shards)
                                              : "--config=" + options.job_config);
    if (!options.certs.empty()) {
      argv.push_back("--certs=" + options.certs);
    } else if (options.job_config.empty()) {
      argv.push_back("--security=none");
    }
    argv.insert(argv.end(), options.args.begin(), options.args.end());
    auto process = Subprocess::Spawn(argv);
    if (!process.ok()) return process.status();
    cluster->shards_.push_back(std::move(*process));
  }
  for (int s = 0; s < options.num_shards; ++s) {
    absl::StatusOr<int> port = WaitForListeningPort(*cluster->shards_[s], options.start_timeout);
    if (!port.ok()) {
      return absl::Status(port.status().code(), absl::StrCat("PS shard ", s, " (", options.binary,
                                                             ") did not start: ", port.status().message()));
    }
    cluster->addresses_.push_back(absl::StrCat(options.host, ":", *port));
  }
  return cluster;
}

absl::Status PsCluster::Stop() {
  for (auto& shard : shards_) shard->Signal(SIGTERM);
  absl::Status result;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (!shards_[s]->running()) continue;
    absl::StatusOr<int> code = shards_[s]->Wait(options_.stop_timeout);
    if (!code.ok()) {
      shards_[s]->Signal(SIGKILL);
      (void)shards_[s]->Wait(options_.stop_timeout);
      if (result.ok()) result = code.status();
    } else if (*code != 0 && result.ok()) {
      result = absl::InternalError(absl::StrCat("PS shard ", s, " exited with ", *code));
    }
  }
  return result;
}

PsCluster::~PsCluster() { (void)Stop(); }

}  // namespace hyrec::embedding_ps
