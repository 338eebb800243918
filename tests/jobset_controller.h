// Kubernetes's part in running a job's rendered JobSet (src/deploy/k8s_render.cc), played by a
// test for the job of tests/hosts_job.h, whose roles it starts by hand on their hosts: the flags
// each pod gets, and the failure policy's restarts (a lost server or worker 1 alone, in the same
// attempt; a lost worker 0 by the whole job, in the next). For the tests of faults that a job
// on a cluster must live through by itself (chaos_hosts_test, partition_test).
#ifndef HYREC_TESTS_JOBSET_CONTROLLER_H_
#define HYREC_TESTS_JOBSET_CONTROLLER_H_

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "fault_costs.h"
#include "hosts_job.h"

namespace hyrec::testing {

// What a run of the job under the controller came to.
struct ControlledOutcome : HostsOutcome {
  bool finished = false;          // Worker 0 of the last attempt exited 0.
  std::vector<std::string> last;  // The last attempt's processes, one per role.
  int attempts = 1;               // The JobSet's attempts: 1 + its restarts.
  int restarted_alone = 0;        // Processes started again alone in their attempt.
  int joins = 0;                  // Worker 1 replacements that joined their peer's group.
  Progress progress;              // Worker 0's progress lines, each attempt's.
};

// Kubernetes's part in running the job's rendered JobSet, for its roles started by hand on the
// hosts. Every role's process starts with the manifests' flags; one that exits with a code other
// than 0 is replaced as the JobSet's failure policy says (a server's or worker 1's alone, in the
// same attempt; worker 0's by the whole job, in the next). Supervise returns once worker 0 of
// the latest attempt exited 0 (the services exit by themselves then) or at `deadline`.
class JobSetController {
 public:
  JobSetController(const NetnsCluster& cluster, std::string job, Roles* roles)
      : cluster_(cluster), job_(std::move(job)), roles_(roles), start_(absl::Now()) {}

  void Supervise(absl::Time deadline, int max_attempts, ControlledOutcome* r) {
    for (const std::string& role : kJobRoles) StartRole(role);
    while (absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      if (roles_->ExitCode(Current("worker-0")) == 0) {
        r->finished = true;
        break;
      }
      for (const std::string& role : kJobRoles) {
        const std::string name = Current(role);
        const int code = roles_->ExitCode(name);
        if (code <= 0) continue;  // Running, or done.
        if (role != "worker-0") {
          std::printf("  controller: %s exited %d%s: started again alone\n", name.c_str(), code, Said(name).c_str());
          ++r->restarted_alone;
          StartRole(role, /*alone=*/true);
        } else if (r->attempts < max_attempts) {
          std::printf("  controller: %s exited %d%s: every role restarted, attempt %d\n", name.c_str(), code,
                      Said(name).c_str(), r->attempts);
          for (const std::string& other : kJobRoles) roles_->Kill(Current(other));
          {
            absl::MutexLock lock(&mu_);
            ++attempt_;
          }
          ++r->attempts;
          for (const std::string& other : kJobRoles) StartRole(other);
          break;
        } else {
          std::printf("  controller: %s exited %d: no attempts left\n", name.c_str(), code);
          return;
        }
      }
    }
    absl::MutexLock lock(&mu_);
    finished_ = true;
    for (const std::string& role : kJobRoles) r->last.push_back(current_.at(role));
    r->joins = joins_;
    r->progress = progress_;
  }

  // The process that plays `role` now.
  std::string Current(const std::string& role) {
    absl::MutexLock lock(&mu_);
    return current_.at(role);
  }
  // The samples worker 0 last reported, and whether the job is over.
  uint64_t Samples() {
    absl::MutexLock lock(&mu_);
    return samples_;
  }
  bool Finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  // Whether worker 1 trains: it joined its peer's group (a replacement) or worker 0 trained since
  // it started (an attempt's first), so a fault may take it again.
  bool WorkerOneTrains() {
    absl::MutexLock lock(&mu_);
    return worker1_trains_;
  }
  double SecondsIn() const { return absl::ToDoubleSeconds(absl::Now() - start_); }
  void Signal(const std::string& name, int signal) { roles_->Signal(name, signal); }

 private:
  // Starts `role`'s next process, with the flags the rendered JobSet gives its pod; `alone`: in
  // place of a lost one, the rest of the attempt running on.
  void StartRole(const std::string& role, bool alone = false) {
    std::string name;
    std::vector<std::string> extra = {"--resume=auto"};
    {
      absl::MutexLock lock(&mu_);
      name = absl::StrCat(role, " (attempt ", attempt_, ", process ", ++started_, ")");
      if (role != "loader") extra.push_back(absl::StrCat("--restart_attempt=", attempt_));
      current_[role] = name;
      if (role == "worker-1") {
        worker1_trains_ = false;
        worker1_replaces_ = alone;
      }
    }
    std::vector<std::string> argv = RoleArgv(role, job_, extra);
    if (role == "worker-0")
      std::replace(argv.begin(), argv.end(), std::string("--progress=none"), std::string("--progress=lines"));
    roles_->Start(cluster_, name, role, argv, [this, name](const std::string& line) { OnLine(name, line); });
  }

  // What a process that exited by itself (not killed by a signal) said last, for the log.
  std::string Said(const std::string& name) {
    if (roles_->ExitCode(name) >= 128) return "";
    return absl::StrCat(" (", roles_->LastErrorLine(name), ")");
  }

  void OnLine(const std::string& name, const std::string& line) {
    if (absl::StrContains(line, "a peer was lost") || absl::StrContains(line, "in place of a lost worker")) {
      std::printf("  %s: %s\n", name.c_str(), line.c_str());
    }
    absl::MutexLock lock(&mu_);
    if (name == current_.at("worker-0")) {
      uint64_t n = 0;
      if (!ProgressSamples(line, &n)) return;
      progress_.emplace_back(SecondsIn(), n);
      samples_ = n;
      if (!worker1_replaces_) worker1_trains_ = true;
    } else if (name == current_.at("worker-1") && absl::StrContains(line, "in place of a lost worker")) {
      worker1_trains_ = true;
      ++joins_;
    }
  }

  const NetnsCluster& cluster_;
  const std::string job_;
  Roles* const roles_;
  const absl::Time start_;
  absl::Mutex mu_;
  int attempt_ ABSL_GUARDED_BY(mu_) = 0;
  size_t started_ ABSL_GUARDED_BY(mu_) = 0;  // Processes started in all.
  std::map<std::string, std::string> current_ ABSL_GUARDED_BY(mu_);
  uint64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  Progress progress_ ABSL_GUARDED_BY(mu_);
  bool worker1_trains_ ABSL_GUARDED_BY(mu_) = false;
  bool worker1_replaces_ ABSL_GUARDED_BY(mu_) = false;  // Worker 1 was started again alone.
  int joins_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs `job`'s roles on `cluster`'s hosts under a JobSetController, for at most `deadline`;
// `faults` (if set) runs beside it, from the start.
inline ControlledOutcome RunUnderJobSet(const NetnsCluster& cluster, const std::string& job, absl::Duration deadline,
                                        const std::function<void(JobSetController*)>& faults) {
  ControlledOutcome r;
  const absl::Time start = absl::Now();
  {
    Roles roles;
    JobSetController controller(cluster, job, &roles);
    std::thread injector([&] {
      if (faults) faults(&controller);
    });
    controller.Supervise(absl::Now() + deadline, 1000, &r);
    injector.join();
    // The services exit by themselves once worker 0 told them the job is done. One that missed
    // it (its link down then) is stopped when both workers are done, as the JobSet's success
    // deletes its pods (SIGTERM: exit 0); one still running half a minute later is killed and
    // counts as failed.
    const auto await = [&](absl::Duration d) {
      const absl::Time until = absl::Now() + d;
      for (const std::string& name : roles.Names()) {
        while (!roles.Done(name) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(100));
      }
    };
    await(absl::Seconds(15));
    for (const std::string& name : roles.Names()) {
      if (roles.Done(name)) continue;
      std::printf("  controller: %s still runs once the workers are done: SIGTERM\n", name.c_str());
      roles.Signal(name, SIGTERM);
    }
    await(absl::Seconds(30));
    for (const std::string& name : roles.Names()) {
      if (roles.Done(name)) continue;
      roles.Kill(name);
      absl::StrAppend(&r.log, name, ": killed by the test, still running at the end\n");
    }
    roles.Finish(&r);
  }
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  ReadReport(job, &r);
  return r;
}

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_JOBSET_CONTROLLER_H_
