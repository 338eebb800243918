// Per-thread scheduling priority (Linux: nice and the scheduling policy apply to a thread, not only
// a process).
#ifndef HYREC_COMMON_THREAD_PRIORITY_H_
#define HYREC_COMMON_THREAD_PRIORITY_H_

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace hyrec {

// A `nice` past the lowest priority (19): the thread runs under SCHED_IDLE, only on a core that
// no other thread of the machine wants.
inline constexpr int kIdleNice = 20;

// Lowers the calling thread's priority by `nice` (0: unchanged), or, for kIdleNice and above, puts
// it under SCHED_IDLE (nice 19 where that is refused). Background work (PS calls, batching) then
// takes the cores when the dense step leaves them idle instead of preempting its BLAS threads:
// under SCHED_IDLE a waking dense thread preempts it at once, where a nice-10 thread still holds
// its core for a share of each scheduling period (docs/benchmarks.md has the figures). A thread
// waiting for that work blocks, which lets it run. The price is on a machine whose other
// processes keep every core busy: the background work then gets almost no CPU, and the pipeline
// waiting for it slows far more than its fair share; plain nice 19 is little better there.
// Best effort: a refusal leaves the priority as it was.
inline void LowerThisThreadsPriority(int nice) {
  if (nice >= kIdleNice) {
    sched_param param{};
    if (sched_setscheduler(0, SCHED_IDLE, &param) == 0) return;  // 0: the calling thread.
    nice = 19;
  }
  if (nice > 0) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
}

}  // namespace hyrec

#endif  // HYREC_COMMON_THREAD_PRIORITY_H_
