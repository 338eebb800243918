// A hand-started job across hosts, for the tests of network faults (partition_test,
// chaos_hosts_test): two PS shards with update logs, a loader and two workers, each role a process started on
// a host of its own (a network namespace, tests/netns_cluster.h) as on a cluster, the roles
// reaching each other by host name on connections that notice 2 s of silence. `Roles` runs and
// reaps the processes; `HostsJobTest` makes the hosts, writes the job and checks its outcome:
// every role's exit code, every sample trained once and every shard's count of each worker's
// applied updates (the final checkpoint's, as in the chaos test) one per step.
//
// Needs root for the namespaces; where they cannot be made, the test says so and skips.
#ifndef HYREC_TESTS_HOSTS_JOB_H_
#define HYREC_TESTS_HOSTS_JOB_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "applied_counts.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "netns_cluster.h"
#include "run_command.h"

namespace hyrec::testing {

// The job's roles, a host each.
inline const std::vector<std::string> kJobRoles = {"ps-0", "ps-1", "loader", "worker-0", "worker-1"};

// The command line of `role` (one of kJobRoles) for `job`, with `extra` flags; worker 0 writes
// the job's report next to it.
inline std::vector<std::string> RoleArgv(const std::string& role, const std::string& job,
                                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv;
  if (absl::StartsWith(role, "ps-")) {
    argv = {HYREC_BINARY, "ps", "--config=" + job, "--shard_index=" + role.substr(3)};
  } else if (role == "loader") {
    argv = {HYREC_BINARY, "loader", "--config=" + job};
  } else {
    argv = {HYREC_BINARY, "worker", "--config=" + job, "--rank=" + role.substr(7), "--progress=none", "--plot="};
    if (role == "worker-0") argv.push_back("--report=" + job + ".report");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

struct HostsOutcome {
  std::map<std::string, int> codes;  // Per process (a role, or a later process's name): its exit code.
  double seconds = 0;
  uint64_t samples = 0;
  double auc = 0;
  std::string checkpoint;
  std::string log;  // Every process's stderr, each line under its name, for a failure's message.
};

// Reads worker 0's report of `job` into `r`.
inline void ReadReport(const std::string& job, HostsOutcome* r) {
  std::ifstream in(job + ".report");
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "samples: ")) (void)absl::SimpleAtoi(line.substr(9), &r->samples);
    if (absl::StartsWith(line, "auc: ")) (void)absl::SimpleAtod(line.substr(5), &r->auc);
    if (absl::StartsWith(line, "checkpoint: \"")) r->checkpoint = line.substr(13, line.size() - 14);
  }
}

// The processes of one run, each started, read to its end (so that it never blocks on a full
// pipe) and waited for by a thread of its own, which lives as long as its process: a child is
// killed when the thread that started it ends (Subprocess's parent-death signal). Start may be
// called while others run; names are unique within a run.
class Roles {
 public:
  // Called with each line a process writes, stdout's and stderr's, from its reading threads.
  using LineCallback = std::function<void(const std::string& line)>;

  ~Roles() { JoinAll(); }

  // Starts `argv` on `host` as `name`; its stderr is kept in the outcome's log, and `on_line`
  // (if set) sees every line.
  void Start(const NetnsCluster& cluster, const std::string& name, const std::string& host,
             const std::vector<std::string>& argv, LineCallback on_line = nullptr) {
    const std::vector<std::string> command = cluster.On(host, argv);
    absl::Notification spawned;
    {
      absl::MutexLock lock(&mu_);
      roles_[name];
      waiters_.emplace_back([this, name, command, on_line, &spawned] { Serve(name, command, on_line, &spawned); });
    }
    spawned.WaitForNotification();
  }

  // `name`'s exit code (128 + the signal that killed it); -1 while it runs.
  int ExitCode(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return roles_.count(name) != 0 && roles_.at(name).done ? roles_.at(name).code : -1;
  }
  // The last line `name` wrote to stderr (what a failed role said), once it has ended.
  std::string LastErrorLine(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return roles_.at(name).last_line;
  }
  // Whether `name` ended with a code other than 0.
  bool Failed(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return roles_.count(name) != 0 && roles_.at(name).done && roles_.at(name).code != 0;
  }
  bool Done(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return roles_.count(name) == 0 || roles_.at(name).done;
  }
  std::vector<std::string> Names() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& [name, role] : roles_) names.push_back(name);
    return names;
  }
  void Signal(const std::string& name, int signal) {
    absl::MutexLock lock(&mu_);
    Role& role = roles_.at(name);
    if (!role.done && role.process != nullptr) role.process->Signal(signal);
  }
  // SIGKILLs `name` (if it still runs) and waits until it has ended.
  void Kill(const std::string& name) {
    Signal(name, SIGKILL);
    while (!Done(name)) absl::SleepFor(absl::Milliseconds(20));
  }
  // Waits for every process to end (after Signal, for any still running), then gives each one's
  // exit code and log.
  void Finish(HostsOutcome* r) {
    JoinAll();
    absl::MutexLock lock(&mu_);
    for (const auto& [name, role] : roles_) {
      r->codes[name] = role.code;
      r->log += role.log;
    }
  }

 private:
  struct Role {
    std::unique_ptr<Subprocess> process;
    std::string log;
    std::string last_line;
    int code = -1;
    bool done = false;
  };
  // Starts `command` as `name`, notifies `spawned`, then reads its lines and waits for it: the
  // body of the process's own thread.
  void Serve(const std::string& name, const std::vector<std::string>& command, const LineCallback& on_line,
             absl::Notification* spawned) {
    SpawnOptions spawn;
    spawn.capture_stderr = true;
    auto p = Subprocess::Spawn(command, spawn);
    Subprocess* process = nullptr;
    {
      absl::MutexLock lock(&mu_);
      Role& role = roles_.at(name);
      if (p.ok()) {
        role.process = std::move(*p);
        process = role.process.get();
      } else {
        role.log = absl::StrCat(name, ": cannot start: ", p.status().ToString(), "\n");
        role.done = true;
      }
    }
    spawned->Notify();
    if (process == nullptr) return;
    std::thread out([process, on_line] {
      for (;;) {
        absl::StatusOr<std::string> line = process->ReadLine(absl::Seconds(3600));
        if (!line.ok()) return;
        if (on_line) on_line(*line);
      }
    });
    std::string log;
    std::string last_line;
    for (;;) {
      absl::StatusOr<std::string> line = process->ReadErrorLine(absl::Seconds(3600));
      if (!line.ok()) break;
      if (on_line) on_line(*line);
      absl::StrAppend(&log, name, ": ", *line, "\n");
      last_line = *line;
    }
    out.join();
    absl::StatusOr<int> code = process->Wait(absl::Seconds(600));
    absl::MutexLock lock(&mu_);
    Role& r = roles_.at(name);
    r.log += log;
    r.last_line = last_line;
    r.code = code.ok() ? *code : -1;
    r.done = true;
  }
  void JoinAll() {
    std::vector<std::thread> waiters;
    {
      absl::MutexLock lock(&mu_);
      waiters.swap(waiters_);
    }
    for (std::thread& t : waiters) t.join();
  }

  absl::Mutex mu_;
  std::map<std::string, Role> roles_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> waiters_ ABSL_GUARDED_BY(mu_);
};

// The hosts (the job's roles' and `extra_hosts`), on subnet `subnet` of NetnsCluster (distinct
// per test binary, as ctest runs them side by side), and a directory for the job's files.
class HostsJobTest : public ::testing::Test {
 protected:
  HostsJobTest(int subnet, std::vector<std::string> extra_hosts) : subnet_(subnet), hosts_(kJobRoles) {
    hosts_.insert(hosts_.end(), extra_hosts.begin(), extra_hosts.end());
  }

  void SetUp() override {
    auto cluster = NetnsCluster::Create(absl::StrCat("h", subnet_, "-", getpid()), subnet_, hosts_);
    if (!cluster.ok()) GTEST_SKIP() << "no hosts to run across: " << cluster.status();
    cluster_ = std::move(*cluster);
    dir_ = ::testing::TempDir() + absl::StrCat("/hosts_job_", subnet_, "_", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  struct JobOptions {
    uint64_t samples = 256 * 2 * 300;  // 300 steps of two workers' batches of 256.
    int eval_samples = 5000;
    std::string train;  // Keys added to the train section (", key: value").
    std::string ps;     // And to the ps section.
  };

  // The roles reach each other by host name (each host's /etc/hosts, as a cluster's DNS), on
  // connections that notice 2 s of silence (cluster.keepalive_seconds).
  std::string Job(const std::string& name, const JobOptions& o) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "loader:\n  source:\n    format: synthetic\n"
                        << "    synthetic: {num_samples: " << o.samples
                        << ", num_slots: 4, num_dense: 4, vocabulary: 2000, ids_per_sample: 2, seed: 11}\n"
                        << "  batch_size: 256\n  threads: 1\n"
                        << "eval: {samples: " << o.eval_samples << "}\n"
                        << "model: {embedding_dim: 8, bottom: [16], top: [16]}\n"
                        << "ps: {shards: 2" << o.ps << "}\n"
                        << "train: {workers: 2, embedding_staleness: 0, seed: 3, log_every_batches: 20" << o.train
                        << "}\n"
                        << "checkpoint: {dir: " << dir_ << "/" << name << "-ckpt, every_steps: 100}\n"
                        << "security: {mode: none}\n"
                        << "cluster:\n  ps: [ps-0:7000, ps-1:7000]\n  loader: loader:7100\n"
                        << "  master: worker-0:29500\n  keepalive_seconds: 2\n"
                        << "  services_exit_when_done: true\n";
    return path;
  }

  // Waits until the job has cut the checkpoint of `step`, or `worker0` ended; false if it ended.
  bool AwaitCheckpoint(const std::string& job_name, uint64_t step, Roles* roles,
                       const std::string& worker0 = "worker-0") {
    const std::string checkpoints = dir_ + "/" + job_name + "-ckpt";
    const absl::Time deadline = absl::Now() + absl::Seconds(300);
    while (!HasCheckpointOfStep(checkpoints, step) && !roles->Done(worker0) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return !roles->Done(worker0);
  }

  static bool HasCheckpointOfStep(const std::string& dir, uint64_t step) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (absl::StartsWith(entry.path().filename().string(), absl::StrFormat("ckpt-%012d-", step))) return true;
    }
    return false;
  }

  // Every process in `exit0` exited 0, and the job of `samples` trained each once and applied
  // every update once.
  static void ExpectFinishedWhole(const HostsOutcome& r, const std::string& what, const std::vector<std::string>& exit0,
                                  uint64_t samples) {
    for (const std::string& name : exit0) {
      EXPECT_EQ(r.codes.count(name) ? r.codes.at(name) : -1, 0) << what << ": " << name << "\n" << r.log;
    }
    EXPECT_EQ(r.samples, samples) << what << ": samples lost or trained twice";
    const uint64_t steps = samples / (256 * 2);
    EXPECT_TRUE(absl::StrContains(r.checkpoint, absl::StrFormat("/ckpt-%012d-", steps)))
        << what << ": " << r.checkpoint;
    const std::map<std::string, uint64_t> applied =
        AppliedCounts(RunCommand({HYREC_BINARY, "checkpoint", "inspect", r.checkpoint}).out);
    EXPECT_EQ(applied.size(), 2u * 2u * 4u) << what << ": " << r.checkpoint;
    for (const auto& [which, count] : applied) EXPECT_EQ(count, steps) << what << ": " << which;
  }

  int subnet_;
  std::vector<std::string> hosts_;
  std::unique_ptr<NetnsCluster> cluster_;
  std::string dir_;
};

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_HOSTS_JOB_H_
