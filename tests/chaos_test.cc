// The chaos test, short version: a real `hyrec train --processes` job (2 PS shards with update
// logs, a loader, 2 workers) under faults drawn from a seed: SIGKILL of a random PS shard,
// SIGSTOP then SIGCONT of one, SIGKILL of the loader, SIGKILL of worker 1, a few seconds apart.
// The job must finish by itself with exit 0, train exactly the data's samples (none lost, none
// repeated), end within 0.002 of the same job's held-out AUC without faults, and every shard's
// count of each worker's applied updates per table (in the final checkpoint) must equal the
// updates that worker had acknowledged: one per step (every batch touches every table on every
// shard here). It prints what it injected, the recoveries the launcher reported, the time lost
// in all and the time each kind of fault cost on average.
//
//   HYREC_CHAOS_SEED=7 HYREC_CHAOS_SAMPLES=2048000 HYREC_CHAOS_FAULTS=400 build/tests/chaos_test
//
// runs a long version (docs/benchmarks.md, "Chaos"); HYREC_CHAOS_LOG=FILE keeps every line the
// jobs printed, their roles' stderr included. Worker 0 is not killed: it hosts the
// group's rendezvous, and its loss rolls the job back to its checkpoint (docs/architecture.md,
// "Failure model").
//
// The stream variant trains a bounded Kafka topic (librdkafka's mock cluster in this process)
// under the same faults and broker errors injected into its fetches: every record is trained
// once, counted by offset (each partition's records up to its end offset, and no more, in the
// final checkpoint's positions and the job's samples), and the AUC is the calm run's.
//
//   HYREC_CHAOS_SEED=7 HYREC_CHAOS_RECORDS=1198080 HYREC_CHAOS_FAULTS=60 build/tests/chaos_test --gtest_filter=*Stream*
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "applied_counts.h"
#include "child_processes.h"
#include "fault_costs.h"
#include "gtest/gtest.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/data_loader/positions.h"
#ifdef HYREC_CHAOS_KAFKA
#include "kafka_mock.h"
#endif

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
  int joins = 0;       // Replacement workers that joined their peers' group.
  int heals = 0;       // Worker 0's regroups (its report).
  std::string checkpoint;
  std::string tail;
  testing::Progress progress;
};

constexpr int kFaultKinds = 5;
constexpr const char* kFaultNames[kFaultKinds] = {"PS kill", "PS stop", "loader kill", "worker kill", "broker errors"};

// Runs `argv` and returns its standard output.
std::string Output(const std::vector<std::string>& argv) {
  auto p = Subprocess::Spawn(argv);
  if (!p.ok()) return "";
  std::string out;
  for (;;) {
    absl::StatusOr<std::string> line = (*p)->ReadLine(absl::Seconds(60));
    if (!line.ok()) break;
    out += *line + "\n";
  }
  (void)(*p)->Wait(absl::Seconds(10));
  return out;
}

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
                        // A fault every 2-4 s: a replacement worker may wait for shards being
                        // restarted for longer than the default heal timeout.
                        << "train: {workers: 2, embedding_staleness: 0, seed: 3, log_every_batches: 100, "
                        << "heal_timeout_seconds: 300}\n"
                        << "checkpoint: {dir: " << dir_ << "/" << name << "-ckpt, every_steps: 200}\n";
    return path;
  }

  // A bounded stream of Criteo records from `brokers`' topic "clicks", the same model, evaluated
  // on `heldout`.
  std::string StreamJob(const std::string& name, const std::string& brokers, const std::string& heldout) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "loader:\n  source:\n    format: criteo\n"
                        << "    kafka: {brokers: '" << brokers << "', topic: clicks, group: chaos-" << name
                        << ", bounded: true, linger_ms: 20}\n"
                        << "  batch_size: 256\n  threads: 1\n  shuffle_window: 2048\n"
                        << "model: {embedding_dim: 8, bottom: [16], top: [16]}\n"
                        << "ps: {shards: 2}\n"
                        << "train: {workers: 2, embedding_staleness: 0, seed: 3, log_every_batches: 20, "
                        << "heal_timeout_seconds: 300}\n"
                        << "eval: {files: [" << heldout << "], progressive_window: 20000}\n"
                        << "checkpoint: {dir: " << dir_ << "/" << name << "-ckpt, every_steps: 200}\n";
    return path;
  }

  // Runs the job; `faults` (if set) runs beside it with the launcher's pid.
  Outcome Train(const std::string& job, const std::function<void(pid_t, const std::atomic<bool>&)>& faults) {
    Outcome r;
    const std::string report = job + ".report";
    SpawnOptions spawn;
    spawn.new_process_group = true;
    spawn.capture_stderr = true;
    const absl::Time start = absl::Now();
    start_ = start;
    auto p = Subprocess::Spawn({HYREC_TRAIN_BINARY, "--processes", "--config=" + job, "--progress=lines",
                                "--plot=", "--report=" + report, "--max_restarts=100000"},
                               spawn);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return r;
    std::atomic<bool> done{false};
    std::mutex log_mu;
    std::ofstream log;
    if (const char* path = std::getenv("HYREC_CHAOS_LOG")) log.open(path, std::ios::app);
    const auto keep = [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu);
      if (log.is_open()) log << line << "\n";
    };
    // The roles' own lines: a replacement's join, the survivors' heals.
    std::thread errors([&, child = p->get()] {
      for (;;) {
        absl::StatusOr<std::string> line = child->ReadErrorLine(absl::Seconds(1));
        if (absl::IsDeadlineExceeded(line.status())) continue;
        if (!line.ok()) return;
        keep(*line);
        if (absl::StrContains(*line, "in place of a lost worker")) ++joins_;
        if (absl::StrContains(*line, "healed") || absl::StrContains(*line, "a peer was lost"))
          std::printf("  %s\n", line->c_str());
      }
    });
    std::thread injector;
    if (faults) injector = std::thread([&] { faults((*p)->pid(), done); });
    for (;;) {
      absl::StatusOr<std::string> line = (*p)->ReadLine(absl::Seconds(120));
      if (!line.ok()) break;
      keep(*line);
      r.tail = *line;
      if (uint64_t n = 0; testing::ProgressSamples(*line, &n)) {
        training_ = true;
        r.progress.emplace_back(absl::ToDoubleSeconds(absl::Now() - start), n);
      }
      // One per server kill: the role serves again, or was lost again while it started (that
      // kill's restart is begun again), or the workers finished while its restart waited out its
      // backoff (a loader killed once every batch was sent).
      if (absl::StrContains(*line, "recovered and serves again") ||
          absl::StrContains(*line, "the loader serves again") ||
          absl::StrContains(*line, "was lost while it started") ||
          absl::StrContains(*line, "was not restarted: the workers finished")) {
        ++r.recoveries;
      }
      if (absl::StrContains(*line, "restart") || absl::StrContains(*line, "exited"))
        std::printf("  %s\n", line->c_str());
    }
    done = true;
    if (injector.joinable()) injector.join();
    auto code = (*p)->Wait(absl::Seconds(60));
    errors.join();
    r.joins = joins_.exchange(0);
    training_ = false;
    r.code = code.ok() ? *code : -1;
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::ifstream in(report);
    for (std::string line; std::getline(in, line);) {
      if (absl::StartsWith(line, "auc: ")) (void)absl::SimpleAtod(line.substr(5), &r.auc);
      if (absl::StartsWith(line, "samples: ")) (void)absl::SimpleAtoi(line.substr(9), &r.samples);
      if (absl::StartsWith(line, "heals: ")) (void)absl::SimpleAtoi(line.substr(7), &r.heals);
      if (absl::StartsWith(line, "checkpoint: \"")) r.checkpoint = line.substr(13, line.size() - 14);
    }
    return r;
  }

  // Of a checkpoint: every "applied" line's count, per "<shard file> worker <w> table <t>".
  static std::map<std::string, uint64_t> AppliedCounts(const std::string& checkpoint) {
    return testing::AppliedCounts(Output({HYREC_CHECKPOINT_BINARY, "inspect", checkpoint}));
  }

  struct FaultCounts {
    int kills = 0, stops = 0, loader_kills = 0, worker_kills = 0, broker_errors = 0;
    int total() const { return kills + stops + loader_kills + worker_kills + broker_errors; }
  };

  // Up to `max_faults` faults drawn from `seed`, 2-4 s apart, once training is under way: PS
  // shard kills and stops, loader kills, worker 1 kills (the next once its replacement joined)
  // and, given `broker_errors`, errors on a stream's next fetches.
  void InjectFaults(pid_t launcher, const std::atomic<bool>& done, uint64_t seed, int max_faults,
                    const std::function<void()>& broker_errors, FaultCounts* n) {
    std::mt19937_64 rng(seed);
    // Training under way (every worker past its set-up): the first progress line, then a second.
    for (const absl::Time limit = absl::Now() + absl::Seconds(120); !training_ && !done && absl::Now() < limit;) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    absl::SleepFor(absl::Seconds(1));
    for (int f = 0; f < max_faults && !done; ++f) {
      int kind = static_cast<int>(rng() % (broker_errors ? 5 : 4));
      const int shard = static_cast<int>(rng() % 2);
      // One worker fault at a time: the next once its replacement has joined.
      if (kind == 3 && joins_ < n->worker_kills) kind = 0;
      if (kind == 4) {
        std::printf("fault %d: the broker fails the next 5 fetches\n", f);
        Injected(kind);
        broker_errors();
        ++n->broker_errors;
        absl::SleepFor(absl::Milliseconds(2000 + rng() % 2000));
        continue;
      }
      std::vector<pid_t> target = kind == 2   ? ChildrenWith(launcher, "hyrec-loader")
                                  : kind == 3 ? ChildrenWith(launcher, "--rank=1")
                                              : ChildrenWith(launcher, absl::StrCat("--shard_index=", shard));
      if (done) break;
      if (target.empty()) {  // Being restarted: the next fault.
        absl::SleepFor(absl::Milliseconds(500));
        continue;
      }
      Injected(kind);
      if (kind == 0) {
        std::printf("fault %d: SIGKILL PS shard %d\n", f, shard);
        kill(target[0], SIGKILL);
        ++n->kills;
      } else if (kind == 1) {
        std::printf("fault %d: SIGSTOP PS shard %d for 1.5 s\n", f, shard);
        kill(target[0], SIGSTOP);
        absl::SleepFor(absl::Milliseconds(1500));
        kill(target[0], SIGCONT);
        ++n->stops;
      } else if (kind == 2) {
        std::printf("fault %d: SIGKILL the loader\n", f);
        kill(target[0], SIGKILL);
        ++n->loader_kills;
      } else {
        std::printf("fault %d: SIGKILL worker 1\n", f);
        kill(target[0], SIGKILL);
        ++n->worker_kills;
      }
      absl::SleepFor(absl::Milliseconds(2000 + rng() % 2000));
    }
  }

  // Prints what was injected and what it cost, and checks what every chaos run must hold.
  void Summarize(uint64_t seed, const FaultCounts& n, const Outcome& calm, const Outcome& chaos) {
    std::printf(
        "chaos (seed %llu): %d PS kills, %d PS stops, %d loader kills, %d worker kills, %d broker errors; %d "
        "recoveries, %d worker heals; %.1f s against %.1f s without faults (%.1f s lost); AUC %.5f against %.5f\n",
        static_cast<unsigned long long>(seed), n.kills, n.stops, n.loader_kills, n.worker_kills, n.broker_errors,
        chaos.recoveries, chaos.heals, chaos.seconds, calm.seconds, chaos.seconds - calm.seconds, chaos.auc, calm.auc);
    const std::vector<double> lost = testing::TimeLost(calm.progress, chaos.progress, faults_, kFaultKinds);
    std::vector<int> counts(kFaultKinds, 0);
    for (const testing::Fault& f : faults_) ++counts[f.kind];
    std::printf("time lost, at the calm run's training rate:");
    for (int k = 0; k < kFaultKinds; ++k) {
      if (counts[k] == 0) continue;
      std::printf(" %s %d x %.1f s,", kFaultNames[k], counts[k], lost[k] / counts[k]);
    }
    std::printf("\n");
    EXPECT_EQ(chaos.code, 0) << chaos.tail;
    EXPECT_EQ(chaos.recoveries, n.kills + n.loader_kills);
    EXPECT_EQ(chaos.joins, n.worker_kills);
    EXPECT_EQ(chaos.heals, n.worker_kills);
    EXPECT_GT(n.total(), 0) << "the job ended before any fault";
    EXPECT_NEAR(chaos.auc, calm.auc, 0.002);
  }

  // Records a fault of `kind` as injected now.
  void Injected(int kind) { faults_.push_back({absl::ToDoubleSeconds(absl::Now() - start_), kind}); }

  std::string dir_;
  absl::Time start_;                    // Of the run under way.
  std::vector<testing::Fault> faults_;  // The injector's; read once it has ended.
  std::atomic<int> joins_{0};
  std::atomic<bool> training_{false};  // The job printed its first progress line.
};

TEST_F(ChaosTest, TheJobFinishesUnderFaultsAsWithoutThem) {
  const uint64_t seed = EnvOr("HYREC_CHAOS_SEED", 2);             // Its 4 faults are one of each kind.
  const uint64_t samples = EnvOr("HYREC_CHAOS_SAMPLES", 512000);  // Its 4 slots end well before the run.
  const int max_faults = static_cast<int>(EnvOr("HYREC_CHAOS_FAULTS", 4));
  const Outcome calm = Train(Job("calm", samples), nullptr);
  ASSERT_EQ(calm.code, 0) << calm.tail;
  ASSERT_EQ(calm.samples, samples);

  FaultCounts n;
  const Outcome chaos = Train(Job("chaos", samples), [&](pid_t launcher, const std::atomic<bool>& done) {
    InjectFaults(launcher, done, seed, max_faults, {}, &n);
  });
  Summarize(seed, n, calm, chaos);
  EXPECT_EQ(chaos.samples, samples) << "samples lost or trained twice";
  // Acknowledged = applied, per shard, worker and table: one update per step of each worker.
  const uint64_t steps = samples / (256 * 2);
  // The final step's checkpoint: every cut after a heal or recovery committed.
  EXPECT_TRUE(absl::StrContains(chaos.checkpoint, absl::StrFormat("/ckpt-%012d-", steps))) << chaos.checkpoint;
  const std::map<std::string, uint64_t> applied = AppliedCounts(chaos.checkpoint);
  EXPECT_EQ(applied.size(), 2u * 2u * 4u) << chaos.checkpoint;
  for (const auto& [what, count] : applied) EXPECT_EQ(count, steps) << what;
}

#ifdef HYREC_CHAOS_KAFKA
TEST_F(ChaosTest, AStreamJobTrainsEveryRecordOnceUnderFaults) {
  const uint64_t seed = EnvOr("HYREC_CHAOS_SEED", 20);  // Its 5 faults are one of each kind.
  // A multiple of 512 (2 workers' batches): a last partial batch whose peer has none is not
  // trained, as with files. Partitions of at most 15,000 records: the mock cluster keeps about
  // 5 MB of each.
  const int records = static_cast<int>(EnvOr("HYREC_CHAOS_RECORDS", 239616));
  const int kPartitions = std::max(16, (records + 14999) / 15000);
  const int max_faults = static_cast<int>(EnvOr("HYREC_CHAOS_FAULTS", 5));
  testing::MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", kPartitions));
  std::vector<int64_t> per_partition(kPartitions, 0);
  for (int id = 0; id < records; ++id) {
    ASSERT_TRUE(kafka.Produce("clicks", id % kPartitions, testing::CriteoRecord(id), 1700000000000 + id));
    ++per_partition[id % kPartitions];
  }
  ASSERT_TRUE(kafka.Flush());
  const std::string heldout = dir_ + "/heldout.tsv";
  {
    std::ofstream out(heldout);
    for (int id = records; id < records + 2000; ++id) out << testing::CriteoRecord(id) << "\n";
  }
  const Outcome calm = Train(StreamJob("calm", kafka.brokers(), heldout), nullptr);
  ASSERT_EQ(calm.code, 0) << calm.tail;
  ASSERT_EQ(calm.samples, static_cast<uint64_t>(records));

  FaultCounts n;
  const Outcome chaos =
      Train(StreamJob("chaos", kafka.brokers(), heldout), [&](pid_t launcher, const std::atomic<bool>& done) {
        InjectFaults(
            launcher, done, seed, max_faults, [&] { kafka.FailFetches(5); }, &n);
      });
  Summarize(seed, n, calm, chaos);
  EXPECT_EQ(chaos.samples, static_cast<uint64_t>(records)) << "records lost or trained twice";
  // By offset: the final checkpoint's windows end at each partition's end, none past it, and the
  // samples trained are those offsets' records.
  absl::StatusOr<CheckpointManifest> m = ReadManifest(Env::Default(), chaos.checkpoint);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::vector<data_loader::ReaderPosition>> positions =
      data_loader::ReadPositionFiles(Env::Default(), chaos.checkpoint, *m, 2);
  ASSERT_TRUE(positions.ok()) << positions.status();
  std::vector<int64_t> reached(kPartitions, 0);
  for (const data_loader::ReaderPosition& p : *positions) {
    for (const data_loader::PartitionRange& r : p.partitions) {
      ASSERT_GE(r.partition, 0);
      ASSERT_LT(r.partition, kPartitions);
      reached[r.partition] = std::max(reached[r.partition], r.end);
    }
  }
  EXPECT_EQ(reached, per_partition);
}
#endif  // HYREC_CHAOS_KAFKA

}  // namespace
}  // namespace hyrec
