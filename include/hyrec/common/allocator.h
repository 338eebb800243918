// Memory the RPC path allocates and frees again on every call.
//
// A batch's requests and responses are megabytes each, built and parsed on every call. glibc's
// malloc hands blocks of that size out as fresh mappings and unmaps them when freed, so each
// call faults in and zeroes every page of them again: that dominated the worker's CPU per row
// (docs/benchmarks.md, client_benchmark). KeepLargeBuffers has this process's malloc serve
// blocks up to 32 MiB (glibc's most) from its heap and keep up to 1 GiB of freed memory for
// reuse, so a steady stream of calls reuses the same pages.
//
// The gRPC embedding client and the PS server call it when they start; a process of one's own
// that moves large buffers the same way may too. Idempotent and thread-safe; nothing off glibc.
#ifndef HYREC_COMMON_ALLOCATOR_H_
#define HYREC_COMMON_ALLOCATOR_H_

namespace hyrec {

void KeepLargeBuffers();

}  // namespace hyrec

#endif  // HYREC_COMMON_ALLOCATOR_H_
