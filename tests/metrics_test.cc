// The Prometheus registry's text format and the HTTP endpoint serving it.
#include <sys/socket.h>

#include <vector>

#include "absl/time/clock.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "http_get.h"
#include "hyrec/common/metrics.h"
#include "hyrec/common/metrics_server.h"

namespace hyrec {
namespace {

TEST(Metrics, RendersTheTextExpositionFormat) {
  MetricsRegistry m;
  m.Describe("hyrec_rows", MetricType::kGauge, "Rows held.\nSecond line");
  m.Set("hyrec_rows", {{"table", "b"}}, 7);
  m.Set("hyrec_rows", {{"table", "a\"x\\y"}}, 1.5);
  m.Describe("hyrec_seen_total", MetricType::kCounter, "Seen.");
  m.Add("hyrec_seen_total", {}, 2);
  m.Add("hyrec_seen_total", {}, 3);
  m.Describe("hyrec_latency_seconds", MetricType::kSummary, "Latency.");
  m.SetSummary("hyrec_latency_seconds", {{"worker", "0"}}, 0.25, 10);
  m.Set("bad name", {}, 1);  // Invalid names are never rendered.
  m.Describe("hyrec_empty", MetricType::kGauge, "No samples: not rendered.");
  EXPECT_EQ(m.Get("hyrec_seen_total", {}), 5);
  EXPECT_EQ(m.Get("hyrec_missing", {}, -1), -1);
  EXPECT_EQ(m.Render(),
            "# HELP hyrec_latency_seconds Latency.\n"
            "# TYPE hyrec_latency_seconds summary\n"
            "hyrec_latency_seconds_count{worker=\"0\"} 10\n"
            "hyrec_latency_seconds_sum{worker=\"0\"} 0.25\n"
            "# HELP hyrec_rows Rows held.\\nSecond line\n"
            "# TYPE hyrec_rows gauge\n"
            "hyrec_rows{table=\"a\\\"x\\\\y\"} 1.5\n"
            "hyrec_rows{table=\"b\"} 7\n"
            "# HELP hyrec_seen_total Seen.\n"
            "# TYPE hyrec_seen_total counter\n"
            "hyrec_seen_total 5\n");
  EXPECT_TRUE(MetricsRegistry::ValidName("a_b:c9"));
  EXPECT_FALSE(MetricsRegistry::ValidName("9a"));
  EXPECT_FALSE(MetricsRegistry::ValidName("a-b"));
}

TEST(Metrics, CollectorsRunAtEveryRender) {
  MetricsRegistry m;
  int reads = 0;
  m.AddCollector([&reads](MetricsRegistry* r) { r->Set("hyrec_reads", {}, ++reads); });
  EXPECT_EQ(m.Render(), "hyrec_reads 1\n");
  EXPECT_EQ(m.Render(), "hyrec_reads 2\n");
  EXPECT_EQ(m.Get("hyrec_reads", {}), 2);  // Get reads what the last collection set.
}

TEST(MetricsHttpServer, ServesTheRegistryAndRefusesOtherPaths) {
  MetricsRegistry m;
  m.Set("hyrec_up", {}, 1);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &m);
  if (absl::IsUnimplemented(server.status())) GTEST_SKIP() << server.status();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  HttpResponse r = HttpGet((*server)->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hyrec_up 1\n");
  m.Set("hyrec_up", {}, 0);  // Every scrape renders afresh.
  EXPECT_EQ(HttpGet((*server)->port(), "/metrics").body, "hyrec_up 0\n");
  EXPECT_EQ(HttpGet((*server)->port(), "/other").status, 404);

  // A taken port is an error naming it, not a crash.
  auto second = MetricsHttpServer::Start("127.0.0.1", (*server)->port(), &m);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_NE(second.status().message().find(std::to_string((*server)->port())), std::string::npos);
  EXPECT_FALSE(MetricsHttpServer::Start("127.0.0.1", 70000, &m).ok());

  const int port = (*server)->port();
  (*server)->Stop();
  EXPECT_EQ(HttpGet(port, "/metrics").status, 0);  // Stopped: nobody answers.
}

TEST(MetricsHttpServer, SlowClientsDoNotKeepAScrapeWaiting) {
  MetricsRegistry m;
  m.Describe("hyrec_up", MetricType::kGauge, "Up.");
  m.Set("hyrec_up", {}, 1);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &m);
  ASSERT_TRUE(server.ok()) << server.status();
  // 64 clients that connect, send half a request line and then nothing.
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(send(fd, "GET /metr", 9, 0), 9);
    slow.push_back(fd);
  }
  const absl::Time start = absl::Now();
  const HttpResponse r = HttpGet((*server)->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Seconds(1)));  // Not held by the slow clients.
  for (int fd : slow) close(fd);
}

TEST(MetricsHttpServer, CheckpointRequestsAreAuthorizedBeforeTheyRun) {
  MetricsRegistry m;
  int runs = 0;
  AdminAction action;
  action.run = [&runs] {
    ++runs;
    return std::string("cut\n");
  };
  action.authorize = [](const std::string& authorization) {
    if (authorization.empty()) return absl::UnauthenticatedError("no token");
    if (authorization != "Bearer admin") return absl::PermissionDeniedError("not admin");
    return absl::OkStatus();
  };
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &m, action);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_EQ(HttpRequest(port, "POST", "/checkpoint").status, 401);
  EXPECT_EQ(HttpRequest(port, "POST", "/checkpoint", "Authorization: Bearer worker\r\n").status, 403);
  EXPECT_EQ(runs, 0);
  const HttpResponse ok = HttpRequest(port, "POST", "/checkpoint", "Authorization: Bearer admin\r\n");
  EXPECT_EQ(ok.status, 202);
  EXPECT_EQ(ok.body, "cut\n");
  EXPECT_EQ(runs, 1);
  // Without a Content-Length (a POST with no body, as `curl -X POST` sends it): the same answers.
  const HttpResponse refused = HttpRequest(port, "POST", "/checkpoint", "", /*content_length=*/false);
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(refused.body, "no token\n");
  EXPECT_EQ(HttpRequest(port, "POST", "/checkpoint", "Authorization: Bearer admin\r\n", false).status, 202);
  EXPECT_EQ(runs, 2);
  auto without = MetricsHttpServer::Start("127.0.0.1", 0, &m);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(HttpRequest((*without)->port(), "POST", "/checkpoint").status, 404);
}

}  // namespace
}  // namespace hyrec
