#include "hyrec/common/allocator.h"

#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace hyrec {

void KeepLargeBuffers() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  });
}

}  // namespace hyrec
