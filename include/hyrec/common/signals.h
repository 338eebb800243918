// Stop signals of role processes: SIGINT and SIGTERM are noted by a handler on a pipe (the
// handler only writes one byte, which is async-signal-safe), so whichever thread of the process
// receives one (a gRPC, Gloo or BLAS thread included) the process goes on, and a thread of its own
// choosing waits for it.
//
//   hyrec::InstallStopSignalHandlers();      // early in main
//   ...
//   int signal = hyrec::WaitForStopSignal(); // blocks until SIGINT or SIGTERM
//   std::cout << "signal " << signal << ": stopping\n";
//
// Each signal is delivered once, to one waiter (WaitForStopSignal, or a reader of
// StopSignalFd()). Installing twice is harmless.
#ifndef HYREC_COMMON_SIGNALS_H_
#define HYREC_COMMON_SIGNALS_H_

namespace hyrec {

// Installs the handlers of SIGINT and SIGTERM (SA_RESTART), and ignores SIGPIPE (a write to a
// lost peer is then an error, EPIPE).
void InstallStopSignalHandlers();

// Also notes SIGUSR1 (a checkpoint request) on the same pipe; only roles that take checkpoints
// (hyrec train, hyrec worker) install it.
void InstallCheckpointSignalHandler();

// Blocks until a stop signal arrives and returns its number.
int WaitForStopSignal();

// The pipe's read end: readable when a stop signal is waiting; read one byte (the signal number)
// to take it. -1 before InstallStopSignalHandlers.
int StopSignalFd();

}  // namespace hyrec

#endif  // HYREC_COMMON_SIGNALS_H_
