// The launcher's process supervisor, behind `hyrec train --processes`: the job's roles as
// processes on this machine (PS shards, the loader, the workers) with real gRPC and Gloo on
// loopback, every one started with the job file and its role and index, so that each runs from
// the same plan as the embedded job does. It watches them, restarts a lost role under a
// RestartPolicy (restart_policy.h), and stops them all at the end.
#ifndef HYREC_SRC_CLI_SUPERVISOR_H_
#define HYREC_SRC_CLI_SUPERVISOR_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/dense_worker/monitor.h"
#include "hyrec/job/job_plan.h"
#include "src/cli/roles.h"

namespace hyrec::cli {

struct ProcessesOptions {
  std::string config_path;             // The job file every role reads.
  std::vector<std::string> overrides;  // Its --set overrides, passed to every role.
  const job::JobPlan* plan = nullptr;  // Its plan (for the counts and timeouts).
  RoleCommands roles;
  // Milliseconds added to every PS round trip by a delaying TCP proxy in front of each PS (half
  // each way); 0: the proxies with no delay; negative: no proxies.
  double ps_latency_ms = -1;
  std::string log_level = "warn";           // Of the child processes.
  dense_worker::MonitorOptions monitor;     // Worker 0's reports are shown through a JobMonitor.
  const std::atomic<bool>* stop = nullptr;  // Set: the workers stop after their current batch.
  // When it becomes true (SIGUSR1, POST /checkpoint), worker 0 is sent SIGUSR1 and it is reset.
  std::atomic<bool>* checkpoint_request = nullptr;
  // A checkpoint directory every role resumes from (--resume=DIR); empty: a fresh start.
  std::string resume;
  // A child whose heartbeat (src/cli/heartbeat.h) is this old is killed and the run fails as
  // transient: a stopped or frozen role. 0: no watchdog.
  absl::Duration watchdog = absl::Seconds(60);
  // Restarts of PS shards, the loader and healing workers in one run. Each waits 1 s, doubling
  // (up to 8 s) with each restart in a row of the same role that had run less than 5 s since it
  // came back, each wait spread by ±20% (src/cli/restart_policy.h): a crash loop backs off, a
  // role lost after a steady run comes back after 1 s.
  int max_restarts = 5;
};

struct ProcessesResult {
  dense_worker::TrainReport report;  // Worker 0's, from its events.
  int exit_code = 0;                 // kExitOk, or the first failed worker's.
};

// Starts every role, relays worker 0's reports, waits for the workers, then stops the loader and
// the PS shards. A stop request is passed on to the workers as SIGINT. Every child's stderr is
// read for its whole life and written to this process's stderr, each line prefixed with the
// child's name.
//
// Supervision: a PS shard or the loader that exits or freezes while the workers run is
// restarted on its port (a shard recovers from its update log, the loader resumes each worker
// where its stream stands), after a backoff, within `max_restarts` a run. A
// worker that fails with invalid input ends the run with its exit code; one that is lost (killed,
// frozen, a transient failure) stops the run, and when the job has a committed checkpoint every
// role restarts from the latest (3 times at most), else the run ends as transient (3).
absl::StatusOr<ProcessesResult> RunProcesses(const ProcessesOptions& options);

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_SUPERVISOR_H_
