// PeriodicTask: runs a task every `period` on a thread of its own until destroyed (a role's
// heartbeat, its watch on what it holds).
#ifndef HYREC_SRC_CLI_PERIODIC_TASK_H_
#define HYREC_SRC_CLI_PERIODIC_TASK_H_

#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace hyrec::cli {

class PeriodicTask {
 public:
  // Calls `task` every `period` (the first after one period) until destroyed; an empty `task`
  // starts nothing. The destructor waits for a call in progress.
  PeriodicTask(absl::Duration period, std::function<void()> task) : task_(std::move(task)) {
    if (!task_) return;
    thread_ = std::thread([this, period] {
      while (!stop_.WaitForNotificationWithTimeout(period)) task_();
    });
  }
  ~PeriodicTask() {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

 private:
  const std::function<void()> task_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_PERIODIC_TASK_H_
