// FaultInjectionEnv: an Env for tests that fails chosen operations and forgets what was never
// synced.
#ifndef HYREC_TESTS_FAULT_INJECTION_ENV_H_
#define HYREC_TESTS_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/env.h"

namespace hyrec {

// An Env over another that fails chosen operations and can forget what was never synced, so
// tests see what a crash or a full disk leaves behind without crashing.
//
//   FaultInjectionEnv env(Env::Default());
//   env.FailAfter(FaultInjectionEnv::kSync, 2);   // the third Sync fails with DATA_LOSS
//   ... write a checkpoint through &env: it fails, the previous one is intact ...
//   env.DropUnsyncedData();                        // what a power loss would leave
class FaultInjectionEnv final : public Env {
 public:
  enum Op { kAppend, kSync, kRename, kSyncDir, kCreate, kNumOps };
  explicit FaultInjectionEnv(Env* base) : base_(base) {}

  // The (n+1)-th call of `op` from now, and every one after it, fails (kAppend fails as a full
  // disk: RESOURCE_EXHAUSTED; the others with DATA_LOSS/UNAVAILABLE). n < 0: never. count >= 0:
  // only that many calls fail; the ones after succeed again (a disk that got room back).
  void FailAfter(Op op, int64_t n, int64_t count = -1);
  // Stops failing anything.
  void Heal();
  // Truncates every file written through this Env to its last synced length, and removes the
  // files created (or renamed into place) after the last SyncDir of their directory. Releases
  // every lock taken through it.
  absl::Status DropUnsyncedData();
  int64_t calls(Op op) const;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewLogFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    return base_->NewSequentialFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status SyncFile(const std::string& path) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::Status DeleteFile(const std::string& path) override { return base_->DeleteFile(path); }
  absl::Status DeleteDir(const std::string& dir) override { return base_->DeleteDir(dir); }
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return base_->GetChildren(dir);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override { return base_->GetFileSize(path); }
  absl::Status TruncateFile(const std::string& path, uint64_t size) override;
  // The base Env's lock, which DropUnsyncedData releases: a crash leaves no process to hold it.
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path, absl::string_view holder) override;
  absl::Status ProbeLock(const std::string& path) override { return base_->ProbeLock(path); }

  // Called by this Env's files.
  absl::Status Check(Op op, const std::string& path);
  void NoteSynced(const std::string& path, uint64_t length);

 private:
  // Registers a file created through this Env (synced length 0, its entry not yet synced).
  void NoteCreated(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  Env* const base_;
  mutable absl::Mutex mu_;
  int64_t calls_[kNumOps] ABSL_GUARDED_BY(mu_) = {};
  int64_t fail_at_[kNumOps] ABSL_GUARDED_BY(mu_) = {-1, -1, -1, -1, -1};
  int64_t fail_until_[kNumOps] ABSL_GUARDED_BY(mu_) = {-1, -1, -1, -1, -1};  // -1: no end.
  // Per file written: its synced length.
  std::vector<std::pair<std::string, uint64_t>> synced_ ABSL_GUARDED_BY(mu_);
  // Entries created or renamed into a directory since its last SyncDir.
  std::vector<std::string> unsynced_entries_ ABSL_GUARDED_BY(mu_);
  // The base locks of the FileLocks handed out; DropUnsyncedData releases them.
  std::vector<std::shared_ptr<std::unique_ptr<FileLock>>> locks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hyrec

#endif  // HYREC_TESTS_FAULT_INJECTION_ENV_H_
