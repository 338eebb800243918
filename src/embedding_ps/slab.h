// RowArena and Slab: where a store stripe's rows live.
//
// A store reserves one range of address space (RowArena) and hands it out in chunks, in order,
// to the slabs of all its stripes and tables; pages are committed as rows first touch them, on
// huge pages, so that a TLB entry covers 2 MiB of rows and only the one extent being filled is
// partly empty. A row is named by its handle, its offset from the arena's base in 4-byte units
// (40 bits: 4 TiB), so that finding a row's address takes the arena's base alone: no chunk table
// to read on the way to a row.
//
// A slot is the row's id (8 bytes) followed by its floats (the weights, then the optimizer's
// state), so that the id a lookup checks and the weights it copies share their first cache line.
// A freed slot keeps the next free slot's handle in its id word until it is allocated again.
//
// RowArena is thread-safe; a Slab is guarded by its owning stripe's lock.
#ifndef HYREC_EMBEDDING_PS_SLAB_H_
#define HYREC_EMBEDDING_PS_SLAB_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hyrec::embedding_ps {

using SlotHandle = uint64_t;
inline constexpr SlotHandle kNoSlot = ~uint64_t{0};

class RowArena {
 public:
  static constexpr uint64_t kUnit = 4;  // Bytes per handle step.
  static constexpr uint64_t kMaxBytes = kUnit << 40;

  // Reserves `reserve_bytes` (at most kMaxBytes) of address space; throws std::bad_alloc when
  // the system refuses it.
  explicit RowArena(uint64_t reserve_bytes);
  ~RowArena();
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;

  char* base() const { return base_; }
  // The handle of `bytes` (a multiple of kUnit) newly handed out, or kNoSlot when the reservation
  // is used up.
  SlotHandle Allocate(uint64_t bytes) {
    const uint64_t before = used_.fetch_add(bytes, std::memory_order_relaxed);
    if (before + bytes > reserved_) return kNoSlot;  // Nothing past the reservation is handed out.
    return before / kUnit;
  }
  uint64_t allocated_bytes() const { return std::min(used_.load(std::memory_order_relaxed), reserved_); }

 private:
  char* base_ = nullptr;
  uint64_t reserved_ = 0;
  std::atomic<uint64_t> used_{0};
};

// The slots of one table in one stripe, allocated from the stripe's arena in chunks of
// 2^chunk_shift slots.
class Slab {
 public:
  static constexpr uint32_t kHeaderBytes = sizeof(uint64_t);  // The id.

  Slab(uint32_t slot_bytes, int chunk_shift, uint32_t max_slots)
      : slot_bytes_(slot_bytes), chunk_shift_(chunk_shift), max_slots_(max_slots) {}

  static char* Slot(char* base, SlotHandle handle) { return base + handle * RowArena::kUnit; }
  static uint64_t id(char* base, SlotHandle handle) {
    uint64_t id;
    std::memcpy(&id, Slot(base, handle), sizeof(id));
    return id;
  }
  static float* floats(char* base, SlotHandle handle) {
    return reinterpret_cast<float*>(Slot(base, handle) + kHeaderBytes);
  }

  // The handle of a free slot now holding `id`, or kNoSlot when the slab holds max_slots already
  // or the arena is used up.
  SlotHandle Allocate(RowArena& arena, uint64_t id) {
    SlotHandle handle;
    if (free_head_ != kNoSlot) {
      handle = free_head_;
      free_head_ = Slab::id(arena.base(), handle);
    } else {
      if (live_ >= max_slots_) return kNoSlot;
      if (chunk_left_ == 0) {
        const SlotHandle chunk = arena.Allocate(static_cast<uint64_t>(slot_bytes_) << chunk_shift_);
        if (chunk == kNoSlot) return kNoSlot;
        next_ = chunk;
        chunk_left_ = 1u << chunk_shift_;
        ++chunks_;
      }
      handle = next_;
      next_ += slot_bytes_ / RowArena::kUnit;
      --chunk_left_;
    }
    ++live_;
    std::memcpy(Slot(arena.base(), handle), &id, sizeof(id));
    return handle;
  }

  void Free(char* base, SlotHandle handle) {
    std::memcpy(Slot(base, handle), &free_head_, sizeof(free_head_));
    free_head_ = handle;
    --live_;
  }

  uint64_t bytes() const { return chunks_ * (static_cast<uint64_t>(slot_bytes_) << chunk_shift_); }

 private:
  uint32_t slot_bytes_;
  int chunk_shift_;
  uint32_t max_slots_;
  uint64_t chunks_ = 0;
  uint32_t live_ = 0;        // Slots allocated and not freed.
  uint32_t chunk_left_ = 0;  // Unused slots left in the current chunk.
  SlotHandle next_ = 0;      // The next unused slot of the current chunk.
  SlotHandle free_head_ = kNoSlot;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_SLAB_H_
