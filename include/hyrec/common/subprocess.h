// Subprocess: a child process with its stdout piped back, for launching hyrec roles (PS shards,
// loaders, workers) as real processes from the launcher, the demo and the integration tests.
//
//   HYREC_ASSIGN_OR_RETURN(auto ps, Subprocess::Spawn({"build/hyrec-ps", "--port=0", "--tables=user:16"}));
//   HYREC_ASSIGN_OR_RETURN(std::string line, ps->ReadLine(absl::Seconds(10)));
//   ps->Signal(SIGTERM);
//   HYREC_ASSIGN_OR_RETURN(int exit_code, ps->Wait(absl::Seconds(5)));
//
// The child's stderr is inherited, or piped back with SpawnOptions::capture_stderr. The
// destructor SIGKILLs and reaps a child still running, so a failing test never leaves processes
// behind. Not thread-safe, except that one thread may read stdout lines, another stderr lines,
// while a third signals and waits.
#ifndef HYREC_COMMON_SUBPROCESS_H_
#define HYREC_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hyrec {

struct SpawnOptions {
  // The child leads a process group of its own, so that a terminal's Ctrl-C reaches only the
  // parent, which decides how its children stop.
  bool new_process_group = false;
  // The child's stderr is piped back too (ReadErrorLine), for a launcher that logs each child's
  // output under its name for the child's whole life; else it is inherited.
  bool capture_stderr = false;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with the given arguments. The child dies with its parent (SIGKILL).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv,
                                                           const SpawnOptions& options = {});

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // The next line the child writes to stdout, without the newline. DEADLINE_EXCEEDED after
  // `timeout`; OUT_OF_RANGE when the child closed stdout (exited) first.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // The same for stderr, when it was captured (FAILED_PRECONDITION otherwise).
  absl::StatusOr<std::string> ReadErrorLine(absl::Duration timeout);

  void Signal(int signal);

  // Waits for the child to exit and returns its exit code (128 + signal when killed).
  // DEADLINE_EXCEEDED when it is still running after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  bool running() const { return running_; }
  // After Wait returned: the signal that ended the child, 0 when it exited (an exit code of
  // 128 + N is then its own, as hyrec's 130 after SIGINT or SIGTERM).
  int term_signal() const { return term_signal_; }

 private:
  Subprocess(pid_t pid, int stdout_fd, int stderr_fd) : pid_(pid), stdout_fd_(stdout_fd), stderr_fd_(stderr_fd) {}

  pid_t pid_;
  int stdout_fd_;
  int stderr_fd_;  // -1: inherited.
  bool running_ = true;
  int exit_code_ = -1;
  int term_signal_ = 0;
  std::string buffer_;
  std::string error_buffer_;
};

// A loopback TCP port that was free a moment ago (for a rendezvous that must be told its port
// in advance, such as c10d's TCPStore; servers that can bind port 0 should do that instead).
int PickFreeLoopbackPort();

// The path of the running executable, and its folder (where the hyrec-<role> binaries live).
std::string ExecutablePath();
std::string ExecutableDirectory();

// Reads lines until one contains "listening on HOST:PORT" and returns PORT.
absl::StatusOr<int> WaitForListeningPort(Subprocess& process, absl::Duration timeout);

}  // namespace hyrec

#endif  // HYREC_COMMON_SUBPROCESS_H_
