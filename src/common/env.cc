#include "hyrec/common/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
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
};

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Wraps a file of the FaultInjectionEnv: counts its length, consults the Env before each call.
class FaultInjectionFile final : public WritableFile {
 public:
  FaultInjectionFile(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status Append(absl::string_view data) override {
    HYREC_RETURN_IF_ERROR(env_->Check(FaultInjectionEnv::kAppend, path_));
    HYREC_RETURN_IF_ERROR(base_->Append(data));
    length_ += data.size();
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    HYREC_RETURN_IF_ERROR(env_->Check(FaultInjectionEnv::kSync, path_));
    HYREC_RETURN_IF_ERROR(base_->Sync());
    env_->NoteSynced(path_, length_);
    return absl::OkStatus();
  }
  absl::Status Close() override { return base_->Close(); }

 private:
  FaultInjectionEnv* const env_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
  uint64_t length_ = 0;
};

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

// ---- FaultInjectionEnv ----

void FaultInjectionEnv::FailAfter(Op op, int64_t n, int64_t count) {
  absl::MutexLock lock(&mu_);
  fail_at_[op] = n < 0 ? -1 : calls_[op] + n;
  fail_until_[op] = n < 0 || count < 0 ? -1 : fail_at_[op] + count;
}

void FaultInjectionEnv::Heal() {
  absl::MutexLock lock(&mu_);
  for (int64_t& f : fail_at_) f = -1;
}

int64_t FaultInjectionEnv::calls(Op op) const {
  absl::MutexLock lock(&mu_);
  return calls_[op];
}

absl::Status FaultInjectionEnv::Check(Op op, const std::string& path) {
  absl::MutexLock lock(&mu_);
  const int64_t call = calls_[op]++;
  if (fail_at_[op] < 0 || call < fail_at_[op]) return absl::OkStatus();
  if (fail_until_[op] >= 0 && call >= fail_until_[op]) return absl::OkStatus();
  static constexpr const char* kNames[] = {"append", "sync", "rename", "directory sync", "create"};
  const std::string message = absl::StrCat("injected ", kNames[op], " failure on '", path, "'");
  if (op == kAppend) return absl::ResourceExhaustedError(absl::StrCat(message, " (no space left on device)"));
  return absl::DataLossError(message);
}

void FaultInjectionEnv::NoteSynced(const std::string& path, uint64_t length) {
  absl::MutexLock lock(&mu_);
  for (auto& [p, synced] : synced_) {
    if (p == path) {
      synced = length;
      return;
    }
  }
  synced_.emplace_back(path, length);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  HYREC_RETURN_IF_ERROR(Check(kCreate, path));
  HYREC_ASSIGN_OR_RETURN(auto base, base_->NewWritableFile(path));
  {
    absl::MutexLock lock(&mu_);
    bool known = false;
    for (auto& [p, synced] : synced_) {
      if (p == path) {
        synced = 0;
        known = true;
      }
    }
    if (!known) synced_.emplace_back(path, 0);
    unsynced_entries_.push_back(path);
  }
  return std::unique_ptr<WritableFile>(new FaultInjectionFile(this, path, std::move(base)));
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  HYREC_RETURN_IF_ERROR(Check(kRename, from));
  HYREC_RETURN_IF_ERROR(base_->RenameFile(from, to));
  absl::MutexLock lock(&mu_);
  for (auto& [p, synced] : synced_) {
    if (p == from) p = to;
  }
  for (std::string& e : unsynced_entries_) {
    if (e == from) e = to;
  }
  unsynced_entries_.push_back(to);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  HYREC_RETURN_IF_ERROR(Check(kSyncDir, dir));
  HYREC_RETURN_IF_ERROR(base_->SyncDir(dir));
  absl::MutexLock lock(&mu_);
  unsynced_entries_.erase(std::remove_if(unsynced_entries_.begin(), unsynced_entries_.end(),
                                         [&](const std::string& e) { return DirName(e) == dir; }),
                          unsynced_entries_.end());
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::SyncFile(const std::string& path) {
  HYREC_RETURN_IF_ERROR(Check(kSync, path));
  HYREC_RETURN_IF_ERROR(base_->SyncFile(path));
  HYREC_ASSIGN_OR_RETURN(const uint64_t size, base_->GetFileSize(path));
  NoteSynced(path, size);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::CreateDirs(const std::string& dir) {
  HYREC_RETURN_IF_ERROR(Check(kCreate, dir));
  return base_->CreateDirs(dir);
}

absl::Status FaultInjectionEnv::DropUnsyncedData() {
  std::vector<std::pair<std::string, uint64_t>> synced;
  std::vector<std::string> entries;
  {
    absl::MutexLock lock(&mu_);
    synced = synced_;
    entries = unsynced_entries_;
    unsynced_entries_.clear();
  }
  for (const auto& [path, length] : synced) {
    if (!base_->FileExists(path)) continue;
    if (::truncate(path.c_str(), static_cast<off_t>(length)) != 0) return PosixError("truncating", path, errno);
  }
  for (const std::string& path : entries) {
    if (base_->FileExists(path)) HYREC_RETURN_IF_ERROR(base_->DeleteFile(path));
  }
  return absl::OkStatus();
}

}  // namespace hyrec
