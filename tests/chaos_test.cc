// The chaos test, short version: a real `hyrec train --processes` job (2 PS shards with update
// logs, a loader, 2 workers) under faults drawn from a seed: SIGKILL of a random PS shard,
// SIGSTOP then SIGCONT of one, SIGKILL of the loader, a few seconds apart. The job must finish by
// itself with exit 0, train exactly the data's samples (none lost, none repeated) and end within
// 0.002 of the same job's held-out AUC without faults. It prints what it injected, the
// recoveries the launcher reported and the time lost.
//
//   HYREC_CHAOS_SEED=7 HYREC_CHAOS_SAMPLES=2048000 HYREC_CHAOS_FAULTS=400 build/tests/chaos_test
//
// runs a long version (docs/benchmarks.md, "Chaos"). Worker faults are not injected yet: a lost
// worker rolls the job back to its checkpoint (docs/architecture.md, "Failure model").
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "child_processes.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"

namespace hyrec {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  uint64_t out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

struct Outcome {
  int code = -1;
  double seconds = 0;
  double auc = 0;
  uint64_t samples = 0;
  int recoveries = 0;  // Restarts the launcher reported done.
  std::string tail;
};

using testing::ChildrenWith;

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/chaos_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Job(const std::string& name, uint64_t samples) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "loader:\n  source:\n    format: synthetic\n"
                        << "    synthetic: {num_samples: " << samples
                        << ", num_slots: 4, num_dense: 4, vocabulary: 2000, ids_per_sample: 2, seed: 11}\n"
                        << "  batch_size: 256\n  threads: 1\n"
                        << "eval: {samples: 20000}\n"
                        << "model: {embedding_dim: 8, bottom: [16], top: [16]}\n"
                        << "ps: {shards: 2}\n"
                        << "train: {workers: 2, embedding_staleness: 0, seed: 3, log_every_batches: 100}\n"
                        << "checkpoint: {dir: " << dir_ << "/" << name << "-ckpt, every_steps: 200}\n";
    return path;
  }

  // Runs the job; `faults` (if set) runs beside it with the launcher's pid.
  Outcome Train(const std::string& job, const std::function<void(pid_t, const std::atomic<bool>&)>& faults) {
    Outcome r;
    const std::string report = job + ".report";
    SpawnOptions spawn;
    spawn.new_process_group = true;
    const absl::Time start = absl::Now();
    auto p = Subprocess::Spawn({HYREC_TRAIN_BINARY, "--processes", "--config=" + job, "--progress=lines",
                                "--plot=", "--report=" + report, "--max_restarts=100000"},
                               spawn);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return r;
    std::atomic<bool> done{false};
    std::thread injector;
    if (faults) injector = std::thread([&] { faults((*p)->pid(), done); });
    for (;;) {
      absl::StatusOr<std::string> line = (*p)->ReadLine(absl::Seconds(120));
      if (!line.ok()) break;
      r.tail = *line;
      if (absl::StrContains(*line, "recovered and serves again") ||
          absl::StrContains(*line, "the loader serves again")) {
        ++r.recoveries;
      }
      if (absl::StrContains(*line, "restart") || absl::StrContains(*line, "exited"))
        std::printf("  %s\n", line->c_str());
    }
    done = true;
    if (injector.joinable()) injector.join();
    auto code = (*p)->Wait(absl::Seconds(60));
    r.code = code.ok() ? *code : -1;
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::ifstream in(report);
    for (std::string line; std::getline(in, line);) {
      if (absl::StartsWith(line, "auc: ")) (void)absl::SimpleAtod(line.substr(5), &r.auc);
      if (absl::StartsWith(line, "samples: ")) (void)absl::SimpleAtoi(line.substr(9), &r.samples);
    }
    return r;
  }

  std::string dir_;
};

TEST_F(ChaosTest, TheJobFinishesUnderFaultsAsWithoutThem) {
  const uint64_t seed = EnvOr("HYREC_CHAOS_SEED", 1);
  const uint64_t samples = EnvOr("HYREC_CHAOS_SAMPLES", 256000);
  const int max_faults = static_cast<int>(EnvOr("HYREC_CHAOS_FAULTS", 4));
  const Outcome calm = Train(Job("calm", samples), nullptr);
  ASSERT_EQ(calm.code, 0) << calm.tail;
  ASSERT_EQ(calm.samples, samples);

  std::mt19937_64 rng(seed);
  int kills = 0, stops = 0, loader_kills = 0;
  const Outcome chaos = Train(Job("chaos", samples), [&](pid_t launcher, const std::atomic<bool>& done) {
    absl::SleepFor(absl::Seconds(3));  // Training under way.
    for (int f = 0; f < max_faults && !done; ++f) {
      const int kind = static_cast<int>(rng() % 3);
      const int shard = static_cast<int>(rng() % 2);
      std::vector<pid_t> target = kind == 2 ? ChildrenWith(launcher, "hyrec-loader")
                                            : ChildrenWith(launcher, absl::StrCat("--shard_index=", shard));
      if (done) break;
      if (target.empty()) {  // Being restarted: the next fault.
        absl::SleepFor(absl::Milliseconds(500));
        continue;
      }
      if (kind == 0) {
        std::printf("fault %d: SIGKILL PS shard %d\n", f, shard);
        kill(target[0], SIGKILL);
        ++kills;
      } else if (kind == 1) {
        std::printf("fault %d: SIGSTOP PS shard %d for 1.5 s\n", f, shard);
        kill(target[0], SIGSTOP);
        absl::SleepFor(absl::Milliseconds(1500));
        kill(target[0], SIGCONT);
        ++stops;
      } else {
        std::printf("fault %d: SIGKILL the loader\n", f);
        kill(target[0], SIGKILL);
        ++loader_kills;
      }
      absl::SleepFor(absl::Milliseconds(2000 + rng() % 2000));
    }
  });
  std::printf(
      "chaos (seed %llu): %d PS kills, %d PS stops, %d loader kills; %d recoveries; %.1f s against %.1f s without "
      "faults (%.1f s lost); AUC %.5f against %.5f\n",
      static_cast<unsigned long long>(seed), kills, stops, loader_kills, chaos.recoveries, chaos.seconds, calm.seconds,
      chaos.seconds - calm.seconds, chaos.auc, calm.auc);
  EXPECT_EQ(chaos.code, 0) << chaos.tail;
  EXPECT_EQ(chaos.samples, samples) << "samples lost or trained twice";
  EXPECT_EQ(chaos.recoveries, kills + loader_kills);
  EXPECT_GT(kills + stops + loader_kills, 0) << "the job ended before any fault";
  EXPECT_NEAR(chaos.auc, calm.auc, 0.002);
}

}  // namespace
}  // namespace hyrec
