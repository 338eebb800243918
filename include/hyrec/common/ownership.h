// OwnershipEpoch: a role's claim on state that whoever plays the role shares through a volume (a
// PS shard's update log, the job's loader), held as a number in a file there: each new holder
// raises it, and a holder that finds it raised past its own has been replaced.
//
//   OwnershipOptions options;
//   options.path = "ckpt/loader/EPOCH";
//   options.what = "the job's loader (ckpt/loader/EPOCH)";
//   HYREC_ASSIGN_OR_RETURN(auto claim, OwnershipEpoch::Take(options));
//   absl::SleepFor(claim->UntilServeable());       // the former holder's lease runs out
//   ... before each answer: HYREC_RETURN_IF_ERROR(claim->CheckLease());
//
// Why an epoch and not a lock: file locks are local to a host, and shared volumes differ in what
// locks they carry between hosts; a holder cut off (or frozen) while it was replaced on another
// host still holds its lock there. Reading the file is what every volume supports.
//
// The lease: a holder answers only while it found the epoch its own within `lease` (CheckLease),
// and a new holder answers only `lease` after it raised the epoch (UntilServeable), so that no
// answer of a replaced holder comes from after its replacement began (both measured on each
// process's monotonic clock; their rates differ by far less than the lease).
#ifndef HYREC_COMMON_OWNERSHIP_H_
#define HYREC_COMMON_OWNERSHIP_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hyrec/common/env.h"

namespace hyrec {

struct OwnershipOptions {
  std::string path;  // The epoch's file (a decimal number and a newline); its directory must exist.
  std::string what;  // What it guards, for messages: "the update log ckpt/update-log/ps-0".
  absl::Duration lease = absl::Seconds(1);
  // Called once, on the thread that found it, when a check finds the epoch raised by another
  // holder (or the file unreadable as an epoch). Every later check fails. Empty: checks fail.
  std::function<void(const absl::Status&)> on_lost;
  Env* env = nullptr;  // nullptr: Env::Default().
};

class OwnershipEpoch {
 public:
  // Reads the epoch in options.path (0 when the file is missing), writes it raised by one
  // (atomically, synced) and holds it. DATA_LOSS when the file holds no epoch.
  static absl::StatusOr<std::unique_ptr<OwnershipEpoch>> Take(const OwnershipOptions& options);

  // Reads the file: OK while it holds this holder's epoch. FAILED_PRECONDITION "<what> was taken
  // over by another process (its epoch is N, this process's M)" once it does not (on_lost is
  // called then, once); every later call fails the same.
  absl::Status Check() const;
  // Whether a Check that began at most options.lease ago succeeded and none found the epoch lost
  // since (reads nothing).
  bool LeaseHeld() const;
  // OK when LeaseHeld; otherwise Check.
  absl::Status CheckLease() const { return LeaseHeld() ? absl::OkStatus() : Check(); }
  // How long this new holder must wait before it answers: until options.lease has passed since
  // Take raised the epoch (the former holder's lease has then run out).
  absl::Duration UntilServeable() const;

  uint64_t epoch() const { return epoch_; }

 private:
  explicit OwnershipEpoch(const OwnershipOptions& options);

  const OwnershipOptions options_;
  Env* const env_;
  uint64_t epoch_ = 0;
  std::chrono::steady_clock::time_point raised_at_;
  // When the latest successful Check began (steady clock, ns since its epoch); 0: none.
  mutable std::atomic<int64_t> owned_as_of_ns_{0};
  mutable absl::Mutex mu_;
  mutable absl::Status lost_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hyrec

#endif  // HYREC_COMMON_OWNERSHIP_H_
