// HugePageArena: bump allocation of row chunks from large blocks backed by transparent huge pages.
//
// The store's rows are spread over gigabytes; with 4 KiB pages nearly every row access also
// misses the TLB. Blocks here are 2 MiB-aligned anonymous mappings advised MADV_HUGEPAGE, so a TLB
// entry covers 2 MiB of rows. Memory is only returned when the arena is destroyed (chunks are
// never freed individually: evicted slots are reused in place). Blocks grow geometrically from
// 2 MiB to 64 MiB, so small stores stay small. Thread-safe.
#ifndef HYREC_EMBEDDING_PS_HUGE_PAGE_ARENA_H_
#define HYREC_EMBEDDING_PS_HUGE_PAGE_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace hyrec::embedding_ps {

class HugePageArena {
 public:
  HugePageArena() = default;
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  // Returns `bytes` of zero-filled memory aligned to 64 bytes; throws std::bad_alloc when the
  // system has no more memory.
  char* Allocate(size_t bytes);

  // Bytes handed out, and bytes mapped (handed out plus the unused tail of the current block).
  size_t allocated_bytes() const;
  size_t mapped_bytes() const;

 private:
  struct Block {
    char* base;
    size_t size;
  };
  mutable std::mutex mu_;
  std::vector<Block> blocks_;
  char* cursor_ = nullptr;
  char* limit_ = nullptr;
  size_t allocated_ = 0;
  size_t mapped_ = 0;
};

// Zero-filled, 64-byte aligned memory for large arrays (the row index): huge-page-advised
// mappings from 2 MiB up, aligned_alloc below. Free with FreeLargeArray(pointer, bytes).
void* AllocateLargeArray(size_t bytes);
void FreeLargeArray(void* pointer, size_t bytes);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_HUGE_PAGE_ARENA_H_
