#include "hyrec/dense_worker/process_tuning.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace hyrec::dense_worker {

bool SleepIdleBlasThreads() {
  static std::once_flag once;
  static bool applied = false;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) return;  // The user's choice stands.
    // Both are exported by libopenblas (0.3.x); looked up at run time so that another BLAS works.
    auto read_env = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "openblas_read_env"));
    auto shutdown = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
    if (read_env == nullptr || shutdown == nullptr) return;
    if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", /*overwrite=*/0) != 0) return;
    read_env();
    shutdown();  // The pool restarts, with the new timeout, at the next multithreaded product.
    applied = true;
  });
  return applied;
}

bool RetainFreedMemory() {
  static std::once_flag once;
  static bool applied = false;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr ||
        std::getenv("MALLOC_ARENA_MAX") != nullptr ||
        (tunables != nullptr &&
         (std::strstr(tunables, "mmap_threshold") != nullptr || std::strstr(tunables, "trim_threshold") != nullptr ||
          std::strstr(tunables, "arena_max") != nullptr))) {
      return;  // The user's choice stands.
    }
    // 32 MiB: glibc's ceiling for the mmap threshold on 64-bit (half a non-main arena's heap).
    applied = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 &&
              mallopt(M_ARENA_MAX, 1) == 1;
#endif
  });
  return applied;
}

void TuneTrainingProcess() {
  SleepIdleBlasThreads();
  RetainFreedMemory();
}

}  // namespace hyrec::dense_worker
