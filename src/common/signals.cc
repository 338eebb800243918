#include "hyrec/common/signals.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

namespace hyrec {
namespace {

int g_pipe[2] = {-1, -1};

void OnStopSignal(int signal) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  (void)!write(g_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

void InstallStopSignalHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
    struct sigaction action = {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
    // A write to a lost peer's socket (a collective's, a rendezvous's) is an error, not the end
    // of this process.
    signal(SIGPIPE, SIG_IGN);
  });
}

void InstallCheckpointSignalHandler() {
  InstallStopSignalHandlers();
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

int StopSignalFd() { return g_pipe[0]; }

int WaitForStopSignal() {
  InstallStopSignalHandlers();
  for (;;) {
    pollfd fd{g_pipe[0], POLLIN, 0};
    if (poll(&fd, 1, -1) < 0) continue;
    unsigned char byte = 0;
    if (read(g_pipe[0], &byte, 1) == 1) return byte;
  }
}

}  // namespace hyrec
