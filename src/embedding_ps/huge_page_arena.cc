#include "src/embedding_ps/huge_page_arena.h"

#include "src/embedding_ps/slab.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace hyrec::embedding_ps {
namespace {

constexpr size_t kHugePage = 2u << 20;

// A 2 MiB-aligned anonymous mapping of `bytes` (a multiple of 2 MiB), advised for huge pages.
char* MapAligned(size_t bytes, int flags = 0) {
  const size_t padded = bytes + kHugePage;
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes) munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<char*>(aligned);
}

}  // namespace

RowArena::RowArena(uint64_t reserve_bytes) {
  reserved_ = std::min<uint64_t>(reserve_bytes, kMaxBytes) & ~(kHugePage - 1);
  if (reserved_ == 0) reserved_ = kHugePage;
  base_ = MapAligned(reserved_, MAP_NORESERVE);
}

RowArena::~RowArena() { munmap(base_, reserved_); }

void* AllocateLargeArray(size_t bytes) {
  if (bytes < kHugePage) {
    // Cache-line aligned: the row index reads a bucket as one line.
    void* p = std::aligned_alloc(64, (bytes + 63) & ~size_t{63});
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  return MapAligned((bytes + kHugePage - 1) & ~(kHugePage - 1));
}

void FreeLargeArray(void* pointer, size_t bytes) {
  if (pointer == nullptr) return;
  if (bytes < kHugePage) {
    std::free(pointer);
  } else {
    munmap(pointer, (bytes + kHugePage - 1) & ~(kHugePage - 1));
  }
}

}  // namespace hyrec::embedding_ps
