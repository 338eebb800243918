// LeaseWatch: while a role serves state it holds through an OwnershipEpoch (a PS shard's update
// log, the job's loader), checks the holding every half lease on a thread of its own, so that a
// process replaced while it was frozen or cut off (on another host that shares the volume) stops,
// through the epoch's on_lost, once it can read the volume again, even when no call reaches it.
#ifndef HYREC_SRC_CLI_LEASE_WATCH_H_
#define HYREC_SRC_CLI_LEASE_WATCH_H_

#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace hyrec::cli {

// The lease of the roles' holdings (OwnershipOptions::lease).
inline constexpr absl::Duration kOwnershipLease = absl::Seconds(1);

class LeaseWatch {
 public:
  // Calls `check` every kOwnershipLease / 2 until destroyed; an empty `check` starts nothing.
  explicit LeaseWatch(std::function<void()> check) : check_(std::move(check)) {
    if (!check_) return;
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(kOwnershipLease / 2)) check_();
    });
  }
  ~LeaseWatch() {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  LeaseWatch(const LeaseWatch&) = delete;
  LeaseWatch& operator=(const LeaseWatch&) = delete;

 private:
  const std::function<void()> check_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_LEASE_WATCH_H_
