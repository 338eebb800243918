// The dense workers' rendezvous (src/nn_sync/rendezvous.h) over real gRPC on loopback: it binds
// the master address only, admits only the job's workers under mTLS, checks sizes before it
// stores anything, and every wait ends within its deadline.
#include "src/nn_sync/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "hyrec/common/certs.h"

namespace hyrec::nn_sync {
namespace {

namespace fs = std::filesystem;

std::string WriteCerts(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/rendezvous_test_" + name;
  fs::remove_all(dir);
  CertificateRequest request;
  request.dir = dir;
  request.identities = JobIdentities(/*workers=*/3, /*ps=*/1, /*loaders=*/1);
  const absl::Status written = WriteJobCertificates(request);
  EXPECT_TRUE(written.ok()) << written;
  return dir;
}

RendezvousOptions Options(const std::string& certs, const Identity& identity, int port = 0) {
  RendezvousOptions o;
  o.port = port;
  o.timeout = absl::Seconds(5);
  if (!certs.empty()) o.security = SecurityInDirectory(certs, identity);
  return o;
}

std::unique_ptr<Rendezvous> Host(const RendezvousOptions& options) {
  auto host = HostRendezvous(options);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *std::move(host) : nullptr;
}

std::unique_ptr<Rendezvous> Join(const RendezvousOptions& options) {
  auto joined = JoinRendezvous(options);
  EXPECT_TRUE(joined.ok()) << joined.status();
  return joined.ok() ? *std::move(joined) : nullptr;
}

TEST(Rendezvous, WorkersMeetUnderMtls) {
  const std::string certs = WriteCerts("meet");
  auto host = Host(Options(certs, {Role::kWorker, 0}));
  ASSERT_NE(host, nullptr);
  auto one = Join(Options(certs, {Role::kWorker, 1}, host->port()));
  auto two = Join(Options(certs, {Role::kWorker, 2}, host->port()));
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);

  // A Get waits for a key another worker sets later.
  absl::StatusOr<std::string> got;
  std::thread waiter([&] { got = one->Get("addr/2", absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(two->Set("addr/2", std::string("10.0.0.2\0:7", 11)).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("10.0.0.2\0:7", 11));

  ASSERT_TRUE(host->Set("addr/0", "x").ok());
  EXPECT_TRUE(two->Wait({"addr/0", "addr/2"}, absl::Seconds(5)).ok());
  EXPECT_EQ(*one->Add("count", 2), 2);
  EXPECT_EQ(*two->Add("count", 3), 5);
  EXPECT_EQ(*host->Get("count", absl::Seconds(1)), "5");
  EXPECT_TRUE(*one->Check({"addr/0", "addr/2", "count"}));
  EXPECT_FALSE(*one->Check({"addr/0", "addr/1"}));
  EXPECT_EQ(*two->NumKeys(), 3);
  EXPECT_TRUE(*one->Delete("addr/0"));
  EXPECT_FALSE(*one->Delete("addr/0"));
  EXPECT_EQ(*host->NumKeys(), 2);
}

TEST(Rendezvous, OnlyTheJobsWorkersAreAdmitted) {
  const std::string certs = WriteCerts("admitted");
  const std::string other_job = WriteCerts("other_job");
  auto host = Host(Options(certs, {Role::kWorker, 0}));
  ASSERT_NE(host, nullptr);
  const int port = host->port();

  for (const Identity& who : {Identity{Role::kLoader, 0}, Identity{Role::kPs, 0}, Identity{Role::kAdmin, 0}}) {
    auto stranger = Join(Options(certs, who, port));
    ASSERT_NE(stranger, nullptr);
    const absl::Status set = stranger->Set("hyrec/rendezvous/1", "1");
    EXPECT_TRUE(absl::IsPermissionDenied(set)) << IdentityName(who) << ": " << set;
    EXPECT_TRUE(absl::IsPermissionDenied(stranger->Get("anything", absl::Seconds(1)).status()));
  }
  RendezvousOptions wrong_ca = Options(other_job, {Role::kWorker, 1}, port);
  wrong_ca.timeout = absl::Seconds(1);
  auto forged = Join(wrong_ca);
  ASSERT_NE(forged, nullptr);
  EXPECT_FALSE(forged->Set("hyrec/rendezvous/1", "1").ok());
  RendezvousOptions plaintext = Options("", {}, port);
  plaintext.timeout = absl::Seconds(1);
  auto no_tls = Join(plaintext);
  ASSERT_NE(no_tls, nullptr);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(no_tls->Set("hyrec/rendezvous/1", "1").ok());
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(plaintext.timeout));

  EXPECT_EQ(*host->NumKeys(), 0);  // Nothing reached the table.
  auto worker = Join(Options(certs, {Role::kWorker, 1}, port));
  EXPECT_TRUE(worker->Set("hyrec/rendezvous/1", "1").ok());
  EXPECT_EQ(*host->NumKeys(), 1);
}

// Whether a plain TCP connection to address:port is accepted.
bool Accepts(const char* address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address, &addr.sin_addr);
  const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return connected;
}

TEST(Rendezvous, ListensOnTheMasterAddressOnlyAndATakenPortIsAnError) {
  RendezvousOptions options = Options("", {});
  options.host = "127.0.0.2";  // Loopback, but not the address every interface would answer on.
  auto host = Host(options);
  ASSERT_NE(host, nullptr);
  EXPECT_TRUE(Accepts("127.0.0.2", host->port()));
  EXPECT_FALSE(Accepts("127.0.0.1", host->port()));

  options.port = host->port();
  auto second = HostRendezvous(options);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "127.0.0.2")) << second.status();
}

TEST(Rendezvous, WaitsEndWithinTheirDeadline) {
  auto host = Host(Options("", {}));
  ASSERT_NE(host, nullptr);
  auto one = Join(Options("", {}, host->port()));
  ASSERT_NE(one, nullptr);
  absl::Time start = absl::Now();
  const absl::Status waited = one->Wait({"hyrec/rendezvous/0", "hyrec/rendezvous/5"}, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_TRUE(absl::StrContains(waited.message(), "hyrec/rendezvous/5")) << waited;
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Milliseconds(300)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(host->Get("never", absl::Milliseconds(100)).status()));

  // A host that never comes up: the call ends at its deadline.
  RendezvousOptions nobody = Options("", {}, host->port());
  host.reset();
  nobody.timeout = absl::Seconds(1);
  auto lonely = Join(nobody);
  ASSERT_NE(lonely, nullptr);
  start = absl::Now();
  EXPECT_FALSE(lonely->Set("k", "v").ok());
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(nobody.timeout));
}

// A rank that starts before worker 0 keeps trying to reach it at least every second, as
// TCPStore's clients do: gRPC's own reconnect backoff grows from 1 s by 1.6x (attempts about 0,
// 1, 2.6 and 5.2 s in), which would leave a late host unseen for longer and longer.
TEST(Rendezvous, ARankThatStartsBeforeTheHostRetriesAtLeastEverySecond) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  // Not a host yet: every connection is closed at once, as by a process that is still starting.
  RendezvousOptions options = Options("", {}, ntohs(addr.sin_port));
  options.timeout = absl::Seconds(6);
  auto early = Join(options);
  ASSERT_NE(early, nullptr);
  std::thread caller([&] { EXPECT_FALSE(early->Set("hyrec/rendezvous/1", "1").ok()); });
  int attempts = 0;
  const absl::Time end = absl::Now() + absl::Seconds(6);
  while (absl::Now() < end) {
    pollfd ready{listener, POLLIN, 0};
    if (::poll(&ready, 1, 100) == 1) {
      const int fd = ::accept(listener, nullptr, nullptr);
      if (fd >= 0) {
        ++attempts;
        ::close(fd);
      }
    }
  }
  caller.join();
  ::close(listener);
  EXPECT_GE(attempts, 7);
}

TEST(Rendezvous, AHostGoingAwayEndsTheWaitsOnIt) {
  auto host = Host(Options("", {}));
  ASSERT_NE(host, nullptr);
  auto one = Join(Options("", {}, host->port()));
  ASSERT_NE(one, nullptr);
  absl::Status waited;
  std::thread waiter([&] { waited = one->Wait({"never"}, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  host.reset();
  waiter.join();
  EXPECT_FALSE(waited.ok());
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Seconds(1)));  // Not the wait's 60 s.
}

TEST(Rendezvous, SizesAreCheckedBeforeAnythingIsStored) {
  RendezvousOptions options = Options("", {});
  options.limits.max_key_bytes = 64;
  options.limits.max_value_bytes = 1024;
  options.limits.max_total_bytes = 4096;
  options.limits.max_keys_per_call = 4;
  auto host = Host(options);
  ASSERT_NE(host, nullptr);
  RendezvousOptions client = Options("", {}, host->port());
  client.limits = options.limits;
  auto one = Join(client);
  ASSERT_NE(one, nullptr);

  EXPECT_TRUE(absl::IsInvalidArgument(one->Set(std::string(65, 'k'), "v")));
  EXPECT_TRUE(absl::IsInvalidArgument(one->Set("", "v")));
  EXPECT_TRUE(absl::IsInvalidArgument(one->Set("big", std::string(1025, 'v'))));
  EXPECT_TRUE(absl::IsInvalidArgument(one->Check({"a", "b", "c", "d", "e"}).status()));
  int stored = 0;
  absl::Status full;
  for (int i = 0; i < 100 && full.ok(); ++i) {
    full = one->Set("key" + std::to_string(i), std::string(1000, 'v'));
    if (full.ok()) ++stored;
  }
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_EQ(*host->NumKeys(), stored);
  EXPECT_LE(stored, 4);

  ASSERT_TRUE(one->Delete("key0").ok());
  ASSERT_TRUE(one->Set("text", "not a number").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(one->Add("text", 1).status()));
  ASSERT_TRUE(one->Add("n", INT64_MAX).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(one->Add("n", 1).status()));
  EXPECT_EQ(*one->Get("n", absl::Seconds(1)), std::to_string(INT64_MAX));
}

}  // namespace
}  // namespace hyrec::nn_sync
