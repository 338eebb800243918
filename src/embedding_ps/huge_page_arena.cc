#include "src/embedding_ps/huge_page_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace hyrec::embedding_ps {
namespace {

constexpr size_t kHugePage = 2u << 20;
constexpr size_t kMinBlock = 2u << 20;
constexpr size_t kMaxBlock = 64u << 20;

// A 2 MiB-aligned anonymous mapping of `bytes` (a multiple of 2 MiB), advised for huge pages.
char* MapAligned(size_t bytes) {
  const size_t padded = bytes + kHugePage;
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes) munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<char*>(aligned);
}

}  // namespace

HugePageArena::~HugePageArena() {
  for (const Block& block : blocks_) munmap(block.base, block.size);
}

char* HugePageArena::Allocate(size_t bytes) {
  bytes = (bytes + 63) & ~size_t{63};
  std::lock_guard<std::mutex> lock(mu_);
  if (cursor_ == nullptr || static_cast<size_t>(limit_ - cursor_) < bytes) {
    size_t size = blocks_.empty() ? kMinBlock : std::min(kMaxBlock, blocks_.back().size * 2);
    size = std::max(size, (bytes + kHugePage - 1) & ~(kHugePage - 1));
    char* base = MapAligned(size);
    blocks_.push_back({base, size});
    mapped_ += size;
    cursor_ = base;
    limit_ = base + size;
  }
  char* out = cursor_;
  cursor_ += bytes;
  allocated_ += bytes;
  return out;
}

size_t HugePageArena::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

size_t HugePageArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_;
}

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
