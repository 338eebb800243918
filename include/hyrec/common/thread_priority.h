// Per-thread scheduling priority (Linux: nice applies to a thread, not only a process).
#ifndef HYREC_COMMON_THREAD_PRIORITY_H_
#define HYREC_COMMON_THREAD_PRIORITY_H_

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace hyrec {

// Lowers the calling thread's priority by `nice` (0: unchanged). Background work (PS calls,
// batching) then takes the cores when the dense step leaves them idle instead of preempting its
// BLAS threads. Best effort: a refusal leaves the priority as it was.
inline void LowerThisThreadsPriority(int nice) {
  if (nice > 0) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
}

}  // namespace hyrec

#endif  // HYREC_COMMON_THREAD_PRIORITY_H_
