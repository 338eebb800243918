// Liveness of a role under a launcher: with --heartbeat_file, a thread of the role touches the
// file every second, and `hyrec train --processes` kills a child whose file has not been touched
// within its watchdog timeout (a stopped or frozen process), failing the job as transient.
#ifndef HYREC_SRC_CLI_HEARTBEAT_H_
#define HYREC_SRC_CLI_HEARTBEAT_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "hyrec/common/flags.h"

namespace hyrec::cli {

inline void AddHeartbeatFlag(FlagSet& flags, std::string* path) {
  flags.String("heartbeat_file", path, "FILE",
               "Touch FILE every second while running (a launcher's watchdog reads it); empty: none.");
}

class Heartbeat {
 public:
  explicit Heartbeat(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    Touch();
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) Touch();
    });
  }
  ~Heartbeat() {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void Touch() {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ::futimens(fd, nullptr);
    ::close(fd);
  }

  const std::string path_;
  absl::Notification stop_;
  std::thread thread_;
};

// Seconds since `path` was last touched; a negative number when it cannot be read.
inline double SecondsSinceTouched(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  const absl::Time touched = absl::TimeFromTimespec(st.st_mtim);
  return absl::ToDoubleSeconds(absl::Now() - touched);
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_HEARTBEAT_H_
