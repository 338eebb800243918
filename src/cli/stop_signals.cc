#include "src/cli/stop_signals.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>

#include "hyrec/common/exit_codes.h"
#include "hyrec/common/signals.h"

namespace hyrec::cli {

StopSignals::StopSignals(std::function<void(int)> on_first, std::function<void()> on_second) {
  InstallCheckpointSignalHandler();
  if (pipe2(wake_fd_, O_CLOEXEC) != 0) wake_fd_[0] = wake_fd_[1] = -1;
  thread_ = std::thread([this, on_first = std::move(on_first), on_second = std::move(on_second)] {
    int received = 0;
    for (;;) {
      pollfd fds[2] = {{StopSignalFd(), POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) continue;
      if (fds[1].revents != 0) return;
      unsigned char signal = 0;
      if (read(StopSignalFd(), &signal, 1) != 1) continue;
      if (signal == SIGUSR1) {
        checkpoint_.store(true);
        continue;
      }
      if (++received == 1) {
        stop_.store(true);
        if (on_first) on_first(signal);
        continue;
      }
      if (on_second) on_second();
      _exit(kExitInterrupted);
    }
  });
}

StopSignals::~StopSignals() {
  if (wake_fd_[1] >= 0) {
    const char byte = 1;
    (void)!write(wake_fd_[1], &byte, 1);
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_[0] >= 0) close(wake_fd_[0]);
  if (wake_fd_[1] >= 0) close(wake_fd_[1]);
}

}  // namespace hyrec::cli
