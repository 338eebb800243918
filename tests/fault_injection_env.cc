#include "fault_injection_env.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

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

void FaultInjectionEnv::NoteCreated(const std::string& path) {
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

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  HYREC_RETURN_IF_ERROR(Check(kCreate, path));
  HYREC_ASSIGN_OR_RETURN(auto base, base_->NewWritableFile(path));
  NoteCreated(path);
  return std::unique_ptr<WritableFile>(new FaultInjectionFile(this, path, std::move(base)));
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewLogFile(const std::string& path) {
  HYREC_RETURN_IF_ERROR(Check(kCreate, path));
  HYREC_ASSIGN_OR_RETURN(auto base, base_->NewLogFile(path));
  NoteCreated(path);
  return std::unique_ptr<WritableFile>(new FaultInjectionFile(this, path, std::move(base)));
}

namespace {

// A lock of the FaultInjectionEnv: its base lock lives in a slot the Env can empty.
class FaultInjectionLock final : public FileLock {
 public:
  FaultInjectionLock(absl::Mutex* mu, std::shared_ptr<std::unique_ptr<FileLock>> slot)
      : mu_(mu), slot_(std::move(slot)) {}
  ~FaultInjectionLock() override {
    absl::MutexLock lock(mu_);
    slot_->reset();
  }

 private:
  absl::Mutex* const mu_;
  const std::shared_ptr<std::unique_ptr<FileLock>> slot_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileLock>> FaultInjectionEnv::LockFile(const std::string& path,
                                                                      absl::string_view holder) {
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<FileLock> base, base_->LockFile(path, holder));
  auto slot = std::make_shared<std::unique_ptr<FileLock>>(std::move(base));
  absl::MutexLock lock(&mu_);
  locks_.push_back(slot);
  return std::unique_ptr<FileLock>(new FaultInjectionLock(&mu_, std::move(slot)));
}

absl::Status FaultInjectionEnv::TruncateFile(const std::string& path, uint64_t size) {
  HYREC_RETURN_IF_ERROR(base_->TruncateFile(path, size));
  absl::MutexLock lock(&mu_);
  for (auto& [p, synced] : synced_) {
    if (p == path) synced = std::min(synced, size);
  }
  return absl::OkStatus();
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
    for (const auto& slot : locks_) slot->reset();  // The crashed process holds nothing.
    locks_.clear();
  }
  for (const auto& [path, length] : synced) {
    if (!base_->FileExists(path)) continue;
    HYREC_RETURN_IF_ERROR(base_->TruncateFile(path, length));
  }
  for (const std::string& path : entries) {
    if (base_->FileExists(path)) HYREC_RETURN_IF_ERROR(base_->DeleteFile(path));
  }
  return absl::OkStatus();
}

}  // namespace hyrec
