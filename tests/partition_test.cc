// A job across hosts: two PS shards with update logs, a loader and two workers, each started by
// hand on a host of its own (a network namespace, tests/netns_cluster.h) as on a cluster, each
// reaching the others by address through a bridge. One host's link is taken down for a few
// seconds (below the job's timeouts) and brought back, once for each kind of role, a worker
// included. The job must finish by itself: every role exits 0, worker 0 trained exactly the
// data's samples, and every shard applied each worker's update of every step once (the
// checkpoint's counts, as in the chaos test). It prints what each partition cost against the
// same job with no fault.
//
// Needs root for the namespaces; where they cannot be made, it says so and skips.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "applied_counts.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "netns_cluster.h"
#include "run_command.h"

namespace hyrec {
namespace {

constexpr uint64_t kSamples = 256 * 2 * 300;  // 300 steps of two workers' batches of 256.
const std::vector<std::string> kHosts = {"ps-0", "ps-1", "loader", "worker-0", "worker-1"};

struct Outcome {
  std::map<std::string, int> codes;  // Per host: its role's exit code.
  double seconds = 0;
  uint64_t samples = 0;
  std::string checkpoint;
  std::string log;  // Every role's stderr, for a failure's message.
};

class PartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = testing::NetnsCluster::Create(absl::StrCat("part", getpid()), 1, kHosts);
    if (!cluster.ok()) GTEST_SKIP() << "no hosts to run across: " << cluster.status();
    cluster_ = std::move(*cluster);
    dir_ = ::testing::TempDir() + "/partition_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string Job(const std::string& name) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "loader:\n  source:\n    format: synthetic\n"
                        << "    synthetic: {num_samples: " << kSamples
                        << ", num_slots: 4, num_dense: 4, vocabulary: 2000, ids_per_sample: 2, seed: 11}\n"
                        << "  batch_size: 256\n  threads: 1\n"
                        << "eval: {samples: 5000}\n"
                        << "model: {embedding_dim: 8, bottom: [16], top: [16]}\n"
                        << "ps: {shards: 2}\n"
                        << "train: {workers: 2, embedding_staleness: 0, seed: 3, log_every_batches: 20}\n"
                        << "checkpoint: {dir: " << dir_ << "/" << name << "-ckpt, every_steps: 100}\n"
                        << "security: {mode: none}\n"
                        << "cluster:\n  ps: [" << cluster_->address("ps-0") << ":7000, " << cluster_->address("ps-1")
                        << ":7000]\n"
                        << "  loader: " << cluster_->address("loader") << ":7100\n"
                        << "  master: " << cluster_->address("worker-0") << ":29500\n"
                        << "  services_exit_when_done: true\n";
    return path;
  }

  // Runs the job's roles on their hosts; `fault` runs beside them, given whether worker 0 still
  // runs.
  Outcome Run(const std::string& job, const std::function<void(const std::function<bool()>&)>& fault) {
    Outcome r;
    const std::string report = job + ".report";
    std::map<std::string, std::vector<std::string>> argv = {
        {"ps-0", {HYREC_BINARY, "ps", "--config=" + job, "--shard_index=0"}},
        {"ps-1", {HYREC_BINARY, "ps", "--config=" + job, "--shard_index=1"}},
        {"loader", {HYREC_BINARY, "loader", "--config=" + job}},
        {"worker-0",
         {HYREC_BINARY, "worker", "--config=" + job, "--rank=0", "--progress=none", "--plot=", "--report=" + report}},
        {"worker-1", {HYREC_BINARY, "worker", "--config=" + job, "--rank=1", "--progress=none", "--plot="}},
    };
    const absl::Time start = absl::Now();
    std::map<std::string, std::unique_ptr<Subprocess>> roles;
    SpawnOptions spawn;
    spawn.capture_stderr = true;
    for (const std::string& host : kHosts) {
      auto p = Subprocess::Spawn(cluster_->On(host, argv.at(host)), spawn);
      EXPECT_TRUE(p.ok()) << host << ": " << p.status();
      if (p.ok()) roles[host] = std::move(*p);
    }
    // Each role's stderr to its end (so that it never blocks on a full pipe), then its exit.
    std::map<std::string, std::string> logs;
    std::map<std::string, std::atomic<bool>> done;
    for (const std::string& host : kHosts) {  // Every entry first: the threads only look them up.
      logs[host];
      done[host] = false;
      r.codes[host] = -1;
    }
    std::thread faults([&] {
      if (fault) fault([&] { return !done.at("worker-0").load(); });
    });
    std::vector<std::thread> waiters;
    for (auto& [host, role] : roles) {
      waiters.emplace_back([&, host = host, role = role.get()] {
        for (;;) {
          absl::StatusOr<std::string> line = role->ReadErrorLine(absl::Seconds(600));
          if (!line.ok()) break;
          absl::StrAppend(&logs.at(host), host, ": ", *line, "\n");
        }
        absl::StatusOr<int> code = role->Wait(absl::Seconds(600));
        r.codes.at(host) = code.ok() ? *code : -1;
        done.at(host) = true;
      });
    }
    // The services exit by themselves once worker 0 has told them the job is done; those that
    // have not a minute after both workers ended are killed and count as failed.
    const absl::Time deadline = absl::Now() + absl::Seconds(400);
    while (!(done.at("worker-0") && done.at("worker-1")) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    const absl::Time grace = std::min(deadline, absl::Now() + absl::Seconds(60));
    std::vector<std::string> killed;
    for (auto& [host, role] : roles) {
      while (!done.at(host) && absl::Now() < grace) absl::SleepFor(absl::Milliseconds(100));
      if (!done.at(host)) {
        role->Signal(SIGKILL);
        killed.push_back(host);
      }
    }
    for (std::thread& w : waiters) w.join();
    for (const std::string& host : killed) {
      r.codes.at(host) = -2;
      absl::StrAppend(&logs.at(host), host, ": killed by the test, still running after the workers ended\n");
    }
    for (const auto& [host, log] : logs) r.log += log;
    faults.join();
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::ifstream in(report);
    for (std::string line; std::getline(in, line);) {
      if (absl::StartsWith(line, "samples: ")) (void)absl::SimpleAtoi(line.substr(9), &r.samples);
      if (absl::StartsWith(line, "checkpoint: \"")) r.checkpoint = line.substr(13, line.size() - 14);
    }
    return r;
  }

  // Of a checkpoint: every "applied" line's count, per "<shard file> worker <w> table <t>".
  static std::map<std::string, uint64_t> AppliedCounts(const std::string& checkpoint) {
    return testing::AppliedCounts(testing::RunCommand({HYREC_BINARY, "checkpoint", "inspect", checkpoint}).out);
  }

  static bool HasCheckpointOfStep(const std::string& dir, uint64_t step) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (absl::StartsWith(entry.path().filename().string(), absl::StrFormat("ckpt-%012d-", step))) return true;
    }
    return false;
  }

  void ExpectFinishedWhole(const Outcome& r, const std::string& what) {
    for (const std::string& host : kHosts) {
      EXPECT_EQ(r.codes.count(host) ? r.codes.at(host) : -1, 0) << what << ": " << host << "\n" << r.log;
    }
    EXPECT_EQ(r.samples, kSamples) << what << ": samples lost or trained twice";
    const uint64_t steps = kSamples / (256 * 2);
    EXPECT_TRUE(absl::StrContains(r.checkpoint, absl::StrFormat("/ckpt-%012d-", steps)))
        << what << ": " << r.checkpoint;
    const std::map<std::string, uint64_t> applied = AppliedCounts(r.checkpoint);
    EXPECT_EQ(applied.size(), 2u * 2u * 4u) << what << ": " << r.checkpoint;
    for (const auto& [which, count] : applied) EXPECT_EQ(count, steps) << what << ": " << which;
  }

  std::unique_ptr<testing::NetnsCluster> cluster_;
  std::string dir_;
};

TEST_F(PartitionTest, AHostCutOffBelowTheTimeoutsCostsTimeNotTheJob) {
  const Outcome calm = Run(Job("calm"), nullptr);
  ExpectFinishedWhole(calm, "no partition");
  std::printf("no partition: %.1f s\n", calm.seconds);
  for (const std::string host : {"ps-0", "loader", "worker-1"}) {
    const std::string name = absl::StrCat("cut-", host);
    const Outcome cut = Run(Job(name), [&](const std::function<bool()>& running) {
      // A third of the way in (the checkpoint of step 100 of 300), so that the cut falls inside
      // the job on a machine of any speed.
      const std::string checkpoints = dir_ + "/" + name + "-ckpt";
      const absl::Time deadline = absl::Now() + absl::Seconds(300);
      while (!HasCheckpointOfStep(checkpoints, 100) && running() && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      ASSERT_TRUE(running()) << "the job ended before its partition";
      ASSERT_TRUE(cluster_->SetLink(host, false).ok());
      absl::SleepFor(absl::Seconds(3));
      ASSERT_TRUE(cluster_->SetLink(host, true).ok());
    });
    ExpectFinishedWhole(cut, absl::StrCat(host, " cut off for 3 s"));
    std::printf("%s cut off for 3 s: %.1f s (%+.1f s)\n", host.c_str(), cut.seconds, cut.seconds - calm.seconds);
  }
}

}  // namespace
}  // namespace hyrec
