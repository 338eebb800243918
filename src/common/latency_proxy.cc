#include "hyrec/common/latency_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hyrec {
namespace {

// One direction of one connection: bytes read from `from` are written to `to` after the delay.
class Pump {
 public:
  Pump(int from, int to, absl::Duration delay) : from_(from), to_(to), delay_(delay) {
    reader_ = std::thread([this] { Read(); });
    sender_ = std::thread([this] { Send(); });
  }
  ~Pump() {
    reader_.join();
    sender_.join();
  }

 private:
  struct Chunk {
    absl::Time due;
    std::string data;
  };

  void Read() {
    char buffer[64 * 1024];
    for (;;) {
      const ssize_t n = read(from_, buffer, sizeof(buffer));
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Chunk{absl::Now() + delay_, std::string(buffer, static_cast<size_t>(n))});
      cv_.notify_one();
    }
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_one();
  }

  void Send() {
    for (;;) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
        if (queue_.empty()) break;
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      const absl::Duration wait = chunk.due - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
      size_t sent = 0;
      while (sent < chunk.data.size()) {
        const ssize_t n = write(to_, chunk.data.data() + sent, chunk.data.size() - sent);
        if (n <= 0) {
          shutdown(from_, SHUT_RDWR);  // The other side is gone: stop reading too.
          return;
        }
        sent += static_cast<size_t>(n);
      }
    }
    shutdown(to_, SHUT_WR);
  }

  const int from_, to_;
  const absl::Duration delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  bool closed_ = false;
  std::thread reader_, sender_;
};

struct Connection {
  int client = -1;
  int server = -1;
  std::unique_ptr<Pump> up, down;
};

}  // namespace

struct LatencyProxy::Impl {
  int listen_fd = -1;
  int port = 0;
  sockaddr_in target{};
  absl::Duration delay;
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  std::mutex mu;
  std::vector<std::unique_ptr<Connection>> connections;

  void Accept() {
    for (;;) {
      const int client = accept(listen_fd, nullptr, nullptr);
      if (client < 0) {
        if (stopping) return;
        continue;
      }
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(server, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
        close(server);
        close(client);
        continue;
      }
      const int one = 1;
      setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Connection>();
      c->client = client;
      c->server = server;
      c->up = std::make_unique<Pump>(client, server, delay);
      c->down = std::make_unique<Pump>(server, client, delay);
      std::lock_guard<std::mutex> lock(mu);
      connections.push_back(std::move(c));
    }
  }
};

LatencyProxy::LatencyProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<LatencyProxy>> LatencyProxy::Start(const std::string& target_host, int target_port,
                                                                  absl::Duration one_way_delay) {
  auto impl = std::make_unique<Impl>();
  impl->delay = one_way_delay;
  impl->target.sin_family = AF_INET;
  impl->target.sin_port = htons(static_cast<uint16_t>(target_port));
  if (inet_pton(AF_INET, target_host.c_str(), &impl->target.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", target_host, "' is not an IPv4 address"));
  }
  impl->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(impl->listen_fd, 64) != 0 || getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(impl->listen_fd);
    return absl::UnavailableError(absl::StrCat("latency proxy cannot listen: ", std::strerror(errno)));
  }
  impl->port = ntohs(addr.sin_port);
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->Accept(); });
  return std::unique_ptr<LatencyProxy>(new LatencyProxy(std::move(impl)));
}

LatencyProxy::~LatencyProxy() {
  impl_->stopping = true;
  shutdown(impl_->listen_fd, SHUT_RDWR);
  close(impl_->listen_fd);
  impl_->acceptor.join();
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& c : impl_->connections) {
    shutdown(c->client, SHUT_RDWR);
    shutdown(c->server, SHUT_RDWR);
  }
  for (auto& c : impl_->connections) {
    c->up.reset();
    c->down.reset();
    close(c->client);
    close(c->server);
  }
}

int LatencyProxy::port() const { return impl_->port; }

}  // namespace hyrec
