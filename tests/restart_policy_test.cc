#include "src/cli/restart_policy.h"

#include <gtest/gtest.h>

namespace hyrec::cli {
namespace {

using Verdict = RestartPolicy::Verdict;

absl::Time At(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

RestartPolicyOptions Options(int budget, double jitter = 0) {
  RestartPolicyOptions options;
  options.budget = budget;
  options.jitter = jitter;
  options.seed = 7;
  return options;
}

// Loses `role` at `at` and brings it back once its backoff has passed; returns that backoff.
absl::Duration LoseAndRestart(RestartPolicy& policy, const std::string& role, absl::Time at) {
  const RestartPolicy::Decision lost = policy.Take(role, at);
  EXPECT_EQ(lost.verdict, Verdict::kLater);
  EXPECT_TRUE(lost.counted);
  EXPECT_EQ(policy.Take(role, at + lost.backoff - absl::Milliseconds(1)).verdict, Verdict::kLater);
  EXPECT_EQ(policy.Take(role, at + lost.backoff).verdict, Verdict::kYes);
  policy.Started(role, at + lost.backoff);
  return lost.backoff;
}

TEST(RestartPolicy, ACrashLoopDoublesItsBackoffToEightTimesAndASteadyRunResetsIt) {
  RestartPolicy policy(Options(100));
  absl::Time now = At(0);
  std::vector<absl::Duration> backoffs;
  for (int i = 0; i < 5; ++i) {  // Each run lasts 1 s: shorter than a steady run.
    backoffs.push_back(LoseAndRestart(policy, "ps 1", now));
    now += backoffs.back() + absl::Seconds(1);
  }
  EXPECT_EQ(backoffs, (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                                                   absl::Seconds(8), absl::Seconds(8)}));
  // Another role's losses are its own streak.
  EXPECT_EQ(LoseAndRestart(policy, "loader 0", now), absl::Seconds(1));
  // A steady run (10 s) before the next loss: back to 1 s.
  now += absl::Seconds(10);
  EXPECT_EQ(LoseAndRestart(policy, "ps 1", now), absl::Seconds(1));
  EXPECT_EQ(policy.restarts(), 7);
  EXPECT_EQ(policy.history().back().role, "ps 1");
  EXPECT_EQ(policy.history()[4].doublings, 3);
}

TEST(RestartPolicy, TheBudgetCountsEveryRoleAndThenRefuses) {
  RestartPolicy policy(Options(2));
  LoseAndRestart(policy, "ps 0", At(0));
  LoseAndRestart(policy, "worker 1", At(100));
  const RestartPolicy::Decision third = policy.Take("ps 0", At(200));
  EXPECT_EQ(third.verdict, Verdict::kNo);
  EXPECT_FALSE(third.counted);
  EXPECT_EQ(policy.restarts(), 2);
  EXPECT_EQ(RestartPolicy(Options(0)).Take("ps 0", At(0)).verdict, Verdict::kNo);
}

TEST(RestartPolicy, JitterSpreadsBackoffsWithinItsBounds) {
  RestartPolicy policy(Options(1000, /*jitter=*/0.2));
  absl::Duration lowest = absl::InfiniteDuration(), highest = absl::ZeroDuration();
  for (int i = 0; i < 200; ++i) {  // Steady runs: every wait is 1 s, spread.
    const absl::Duration backoff = LoseAndRestart(policy, "ps 0", At(100.0 * i));
    EXPECT_GE(backoff, absl::Milliseconds(800));
    EXPECT_LE(backoff, absl::Milliseconds(1200));
    lowest = std::min(lowest, backoff);
    highest = std::max(highest, backoff);
  }
  // Not in lockstep: 200 draws spread over most of the range.
  EXPECT_LT(lowest, absl::Milliseconds(850));
  EXPECT_GT(highest, absl::Milliseconds(1150));
}

TEST(RestartPolicy, PendingListsRolesWaitingOutABackoff) {
  RestartPolicy policy(Options(5));
  policy.Take("ps 1", At(0));
  policy.Take("loader 0", At(0));
  EXPECT_EQ(policy.Pending(), (std::vector<std::string>{"loader 0", "ps 1"}));
  EXPECT_EQ(policy.Take("ps 1", At(1)).verdict, Verdict::kYes);
  EXPECT_EQ(policy.Pending(), (std::vector<std::string>{"loader 0"}));
  policy.ClearPending();
  EXPECT_TRUE(policy.Pending().empty());
}

}  // namespace
}  // namespace hyrec::cli
