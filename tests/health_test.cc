// The grpc.health.v1 endpoint Kubernetes probes (hyrec/common/health.h): NOT_SERVING until the
// role says it is ready, plaintext, and a taken port is an error.
#include "hyrec/common/health.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace hyrec {
namespace {

TEST(Health, NotServingUntilReadyAndAgainWhenStopping) {
  auto health = HealthServer::Start(HealthOptions{"127.0.0.1", 0});
  ASSERT_TRUE(health.ok()) << health.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*health)->port());
  absl::Status before = CheckHealth(address, 5);
  EXPECT_TRUE(absl::IsUnavailable(before)) << before;
  EXPECT_NE(before.message().find("NOT_SERVING"), std::string::npos) << before;
  (*health)->SetServing(true);
  EXPECT_TRUE(CheckHealth(address, 5).ok());
  (*health)->SetServing(false);
  EXPECT_FALSE(CheckHealth(address, 5).ok());
}

TEST(Health, ATakenPortIsAnErrorAndNobodyAnsweringIsUnavailable) {
  auto first = HealthServer::Start(HealthOptions{"127.0.0.1", 0});
  ASSERT_TRUE(first.ok());
  auto second = HealthServer::Start(HealthOptions{"127.0.0.1", (*first)->port()});
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("--health_port"), std::string::npos) << second.status();
  const int port = (*first)->port();
  first->reset();
  EXPECT_TRUE(absl::IsUnavailable(CheckHealth(absl::StrCat("127.0.0.1:", port), 1)));
}

}  // namespace
}  // namespace hyrec
