// OpenBLAS's idle worker threads, tuned for a dense step that shares the cores with PS work.
#ifndef HYREC_DENSE_WORKER_BLAS_THREADS_H_
#define HYREC_DENSE_WORKER_BLAS_THREADS_H_

namespace hyrec::dense_worker {

// Makes OpenBLAS's worker threads sleep as soon as they are idle instead of spinning on
// sched_yield for ~2^28 cycles (their default) between matrix products. While a spinning thread
// holds a core, the hybrid pipeline's PS and loader threads (at lower priority) hardly run there;
// with the threads asleep they take the cores the dense step leaves idle (measured on 2 cores:
// +10-25% samples/s for the embedded default, see docs/benchmarks.md).
//
// Sets OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's minimum) unless the environment already sets it,
// then restarts OpenBLAS's thread pool, which re-reads it at the next product. A no-op when the
// BLAS LibTorch loaded is not OpenBLAS. Call it once, early, while no other thread runs BLAS
// (it calls setenv); later calls do nothing. Returns whether the setting was applied.
bool SleepIdleBlasThreads();

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_BLAS_THREADS_H_
