// Graceful stops on SIGINT and SIGTERM for the training roles: the first signal asks the job to
// stop after its current batch (the summary then says what was trained); a second one ends the
// process at once with kExitInterrupted.
//
//   StopSignals signals([&](int signal) { monitor.Note("stopping after the current batch"); },
//                       [&] { /* kill children */ });
//   options.stop = signals.flag();
//
// It installs the process's stop-signal handlers (common/signals.h) and waits for them on a
// thread of its own; one StopSignals per process at a time. SIGUSR1 sets checkpoint_flag() and
// stops nothing.
#ifndef HYREC_SRC_CLI_STOP_SIGNALS_H_
#define HYREC_SRC_CLI_STOP_SIGNALS_H_

#include <atomic>
#include <functional>
#include <thread>

namespace hyrec::cli {

class StopSignals {
 public:
  // `on_first` runs on the signal thread after the flag is set; `on_second` just before the
  // process exits (e.g. to kill child processes). Either may be empty.
  StopSignals(std::function<void(int signal)> on_first, std::function<void()> on_second);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  const std::atomic<bool>* flag() const { return &stop_; }
  // Set by SIGUSR1 (a checkpoint request); the job resets it once it acts on it.
  std::atomic<bool>* checkpoint_flag() { return &checkpoint_; }
  bool stopped() const { return stop_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> checkpoint_{false};
  int wake_fd_[2] = {-1, -1};  // Written by the destructor to end the thread.
  std::thread thread_;
};

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_STOP_SIGNALS_H_
