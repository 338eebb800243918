#include "hyrec/common/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

absl::Status PosixError(absl::string_view what, const std::string& path, int error) {
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(message);
  if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("writing", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
    if (::fdatasync(fd_) != 0) return PosixError("syncing", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return PosixError("closing", path_, errno);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
};

// NewLogFile's file: appends gather in an aligned buffer that starts at a block boundary of the
// file (block_start_); Sync writes the buffer's unwritten bytes (direct: every block from the
// buffer's start, the last one padded) and fdatasyncs, then keeps only the partial last block.
class PosixLogFile final : public WritableFile {
 public:
  PosixLogFile(std::string path, int fd, bool direct) : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixLogFile() override {
    if (fd_ >= 0) ::close(fd_);
    std::free(buffer_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
    if (used_ + data.size() > capacity_) {
      const size_t capacity = RoundUp(std::max(2 * capacity_, used_ + data.size()));
      void* grown = nullptr;
      if (::posix_memalign(&grown, kLogFileBlock, capacity) != 0) {
        return absl::ResourceExhaustedError(absl::StrCat("no memory to buffer ", capacity, " bytes for '", path_, "'"));
      }
      if (used_ > 0) std::memcpy(grown, buffer_, used_);
      std::free(buffer_);
      buffer_ = static_cast<char*>(grown);
      capacity_ = capacity;
    }
    std::memcpy(buffer_ + used_, data.data(), data.size());
    used_ += data.size();
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    HYREC_RETURN_IF_ERROR(Write());
    if (::fdatasync(fd_) != 0) return PosixError("syncing", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    absl::Status status = Write();
    const uint64_t length = block_start_ + used_;
    if (status.ok() && direct_ && ::ftruncate(fd_, static_cast<off_t>(length)) != 0) {
      status = PosixError("cutting the padding of", path_, errno);
    }
    if (status.ok() && ::fdatasync(fd_) != 0) status = PosixError("syncing", path_, errno);
    if (::close(fd_) != 0 && status.ok()) status = PosixError("closing", path_, errno);
    fd_ = -1;
    return status;
  }

 private:
  static size_t RoundUp(size_t n) { return (n + kLogFileBlock - 1) / kLogFileBlock * kLogFileBlock; }

  // Writes what Sync has not written yet; the buffer then holds only a partial last block.
  absl::Status Write() {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
    if (used_ == written_) return absl::OkStatus();
    // Direct: from the buffer's start (a block boundary), padded to whole blocks. Buffered: only
    // what is new.
    const size_t from = direct_ ? 0 : written_;
    const size_t to = direct_ ? RoundUp(used_) : used_;
    if (direct_) std::memset(buffer_ + used_, 0, to - used_);
    for (size_t at = from; at < to;) {
      const ssize_t n = ::pwrite(fd_, buffer_ + at, to - at, static_cast<off_t>(block_start_ + at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return PosixError("writing", path_, errno);
      if (n == 0 || (direct_ && n % kLogFileBlock != 0)) {
        return absl::UnavailableError(absl::StrCat("writing '", path_, "': short write of ", n, " bytes"));
      }
      at += static_cast<size_t>(n);
    }
    const size_t whole = used_ / kLogFileBlock * kLogFileBlock;  // Bytes that never change again.
    std::memmove(buffer_, buffer_ + whole, used_ - whole);
    block_start_ += whole;
    used_ -= whole;
    written_ = used_;
    return absl::OkStatus();
  }

  const std::string path_;
  int fd_;
  const bool direct_;
  char* buffer_ = nullptr;  // Aligned to kLogFileBlock.
  size_t capacity_ = 0;
  size_t used_ = 0;           // Bytes appended, from block_start_.
  size_t written_ = 0;        // Of them, those already written.
  uint64_t block_start_ = 0;  // The file offset of buffer_[0].
};

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(char* dst, size_t n) override {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd_, dst + got, n - got);
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError("reading", path_, errno);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

 private:
  const std::string path_;
  const int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("creating", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewLogFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    const bool direct = fd >= 0;
    if (!direct && errno == EINVAL) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("creating", path, errno);
    return std::unique_ptr<WritableFile>(new PosixLogFile(path, fd, direct));
  }

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("opening", path, errno);
    return std::unique_ptr<SequentialFile>(new PosixSequentialFile(path, fd));
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return PosixError(absl::StrCat("renaming to '", to, "'"), from, errno);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    return SyncPath(dir.empty() ? "." : dir, O_DIRECTORY, " directory", ::fsync);
  }

  absl::Status SyncFile(const std::string& path) override { return SyncPath(path, 0, "", ::fdatasync); }

 private:
  // Opens `path` read-only (with `flags`) and syncs it with `sync`; errors say "opening<what>" or
  // "syncing<what>" and name it.
  static absl::Status SyncPath(const std::string& path, int flags, absl::string_view what, int (*sync)(int)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0) return PosixError(absl::StrCat("opening", what), path, errno);
    const int rc = sync(fd);
    const int error = errno;
    ::close(fd);
    if (rc != 0) return PosixError(absl::StrCat("syncing", what), path, error);
    return absl::OkStatus();
  }

 public:
  absl::Status CreateDirs(const std::string& dir) override {
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
      if (pos != dir.size() && dir[pos] != '/') continue;
      const std::string prefix = dir.substr(0, pos);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return PosixError("creating directory", prefix, errno);
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return PosixError("creating directory", dir, errno);
    if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat("'", dir, "' is not a directory"));
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("deleting", path, errno);
    return absl::OkStatus();
  }

  absl::Status DeleteDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return PosixError("deleting directory", dir, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("listing", dir, errno);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("reading the size of", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) return PosixError("truncating", path, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path, absl::string_view holder) override;
  absl::Status ProbeLock(const std::string& path) override;
};

class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { ::close(fd_); }  // Closing the last descriptor releases the flock.

 private:
  const int fd_;
};

absl::StatusOr<std::unique_ptr<FileLock>> PosixEnv::LockFile(const std::string& path, absl::string_view holder) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError("opening the lock file", path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char note[512];
    const ssize_t n = error == EWOULDBLOCK ? ::pread(fd, note, sizeof(note) - 1, 0) : -1;
    ::close(fd);
    if (error != EWOULDBLOCK) return PosixError("locking", path, error);
    const std::string who(note, n > 0 ? static_cast<size_t>(n) : 0);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is locked by ", who.empty() ? std::string("another process") : who));
  }
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const int error = errno;
    ::close(fd);
    return PosixError("writing the holder into the lock file", path, error);
  }
  return std::unique_ptr<FileLock>(new PosixFileLock(fd));
}

absl::Status PosixEnv::ProbeLock(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? absl::OkStatus() : PosixError("opening the lock file", path, errno);
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
    ::close(fd);  // Releases the shared lock.
    return absl::OkStatus();
  }
  const int error = errno;
  char note[512];
  const ssize_t n = error == EWOULDBLOCK ? ::pread(fd, note, sizeof(note) - 1, 0) : -1;
  ::close(fd);
  if (error != EWOULDBLOCK) return PosixError("probing the lock of", path, error);
  const std::string who(note, n > 0 ? static_cast<size_t>(n) : 0);
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is locked by ", who.empty() ? std::string("another process") : who));
}

}  // namespace

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv();
  return env;
}

absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path, uint64_t max_bytes) {
  HYREC_ASSIGN_OR_RETURN(const uint64_t size, env->GetFileSize(path));
  if (size > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' holds ", size, " bytes, over the limit of ", max_bytes));
  }
  HYREC_ASSIGN_OR_RETURN(auto file, env->NewSequentialFile(path));
  std::string data(size + 1, '\0');  // One byte more: a file that grew since its size was read.
  HYREC_ASSIGN_OR_RETURN(const size_t got, file->Read(data.data(), data.size()));
  if (got > size) return absl::FailedPreconditionError(absl::StrCat("'", path, "' grew while it was read"));
  data.resize(got);
  return data;
}

absl::StatusOr<std::unique_ptr<FileLock>> LockFileWithin(Env* env, const std::string& path, absl::string_view what,
                                                         absl::Duration wait) {
  char host[256] = {};
  (void)::gethostname(host, sizeof(host) - 1);
  const std::string holder = absl::StrCat(what, what.empty() ? "" : ": ", "pid ", ::getpid(), " on ", host, " since ",
                                          absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone()));
  const absl::Time deadline = absl::Now() + wait;
  for (;;) {
    absl::StatusOr<std::unique_ptr<FileLock>> lock = env->LockFile(path, holder);
    if (lock.ok() || !absl::IsFailedPrecondition(lock.status()) || absl::Now() >= deadline) return lock;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

uint64_t RandomId() {
  std::random_device device;
  const uint64_t id =
      (static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return id | 1;
}

absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view data, bool sync_dir) {
  const std::string tmp = path + ".tmp";
  HYREC_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
  absl::Status status = file->Append(data);
  if (status.ok()) status = file->Sync();
  const absl::Status closed = file->Close();
  if (status.ok()) status = closed;
  if (status.ok()) status = env->RenameFile(tmp, path);
  if (!status.ok()) {
    (void)env->DeleteFile(tmp);
    return status;
  }
  return sync_dir ? env->SyncDir(DirName(path)) : absl::OkStatus();
}

absl::Status DeleteDirAndFiles(Env* env, const std::string& dir) {
  HYREC_ASSIGN_OR_RETURN(const std::vector<std::string> names, env->GetChildren(dir));
  for (const std::string& name : names) HYREC_RETURN_IF_ERROR(env->DeleteFile(JoinPath(dir, name)));
  return env->DeleteDir(dir);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty() || (!name.empty() && name[0] == '/')) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace hyrec
