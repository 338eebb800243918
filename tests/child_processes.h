// The children of a process, found by their command lines in /proc: how tests of the launcher
// reach the roles it started (to kill or stop one).
#ifndef HYREC_TESTS_CHILD_PROCESSES_H_
#define HYREC_TESTS_CHILD_PROCESSES_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "hyrec/common/process_info.h"

namespace hyrec::testing {

// The pids of `parent`'s children whose command line (arguments joined by spaces) contains
// `needle`.
inline std::vector<pid_t> ChildrenWith(pid_t parent, const std::string& needle) {
  std::vector<pid_t> out;
  for (const ChildProcess& child : ChildProcesses(parent)) {
    if (child.command.find(needle) != std::string::npos) out.push_back(child.pid);
  }
  return out;
}

// The first of them; 0 when there is none.
inline pid_t ChildWith(pid_t parent, const std::string& needle) {
  const std::vector<pid_t> children = ChildrenWith(parent, needle);
  return children.empty() ? 0 : children.front();
}

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_CHILD_PROCESSES_H_
