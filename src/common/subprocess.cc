#include "hyrec/common/subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hyrec {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                              const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn needs a program");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  int error_fds[2] = {-1, -1};
  if (options.capture_stderr && pipe2(error_fds, O_CLOEXEC) != 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> args_copy = argv;
  std::vector<char*> args;
  for (std::string& a : args_copy) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {pipe_fds[0], pipe_fds[1], error_fds[0], error_fds[1]}) {
      if (fd >= 0) close(fd);
    }
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (options.new_process_group) setpgid(0, 0);
    dup2(pipe_fds[1], STDOUT_FILENO);
    if (error_fds[1] >= 0) dup2(error_fds[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    const char message[] = "Subprocess: exec failed\n";
    (void)!write(STDERR_FILENO, message, sizeof(message) - 1);
    _exit(127);
  }
  close(pipe_fds[1]);
  if (error_fds[1] >= 0) close(error_fds[1]);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, pipe_fds[0], error_fds[0]));
}

Subprocess::~Subprocess() {
  if (running_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  close(stdout_fd_);
  if (stderr_fd_ >= 0) close(stderr_fd_);
}

namespace {

// The next line of `fd` (without its newline), buffering what follows it in `buffer`.
absl::StatusOr<std::string> ReadLineFrom(int fd, std::string* buffer, pid_t pid, const char* stream,
                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const size_t newline = buffer->find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer->substr(0, newline);
      buffer->erase(0, newline + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid, " wrote no line to ", stream, " within ", absl::FormatDuration(timeout)));
    }
    pollfd ready_fd{fd, POLLIN, 0};
    const int ready = poll(&ready_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n == 0) return absl::OutOfRangeError(absl::StrCat("process ", pid, " closed ", stream));
    if (n < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    if (n > 0) buffer->append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  return ReadLineFrom(stdout_fd_, &buffer_, pid_, "stdout", timeout);
}

absl::StatusOr<std::string> Subprocess::ReadErrorLine(absl::Duration timeout) {
  if (stderr_fd_ < 0) return absl::FailedPreconditionError("the child's stderr was not captured");
  return ReadLineFrom(stderr_fd_, &error_buffer_, pid_, "stderr", timeout);
}

void Subprocess::Signal(int signal) {
  if (running_) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (!running_) return exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      running_ = false;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      term_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      return exit_code_;
    }
    if (r < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

int PickFreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string ExecutablePath() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

std::string ExecutableDirectory() {
  const std::string path = ExecutablePath();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

absl::StatusOr<int> WaitForListeningPort(Subprocess& process, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::string> line = process.ReadLine(deadline - absl::Now());
    if (!line.ok()) return line.status();
    const size_t at = line->find("listening on ");
    if (at == std::string::npos) continue;
    const size_t colon = line->rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(line->substr(colon + 1), &port)) {
      return absl::InternalError(absl::StrCat("cannot read a port from '", *line, "'"));
    }
    return port;
  }
}

}  // namespace hyrec
