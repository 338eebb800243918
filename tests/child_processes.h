// The children of a process, found by their command lines in /proc: how tests of the launcher
// reach the roles it started (to kill or stop one).
#ifndef HYREC_TESTS_CHILD_PROCESSES_H_
#define HYREC_TESTS_CHILD_PROCESSES_H_

#include <sys/types.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace hyrec::testing {

// The pids of `parent`'s children whose command line (arguments joined by spaces) contains
// `needle`.
inline std::vector<pid_t> ChildrenWith(pid_t parent, const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    std::replace(args.begin(), args.end(), '\0', ' ');
    if (args.find(needle) != std::string::npos) out.push_back(static_cast<pid_t>(std::stoi(name)));
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
