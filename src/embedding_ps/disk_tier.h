// DiskTier: the rows of a PS store that DRAM does not hold, on local disk.
//
// The store evicts a row it still needs into the tier (Put) and reads it back, removing it, when
// a lookup or an update misses in DRAM (Take). The tier is a cache's lower level, not a durable
// copy: it is created empty with its store, and what makes its rows durable is what makes DRAM's
// (checkpoints, the update log), so its file is truncated when opened and removed when closed.
//
// The file is an array of 4 KiB pages read and written with O_DIRECT (the page cache would hold
// the rows in DRAM again). Each page holds records of one table:
//   u32 CRC-32C of the page's bytes after it, u16 table, u16 records, u64 the page's write number,
//   then records of 16 + the table's payload rounded up to 8 bytes: u64 id, u64 score, payload.
// A page is written once, when the table's open page (in memory) fills, and read whole; its
// checksum is checked on every read, and a mismatch is DataLoss naming the file, page and offset.
// An in-memory index maps each row to its (page, record). A row taken or erased leaves a hole in
// its page; a page whose rows are all gone is free again, and when no page is free the cleaner
// moves the live rows of the emptiest of a few sampled pages into the open pages and frees it.
// An open page's rows are found in memory until it is written; a page number is given to it only
// then. The tier refuses a Put (ResourceExhausted, nothing written) that would need more than 90%
// of its pages for its live rows packed tight, so that cleaning always finds holes, or that
// needs a page while HoldPages keeps the free ones.
//
// Take batches its page reads through io_uring, `queue_depth` in flight (one at a time with pread
// where the build found no liburing).
//
// Thread safety: every method is safe for concurrent use; one mutex serializes them, held across
// a Take's reads. ReadAhead reads pages without it, so that a caller can read a request's pages
// while holding no lock of its own, and then Take the rows under its locks from those pages: a
// page read ahead is used only when it was not rewritten since (its write number is the page's
// latest) and passes its checksum; otherwise Take reads it again.
//
// Checkpoints: a snapshot taken while the store is frozen (FrozenStore) reads the tier's pages
// from a forked child while the parent keeps training. Between HoldPages and ReleasePages no page
// is reused (pages that become free wait), so the child reads every page as it was at the fork.
#ifndef HYREC_SRC_EMBEDDING_PS_DISK_TIER_H_
#define HYREC_SRC_EMBEDDING_PS_DISK_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace hyrec::embedding_ps {

struct DiskTierOptions {
  std::string path;             // The tier's file: created (with its directory), or truncated.
  uint64_t capacity_bytes = 0;  // > 0: the file's size bound; at least one page a table, plus one.
  int queue_depth = 32;         // Page reads a Take keeps in flight, 1 to 4096.
};

struct DiskTierStats {
  uint64_t rows = 0;        // Rows held.
  double fill = 0;          // Pages its live rows need packed tight, over the 90% it allows.
  uint64_t pages = 0;       // Pages of the file.
  uint64_t used_pages = 0;  // Pages holding a live row, or open.
  uint64_t puts = 0;        // Rows written.
  uint64_t takes = 0;       // Rows read back.
  uint64_t page_reads = 0;  // For takes, cleaning and snapshots.
  uint64_t page_writes = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t cleaned_pages = 0;  // Pages the cleaner freed by moving their rows.
  uint64_t full_refusals = 0;  // Puts refused: the tier was full.
  uint64_t checksum_failures = 0;
  uint64_t index_bytes = 0;  // DRAM the index of rows and the pages' state (kPageStateBytes each) take.
};

class DiskTier {
 public:
  static constexpr uint32_t kPageBytes = 4096;
  static constexpr uint32_t kPageHeaderBytes = 16;
  static constexpr double kMostFill = 0.9;  // Of the pages' records a Put may fill.
  // DRAM a page of the file takes beside the index of rows: its live rows, its table and its
  // latest write number, for every page of capacity_bytes.
  static constexpr uint64_t kPageStateBytes = 2 * sizeof(uint16_t) + sizeof(uint64_t);
  // Bytes of a record of a row of `payload_bytes`, and how many a page holds.
  static uint32_t RecordBytes(uint32_t payload_bytes) { return 16 + ((payload_bytes + 7) & ~7u); }
  static uint32_t RecordsPerPage(uint32_t payload_bytes) {
    const uint32_t n = (kPageBytes - kPageHeaderBytes) / RecordBytes(payload_bytes);
    return n < 255 ? n : 255;
  }
  // The index's bytes for `rows` rows of one table (an absl flat_hash_map of id to location:
  // capacity 2^k - 1, grown past 7/8 full, 17 bytes a slot).
  static uint64_t IndexBytes(uint64_t rows);

  // `payload_bytes[t]`: the bytes of one row of table t (its weights and state as the store's
  // slot holds them), at most kPageBytes - kPageHeaderBytes - 16. InvalidArgument for a bad
  // option; the errno's status when the file cannot be opened for direct I/O.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options,
                                                        std::vector<uint32_t> payload_bytes);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Holds (table, id)'s row, replacing one it held. ResourceExhausted, naming the file and its
  // capacity, when the tier is full; an I/O error's status when a page cannot be written or
  // cleaned. Either way nothing of the row is held and nothing else is lost.
  absl::Status Put(int table, uint64_t id, uint64_t score, const char* payload);

  // Whether the tier holds (table, id).
  bool Contains(int table, uint64_t id) const;
  // How many of `ids` the tier holds.
  size_t CountHeld(int table, absl::Span<const uint64_t> ids) const;

  // Reads and removes the rows of `ids` the tier holds, calling found(position in ids, score,
  // payload) once for each (for the first position of an id given more than once). A page whose checksum fails is
  // DataLoss naming the file, page and offset; its rows stay held (and fail again), the others are taken.
  absl::Status Take(int table, absl::Span<const uint64_t> ids,
                    const std::function<void(size_t, uint64_t, const char*)>& found);

  // Take for several tables at once, their pages read together: found(call, position in its
  // ids, score, payload).
  struct TakeCall {
    int table = 0;
    absl::Span<const uint64_t> ids;
  };
  using ManyFoundFn = std::function<void(size_t, size_t, uint64_t, const char*)>;
  // Pages read by ReadAhead, for a later TakeMany; reusable.
  class PagesRead;
  // `ahead`, when given, holds pages ReadAhead read: TakeMany uses those still current.
  absl::Status TakeMany(absl::Span<const TakeCall> calls, const ManyFoundFn& found, const PagesRead* ahead = nullptr);
  // Reads the pages that hold the rows of `calls` now into `ahead` (replacing what it held),
  // holding the tier's lock only to find them. Takes nothing; an I/O error's status.
  absl::Status ReadAhead(absl::Span<const TakeCall> calls, PagesRead* ahead);

  // Forgets (table, id)'s row; whether it was held.
  bool Erase(int table, uint64_t id);

  // Whether `rows` more rows of `table` would fit (as Put judges it); no is counted as a refusal.
  bool HasRoomFor(int table, uint64_t rows) const;

  // Calls fn(id, score, payload) for every row of `table`, page by page.
  using RowFn = std::function<absl::Status(uint64_t, uint64_t, const char*)>;
  absl::Status ForEach(int table, const RowFn& fn) const;
  // ForEach without taking the tier's lock: for a child forked while the lock was held (the
  // store's frozen cut), where no other thread exists and the parent holds the pages.
  absl::Status ForEachInForkedChild(int table, const RowFn& fn) const ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Holds the tier's lock for a fork (the child must not inherit it mid-change).
  void LockForFork() ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_) { mu_.Lock(); }
  void UnlockAfterFork() ABSL_UNLOCK_FUNCTION(mu_) { mu_.Unlock(); }

  // Pages that become free are not reused until ReleasePages (see the file comment).
  void HoldPages();
  void ReleasePages();

  uint64_t rows(int table) const;
  DiskTierStats Stats() const;
  const std::string& path() const { return options_.path; }

 private:
  struct Table;
  struct Reader;
  struct PageFree {
    void operator()(char* p) const;
  };
  using PageBuffer = std::unique_ptr<char, PageFree>;  // Page-aligned, for O_DIRECT.
  static PageBuffer NewPages(size_t pages);
  DiskTier(DiskTierOptions options, int fd, std::vector<uint32_t> payload_bytes);

  // Writes a row into its table's open page, which has room.
  void AppendLocked(int table, uint64_t id, uint64_t score, const char* payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t LiveRowsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> FreePageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CleanOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked(int table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetLocked(uint64_t location) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ForEachLocked(int table, const RowFn& fn, bool forked_child) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pages the live rows (and `extra` more of table `extra_table`) need packed tight, over
  // the 90% of the pages a Put may fill.
  double FillLocked(int extra_table, uint64_t extra) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads a page into `buf` (pread); ReadPage also counts and checks it.
  absl::Status PreadRaw(uint32_t page, char* buf) const;
  absl::Status ReadPage(uint32_t page, char* buf) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `pages` page reads to stats_.
  void CountPageReadsLocked(uint64_t pages) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckPage(uint32_t page, const char* buf) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a page's bytes pass its checksum and name a table and a record count it can have.
  bool PageIntact(const char* buf) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads `pages` with up to queue_depth in flight, calling done(i, buf) for pages[i] in order
  // of completion; `forked_child`: with a reader of its own.
  absl::Status ReadPages(absl::Span<const uint32_t> pages, const std::function<absl::Status(size_t, const char*)>& done,
                         bool forked_child = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Takes the rows of `wanted` ((page, record, call, position), sorted) from `buf`, page
  // `page`'s bytes, which passed CheckPage.
  void TakeFromPageLocked(absl::Span<const TakeCall> calls, const ManyFoundFn& found, uint32_t page, const char* buf,
                          absl::Span<const std::tuple<uint32_t, uint32_t, uint32_t, size_t>> wanted,
                          absl::Status* failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReadPages for any caller: pages[i] goes to into + i * kPageBytes when `into` is given (else
  // to a buffer of the reader's); adds the pages read to *reads, and counts nothing in stats_.
  // The reader is read_mu_'s (taken after mu_ where both are held).
  absl::Status ReadPagesWithReader(absl::Span<const uint32_t> pages, char* into,
                                   const std::function<absl::Status(size_t, const char*)>& done, bool forked_child,
                                   uint64_t* reads) const;

  const DiskTierOptions options_;
  const int fd_;
  const uint32_t num_pages_;
  std::vector<Table> tables_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex mu_;
  std::vector<uint16_t> live_ ABSL_GUARDED_BY(mu_);        // Per page: its live rows.
  std::vector<uint16_t> page_table_ ABSL_GUARDED_BY(mu_);  // Per page: its table.
  std::vector<uint64_t> page_write_ ABSL_GUARDED_BY(mu_);  // Per page: its latest write number.
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> held_free_ ABSL_GUARDED_BY(mu_);  // Freed while pages are held.
  PageBuffer spare_ ABSL_GUARDED_BY(mu_);                 // A zeroed page buffer for the next open page.
  mutable absl::Mutex read_mu_ ABSL_ACQUIRED_AFTER(mu_);
  mutable std::unique_ptr<Reader> reader_ ABSL_GUARDED_BY(read_mu_);  // Set up at the first batched read.
  uint32_t never_used_ ABSL_GUARDED_BY(mu_) = 0;                      // Pages at or above it were never used.
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_write_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t clean_draw_ ABSL_GUARDED_BY(mu_) = 0;
  mutable DiskTierStats stats_ ABSL_GUARDED_BY(mu_);
};

class DiskTier::PagesRead {
 public:
  PagesRead() = default;
  PagesRead(const PagesRead&) = delete;
  PagesRead& operator=(const PagesRead&) = delete;

  size_t size() const { return pages_.size(); }  // Pages read by the last ReadAhead.
  size_t capacity() const { return capacity_; }  // Pages its buffers hold room for.

 private:
  friend class DiskTier;
  // The bytes read of `page`, or null when it was not read.
  const char* Find(uint32_t page) const;

  std::vector<uint32_t> pages_;  // Sorted.
  PageBuffer bufs_;              // pages_[i]'s bytes at i * kPageBytes.
  size_t capacity_ = 0;          // Pages bufs_ holds room for.
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_SRC_EMBEDDING_PS_DISK_TIER_H_
