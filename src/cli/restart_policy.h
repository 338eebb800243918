// RestartPolicy: when the launcher brings a lost role back, and when it gives up.
//
// Every restart in a run counts against one budget, whichever role it is. A role's restart waits
// a backoff first: first_backoff, doubled for each restart in a row of the same role that
// followed a short run (less than steady_run since it last began serving: a crash loop), at most
// max_doublings times, each scaled by a random factor in [1 - jitter, 1 + jitter] so that roles
// lost together do not come back in lockstep. A role that ran steadily before it was lost waits
// first_backoff again.
//
// The policy keeps no clock of its own: callers pass the time, so that it is tested without
// processes or sleeps. Not thread-safe.
//
//   RestartPolicy policy(RestartPolicyOptions{.budget = 5});
//   RestartPolicy::Decision d = policy.Take("ps 1", absl::Now());  // kLater: counted, waits d.backoff
//   ... policy.Take("ps 1", later) returns kYes once the backoff has passed; start it, then
//   policy.Started("ps 1", absl::Now());
#ifndef HYREC_SRC_CLI_RESTART_POLICY_H_
#define HYREC_SRC_CLI_RESTART_POLICY_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace hyrec::cli {

struct RestartPolicyOptions {
  int budget = 5;                                   // Restarts in one run, all roles together.
  absl::Duration first_backoff = absl::Seconds(1);  // The wait before a restart after a steady run.
  int max_doublings = 3;                            // So a crash loop waits at most 8 x first_backoff.
  absl::Duration steady_run = absl::Seconds(5);     // A shorter run before a loss continues a streak.
  double jitter = 0.2;                              // In [0, 1): each backoff's random spread.
  uint64_t seed = 0;                                // Of the jitter; 0: a random seed.
};

class RestartPolicy {
 public:
  enum class Verdict {
    kNo,     // The budget is spent: the role stays down.
    kLater,  // The role waits out its backoff; ask again.
    kYes,    // Restart it now (once: the next loss is a new restart).
  };
  struct Decision {
    Verdict verdict = Verdict::kNo;
    bool counted = false;    // This call counted a restart against the budget.
    absl::Duration backoff;  // When counted: the wait it set.
  };
  // A counted restart, for the run's log and tests.
  struct Restart {
    std::string role;
    absl::Time at;
    absl::Duration backoff;
    int doublings = 0;  // Of first_backoff in its backoff: the role's crash-loop streak, capped.
  };

  explicit RestartPolicy(RestartPolicyOptions options);

  // The verdict on `role`, lost (or still waiting) at `now`. The first call for a loss counts
  // it (kNo when the budget is spent) and sets its backoff; calls until the backoff has passed
  // are kLater, the first after it kYes.
  Decision Take(const std::string& role, absl::Time now);
  // `role` (restarted) began serving at `now`: its run, which decides its next backoff, starts.
  void Started(const std::string& role, absl::Time now);

  int restarts() const { return static_cast<int>(history_.size()); }
  int budget() const { return options_.budget; }
  const std::vector<Restart>& history() const { return history_; }
  // The roles waiting out a backoff; ClearPending forgets them (the run ended without them).
  std::vector<std::string> Pending() const;
  void ClearPending() { due_.clear(); }

 private:
  struct RoleState {
    absl::Time started = absl::InfinitePast();  // When it last began serving after a restart.
    int streak = 0;
  };
  RestartPolicyOptions options_;
  std::mt19937_64 rng_;
  std::map<std::string, RoleState> roles_;
  std::map<std::string, absl::Time> due_;  // Roles waiting out their backoff: when it ends.
  std::vector<Restart> history_;
};

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_RESTART_POLICY_H_
