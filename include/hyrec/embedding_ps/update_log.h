// UpdateLog: a PS shard's write-ahead log of the updates it applies between checkpoints, so that
// a shard that crashes recovers every update it acknowledged (docs/architecture.md, "Failure
// model").
//
//   UpdateLogOptions options;
//   options.dir = "ckpt/update-log/ps-1";
//   HYREC_ASSIGN_OR_RETURN(auto log, UpdateLog::Open(options));
//   HYREC_ASSIGN_OR_RETURN(LogRecovery start, log->FindRecovery(committed));  // after a crash
//   ... restore start.checkpoint (when not empty), then:
//   HYREC_RETURN_IF_ERROR(log->Replay(start.segment, [&](const LoggedUpdate& u) { return Apply(u); }, &stats));
//   HYREC_RETURN_IF_ERROR(log->StartWriting());
//   HYREC_RETURN_IF_ERROR(log->Append(update, [&] { Apply(update); }));  // durable on return
//
// Ownership: one process owns a shard's log. Open locks the directory's LOCK file (which says
// which process holds it) before it reads or writes anything there, and holds it until the log is
// destroyed or the process ends (a killed shard releases it at once, so its --recover finds it
// free); a second Open of the same directory, from this or another process, fails. Open then
// raises the directory's epoch (its EPOCH file), and every write, rotation and deletion first
// checks that the epoch is still its own: where locks do not reach (two hosts sharing a volume
// that does not carry flock), an owner that was replaced while it was frozen or cut off stops at
// its next write (on_fenced), rather than appending to a log that another process now owns.
// Reads are fenced by the epoch's lease (hyrec/common/ownership.h): an owner answers from its
// rows only while it found the epoch its own within `ownership_lease` (CheckLease), and a new
// owner answers only `ownership_lease` after it raised the epoch (UntilServeable).
//
// Layout: the directory holds segments "log-<20 digits>.wal", numbered from 1. Each begins with a
// header (magic "HYRECWAL", version, its number, what it starts from, the log's lineage, the index
// of its first record and the size of the segment before it, a CRC-32C) and holds records, each
// numbered in the log and naming the first record of the group it was written in, the payload
// holding one or more updates (docs/checkpoint-format.md, "Update log segments"). A segment
// starts from one of: nothing (the shard's first, over an empty store), a checkpoint (the cut
// whose snapshot was taken when it was opened: its updates are the ones after that snapshot), or
// the segment before it (a segment opened after a restart or a rotation by size).
//
// Group commit (as LevelDB's writers): concurrent Appends queue; while no one writes, the oldest
// waiting one leads (only it wakes): it writes every queued record in one write and, with sync
// kEveryGroup, one fdatasync, and wakes the writers of that group. An Append
// returns only once its record is written (and synced, with kEveryGroup), so a caller that
// acknowledges after Append never acknowledges an update a crash can lose. A failed write or
// sync fails every Append of its group and every later one; the log must be reopened. With
// kEveryGroup the segments are Env::NewLogFile's files (direct I/O), so a segment of a crashed
// shard may end in fewer than kLogFileBlock zeros: padding, not a record.
//
// A record that is not whole at the end of the last segment, with no whole record of a later
// group after it, is a torn tail (a crash while its group was written, whose Appends never
// returned): replay stops there and counts the bytes, and StartWriting cuts it off before a new
// segment follows, so a shard that crashes again later still replays that segment whole. Any
// other damage, and a segment that does not continue the one before it (missing, cut, renamed,
// another log's), is DATA_LOSS naming the segment (and the record and offset). All file access
// goes through `env`. Thread-safe.
#ifndef HYREC_EMBEDDING_PS_UPDATE_LOG_H_
#define HYREC_EMBEDDING_PS_UPDATE_LOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hyrec/common/enum_names.h"
#include "hyrec/common/env.h"
#include "hyrec/common/ownership.h"

namespace hyrec::embedding_ps {

enum class LogSync {
  kEveryGroup,  // fdatasync before any Append of a group returns: nothing acknowledged is lost.
  kInterval,    // fdatasync when sync_interval has passed since the last: a power loss (not a
                // process crash) loses up to that interval of acknowledged updates.
  kOff,         // never: the kernel writes back when it likes; a process crash loses nothing
                // written, a power loss what the kernel had not written.
};

inline constexpr EnumName<LogSync> kLogSyncNames[] = {
    {LogSync::kEveryGroup, "every_group"}, {LogSync::kInterval, "interval"}, {LogSync::kOff, "off"}};
const char* LogSyncName(LogSync sync);

struct UpdateLogOptions {
  std::string dir;  // The shard's own directory (created when missing). Required.
  LogSync sync = LogSync::kEveryGroup;
  absl::Duration sync_interval = absl::Milliseconds(100);  // With kInterval.
  uint64_t segment_bytes = 64 << 20;                       // A new segment once the current one passes this.
  size_t max_group_bytes = 4 << 20;  // One write carries at most this much (and at least one record).
  // With kEveryGroup, a leader alone in the queue waits this long for others to share its sync.
  absl::Duration group_linger = absl::Microseconds(200);
  Env* env = nullptr;  // nullptr: Env::Default().
  // Open takes the directory's LOCK file for the log's lifetime; while another process holds it
  // (a second PS started for a shard that serves), Open retries for this long, then refuses.
  absl::Duration lock_wait = absl::Seconds(5);
  // Reads only (`hyrec checkpoint verify`): takes no lock and creates nothing; every write and
  // deletion refuses.
  bool read_only = false;
  // Called once (with the log's lock held; it must not call the log) when the log finds that
  // another process raised the directory's epoch: it owns the shard now. Every later write
  // fails. Empty: only the writes fail.
  std::function<void(const absl::Status&)> on_fenced;
  // See "Reads are fenced by a lease" above. Longer: fewer reads of EPOCH (one a lease while the
  // shard takes no writes), and a longer wait for a new owner before it serves.
  absl::Duration ownership_lease = absl::Seconds(1);
};

// One logged Update, as the request carried it (the gradients in their wire precision). Its
// bytes are views: of the caller's request while Append runs, of the segment being read while
// Replay's `apply` runs.
struct LoggedUpdate {
  absl::string_view table;
  uint32_t worker_id = 0;
  uint64_t sequence = 0;
  uint32_t precision = 0;   // proto::Precision
  absl::string_view ids;    // little-endian uint64s
  absl::string_view grads;  // little-endian values of `precision`
};

// Where a recovery starts: restore `checkpoint` (empty: start from an empty store), then replay
// the segments from `segment` on.
struct LogRecovery {
  std::string checkpoint;
  uint64_t segment = 0;
};

struct ReplayStats {
  uint64_t records = 0;
  uint64_t updates = 0;  // In those records.
  uint64_t segments = 0;
  uint64_t torn_bytes = 0;  // Dropped from the end of the last segment.
  uint64_t refused = 0;     // Records the store refused again (ReplayInto).
};

class UpdateLog {
 public:
  static absl::StatusOr<std::unique_ptr<UpdateLog>> Open(const UpdateLogOptions& options);
  ~UpdateLog();
  UpdateLog(const UpdateLog&) = delete;
  UpdateLog& operator=(const UpdateLog&) = delete;

  // A random id the log keeps across restarts (recoveries) and a Reset renews: a shard that
  // recovered from its log has the lineage it had before.
  uint64_t lineage() const;
  const std::string& dir() const { return options_.dir; }
  // Bytes in the segments since the newest one that starts from a checkpoint (or from nothing):
  // what a recovery would replay once that checkpoint commits.
  uint64_t bytes_since_cut() const { return bytes_since_cut_.load(std::memory_order_relaxed); }

  // The latest start this log can recover from: the newest segment that starts from a checkpoint
  // `committed` says is usable (committed and intact), else the first segment when it starts from
  // nothing. DATA_LOSS when there is none (the checkpoints it starts from are gone).
  absl::StatusOr<LogRecovery> FindRecovery(const std::function<bool(const std::string&)>& committed) const;

  // Reads the records of the segments from `first` on, in order, calling `apply` on each update of
  // each; stops at the first error `apply` returns.
  absl::Status Replay(uint64_t first, const std::function<absl::Status(const LoggedUpdate&)>& apply,
                      ReplayStats* stats) const;

  // Deletes every segment and starts segment 1 over `checkpoint` (empty: an empty store), with a
  // new lineage: for a shard that starts fresh, or from a checkpoint the job resumes from.
  absl::Status Reset(const std::string& checkpoint);
  // Opens a new segment after the existing ones (that continues them), to write after a replay.
  // First cuts the last segment after its last whole record (a torn tail, padding) and syncs it.
  absl::Status StartWriting();

  // Appends one record of `updates` (at least one: the tables of one UpdateTables call); returns
  // once it is written and synced as options.sync says. A record is replayed whole or not at all.
  // `meanwhile` (may be empty) runs after the record is queued and before the wait, so that the
  // caller's work (the shard applies the updates) overlaps the write of the group the record
  // joins: a reader may then see an update before it is durable, but its caller acknowledges it
  // only once Append returned OK.
  absl::Status Append(absl::Span<const LoggedUpdate> updates, const std::function<void()>& meanwhile);
  absl::Status Append(const LoggedUpdate& update, const std::function<void()>& meanwhile) {
    return Append(absl::MakeConstSpan(&update, 1), meanwhile);
  }
  absl::Status Append(const LoggedUpdate& update) { return Append(update, nullptr); }

  // Opens a new segment that starts from checkpoint `name` (whose snapshot is being taken now,
  // with no Append running); returns its number.
  absl::StatusOr<uint64_t> Rotate(const std::string& name);
  // Deletes the segments before the newest one that starts from a checkpoint `committed` accepts.
  absl::Status Truncate(const std::function<bool(const std::string&)>& committed);

  // OK while this log owns its directory as of at most options.ownership_lease ago (a write or an
  // earlier check found the epoch its own); otherwise reads the EPOCH again, which, once another
  // process raised it, fails (FAILED_PRECONDITION naming both epochs) and calls on_fenced, as a
  // write would. A shard checks it before it answers from its rows.
  absl::Status CheckLease() const;
  // How long this new owner must still wait before it answers: until options.ownership_lease has
  // passed since Open raised the epoch, so that its former owner's lease has run out.
  absl::Duration UntilServeable() const;

  // Syncs and closes the current segment and gives the directory up (its LOCK): afterwards the
  // log reads (Segments, Replay) but no longer writes or deletes.
  absl::Status Close();

  struct Segment {
    uint64_t number = 0;
    uint32_t kind = 0;  // kFresh, kCheckpoint or kContinue (update_log.cc).
    std::string checkpoint;
    uint64_t lineage = 0;
    uint64_t first_record = 0;  // The log-wide index of its first record.
    uint64_t prev_end = 0;      // The size of the segment before it when it opened (0: none).
  };
  // The segments on disk, oldest first (headers that do not read: only a last, torn one is
  // passed over).
  absl::StatusOr<std::vector<Segment>> Segments() const;

 private:
  explicit UpdateLog(const UpdateLogOptions& options);
  // Opens segment `number` after the current one (or after one that ended at `prev_end` bytes),
  // its first record numbered next_record_.
  absl::Status OpenSegment(uint64_t number, uint32_t kind, const std::string& checkpoint, uint64_t prev_end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  // FAILED_PRECONDITION once the log was closed, or once another process raised the directory's
  // epoch past this one's: it writes and deletes only while it owns the directory.
  absl::Status CheckOwned() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  std::string SegmentPath(uint64_t number) const;
  // Numbers the records (next_record_ on, as one group) and writes them.
  absl::Status WriteGroup(const std::vector<absl::Span<char>>& records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  // Writes the queued records (up to max_group_bytes) as one group and marks their writers done.
  void LeadGroup() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UpdateLogOptions options_;
  Env* const env_;
  std::unique_ptr<FileLock> lock_ ABSL_GUARDED_BY(file_mu_);  // The directory's LOCK, from Open to Close.

  struct Writer;
  struct Turn;
  mutable absl::Mutex mu_;                           // The queue of writers.
  std::vector<Writer*> queue_ ABSL_GUARDED_BY(mu_);  // Records not yet written, oldest first.
  bool leading_ ABSL_GUARDED_BY(mu_) = false;        // A writer is writing a group.
  absl::Status failed_ ABSL_GUARDED_BY(mu_);         // A write or sync failed: every later Append fails.

  mutable absl::Mutex file_mu_ ABSL_ACQUIRED_AFTER(mu_);  // The open segment, held while writing.
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(file_mu_);
  uint64_t segment_ ABSL_GUARDED_BY(file_mu_) = 0;
  uint64_t segment_size_ ABSL_GUARDED_BY(file_mu_) = 0;  // Its records' bytes.
  uint64_t segment_end_ ABSL_GUARDED_BY(file_mu_) = 0;   // Its size, header included.
  uint64_t next_record_ ABSL_GUARDED_BY(file_mu_) = 0;   // The index the next record gets.
  absl::Time last_sync_ ABSL_GUARDED_BY(file_mu_);
  uint64_t lineage_ = 0;
  std::atomic<uint64_t> bytes_since_cut_{0};
  // Raised in EPOCH when this log took the directory; null for a read-only log.
  std::unique_ptr<OwnershipEpoch> owner_;
  mutable absl::Status fenced_ ABSL_GUARDED_BY(file_mu_);  // Another process took the directory.
};

class EmbeddingShardStore;

// Replays `log`'s segments from `first` on into `store`, each record as the Update request it was
// (validated the same way, deduplicated by its (worker, table, sequence)). A record the store
// refused when it was first applied (a NaN, a sequence older than the window) is refused again
// and counted in stats->refused: the replay ends where the acknowledged state did.
absl::Status ReplayInto(const UpdateLog& log, uint64_t first, EmbeddingShardStore* store, ReplayStats* stats);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_UPDATE_LOG_H_
