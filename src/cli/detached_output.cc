#include "src/cli/detached_output.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <iostream>
#include <streambuf>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace hyrec::cli {
namespace {

std::atomic<uint64_t> g_dropped{0};

// A stream buffer whose complete lines (and whatever a flush asks for) go to a bounded queue;
// a thread writes the queue to `fd` with blocking writes. Writers never wait for the fd.
class QueuedBuf final : public std::streambuf {
 public:
  QueuedBuf(int fd, uint64_t max_bytes) : fd_(fd), max_bytes_(max_bytes) {
    std::thread([this] { Write(); }).detach();  // Lives as long as the process: never joined.
  }

  // Waits until everything handed over was written, or `deadline`; returns the lines still
  // unwritten then.
  uint64_t Drain(absl::Time deadline) {
    Push(/*all=*/true);
    absl::MutexLock lock(&mu_);
    const auto empty = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return queue_.empty() && !writing_; };
    if (mu_.AwaitWithDeadline(absl::Condition(&empty), deadline)) return 0;
    uint64_t lines = writing_ ? 1 : 0;
    for (const std::string& chunk : queue_) lines += std::count(chunk.begin(), chunk.end(), '\n');
    return lines;
  }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    xsputn(&ch, 1);
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    absl::MutexLock lock(&mu_);
    pending_.append(s, static_cast<size_t>(n));
    PushLocked(/*all=*/false);
    return n;
  }
  int sync() override {
    Push(/*all=*/true);
    return 0;
  }

 private:
  void Push(bool all) {
    absl::MutexLock lock(&mu_);
    PushLocked(all);
  }
  // Moves the complete lines of pending_ (all of it with `all`) to the queue, or drops them
  // when the queue is full.
  void PushLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t end = all ? pending_.size() : pending_.rfind('\n') + 1;  // npos + 1 == 0.
    if (end == 0) return;
    if (queued_bytes_ + end > max_bytes_) {
      uint64_t lines = 0;
      for (size_t i = 0; i < end; ++i) lines += pending_[i] == '\n';
      g_dropped.fetch_add(lines > 0 ? lines : 1, std::memory_order_relaxed);
    } else {
      queue_.push_back(pending_.substr(0, end));
      queued_bytes_ += end;
    }
    pending_.erase(0, end);
  }

  void Write() {
    for (;;) {
      std::string chunk;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<std::string>* q) { return !q->empty(); }, &queue_));
        chunk = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      }
      for (size_t at = 0; at < chunk.size();) {  // Blocks while no one reads: only this thread.
        const ssize_t n = ::write(fd_, chunk.data() + at, chunk.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // A closed reader: the rest of the chunk is lost, as a write would lose it.
        at += static_cast<size_t>(n);
      }
      absl::MutexLock lock(&mu_);
      queued_bytes_ -= chunk.size();
      writing_ = false;
    }
  }

  const int fd_;
  const uint64_t max_bytes_;
  absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);  // Written, not yet a whole line.
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // In queue_ and in the chunk being written.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
};

QueuedBuf* g_out = nullptr;
QueuedBuf* g_err = nullptr;

}  // namespace

void DetachedOutput::Install(uint64_t queue_bytes) {
  if (g_out != nullptr) return;
  std::cout.flush();
  std::cerr.flush();
  g_out = new QueuedBuf(STDOUT_FILENO, queue_bytes);  // Never deleted: the threads outlive main.
  g_err = new QueuedBuf(STDERR_FILENO, queue_bytes);
  std::cout.rdbuf(g_out);
  std::cerr.rdbuf(g_err);
}

void DetachedOutput::Finish(absl::Duration wait) {
  if (g_out == nullptr) return;
  const absl::Time deadline = absl::Now() + wait;
  const uint64_t unwritten = g_out->Drain(deadline);
  if (const uint64_t lost = dropped_lines() + unwritten; lost > 0) {
    std::cerr << absl::StrCat("hyrec train: ", lost,
                              " line(s) of output were dropped: stdout or stderr was not being read")
              << std::endl;
  }
  g_err->Drain(deadline);
}

uint64_t DetachedOutput::dropped_lines() { return g_dropped.load(std::memory_order_relaxed); }

}  // namespace hyrec::cli
