// What Linux's /proc says of other processes: a process's children and the CPU time it (or one
// of its threads) has used. How `hyrec plan --calibrate` reads the roles `hyrec train
// --processes` started, and how tests reach them.
#ifndef HYREC_COMMON_PROCESS_INFO_H_
#define HYREC_COMMON_PROCESS_INFO_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hyrec {

struct ChildProcess {
  pid_t pid = 0;
  std::string name;     // The command name (/proc/<pid>/comm, at most 15 characters).
  std::string command;  // The command line, its arguments joined by spaces.
};

// The living children of `parent`, in pid order; empty when it has none (or is gone).
std::vector<ChildProcess> ChildProcesses(pid_t parent);

// User and system CPU time of process `pid`, or of its thread `tid` when tid > 0, in
// milliseconds; NotFound once it is gone.
absl::StatusOr<double> CpuMilliseconds(pid_t pid, pid_t tid = 0);

}  // namespace hyrec

#endif  // HYREC_COMMON_PROCESS_INFO_H_
