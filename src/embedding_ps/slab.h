// RowArena and Slab: where a store stripe's rows live.
//
// Each stripe reserves one range of address space (RowArena) and hands it out in chunks, in
// order, to its tables' slabs; the pages are committed as rows first touch them, and each 2 MiB
// extent becomes one huge page once it is handed out whole, so rows of every table of the stripe
// share huge pages and a stripe's partly filled extent costs no more than its rows. A row is named by its
// handle, its offset from the arena's base in 4-byte units, so that finding a row's address takes
// the arena's base alone: no chunk table to read on the way to a row.
//
// A slot is the row's id (8 bytes) followed by its floats (the weights, then the optimizer's
// state), so that the id a lookup checks and the weights it copies share their first cache line.
// A freed slot keeps the next free slot's handle in its id word until it is allocated again.
//
// Not thread-safe: the owning stripe's lock guards them.
#ifndef HYREC_EMBEDDING_PS_SLAB_H_
#define HYREC_EMBEDDING_PS_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hyrec::embedding_ps {

inline constexpr uint32_t kNoSlot = 0xffffffffu;

class RowArena {
 public:
  static constexpr uint64_t kUnit = 4;  // Bytes per handle step.
  static constexpr uint64_t kMaxBytes = kUnit * 0xffffffffull;

  // Reserves `reserve_bytes` (at most kMaxBytes) of address space; throws std::bad_alloc when
  // the system refuses it.
  explicit RowArena(uint64_t reserve_bytes);
  ~RowArena();
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;

  char* base() const { return base_; }
  // The handle of `bytes` (a multiple of kUnit) newly handed out, or kNoSlot when the reservation
  // is used up.
  uint32_t Allocate(uint64_t bytes) {
    if (used_ + bytes > reserved_) return kNoSlot;
    const uint64_t before = used_;
    used_ += bytes;
    if ((before >> 21) != (used_ >> 21)) CollapseFilled(before);
    return static_cast<uint32_t>(before / kUnit);
  }
  uint64_t allocated_bytes() const { return used_; }

 private:
  // Turns the extents filled since `before` bytes were handed out into huge pages.
  void CollapseFilled(uint64_t before);

  char* base_ = nullptr;
  uint64_t reserved_ = 0;
  uint64_t used_ = 0;
};

// The slots of one table in one stripe, allocated from the stripe's arena in chunks of
// 2^chunk_shift slots.
class Slab {
 public:
  static constexpr uint32_t kHeaderBytes = sizeof(uint64_t);  // The id.

  Slab(uint32_t slot_bytes, int chunk_shift, uint32_t max_slots)
      : slot_bytes_(slot_bytes), chunk_shift_(chunk_shift), max_slots_(max_slots) {}

  static char* Slot(char* base, uint32_t handle) { return base + static_cast<uint64_t>(handle) * RowArena::kUnit; }
  static uint64_t id(char* base, uint32_t handle) {
    uint64_t id;
    std::memcpy(&id, Slot(base, handle), sizeof(id));
    return id;
  }
  static float* floats(char* base, uint32_t handle) {
    return reinterpret_cast<float*>(Slot(base, handle) + kHeaderBytes);
  }

  // The handle of a free slot now holding `id`, or kNoSlot when the slab holds max_slots already
  // or the arena is used up.
  uint32_t Allocate(RowArena& arena, uint64_t id) {
    uint32_t handle;
    if (free_head_ != kNoSlot) {
      handle = free_head_;
      free_head_ = static_cast<uint32_t>(Slab::id(arena.base(), handle));
    } else {
      if (live_ >= max_slots_) return kNoSlot;
      if (chunk_left_ == 0) {
        const uint32_t chunk = arena.Allocate(static_cast<uint64_t>(slot_bytes_) << chunk_shift_);
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

  void Free(char* base, uint32_t handle) {
    const uint64_t next = free_head_;
    std::memcpy(Slot(base, handle), &next, sizeof(next));
    free_head_ = handle;
    --live_;
  }

  uint32_t slot_bytes() const { return slot_bytes_; }
  uint64_t bytes() const { return chunks_ * (static_cast<uint64_t>(slot_bytes_) << chunk_shift_); }

 private:
  uint32_t slot_bytes_;
  int chunk_shift_;
  uint32_t max_slots_;
  uint64_t chunks_ = 0;
  uint32_t live_ = 0;        // Slots allocated and not freed.
  uint32_t next_ = 0;        // The next unused slot of the current chunk.
  uint32_t chunk_left_ = 0;  // Unused slots left in the current chunk.
  uint32_t free_head_ = kNoSlot;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_SLAB_H_
