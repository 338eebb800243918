// Process-wide settings for a dense step that shares the cores with PS and loader work: OpenBLAS's
// idle threads and glibc's handling of freed memory. hyrec train, hyrec worker and RunTrainJob
// call TuneTrainingProcess(); a program built on the C++ API calls it at the start of main.
#ifndef HYREC_DENSE_WORKER_PROCESS_TUNING_H_
#define HYREC_DENSE_WORKER_PROCESS_TUNING_H_

namespace hyrec::dense_worker {

// Makes OpenBLAS's worker threads sleep as soon as they are idle instead of spinning on
// sched_yield (for OpenBLAS's default spin count) between matrix products. While a spinning
// thread holds a core, the hybrid pipeline's PS and loader threads (at lower priority) hardly run
// there; with the threads asleep they take the cores the dense step leaves idle
// (docs/benchmarks.md has the figures).
//
// Sets OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's minimum) unless the environment already sets it,
// then restarts OpenBLAS's thread pool, which re-reads it at the next product. A no-op when the
// BLAS LibTorch loaded is not OpenBLAS. Call it once, early, while no other thread runs BLAS
// (it calls setenv); later calls do nothing. Returns whether the setting was applied.
bool SleepIdleBlasThreads();

// Makes glibc's malloc keep freed blocks of up to 32 MiB for reuse instead of returning them to
// the kernel: the mmap threshold becomes 32 MiB (glibc's maximum) and the trim threshold 1 GiB.
// A training step allocates and frees the same few-MiB tensors and row buffers every batch; with
// glibc's adaptive defaults some of them are unmapped (or trimmed) when freed and page-faulted in
// again, zero-filled, at the next batch. The cost is that the process keeps its peak heap.
// It also makes every thread allocate from glibc's main arena (M_ARENA_MAX 1): a thread's own
// arena grows in separate heaps, and a heap that empties is unmapped whatever the thresholds say,
// so the lookup and update threads and the training thread would page-fault their buffers in
// again batch after batch. The threads here allocate little, so sharing the arena's lock is
// cheap. docs/benchmarks.md has the figures.
// Leaves malloc alone when the environment already sets any of these (MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_, MALLOC_ARENA_MAX or GLIBC_TUNABLES), and outside glibc. Call it before
// the process starts threads (a thread keeps the arena it has). Once per process; returns whether
// the settings were applied.
bool RetainFreedMemory();

// Both of the above.
void TuneTrainingProcess();

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_PROCESS_TUNING_H_
