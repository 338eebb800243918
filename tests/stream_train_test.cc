// Training from a Kafka topic (librdkafka's mock cluster in this process, the real protocol on
// loopback): `hyrec train`, embedded and with --processes, trains a bounded stream's records once
// each and checkpoints; a resume from its last checkpoint has nothing left; a missing topic and
// brokers that do not answer stop the job at its start with their exit codes, named.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/job/job_plan.h"
#include "kafka_mock.h"
#include "run_command.h"

namespace hyrec {
namespace {

using hyrec::testing::MockKafka;
using hyrec::testing::ReportField;
using hyrec::testing::RunCommand;

std::string WriteJob(const std::string& name, const std::string& brokers, const std::string& topic,
                     const std::string& dir) {
  const std::string path = ::testing::TempDir() + "/" + name + ".yaml";
  std::ofstream(path) << absl::StrCat(
      "loader:\n  source:\n    format: criteo\n    kafka: {brokers: '", brokers, "', topic: ", topic,
      ", group: hyrec-test, bounded: true, connect_timeout_seconds: 5, linger_ms: 20}\n",
      "  batch_size: 64\n  threads: 1\n  shuffle_window: 256\n",
      "model: {kind: dlrm, embedding_dim: 4, bottom: [8], top: [8]}\n", "ps: {shards: 2}\n",
      "train: {workers: 2, log_every_batches: 2}\n", "eval: {progressive_window: 512}\n", "checkpoint: {dir: ", dir,
      "/ckpt, every_steps: 4}\n");
  return path;
}

void Produce(MockKafka& kafka, int records) {
  ASSERT_TRUE(kafka.CreateTopic("clicks", 3));
  for (int id = 0; id < records; ++id) {
    ASSERT_TRUE(kafka.Produce("clicks", id % 3, hyrec::testing::CriteoRecord(id), 1700000000000 + 1000 * int64_t{id}));
  }
  ASSERT_TRUE(kafka.Flush());
}

class StreamTrain : public ::testing::TestWithParam<bool> {};

TEST_P(StreamTrain, ABoundedStreamTrainsEveryRecordOnceAndResumesWithNothingLeft) {
  const bool processes = GetParam();
  MockKafka kafka;
  Produce(kafka, 1024);  // 16 batches of 64: 8 steps of 2 workers.
  const std::string dir = ::testing::TempDir() + (processes ? "/stream_processes" : "/stream_embedded");
  std::filesystem::remove_all(dir);
  const std::string job = WriteJob(processes ? "stream_p" : "stream_e", kafka.brokers(), "clicks", dir);
  const std::string report = dir + "_report.yaml";
  std::vector<std::string> argv = {HYREC_TRAIN_BINARY, "--config=" + job, "--plot=", "--report=" + report,
                                   "--progress=lines"};
  if (processes) argv.push_back("--processes");
  hyrec::testing::CommandResult r = RunCommand(argv);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), "1024") << r.all();
  EXPECT_FALSE(ReportField(report, "checkpoint").empty()) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "progressive AUC")) << "each batch scored before it trains: " << r.all();
  // The group heard of the checkpoints: each partition's committed offset is where the last
  // checkpoint's earliest window starts, past the first window and within the partition.
  const std::map<int32_t, int64_t> committed = kafka.Committed("hyrec-test", "clicks", 3);
  ASSERT_EQ(committed.size(), 3u);
  for (const auto& [p, offset] : committed) {
    EXPECT_GT(offset, 0) << "partition " << p;
    EXPECT_LE(offset, 342) << "partition " << p;
  }

  argv.push_back("--resume=latest");
  r = RunCommand(argv);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), "1024") << "nothing left to train: " << r.all();
}

INSTANTIATE_TEST_SUITE_P(EmbeddedAndProcesses, StreamTrain, ::testing::Bool());

TEST(StreamTrainErrors, TheExampleStreamJobPlans) {
  absl::StatusOr<job::JobPlan> plan = job::PlanJobFile(HYREC_SOURCE_DIR "/examples/configs/stream.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->workers[0].stream.has_value());
  EXPECT_EQ(plan->workers[0].stream->topic, "clicks");
  EXPECT_FALSE(plan->workers[0].eval_loader.source.kafka.has_value()) << "held-out data is files";
}

TEST(StreamTrainErrors, AMissingTopicIsInvalidInputNamingItEmbeddedAndWithProcesses) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 1));
  rd_kafka_mock_topic_set_error(kafka.cluster(), "no-such-topic", RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  const std::string dir = ::testing::TempDir() + "/stream_missing";
  for (const bool processes : {false, true}) {
    std::filesystem::remove_all(dir);
    std::vector<std::string> argv = {
        HYREC_TRAIN_BINARY, "--config=" + WriteJob("stream_missing", kafka.brokers(), "no-such-topic", dir), "--plot="};
    if (processes) argv.push_back("--processes");
    const hyrec::testing::CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.code, 2) << "processes " << processes << ": " << r.all();
    EXPECT_TRUE(absl::StrContains(r.all(), "'no-such-topic'")) << r.all();
  }
}

TEST(StreamTrainErrors, BrokersThatDoNotAnswerAreTransientWithinTheTimeout) {
  const std::string brokers = absl::StrCat("127.0.0.1:", hyrec::PickFreeLoopbackPort());
  const std::string dir = ::testing::TempDir() + "/stream_silent";
  std::filesystem::remove_all(dir);
  const absl::Time start = absl::Now();
  const hyrec::testing::CommandResult r =
      RunCommand({HYREC_TRAIN_BINARY, "--config=" + WriteJob("stream_silent", brokers, "clicks", dir), "--plot="});
  EXPECT_EQ(r.code, 3) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), brokers)) << r.all();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5 + 60)) << "connect_timeout_seconds 5, plus the job's start";
}

}  // namespace
}  // namespace hyrec
