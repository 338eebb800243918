// The launcher's stdout and stderr, detached from whoever reads them: `hyrec train` writes its
// progress, its summary and its roles' log lines through a bounded queue that a thread of its own
// writes to the file descriptors. A reader that stops reading (a stopped `| tee`, Ctrl-S on a
// terminal) then blocks only that thread: training, the watchdog and SIGINT/SIGTERM go on, and
// what does not fit the queue is dropped and counted instead of waited for.
//
//   DetachedOutput::Install();  // std::cout and std::cerr now go through the queues
//   ... run ...
//   DetachedOutput::Finish(absl::Seconds(2));  // what is queued, within 2 s; says what was dropped
#ifndef HYREC_SRC_CLI_DETACHED_OUTPUT_H_
#define HYREC_SRC_CLI_DETACHED_OUTPUT_H_

#include <cstdint>

#include "absl/time/time.h"

namespace hyrec::cli {

class DetachedOutput {
 public:
  // Routes std::cout (fd 1) and std::cerr (fd 2) through queues of at most `queue_bytes` each.
  // Once per process; the queues and their threads live until the process ends.
  static void Install(uint64_t queue_bytes = 1 << 20);
  // Waits up to `wait` for the queues to drain, then, when lines were dropped or are still
  // unwritten, says how many on stderr (queued like the rest). Safe to call without Install.
  static void Finish(absl::Duration wait);
  // Lines dropped so far (both streams), because their queue was full.
  static uint64_t dropped_lines();
};

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_DETACHED_OUTPUT_H_
