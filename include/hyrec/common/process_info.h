// What Linux's /proc says of processes: a process's children, the CPU time it (or one of its
// threads) has used, and the fields of its status (memory, threads, signals). How `hyrec plan
// --calibrate` reads the roles `hyrec train --processes` started, and how tests and benchmarks
// reach them; the one place hyrec reads /proc.
#ifndef HYREC_COMMON_PROCESS_INFO_H_
#define HYREC_COMMON_PROCESS_INFO_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// The value of `field` in /proc/<pid>/status ("Threads", "SigCgt"), without the name and the
// surrounding blanks; NotFound when the process is gone or has no such field.
absl::StatusOr<std::string> ProcessStatusField(pid_t pid, absl::string_view field);
// A memory field of it ("VmRSS": resident now, "VmHWM": the peak), in bytes.
absl::StatusOr<uint64_t> ProcessStatusBytes(pid_t pid, absl::string_view field);

}  // namespace hyrec

#endif  // HYREC_COMMON_PROCESS_INFO_H_
