// The chaos test across hosts: the job of tests/hosts_job.h (2 PS shards with update logs, a
// loader and 2 workers, each on a host of its own; connections that notice 2 s of silence; the
// collectives', PS calls' and batches' timeouts 5 s) run as Kubernetes runs its rendered JobSet,
// under faults drawn from a seed. The network's faults:
// - a host's link down for 3 s (below the timeouts) or for 8 s (beyond them);
// - a host's link narrowed to 2 Mbit/s for 4 s.
// The processes' faults, beside them:
// - SIGKILL of a PS shard, the loader or worker 1;
// - SIGSTOP of a shard for 1.5 s.
// The test plays Kubernetes's part (`JobSetController`). Every role starts with the flags the
// rendered manifests give it (--resume=auto; --restart_attempt for the shards and the workers).
// A lost shard, loader or worker 1 is started again alone on its host, in the same attempt (the
// JobSet's RestartJob of a server's child Job; the workers' Job recreating an index's pod). A
// lost worker 0 restarts every role in the next attempt, from the newest checkpoint (the JobSet
// restarted).
//
// The faults fall through the job by its progress: fault i once worker 0 has reported (i + 1) /
// (n + 1) of its samples, and at least 1-2 s after the previous one ended, so that each falls inside
// the job on a machine of any speed. The first seven are one of each kind, in an order drawn
// from the seed. The job must finish by itself: the last attempt's processes all exit 0, it
// trained exactly its samples, every shard's count of each worker's applied updates is one per
// step, and its AUC is within 0.002 of the same job's without faults (which runs beside it, on
// hosts of its own). It prints each fault, what the controller did, and the training time each
// kind of fault cost.
//
//   sudo HYREC_CHAOS_SEED=7 HYREC_CHAOS_SAMPLES=4096000 HYREC_CHAOS_FAULTS=280 build/tests/chaos_hosts_test
//
// runs a long version (docs/benchmarks.md, "Chaos across hosts"). Needs root for the hosts;
// where they cannot be made, it says so and skips.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fault_costs.h"
#include "gtest/gtest.h"
#include "hosts_job.h"
#include "jobset_controller.h"

namespace hyrec {
namespace {

using testing::ControlledOutcome;
using testing::Fault;
using testing::JobSetController;
using testing::kJobRoles;
using testing::RunUnderJobSet;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  uint64_t out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

// Every host's link, as on a cluster of narrow links: the job's pace is the network's more than
// the machine's, so that the faults find it under way on any machine.
constexpr int kLinkMbit = 20;

enum FaultKind { kPsKill, kPsStop, kLoaderKill, kWorkerKill, kShortCut, kLongCut, kSlowLink, kKinds };
constexpr const char* kFaultNames[kKinds] = {"PS kill",       "PS stop",       "loader kill",     "worker kill",
                                             "link down 3 s", "link down 8 s", "link at 2 Mbit/s"};

class ChaosHostsTest : public testing::HostsJobTest {
 protected:
  ChaosHostsTest() : HostsJobTest(2, {}) {}

  // The job without faults runs beside the one under faults, on hosts of its own: the pace of
  // both is their links' more than the machine's.
  void SetUp() override {
    HostsJobTest::SetUp();
    if (IsSkipped()) return;
    auto calm = testing::NetnsCluster::Create(absl::StrCat("h3-", getpid()), 3, kJobRoles);
    ASSERT_TRUE(calm.ok()) << calm.status();
    calm_cluster_ = std::move(*calm);
  }

  std::string Job(const std::string& name, uint64_t samples) {
    return HostsJobTest::Job(
        name, {samples, 20000, ", sync_timeout_seconds: 5, batch_timeout_seconds: 5", ", recovery_timeout_seconds: 5"});
  }

  // Up to `max_faults` faults drawn from `seed`, the first kKinds of them one of each kind, each
  // 1-2 s after the previous one ended, once the job trained its share of the samples left.
  void InjectFaults(JobSetController* job, uint64_t seed, int max_faults, uint64_t samples) {
    std::mt19937_64 rng(seed);
    std::vector<int> order(kKinds);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int f = 0; f < max_faults; ++f) {
      const absl::Time gap = absl::Now() + absl::Milliseconds(1000 + rng() % 1000);
      while (absl::Now() < gap && !job->Finished()) absl::SleepFor(absl::Milliseconds(50));
      // The samples left, shared among the faults left: a fault that lags (the ones before it took
      // long) waits for less, and none falls after the job's last step.
      const uint64_t from = job->Samples();
      const uint64_t share = from + (samples - std::min(samples, from)) / (max_faults - f + 1);
      while (job->Samples() < share && !job->Finished()) absl::SleepFor(absl::Milliseconds(20));
      if (job->Finished() || job->Samples() >= samples) return;
      int kind = f < kKinds ? order[f] : static_cast<int>(rng() % kKinds);
      // One worker fault at a time: the next once its replacement trains.
      if (kind == kWorkerKill && !job->WorkerOneTrains()) kind = kPsKill;
      const std::string host = kJobRoles[rng() % kJobRoles.size()];
      const std::string shard = absl::StrCat("ps-", rng() % 2);
      faults_.push_back({job->SecondsIn(), kind});
      std::printf("fault %d at %.1f s (samples %llu): ", f, faults_.back().at,
                  static_cast<unsigned long long>(job->Samples()));
      Inject(job, static_cast<FaultKind>(kind), host, shard);
    }
  }

  void Inject(JobSetController* job, FaultKind kind, const std::string& host, const std::string& shard) {
    switch (kind) {
      case kPsKill:
      case kLoaderKill:
      case kWorkerKill: {
        const std::string name = job->Current(kind == kPsKill ? shard : kind == kLoaderKill ? "loader" : "worker-1");
        std::printf("SIGKILL %s\n", name.c_str());
        job->Signal(name, SIGKILL);
        return;
      }
      case kPsStop: {
        const std::string name = job->Current(shard);
        std::printf("SIGSTOP %s for 1.5 s\n", name.c_str());
        job->Signal(name, SIGSTOP);
        absl::SleepFor(absl::Milliseconds(1500));
        job->Signal(name, SIGCONT);
        return;
      }
      case kShortCut:
      case kLongCut: {
        const int seconds = kind == kShortCut ? 3 : 8;
        std::printf("%s's link down for %d s\n", host.c_str(), seconds);
        EXPECT_TRUE(cluster_->SetLink(host, false).ok());
        absl::SleepFor(absl::Seconds(seconds));
        EXPECT_TRUE(cluster_->SetLink(host, true).ok());
        return;
      }
      case kSlowLink:
        std::printf("%s's link at 2 Mbit/s for 4 s\n", host.c_str());
        EXPECT_TRUE(cluster_->Limit(host, 2).ok());
        absl::SleepFor(absl::Seconds(4));
        EXPECT_TRUE(cluster_->Limit(host, kLinkMbit).ok());
        return;
      case kKinds:
        return;
    }
  }

  std::vector<Fault> faults_;  // The injector's; read once it has ended.
  std::unique_ptr<testing::NetnsCluster> calm_cluster_;
};

TEST_F(ChaosHostsTest, TheJobFinishesAcrossHostsUnderNetworkAndProcessFaults) {
  const uint64_t seed = EnvOr("HYREC_CHAOS_SEED", 1);
  const uint64_t samples = EnvOr("HYREC_CHAOS_SAMPLES", 256 * 2 * 600);  // 600 steps.
  const int max_faults = static_cast<int>(EnvOr("HYREC_CHAOS_FAULTS", kKinds));
  // Generous: a fault and what follows it take seconds, a thousand samples take a fraction of one.
  const absl::Duration deadline = absl::Seconds(300 + 20 * max_faults + samples / 1000);
  for (testing::NetnsCluster* hosts : {cluster_.get(), calm_cluster_.get()}) {
    for (const std::string& host : kJobRoles) ASSERT_TRUE(hosts->Limit(host, kLinkMbit).ok());
  }
  ControlledOutcome calm;
  std::thread beside([&] { calm = RunUnderJobSet(*calm_cluster_, Job("calm", samples), deadline, nullptr); });
  const ControlledOutcome chaos =
      RunUnderJobSet(*cluster_, Job("chaos", samples), deadline,
                     [&](JobSetController* job) { InjectFaults(job, seed, max_faults, samples); });
  beside.join();
  ASSERT_TRUE(calm.finished) << calm.log;
  ExpectFinishedWhole(calm, "no fault", calm.last, samples);
  std::vector<int> counts(kKinds, 0);
  for (const Fault& f : faults_) ++counts[f.kind];
  const std::vector<double> lost = testing::TimeLost(calm.progress, chaos.progress, faults_, kKinds);
  std::printf(
      "chaos across hosts (seed %llu): %zu faults, %d attempts, %d processes started again alone, %d "
      "worker joins; %.1f s against %.1f s without faults; AUC %.5f against %.5f\n",
      static_cast<unsigned long long>(seed), faults_.size(), chaos.attempts, chaos.restarted_alone, chaos.joins,
      chaos.seconds, calm.seconds, chaos.auc, calm.auc);
  std::printf("time lost, at the calm run's training rate:");
  for (int k = 0; k < kKinds; ++k) {
    if (counts[k] > 0) std::printf(" %s %d x %.1f s,", kFaultNames[k], counts[k], lost[k] / counts[k]);
  }
  std::printf("\n");
  ASSERT_TRUE(chaos.finished) << chaos.log;
  EXPECT_GT(faults_.size(), 0u) << "the job ended before any fault";
  ExpectFinishedWhole(chaos, "under faults", chaos.last, samples);
  EXPECT_NEAR(chaos.auc, calm.auc, 0.002);
}

}  // namespace
}  // namespace hyrec
