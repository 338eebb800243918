#include "hyrec/common/latency_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace hyrec {
namespace {

// An echo server on an ephemeral loopback port, one connection.
struct EchoServer {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  std::thread thread;
  EchoServer() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd, 4);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    thread = std::thread([this] {
      const int c = accept(fd, nullptr, nullptr);
      char buffer[65536];
      for (ssize_t n; (n = read(c, buffer, sizeof(buffer))) > 0;) {
        if (write(c, buffer, n) != n) break;
      }
      close(c);
    });
  }
  ~EchoServer() {
    thread.join();
    close(fd);
  }
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

std::string RoundTrip(int fd, const std::string& message) {
  EXPECT_EQ(write(fd, message.data(), message.size()), static_cast<ssize_t>(message.size()));
  std::string reply;
  char buffer[65536];
  while (reply.size() < message.size()) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    reply.append(buffer, n);
  }
  return reply;
}

TEST(LatencyProxy, AddsTheDelayInBothDirectionsAndKeepsTheBytes) {
  EchoServer echo;
  auto proxy = LatencyProxy::Start("127.0.0.1", echo.port, absl::Milliseconds(10));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  const int fd = Connect((*proxy)->port());
  std::string big(200000, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  for (int round = 0; round < 3; ++round) {
    const absl::Time start = absl::Now();
    EXPECT_EQ(RoundTrip(fd, "ping"), "ping");
    const absl::Duration rtt = absl::Now() - start;
    EXPECT_GE(rtt, absl::Milliseconds(20));  // 10 ms each way; a loaded machine only adds to it.
  }
  EXPECT_EQ(RoundTrip(fd, big), big);
  close(fd);
}

TEST(LatencyProxy, RefusesABadTarget) { EXPECT_FALSE(LatencyProxy::Start("not-an-ip", 1, absl::Milliseconds(1)).ok()); }

}  // namespace
}  // namespace hyrec
