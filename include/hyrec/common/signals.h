// Clean shutdown of role processes: block SIGTERM/SIGINT before any thread starts (threads
// inherit the mask, so no thread is interrupted), then wait for one in the main thread.
//
//   sigset_t stop = hyrec::BlockStopSignals();
//   ... start servers ...
//   int signal = hyrec::WaitForStopSignal(stop);
#ifndef HYREC_COMMON_SIGNALS_H_
#define HYREC_COMMON_SIGNALS_H_

#include <pthread.h>
#include <signal.h>

namespace hyrec {

inline sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

inline int WaitForStopSignal(const sigset_t& set) {
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

}  // namespace hyrec

#endif  // HYREC_COMMON_SIGNALS_H_
