// Env: the file operations checkpoints and exports use, behind an interface so that tests can
// inject failures (LevelDB's habit).
//
//   Env* env = Env::Default();
//   HYREC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile("ckpt/a.tmp"));
//   HYREC_RETURN_IF_ERROR(file->Append("bytes"));
//   HYREC_RETURN_IF_ERROR(file->Sync());
//   HYREC_RETURN_IF_ERROR(file->Close());
//   HYREC_RETURN_IF_ERROR(env->RenameFile("ckpt/a.tmp", "ckpt/a"));
//   HYREC_RETURN_IF_ERROR(env->SyncDir("ckpt"));
//
// Every error names the path and the operation (errno's text). A failed Sync is reported once and
// the file is then unusable: its unsynced data may be lost, and a retry of the same data would
// hide that (a writer starts a new file instead).
//
// Thread safety: Env methods may be called from many threads; one WritableFile is used by one.
#ifndef HYREC_COMMON_ENV_H_
#define HYREC_COMMON_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace hyrec {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes everything appended durable (fdatasync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

// Reads a file front to back.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to n bytes into dst; returns how many (0 at the end, fewer only there).
  virtual absl::StatusOr<size_t> Read(char* dst, size_t n) = 0;
};

// An exclusive lock on a file (Env::LockFile), released when destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  virtual ~Env() = default;
  // The process-wide POSIX Env.
  static Env* Default();

  // Creates (or truncates) `path` for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Creates (or truncates) `path` for a write-ahead log that waits for every Sync. Append only
  // buffers in memory; Sync writes what was appended since the last Sync in one write, bypassing
  // the page cache (direct I/O) where the file system allows, and makes it durable. A direct
  // write covers whole blocks of kLogFileBlock bytes: the block the data ends in is written
  // padded with zeros, and written again, whole, by the next Sync. So after a crash the file may
  // end in fewer than kLogFileBlock zeros past its last synced byte; Close writes what is
  // pending, cuts those zeros off and syncs. Where the file system refuses direct I/O (tmpfs),
  // Sync writes through the page cache instead, with no padding.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewLogFile(const std::string& path) = 0;
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Makes a closed file's data durable (fdatasync of the file).
  virtual absl::Status SyncFile(const std::string& path) = 0;
  // Creates `dir` and its parents; OK when it exists.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Removes an empty directory.
  virtual absl::Status DeleteDir(const std::string& dir) = 0;
  // Names in `dir` (not "." or ".."), sorted.
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual absl::StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;
  // Cuts `path` to `size` bytes (not synced: SyncFile makes it durable).
  virtual absl::Status TruncateFile(const std::string& path, uint64_t size) = 0;
  // Takes an exclusive lock on `path` (flock(2); the file is created when missing) and writes
  // `holder` into it, so that a refused taker can say who holds it. The lock lasts until the
  // returned object is destroyed or its process ends, however it ends (a killed process holds
  // nothing); exec'd children do not inherit it. Never waits: FAILED_PRECONDITION naming `path`
  // and the holder's text when another holder has it.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path, absl::string_view holder) = 0;
  // Whether a LockFile holder has `path` now, without taking it from anyone: OK when none does
  // (or the file does not exist), FAILED_PRECONDITION naming the holder when one does. Many
  // processes may probe at once without seeing each other (flock(2) shared, then released); a
  // LockFile taker that meets a probe in that instant is refused as by a holder, which
  // LockFileWithin's wait rides out. Writes nothing.
  virtual absl::Status ProbeLock(const std::string& path) = 0;
};

// The block of NewLogFile's direct writes: their offsets and lengths are multiples of it.
inline constexpr size_t kLogFileBlock = 4096;

// Env::LockFile for a process that owns something (`what`, say "a run of job 1234"): its holder
// text is "WHAT: pid N on HOST since TIME" ("pid N ..." without `what`), and while another holder
// has the lock it retries for up to `wait`, then returns that FAILED_PRECONDITION (which names the
// holder) for the caller to say what it could not take.
absl::StatusOr<std::unique_ptr<FileLock>> LockFileWithin(Env* env, const std::string& path, absl::string_view what,
                                                         absl::Duration wait);

// A random non-zero 64-bit id: a log's lineage, a server's incarnation, a job's id.
uint64_t RandomId();

// Reads a whole file; FailedPrecondition when it holds more than `max_bytes`.
absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path, uint64_t max_bytes);

// Writes `data` to `path` durably: to path + ".tmp", Sync, Close, rename over `path`, then (with
// sync_dir) SyncDir. After an error the temporary file is removed and `path` is as it was.
absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view data, bool sync_dir = true);

// Deletes `dir` and the files in it (one level: checkpoint directories hold no subdirectories).
absl::Status DeleteDirAndFiles(Env* env, const std::string& dir);

// "a/b" from ("a", "b"); an absolute `name` stays as it is.
std::string JoinPath(absl::string_view dir, absl::string_view name);
// The directory of `path`: "a" for "a/b", "." for "b".
std::string DirName(const std::string& path);

}  // namespace hyrec

#endif  // HYREC_COMMON_ENV_H_
