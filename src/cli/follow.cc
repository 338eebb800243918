#include "src/cli/follow.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/dense_worker/follower.h"

namespace hyrec::cli {
namespace {

constexpr size_t kMaxLinesAtOnce = 4096;

// Standard input's lines as they arrive.
class InputLines {
 public:
  // Appends the complete lines available within `wait` (none when nothing came); at the end of
  // the input its last line, unterminated, too.
  absl::Status Read(absl::Duration wait, std::vector<std::string>* lines) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait)));
    if (ready < 0 && errno != EINTR) return absl::UnavailableError(absl::StrCat("stdin: ", std::strerror(errno)));
    if (ready <= 0) return absl::OkStatus();
    char buf[1 << 16];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return absl::UnavailableError(absl::StrCat("stdin: ", std::strerror(errno)));
    }
    if (n == 0) {
      eof_ = true;
      if (!pending_.empty()) lines->push_back(std::move(pending_));
      pending_.clear();
      return absl::OkStatus();
    }
    if (n > 0) pending_.append(buf, n);
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines->emplace_back(absl::StripSuffix(absl::string_view(pending_).substr(start, nl - start), "\r"));
    }
    pending_.erase(0, start);
    return absl::OkStatus();
  }
  bool eof() const { return eof_; }

 private:
  std::string pending_;
  bool eof_ = false;
};

void Announce(const dense_worker::Follower::Model& m) {
  std::cerr << "model step " << m.step << " delta " << m.delta_sequence << " ("
            << (m.base.empty() ? std::string("no base") : m.base) << ", +" << m.deltas << " deltas)" << std::endl;
}

// Polls the root on its own thread until stopped or refused.
class Poller {
 public:
  Poller(dense_worker::Follower* follower, absl::Duration every) : follower_(follower), every_(every) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Poller() {
    stop_.Notify();
    thread_.join();
  }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Run() {
    while (!stop_.WaitForNotificationWithTimeout(every_)) {
      absl::StatusOr<bool> changed = follower_->Poll();
      if (!changed.ok()) {
        absl::MutexLock lock(&mu_);
        error_ = changed.status();
        return;
      }
      if (*changed) Announce(*follower_->model());
    }
  }

  dense_worker::Follower* const follower_;
  const absl::Duration every_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace

absl::Status Follow(const FollowOptions& options) {
  // A follower may start before the job's first base export: it waits for it.
  absl::StatusOr<std::unique_ptr<dense_worker::Follower>> started;
  for (bool said = false;; said = true) {
    started = dense_worker::Follower::Start(options.export_root);
    if (!absl::IsNotFound(started.status())) break;
    if (!said) std::cerr << "waiting for the first export under " << options.export_root << std::endl;
    absl::SleepFor(options.poll);
  }
  HYREC_RETURN_IF_ERROR(started.status());
  std::unique_ptr<dense_worker::Follower> follower = *std::move(started);
  Announce(*follower->model());
  std::ofstream file;
  if (!options.output.empty()) file.open(options.output);
  std::ostream& out = options.output.empty() ? std::cout : file;
  const bool wants_header =
      follower->model()->predictor->plan().loader.options.source.format == data_loader::Format::kCsv &&
      follower->model()->predictor->plan().loader.options.source.csv.header;
  std::optional<data_loader::SourceConfig> source;
  if (!wants_header) {
    HYREC_ASSIGN_OR_RETURN(source, follower->model()->predictor->LineSource(""));
  }
  Poller poller(follower.get(), options.poll);
  InputLines input;
  std::vector<std::string> lines;
  std::vector<float> logits;
  uint64_t scored = 0;
  while (!input.eof()) {
    HYREC_RETURN_IF_ERROR(poller.error());
    lines.clear();
    HYREC_RETURN_IF_ERROR(input.Read(absl::Milliseconds(100), &lines));
    // What else has arrived by now is scored with them.
    while (!input.eof() && !lines.empty() && lines.size() < kMaxLinesAtOnce) {
      const size_t had = lines.size();
      HYREC_RETURN_IF_ERROR(input.Read(absl::ZeroDuration(), &lines));
      if (lines.size() == had) break;
    }
    if (lines.empty()) continue;
    if (!source.has_value()) {
      HYREC_ASSIGN_OR_RETURN(source, follower->model()->predictor->LineSource(lines.front()));
      lines.erase(lines.begin());
    }
    const std::shared_ptr<const dense_worker::Follower::Model> model = follower->model();
    const absl::Status s = model->predictor->ScoreLines(*source, lines, &logits);
    if (!s.ok()) return Annotate(s, absl::StrCat("standard input, after line ", scored + (wants_header ? 1 : 0)));
    for (float l : logits) out << absl::StrFormat("%.9g\n", 1.0 / (1.0 + std::exp(-static_cast<double>(l))));
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write --output '", options.output, "'"));
    scored += lines.size();
  }
  std::cerr << scored << " samples scored" << std::endl;
  return poller.error();
}

}  // namespace hyrec::cli
