#include "hyrec/dense_worker/blas_threads.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

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

}  // namespace hyrec::dense_worker
