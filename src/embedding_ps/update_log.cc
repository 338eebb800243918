#include "hyrec/embedding_ps/update_log.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/crc32c.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::embedding_ps {
namespace {

constexpr char kMagic[] = "HYRECWAL";  // 8 bytes, without the terminator.
constexpr uint32_t kVersion = 3;       // 2: records not numbered, segments not linked; 1: crc32 (zlib).
constexpr uint32_t kFresh = 1;         // Starts from an empty store.
constexpr uint32_t kCheckpoint = 2;    // Starts from a checkpoint's snapshot.
constexpr uint32_t kContinue = 3;      // Continues the segment before it.
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 31;
constexpr uint64_t kMaxCheckpointName = 4096;
// A record's header: u32 payload length | u32 CRC-32C of the payload | u64 the record's index in
// the log | u64 the index of the first record of its group | u32 CRC-32C of those 24 bytes.
constexpr size_t kRecordHeader = 28;

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}
void PutBytes(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// Reads fixed-size values and length-prefixed strings from a byte range; false past its end.
class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  bool U32(uint32_t* v) { return Fixed(v, 4); }
  bool U64(uint64_t* v) { return Fixed(v, 8); }
  bool Bytes(absl::string_view* s, uint64_t max) {
    uint32_t n = 0;
    if (!U32(&n) || n > max || n > data_.size()) return false;
    *s = data_.substr(0, n);
    data_.remove_prefix(n);
    return true;
  }
  bool done() const { return data_.empty(); }

 private:
  template <typename T>
  bool Fixed(T* v, size_t n) {
    if (data_.size() < n) return false;
    std::memcpy(v, data_.data(), n);
    data_.remove_prefix(n);
    return true;
  }
  absl::string_view data_;
};

struct Header {
  uint32_t version = 0;  // Set once the magic reads, whatever the rest.
  uint64_t number = 0;
  uint32_t kind = 0;
  uint64_t lineage = 0;
  uint64_t first_record = 0;  // The log-wide index of the segment's first record.
  uint64_t prev_end = 0;      // The size of the segment before it, when this one opened (0: none).
  std::string checkpoint;
  size_t size = 0;  // Bytes the header takes.
};

std::string EncodeHeader(const Header& s) {
  std::string h(kMagic, 8);
  PutU32(&h, kVersion);
  PutU64(&h, s.number);
  PutU32(&h, s.kind);
  PutU64(&h, s.lineage);
  PutU64(&h, s.first_record);
  PutU64(&h, s.prev_end);
  PutBytes(&h, s.checkpoint);
  PutU32(&h, Crc32c(h));
  return h;
}

// The header at the start of `data`; false when it does not read (short, bad magic or crc).
bool DecodeHeader(absl::string_view data, Header* h) {
  if (data.size() < 8 || data.substr(0, 8) != absl::string_view(kMagic, 8)) return false;
  Reader r(data.substr(8));
  uint32_t crc = 0;
  absl::string_view checkpoint;
  if (!r.U32(&h->version) || h->version != kVersion || !r.U64(&h->number) || !r.U32(&h->kind) || !r.U64(&h->lineage) ||
      !r.U64(&h->first_record) || !r.U64(&h->prev_end) || !r.Bytes(&checkpoint, kMaxCheckpointName)) {
    return false;
  }
  h->checkpoint = std::string(checkpoint);
  const size_t body = 8 + 4 + 8 + 4 + 8 + 8 + 8 + 4 + h->checkpoint.size();
  if (data.size() < body + 4) return false;
  std::memcpy(&crc, data.data() + body, 4);
  h->size = body + 4;
  return crc == Crc32c(data.substr(0, body)) && h->kind >= kFresh && h->kind <= kContinue;
}

// Encodes the record of `updates` into *buffer (grown when too small, never shrunk here) and
// returns it: one pass over the ids and gradients copies them and computes the crc. Its index and
// group are stamped when its group is written (StampRecord).
absl::Span<char> EncodeRecord(absl::Span<const LoggedUpdate> updates, std::string* buffer) {
  size_t payload = 4;
  for (const LoggedUpdate& u : updates) {
    payload += 4 + u.table.size() + 4 + 8 + 4 + 4 + u.ids.size() + 4 + u.grads.size();
  }
  if (buffer->size() < kRecordHeader + payload) buffer->resize(kRecordHeader + payload);
  char* out = buffer->data() + kRecordHeader;
  uint32_t crc = 0;
  const auto put = [&](const void* data, size_t n) {
    crc = Crc32cCopy(out, absl::string_view(static_cast<const char*>(data), n), crc);
    out += n;
  };
  const auto put_bytes = [&](absl::string_view bytes) {
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    put(&n, 4);
    put(bytes.data(), bytes.size());
  };
  const uint32_t count = static_cast<uint32_t>(updates.size());
  put(&count, 4);
  for (const LoggedUpdate& u : updates) {
    put_bytes(u.table);
    put(&u.worker_id, 4);
    put(&u.sequence, 8);
    put(&u.precision, 4);
    put_bytes(u.ids);
    put_bytes(u.grads);
  }
  const uint32_t length = static_cast<uint32_t>(payload);
  std::memcpy(buffer->data(), &length, 4);
  std::memcpy(buffer->data() + 4, &crc, 4);
  return absl::Span<char>(buffer->data(), kRecordHeader + payload);
}

// Sets the record's index in the log and its group's first index, and seals its header.
void StampRecord(absl::Span<char> record, uint64_t index, uint64_t group_first) {
  std::memcpy(record.data() + 8, &index, 8);
  std::memcpy(record.data() + 16, &group_first, 8);
  const uint32_t crc = Crc32c(absl::string_view(record.data(), 24));
  std::memcpy(record.data() + 24, &crc, 4);
}

// The updates of a record's payload, all or none.
bool DecodePayload(absl::string_view payload, std::vector<LoggedUpdate>* updates) {
  Reader r(payload);
  uint32_t count = 0;
  if (!r.U32(&count) || count == 0 || count > payload.size()) return false;
  updates->resize(count);
  for (LoggedUpdate& u : *updates) {
    if (!r.Bytes(&u.table, 1 << 16) || !r.U32(&u.worker_id) || !r.U64(&u.sequence) || !r.U32(&u.precision) ||
        !r.Bytes(&u.ids, kMaxRecordBytes) || !r.Bytes(&u.grads, kMaxRecordBytes)) {
      return false;
    }
  }
  return r.done();
}

// The record at `at` of `data`, when it is whole: its header's crc and its payload's match, and
// its payload decodes (into *updates). Sets *length (of its payload), *index and *group_first.
bool ReadRecord(absl::string_view data, size_t at, uint32_t* length, uint64_t* index, uint64_t* group_first,
                std::vector<LoggedUpdate>* updates) {
  if (data.size() - at < kRecordHeader) return false;
  uint32_t crc = 0, header_crc = 0;
  std::memcpy(&header_crc, data.data() + at + 24, 4);
  if (Crc32c(data.substr(at, 24)) != header_crc) return false;
  std::memcpy(length, data.data() + at, 4);
  std::memcpy(&crc, data.data() + at + 4, 4);
  std::memcpy(index, data.data() + at + 8, 8);
  std::memcpy(group_first, data.data() + at + 16, 8);
  if (*length > data.size() - at - kRecordHeader || *group_first > *index) return false;
  const absl::string_view payload = data.substr(at + kRecordHeader, *length);
  return Crc32c(payload) == crc && DecodePayload(payload, updates);
}

// What follows a segment's whole records: nothing, zeros of a direct write's padding (fewer than
// a block), or a torn tail (the last group, cut short: never acknowledged).
enum class Tail { kNone, kPadding, kTorn };

struct Walk {
  size_t end = 0;  // Where the whole records end.
  uint64_t records = 0;
  Tail tail = Tail::kNone;
};

// Walks the records of segment `path`'s `data` from `at` (past its header), the first numbered
// `first_record`, calling `apply` on each update of each whole one. A record that is not whole is
// a torn tail only when no whole record of a later group follows it anywhere in the segment
// (groups are written one after the other, so a later group's record means that this one's group
// was written, synced and acknowledged before): otherwise DATA_LOSS naming it.
absl::StatusOr<Walk> WalkRecords(const std::string& path, absl::string_view data, size_t at, uint64_t first_record,
                                 const std::function<absl::Status(const LoggedUpdate&)>& apply) {
  std::vector<LoggedUpdate> updates;
  Walk walk;
  uint64_t expected = first_record;
  while (at < data.size()) {
    uint32_t length = 0;
    uint64_t index = 0, group_first = 0;
    if (ReadRecord(data, at, &length, &index, &group_first, &updates) && index == expected) {
      if (apply) {
        for (const LoggedUpdate& u : updates) HYREC_RETURN_IF_ERROR(apply(u));
      }
      ++walk.records;
      ++expected;
      at += kRecordHeader + length;
      continue;
    }
    walk.end = at;
    const absl::string_view rest = data.substr(at);
    if (rest.size() < kLogFileBlock && rest.find_first_not_of('\0') == absl::string_view::npos) {
      walk.tail = Tail::kPadding;
      return walk;
    }
    for (size_t p = at + 1; p + kRecordHeader <= data.size();) {
      if (!ReadRecord(data, p, &length, &index, &group_first, &updates)) {
        ++p;
        continue;
      }
      if (group_first > expected) {
        return absl::DataLossError(absl::StrCat(path, ": record ", expected, " at offset ", at,
                                                " is damaged, and whole records of later groups follow it ", "(record ",
                                                index, " at offset ", p,
                                                "): the log is damaged, not torn by a crash, and the updates from "
                                                "record ",
                                                expected, " on were acknowledged"));
      }
      p += kRecordHeader + length;
    }
    walk.tail = Tail::kTorn;
    return walk;
  }
  walk.end = at;
  return walk;
}

absl::StatusOr<std::string> ReadAll(Env* env, const std::string& path) {
  return ReadFileToString(env, path, uint64_t{1} << 40);
}

// The first bytes of a segment, as many as the longest header takes: what listing the segments
// reads, rather than every segment whole.
absl::StatusOr<std::string> ReadHead(Env* env, const std::string& path) {
  constexpr size_t kMaxHeaderBytes = 8 + 4 + 8 + 4 + 8 + 8 + 8 + 4 + kMaxCheckpointName + 4;
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, env->NewSequentialFile(path));
  std::string head(kMaxHeaderBytes, '\0');
  size_t got = 0;
  while (got < head.size()) {
    HYREC_ASSIGN_OR_RETURN(const size_t n, file->Read(head.data() + got, head.size() - got));
    if (n == 0) break;
    got += n;
  }
  head.resize(got);
  return head;
}

}  // namespace

const char* LogSyncName(LogSync sync) { return NameOf(kLogSyncNames, sync); }

struct UpdateLog::Writer {
  explicit Writer(absl::Span<char> b) : bytes(b) {}
  absl::Span<char> bytes;  // Its record, stamped by the leader that writes it.
  absl::Status status;
  bool done = false;
  bool waiting = false;  // Past its `meanwhile`: it can lead.
};

// An Append's wait: until a leader wrote its record, or no one leads and it is the oldest
// waiting writer (only that one wakes to lead, not every writer in the queue).
struct UpdateLog::Turn {
  Writer* writer;
  const UpdateLog* log;
  static bool Ready(Turn* t) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // Evaluated under mu_.
    if (t->writer->done) return true;
    if (t->log->leading_) return false;
    for (const Writer* w : t->log->queue_) {
      if (w->waiting) return w == t->writer;
    }
    return false;
  }
};

namespace {

constexpr char kEpochFile[] = "EPOCH";

// The directory's LOCK, waiting up to options.lock_wait for another holder to go.
absl::StatusOr<std::unique_ptr<FileLock>> LockLogDir(Env* env, const UpdateLogOptions& options) {
  absl::StatusOr<std::unique_ptr<FileLock>> lock =
      LockFileWithin(env, JoinPath(options.dir, "LOCK"), "", options.lock_wait);
  if (lock.ok() || !absl::IsFailedPrecondition(lock.status())) return lock;
  return absl::FailedPreconditionError(
      absl::StrCat("the update log ", options.dir, " belongs to a shard that runs: ", lock.status().message(),
                   ". One process owns a shard's log; two would lose acknowledged updates. Stop that one first "
                   "(a shard that crashed holds nothing), or start this one on another checkpoint.dir"));
}

}  // namespace

UpdateLog::UpdateLog(const UpdateLogOptions& options)
    : options_(options), env_(options.env != nullptr ? options.env : Env::Default()) {}

UpdateLog::~UpdateLog() { (void)Close(); }

absl::StatusOr<std::unique_ptr<UpdateLog>> UpdateLog::Open(const UpdateLogOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("the update log needs a directory");
  std::unique_ptr<UpdateLog> log(new UpdateLog(options));
  if (!options.read_only) {
    HYREC_RETURN_IF_ERROR(Annotate(log->env_->CreateDirs(options.dir), "the update log's directory"));
    absl::MutexLock lock(&log->file_mu_);
    HYREC_ASSIGN_OR_RETURN(log->lock_, LockLogDir(log->env_, options));
    // Ownership is also an epoch in the directory, raised by every owner before it reads or
    // writes the log and checked before each write or deletion: on a file system that does not
    // carry locks between hosts, the owner that a newer one replaced stops at its next write.
    OwnershipOptions owner;
    owner.path = JoinPath(options.dir, kEpochFile);
    owner.what = absl::StrCat("the update log ", options.dir);
    owner.lease = options.ownership_lease;
    owner.env = log->env_;
    absl::StatusOr<std::unique_ptr<OwnershipEpoch>> taken = OwnershipEpoch::Take(owner);
    if (!taken.ok()) return Annotate(taken.status(), "the update log's EPOCH");
    log->owner_ = std::move(*taken);
  }
  HYREC_ASSIGN_OR_RETURN(std::vector<Segment> segments, log->Segments());
  log->lineage_ = segments.empty() ? RandomId() : segments.back().lineage;
  return log;
}

std::string UpdateLog::SegmentPath(uint64_t number) const {
  return JoinPath(options_.dir, absl::StrFormat("log-%020d.wal", number));
}

absl::StatusOr<std::vector<UpdateLog::Segment>> UpdateLog::Segments() const {
  HYREC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->GetChildren(options_.dir));
  std::vector<uint64_t> numbers;
  for (const std::string& name : names) {
    uint64_t n = 0;
    if (name.size() == 28 && absl::StartsWith(name, "log-") && absl::EndsWith(name, ".wal") &&
        absl::SimpleAtoi(name.substr(4, 20), &n)) {
      numbers.push_back(n);
    }
  }
  std::sort(numbers.begin(), numbers.end());
  std::vector<Segment> out;
  for (size_t i = 0; i < numbers.size(); ++i) {
    const std::string path = SegmentPath(numbers[i]);
    HYREC_ASSIGN_OR_RETURN(const std::string head, ReadHead(env_, path));
    Header h;
    const bool read = DecodeHeader(head, &h);
    if (read && h.number != numbers[i]) {
      return absl::DataLossError(absl::StrCat(path, " holds segment ", h.number,
                                              " of the log: segments were renamed, "
                                              "moved or copied between logs"));
    }
    if (!read) {
      if (h.version != 0 && h.version != kVersion) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, ": an update log segment of format ", h.version, "; this hyrec reads format ", kVersion,
                         " (restore the shard from its checkpoint with the hyrec that wrote the log)"));
      }
      if (i + 1 == numbers.size()) break;  // Created, but its header never written whole.
      return absl::DataLossError(absl::StrCat(path, ": not an update log segment, or its header is damaged"));
    }
    out.push_back(Segment{h.number, h.kind, h.checkpoint, h.lineage, h.first_record, h.prev_end});
  }
  return out;
}

uint64_t UpdateLog::lineage() const {
  absl::MutexLock lock(&file_mu_);
  return lineage_;
}

absl::StatusOr<LogRecovery> UpdateLog::FindRecovery(const std::function<bool(const std::string&)>& committed) const {
  HYREC_ASSIGN_OR_RETURN(std::vector<Segment> segments, Segments());
  for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
    if (it->kind == kCheckpoint && committed(it->checkpoint)) return LogRecovery{it->checkpoint, it->number};
    if (it->kind == kFresh) return LogRecovery{"", it->number};
  }
  return absl::DataLossError(absl::StrCat(
      "the update log in ", options_.dir,
      segments.empty() ? " is empty"
                       : " starts from no checkpoint that is still there and intact: its updates cannot be "
                         "replayed onto anything"));
}

namespace {

// DATA_LOSS unless segment `next` continues `prev` (the segment before it in the log, whose whole
// records `walk` found in its `size` bytes): the next number, the same lineage, and the end and
// record count `next` saw `prev` have when it opened.
absl::Status CheckLink(const UpdateLog::Segment& prev, const Walk& walk, uint64_t size, const UpdateLog::Segment& next,
                       const std::string& prev_path, const std::string& next_path) {
  if (next.number != prev.number + 1) {
    return absl::DataLossError(absl::StrCat(
        "the update log is missing segment(s) ", prev.number + 1, next.number > prev.number + 2 ? " to " : "",
        next.number > prev.number + 2 ? absl::StrCat(next.number - 1) : "", " between ", prev_path, " and ", next_path,
        ": the updates they held were acknowledged"));
  }
  if (next.lineage != prev.lineage) {
    return absl::DataLossError(absl::StrFormat(
        "%s (lineage %016x) does not continue %s (lineage %016x): a segment of another log, or of an earlier run "
        "of this one",
        next_path, next.lineage, prev_path, prev.lineage));
  }
  if (next.kind == kFresh || next.prev_end != size || next.prev_end != walk.end ||
      next.first_record != prev.first_record + walk.records) {
    return absl::DataLossError(absl::StrCat(prev_path, " holds ", walk.records, " record(s) in ", size,
                                            " bytes, but when ", next_path, " was opened after it, it held ",
                                            next.first_record - prev.first_record, " record(s) in ", next.prev_end,
                                            " bytes: the segment was cut, extended or replaced"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status UpdateLog::Replay(uint64_t first, const std::function<absl::Status(const LoggedUpdate&)>& apply,
                               ReplayStats* stats) const {
  ReplayStats local;
  ReplayStats& s = stats != nullptr ? *stats : local;
  HYREC_ASSIGN_OR_RETURN(std::vector<Segment> segments, Segments());
  const std::function<absl::Status(const LoggedUpdate&)> count = [&](const LoggedUpdate& u) {
    if (apply) HYREC_RETURN_IF_ERROR(apply(u));
    ++s.updates;
    return absl::OkStatus();
  };
  const Segment* prev = nullptr;
  Walk prev_walk;
  uint64_t prev_size = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].number < first) continue;
    const bool last = i + 1 == segments.size();
    const std::string path = SegmentPath(segments[i].number);
    if (prev != nullptr) {
      HYREC_RETURN_IF_ERROR(CheckLink(*prev, prev_walk, prev_size, segments[i], SegmentPath(prev->number), path));
    }
    HYREC_ASSIGN_OR_RETURN(const std::string data, ReadAll(env_, path));
    Header h;
    DecodeHeader(data, &h);
    ++s.segments;
    HYREC_ASSIGN_OR_RETURN(const Walk walk, WalkRecords(path, data, h.size, h.first_record, count));
    s.records += walk.records;
    if (walk.tail == Tail::kTorn) {
      if (!last) {
        return absl::DataLossError(absl::StrCat(path, ": record ", h.first_record + walk.records, " at offset ",
                                                walk.end, " is damaged, and segments follow it"));
      }
      s.torn_bytes = data.size() - walk.end;  // A torn tail: the group whose Appends never returned.
    }
    prev = &segments[i];
    prev_walk = walk;
    prev_size = data.size();
  }
  return absl::OkStatus();
}

absl::Status UpdateLog::CheckOwned() const {
  if (lock_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the update log ", options_.dir, options_.read_only ? " is open read-only" : " was closed"));
  }
  if (!fenced_.ok()) return fenced_;
  const absl::Status owned = owner_->Check();
  if (owned.ok() || !absl::IsFailedPrecondition(owned)) return owned;
  fenced_ = absl::FailedPreconditionError(
      absl::StrCat(owned.message(), ": this process no longer owns the shard and stops writing to it"));
  if (options_.on_fenced) options_.on_fenced(fenced_);
  return fenced_;
}

absl::Status UpdateLog::CheckLease() const {
  if (owner_ != nullptr && owner_->LeaseHeld()) return absl::OkStatus();
  absl::MutexLock lock(&file_mu_);
  return CheckOwned();
}

absl::Duration UpdateLog::UntilServeable() const {
  return owner_ != nullptr ? owner_->UntilServeable() : absl::ZeroDuration();
}

absl::Status UpdateLog::OpenSegment(uint64_t number, uint32_t kind, const std::string& checkpoint, uint64_t prev_end) {
  HYREC_RETURN_IF_ERROR(CheckOwned());
  if (file_ != nullptr) {
    HYREC_RETURN_IF_ERROR(file_->Sync());
    HYREC_RETURN_IF_ERROR(file_->Close());
    file_.reset();
  }
  const std::string path = SegmentPath(number);
  // Every group waits for its sync: direct writes, which skip the page cache's write-back.
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                         options_.sync == LogSync::kEveryGroup ? env_->NewLogFile(path) : env_->NewWritableFile(path));
  Header h;
  h.number = number;
  h.kind = kind;
  h.lineage = lineage_;
  h.first_record = next_record_;
  h.prev_end = prev_end;
  h.checkpoint = checkpoint;
  const std::string header = EncodeHeader(h);
  HYREC_RETURN_IF_ERROR(file->Append(header));
  HYREC_RETURN_IF_ERROR(file->Sync());
  HYREC_RETURN_IF_ERROR(env_->SyncDir(options_.dir));  // The segment exists after a crash.
  file_ = std::move(file);
  segment_ = number;
  segment_size_ = 0;
  segment_end_ = header.size();
  last_sync_ = absl::Now();
  return absl::OkStatus();
}

absl::Status UpdateLog::Reset(const std::string& checkpoint) {
  absl::MutexLock lock(&file_mu_);
  HYREC_RETURN_IF_ERROR(CheckOwned());
  if (file_ != nullptr) {
    (void)file_->Close();
    file_.reset();
  }
  HYREC_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->GetChildren(options_.dir));
  for (const std::string& name : names) {
    if (absl::StartsWith(name, "log-") && absl::EndsWith(name, ".wal")) {
      HYREC_RETURN_IF_ERROR(env_->DeleteFile(JoinPath(options_.dir, name)));
    }
  }
  lineage_ = RandomId();
  next_record_ = 0;
  bytes_since_cut_ = 0;
  return OpenSegment(1, checkpoint.empty() ? kFresh : kCheckpoint, checkpoint, 0);
}

absl::Status UpdateLog::StartWriting() {
  {
    absl::MutexLock lock(&file_mu_);
    HYREC_RETURN_IF_ERROR(CheckOwned());
  }
  HYREC_ASSIGN_OR_RETURN(std::vector<Segment> segments, Segments());
  if (segments.empty()) return absl::FailedPreconditionError("an empty update log starts with Reset");
  const std::string last = SegmentPath(segments.back().number);
  HYREC_ASSIGN_OR_RETURN(const std::string data, ReadAll(env_, last));
  Header h;
  DecodeHeader(data, &h);
  HYREC_ASSIGN_OR_RETURN(const Walk walk, WalkRecords(last, data, h.size, h.first_record, nullptr));
  if (walk.end < data.size()) {
    HYREC_RETURN_IF_ERROR(env_->TruncateFile(last, walk.end));
    HYREC_RETURN_IF_ERROR(env_->SyncFile(last));
  }
  uint64_t since_cut = walk.end;  // The segments from the newest that starts from a cut.
  for (size_t i = segments.size() - 1; i > 0 && segments[i].kind == kContinue; --i) {
    HYREC_ASSIGN_OR_RETURN(const uint64_t size, env_->GetFileSize(SegmentPath(segments[i - 1].number)));
    since_cut += size;
  }
  bytes_since_cut_ = since_cut;
  absl::MutexLock lock(&file_mu_);
  next_record_ = h.first_record + walk.records;
  return OpenSegment(segments.back().number + 1, kContinue, "", walk.end);
}

absl::Status UpdateLog::WriteGroup(const std::vector<absl::Span<char>>& records) {
  if (file_ == nullptr) return absl::FailedPreconditionError("the update log is not open for writing");
  HYREC_RETURN_IF_ERROR(CheckOwned());  // The fence: no record of a process that lost the shard.
  const uint64_t group_first = next_record_;
  for (absl::Span<char> record : records) {
    StampRecord(record, next_record_++, group_first);
    HYREC_RETURN_IF_ERROR(file_->Append(absl::string_view(record.data(), record.size())));
    segment_size_ += record.size();
    segment_end_ += record.size();
    bytes_since_cut_.fetch_add(record.size(), std::memory_order_relaxed);
  }
  const bool sync = options_.sync == LogSync::kEveryGroup ||
                    (options_.sync == LogSync::kInterval && absl::Now() - last_sync_ >= options_.sync_interval);
  if (sync) {
    HYREC_RETURN_IF_ERROR(file_->Sync());
    last_sync_ = absl::Now();
  }
  if (segment_size_ >= options_.segment_bytes) {
    HYREC_RETURN_IF_ERROR(OpenSegment(segment_ + 1, kContinue, "", segment_end_));
  }
  return absl::OkStatus();
}

absl::Status UpdateLog::Append(absl::Span<const LoggedUpdate> updates, const std::function<void()>& meanwhile) {
  if (updates.empty()) return absl::InvalidArgumentError("an update log record holds at least one update");
  // The calling thread's buffer: no allocation (and no fresh pages) per record. One that grew
  // past kKeptBufferBytes for a large record is given back afterwards.
  constexpr size_t kKeptBufferBytes = 1 << 20;
  thread_local std::string buffer;
  struct Trim {
    ~Trim() {
      if (buffer.capacity() > kKeptBufferBytes) std::string().swap(buffer);
    }
  } trim;
  Writer w(EncodeRecord(updates, &buffer));
  absl::MutexLock lock(&mu_);
  queue_.push_back(&w);
  if (meanwhile) {
    mu_.Unlock();
    meanwhile();
    mu_.Lock();
  }
  w.waiting = true;
  Turn turn{&w, this};
  while (!w.done) {
    // Followers wait until a leader has written their record, or until no one leads.
    mu_.Await(absl::Condition(&Turn::Ready, &turn));
    if (w.done) break;
    LeadGroup();
  }
  return w.status;
}

void UpdateLog::LeadGroup() {
  leading_ = true;
  // Requests of one batch arrive together (a table each): waiting a moment for the others lets
  // one sync serve them all.
  if (options_.sync == LogSync::kEveryGroup && queue_.size() == 1 && options_.group_linger > absl::ZeroDuration()) {
    std::vector<Writer*>* queue = &queue_;
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::vector<Writer*>* q) { return q->size() > 1; }, queue),
                         options_.group_linger);
  }
  // Everything queued, up to max_group_bytes, whether or not its writer is still applying its
  // update: its bytes are final, and it waits for `done` before it returns. The records stay
  // where their writers keep them.
  std::vector<absl::Span<char>> group;
  size_t count = 0, bytes = 0;
  while (count < queue_.size() && (count == 0 || bytes + queue_[count]->bytes.size() <= options_.max_group_bytes)) {
    group.push_back(queue_[count]->bytes);
    bytes += queue_[count]->bytes.size();
    ++count;
  }
  absl::Status status = failed_;
  if (status.ok()) {
    mu_.Unlock();
    {
      absl::MutexLock file_lock(&file_mu_);
      status = WriteGroup(group);
    }
    mu_.Lock();
    if (!status.ok()) failed_ = Annotate(status, "the update log");
    status = status.ok() ? status : failed_;
  }
  for (size_t i = 0; i < count; ++i) {
    queue_[i]->status = status;
    queue_[i]->done = true;
  }
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(count));
  leading_ = false;
}

absl::StatusOr<uint64_t> UpdateLog::Rotate(const std::string& name) {
  absl::MutexLock lock(&file_mu_);
  if (file_ == nullptr) return absl::FailedPreconditionError("the update log is not open for writing");
  HYREC_RETURN_IF_ERROR(OpenSegment(segment_ + 1, kCheckpoint, name, segment_end_));
  bytes_since_cut_ = 0;
  return segment_;
}

absl::Status UpdateLog::Truncate(const std::function<bool(const std::string&)>& committed) {
  {
    absl::MutexLock lock(&file_mu_);
    HYREC_RETURN_IF_ERROR(CheckOwned());
  }
  HYREC_ASSIGN_OR_RETURN(std::vector<Segment> segments, Segments());
  uint64_t keep_from = 0;
  for (const Segment& s : segments) {
    if (s.kind == kCheckpoint && committed(s.checkpoint)) keep_from = s.number;
  }
  for (const Segment& s : segments) {
    if (s.number >= keep_from) break;
    HYREC_RETURN_IF_ERROR(env_->DeleteFile(SegmentPath(s.number)));
  }
  return absl::OkStatus();
}

absl::Status UpdateLog::Close() {
  absl::MutexLock lock(&file_mu_);
  absl::Status s, c;
  if (file_ != nullptr) {
    s = file_->Sync();
    c = file_->Close();
    file_.reset();
  }
  lock_.reset();  // Closed, the log owns its directory no more.
  return s.ok() ? c : s;
}

}  // namespace hyrec::embedding_ps
