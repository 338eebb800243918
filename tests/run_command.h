// Runs a command to its end, for tests of the binaries: its exit code, and what it wrote to
// stdout and to stderr, kept apart.
#ifndef HYREC_TESTS_RUN_COMMAND_H_
#define HYREC_TESTS_RUN_COMMAND_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace hyrec::testing {

struct CommandResult {
  int code = -1;    // The exit code; 128 + the signal when one ended it.
  std::string out;  // stdout
  std::string err;  // stderr
  std::string all() const { return out + err; }
};

inline CommandResult RunCommand(const std::vector<std::string>& argv) {
  char err_path[] = "/tmp/hyrec_run_command_XXXXXX";
  const int fd = mkstemp(err_path);
  if (fd >= 0) close(fd);
  std::string command;
  for (const std::string& a : argv) command += "'" + a + "' ";
  command += "2>'" + std::string(err_path) + "'";
  CommandResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) r.out += buffer;
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream err(err_path);
  r.err.assign(std::istreambuf_iterator<char>(err), {});
  std::remove(err_path);
  return r;
}

// The value of `key: value` in a report file (--report), as written; empty when absent.
inline std::string ReportField(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  const std::string prefix = key + ": ";
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, prefix.size(), prefix) == 0) return line.substr(prefix.size());
  }
  return "";
}

// A report's string value without its double quotes.
inline std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_RUN_COMMAND_H_
