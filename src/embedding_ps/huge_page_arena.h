// Memory for the store's large arrays on transparent huge pages.
//
// The store's rows and index are spread over gigabytes; with 4 KiB pages nearly every row access
// also misses the TLB. Large arrays here are 2 MiB-aligned anonymous mappings advised
// MADV_HUGEPAGE, so a TLB entry covers 2 MiB. (RowArena, in slab.h, reserves its rows' address
// space the same way.)
#ifndef HYREC_EMBEDDING_PS_HUGE_PAGE_ARENA_H_
#define HYREC_EMBEDDING_PS_HUGE_PAGE_ARENA_H_

#include <cstddef>
#include <cstdint>

namespace hyrec::embedding_ps {

// Zero-filled, 64-byte aligned memory for large arrays (the row index): huge-page-advised
// mappings from 2 MiB up, aligned_alloc below. Free with FreeLargeArray(pointer, bytes).
void* AllocateLargeArray(size_t bytes);
void FreeLargeArray(void* pointer, size_t bytes);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_HUGE_PAGE_ARENA_H_
