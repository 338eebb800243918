// A job across hosts (tests/hosts_job.h): two PS shards with update logs, a loader and two
// workers, each started by hand on a host of its own (a network namespace, tests/netns_cluster.h)
// as on a cluster, each reaching the others by host name through a bridge, on connections that
// notice 2 s of silence.
// - One host's link is taken down for 3 s (beyond the keepalive, below the job's other timeouts)
//   and brought back, once for each kind of role, a worker included.
// - Worker 1's host is cut off for longer than the job's timeouts, and so is a PS host and the
//   loader's (the job then run as Kubernetes runs it, tests/jobset_controller.h).
// - A PS host, and the loader's, is cut off and its role replaced on a spare host, by name.
// - Every link is narrowed (tc tbf), and what each host sent is held against the planner's model.
// The job must finish by itself: every role exits 0 (a replaced one 2), worker 0 trained exactly
// the data's samples, and every shard applied each worker's update of every step once (the
// checkpoint's counts, as in the chaos test). It prints what each partition cost against the
// same job with no fault.
//
// Needs root for the namespaces; where they cannot be made, it says so and skips.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hosts_job.h"
#include "jobset_controller.h"
#include "json_fields.h"
#include "run_command.h"

namespace hyrec {
namespace {

using testing::HostsOutcome;
using testing::kJobRoles;
using testing::Roles;

constexpr uint64_t kSamples = 256 * 2 * 300;  // 300 steps of two workers' batches of 256.

class PartitionTest : public testing::HostsJobTest {
 protected:
  // The job's hosts and a spare one a lost role may be started on again.
  PartitionTest() : HostsJobTest(1, {"spare"}) {}

  // `train` and `ps` add keys to those sections.
  std::string Job(const std::string& name, const std::string& train = "", const std::string& ps = "") {
    return HostsJobTest::Job(name, {kSamples, 5000, train, ps});
  }

  // Runs the job's roles on their hosts; `fault` runs beside them (and may start more roles).
  HostsOutcome Run(const std::string& job, const std::function<void(Roles*)>& fault) {
    HostsOutcome r;
    const absl::Time start = absl::Now();
    Roles roles;
    for (const std::string& host : kJobRoles) roles.Start(*cluster_, host, host, testing::RoleArgv(host, job));
    std::thread faults([&] {
      if (fault) fault(&roles);
    });
    // The services exit by themselves once worker 0 has told them the job is done; those that
    // have not a minute after both workers ended are killed and count as failed.
    const absl::Time deadline = absl::Now() + absl::Seconds(400);
    while (!(roles.Done("worker-0") && roles.Done("worker-1")) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    faults.join();
    const absl::Time grace = std::min(deadline, absl::Now() + absl::Seconds(60));
    std::vector<std::string> killed;
    for (const std::string& name : roles.Names()) {
      while (!roles.Done(name) && absl::Now() < grace) absl::SleepFor(absl::Milliseconds(100));
      if (!roles.Done(name)) {
        roles.Signal(name, SIGKILL);
        killed.push_back(name);
      }
    }
    roles.Finish(&r);
    for (const std::string& name : killed) {
      r.codes.at(name) = -2;
      absl::StrAppend(&r.log, name, ": killed by the test, still running after the workers ended\n");
    }
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    testing::ReadReport(job, &r);
    return r;
  }

  // Every role in `exit0` exited 0, and the job trained its samples and applied its updates once.
  static void ExpectFinishedWhole(const HostsOutcome& r, const std::string& what,
                                  const std::vector<std::string>& exit0 = kJobRoles) {
    HostsJobTest::ExpectFinishedWhole(r, what, exit0, kSamples);
  }
};

TEST_F(PartitionTest, AHostCutOffBelowTheTimeoutsCostsTimeNotTheJob) {
  const HostsOutcome calm = Run(Job("calm"), nullptr);
  ExpectFinishedWhole(calm, "no partition");
  std::printf("no partition: %.1f s\n", calm.seconds);
  // 3 s: beyond the keepalive (the connections to the host are closed and made again), within
  // every other timeout.
  for (const std::string host : {"ps-0", "loader", "worker-1"}) {
    const std::string name = absl::StrCat("cut-", host);
    const HostsOutcome cut = Run(Job(name), [&](Roles* roles) {
      // A third of the way in (the checkpoint of step 100 of 300), so that the cut falls inside
      // the job on a machine of any speed.
      ASSERT_TRUE(AwaitCheckpoint(name, 100, roles)) << "the job ended before its partition";
      ASSERT_TRUE(cluster_->SetLink(host, false).ok());
      absl::SleepFor(absl::Seconds(3));
      ASSERT_TRUE(cluster_->SetLink(host, true).ok());
    });
    ExpectFinishedWhole(cut, absl::StrCat(host, " cut off for 3 s"));
    std::printf("%s cut off for 3 s: %.1f s (%+.1f s)\n", host.c_str(), cut.seconds, cut.seconds - calm.seconds);
  }
}

// Worker 1 cut off for 10 s, longer than the job's timeouts (the collectives' and the PS calls',
// 5 s here): the step's collective fails on both sides and each waits for the other to join the
// group's next generation (train.heal_timeout_seconds). When the link comes back worker 1 joins,
// heals from worker 0 and the job finishes whole. Should worker 1 fail instead, it is started
// again on its host with the same flags (as a kubelet restarts a failed container in place) and
// heals the same way.
TEST_F(PartitionTest, AWorkerCutOffBeyondTheTimeoutsHeals) {
  const std::string job = Job("worker-cut", ", sync_timeout_seconds: 5", ", recovery_timeout_seconds: 5");
  bool restarted = false;
  const HostsOutcome r = Run(job, [&](Roles* roles) {
    ASSERT_TRUE(AwaitCheckpoint("worker-cut", 100, roles)) << "the job ended before its partition";
    ASSERT_TRUE(cluster_->SetLink("worker-1", false).ok());
    const absl::Time up = absl::Now() + absl::Seconds(10);
    bool linked = false;
    while (!roles->Done("worker-0")) {
      if (!linked && absl::Now() >= up) {
        ASSERT_TRUE(cluster_->SetLink("worker-1", true).ok());
        linked = true;
      }
      if (!restarted && roles->Failed("worker-1")) {
        restarted = true;
        roles->Start(*cluster_, "worker-1 again", "worker-1",
                     {HYREC_BINARY, "worker", "--config=" + job, "--rank=1", "--progress=none", "--plot="});
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (!linked) {
      ASSERT_TRUE(cluster_->SetLink("worker-1", true).ok());
    }
  });
  ExpectFinishedWhole(r, "worker-1 cut off for 10 s",
                      {"ps-0", "ps-1", "loader", "worker-0", restarted ? "worker-1 again" : "worker-1"});
  std::printf("worker-1 cut off for 10 s%s: %.1f s\n", restarted ? " and restarted" : "", r.seconds);
}

// A PS host, and then the loader's, cut off for 8 s: longer than the job's timeouts (5 s here),
// so that the workers' calls to it run out and fail them. The job runs as Kubernetes runs it
// (tests/jobset_controller.h): a failed worker 1 is started again alone and heals, a failed
// worker 0 restarts every role from the latest checkpoint in the next attempt; which of them
// comes first is a race, and either way the job must finish whole.
TEST_F(PartitionTest, AServerCutOffBeyondTheTimeoutsCostsTimeNotTheJob) {
  for (const std::string host : {"ps-0", "loader"}) {
    const std::string job = Job(absl::StrCat("long-", host), ", sync_timeout_seconds: 5, batch_timeout_seconds: 5",
                                ", recovery_timeout_seconds: 5");
    const testing::ControlledOutcome r =
        testing::RunUnderJobSet(*cluster_, job, absl::Seconds(400), [&](testing::JobSetController* c) {
          // A third of the way in, as the shorter cuts.
          while (c->Samples() < kSamples / 3 && !c->Finished()) absl::SleepFor(absl::Milliseconds(20));
          ASSERT_FALSE(c->Finished()) << "the job ended before its partition";
          ASSERT_TRUE(cluster_->SetLink(host, false).ok());
          absl::SleepFor(absl::Seconds(8));
          ASSERT_TRUE(cluster_->SetLink(host, true).ok());
        });
    ASSERT_TRUE(r.finished) << r.log;
    ExpectFinishedWhole(r, host + " cut off for 8 s", r.last);
    std::printf("%s cut off for 8 s: %.1f s, %d attempt(s), %d process(es) started again alone\n", host.c_str(),
                r.seconds, r.attempts, r.restarted_alone);
  }
}

// Every host's link limited to 100 Mbit/s (a token bucket on its egress): the job finishes whole,
// and what each kind of host sent (its link's byte counter, headers and acknowledgements
// included) is what `hyrec plan`'s network model says a step sends, within 15%: the shards' rows,
// the workers' ids and gradients (and the dense allreduce), the loader's batches. The rate the
// links allow is a benchmark (docs/capacity.md), not a verdict here.
TEST_F(PartitionTest, TheLinksCarryWhatThePlannerModels) {
  const std::string job = Job("slow");
  {  // No held-out evaluation: its lookups are not steps'.
    std::ifstream in(job);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("eval: {samples: 5000}"), 21, "eval: {samples: 0}");
    std::ofstream(job, std::ios::trunc) << text;
  }
  for (const std::string& host : kJobRoles) ASSERT_TRUE(cluster_->Limit(host, 100).ok()) << host;
  const HostsOutcome r = Run(job, nullptr);
  ExpectFinishedWhole(r, "every link at 100 Mbit/s");

  const testing::CommandResult plan = testing::RunCommand({HYREC_BINARY, "plan", "--config=" + job, "--json"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  const auto field = [&](const std::string& key) { return testing::JsonNumber(plan.out, key); };
  double dense_parameters = -1;
  std::ifstream report(job + ".report");
  for (std::string line; std::getline(report, line);) {
    if (absl::StartsWith(line, "dense_parameters: ")) (void)absl::SimpleAtod(line.substr(18), &dense_parameters);
  }
  ASSERT_GT(dense_parameters, 0);
  const double steps = kSamples / (256.0 * 2);
  // Each worker sends its half of the dense gradients' ring allreduce: 2 (w - 1) / w of them.
  const double allreduce = 2 * 4 * dense_parameters;
  const std::map<std::string, std::pair<std::vector<std::string>, double>> links = {
      {"PS -> workers (rows)", {{"ps-0", "ps-1"}, steps * field("row_bytes_fp32")}},
      {"workers -> PS (ids, gradients) and each other (dense)",
       {{"worker-0", "worker-1"}, steps * (field("id_bytes") + field("gradient_bytes_fp32") + allreduce)}},
      {"loader -> workers (batches)", {{"loader"}, steps * field("loader_bytes")}},
  };
  for (const auto& [what, link] : links) {
    double sent = 0;
    for (const std::string& host : link.first) {
      absl::StatusOr<uint64_t> bytes = cluster_->SentBytes(host);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      sent += static_cast<double>(*bytes);
    }
    ASSERT_GT(link.second, 0) << what << ": " << plan.out;
    std::printf("%s: sent %.0f bytes, modelled %.0f (%.3f)\n", what.c_str(), sent, link.second, sent / link.second);
    EXPECT_NEAR(sent / link.second, 1.0, 0.15) << what << "\n" << plan.out;
  }
  std::printf("every link at 100 Mbit/s: %.1f s, %.0f samples/s\n", r.seconds, kSamples / r.seconds);
}

// A host cut off from the network and from the volume the job's state is on (its link down, its
// process frozen: a network volume is out of reach with the link) is replaced on another host, as
// Kubernetes recreates a lost pod on another node: its role started on the spare host, its name
// now resolving there, on a volume whose locks do not reach the old host. The workers'
// connections to the old host close (keepalive) and reach the new one by name. When the old
// host's link comes back, the old process must stop (exit 2, saying it was replaced) without
// having written to the shared state or answered as the role, and the job must finish whole.
class ReplacedTest : public PartitionTest {
 protected:
  // Replaces `host`'s role (`argv` on the spare host) once the job cut the checkpoint of step
  // 100; `before` runs just before the replacement starts (the old one cut off and frozen).
  HostsOutcome RunReplacing(const std::string& name, const std::string& host, const std::vector<std::string>& argv,
                            const std::function<void()>& before) {
    return Run(Job(name), [&](Roles* roles) {
      ASSERT_TRUE(AwaitCheckpoint(name, 100, roles)) << "the job ended before its partition";
      ASSERT_TRUE(cluster_->SetLink(host, false).ok());
      roles->Signal(host, SIGSTOP);
      if (before) before();
      ASSERT_TRUE(cluster_->MoveName(host, "spare").ok());
      roles->Start(*cluster_, host + " on spare", "spare", argv);
      // Long enough for the workers to have gone on with the new one.
      const absl::Time until = absl::Now() + absl::Seconds(8);
      while (absl::Now() < until && !roles->Done("worker-0")) absl::SleepFor(absl::Milliseconds(100));
      ASSERT_TRUE(cluster_->SetLink(host, true).ok());
      roles->Signal(host, SIGCONT);
    });
  }

  void ExpectReplaced(const HostsOutcome& r, const std::string& host, const std::string& message) {
    std::vector<std::string> exit0 = {host + " on spare"};
    for (const std::string& role : kJobRoles) {
      if (role != host) exit0.push_back(role);
    }
    ExpectFinishedWhole(r, host + " replaced while cut off", exit0);
    EXPECT_EQ(r.codes.at(host), 2) << r.log;
    EXPECT_TRUE(absl::StrContains(r.log, host + ": " + message)) << r.log;
    std::printf("%s replaced while cut off: %.1f s\n", host.c_str(), r.seconds);
  }
};

// The shard's replacement recovers from the update log (its old LOCK file gone: the volume's
// locks do not reach the old host).
TEST_F(ReplacedTest, AShardStopsWhenItsLinkComesBack) {
  const std::string job = dir_ + "/shard.yaml";
  const HostsOutcome r =
      RunReplacing("shard", "ps-0", {HYREC_BINARY, "ps", "--config=" + job, "--shard_index=0", "--recover"},
                   [&] { std::filesystem::remove(dir_ + "/shard-ckpt/update-log/ps-0/LOCK"); });
  ExpectReplaced(r, "ps-0",
                 "hyrec ps: the update log " + dir_ + "/shard-ckpt/update-log/ps-0 was taken over by another process");
}

// The new loader resumes each worker from where its stream stands.
TEST_F(ReplacedTest, ALoaderStopsWhenItsLinkComesBack) {
  const std::string job = dir_ + "/loader.yaml";
  const HostsOutcome r = RunReplacing("loader", "loader", {HYREC_BINARY, "loader", "--config=" + job}, nullptr);
  ExpectReplaced(
      r, "loader",
      "hyrec loader: the job's loader (" + dir_ + "/loader-ckpt/loader/EPOCH) was taken over by another process");
}

}  // namespace
}  // namespace hyrec
