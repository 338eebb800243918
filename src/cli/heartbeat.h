// Liveness of a role under a launcher: with --heartbeat_file, a thread of the role touches the
// file every second, and `hyrec train --processes` kills a child whose file has not been touched
// within its watchdog timeout (a stopped or frozen process), failing the job as transient.
#ifndef HYREC_SRC_CLI_HEARTBEAT_H_
#define HYREC_SRC_CLI_HEARTBEAT_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "hyrec/common/flags.h"
#include "src/cli/periodic_task.h"

namespace hyrec::cli {

inline void AddHeartbeatFlag(FlagSet& flags, std::string* path) {
  flags.String("heartbeat_file", path, "FILE",
               "Touch FILE every second while running (a launcher's watchdog reads it); empty: none.");
}

class Heartbeat {
 public:
  explicit Heartbeat(std::string path)
      : path_(std::move(path)),
        beat_(
            absl::Seconds(1), path_.empty() ? std::function<void()>() : [this] { Touch(); }) {
    if (!path_.empty()) Touch();
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  // Sets the file's times without a descriptor (a process out of them still beats); creates it
  // when missing. A failure is said once (to stderr, which the launcher shows), not every second.
  void Touch() {
    if (::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0) == 0) return;
    int error = errno;
    if (error == ENOENT) {
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      if (fd >= 0) {
        ::close(fd);
        return;
      }
      error = errno;
    }
    if (!warned_.exchange(true)) {
      std::fprintf(stderr, "cannot touch the heartbeat file %s: %s (the launcher's watchdog will see it stale)\n",
                   path_.c_str(), std::strerror(error));
    }
  }

  const std::string path_;
  std::atomic<bool> warned_{false};  // The constructor's touch may overlap the first beat.
  PeriodicTask beat_;                // Last: it stops before the members it touches go.
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
