// Training from a Kafka topic (librdkafka's mock cluster in this process, the real protocol on
// loopback): `hyrec train`, embedded and with --processes, trains the records of a stream with an
// end (bounded, end_time) once each and checkpoints; a resume from its last checkpoint has nothing left; a missing
// topic and brokers that do not answer stop the job at its start with their exit codes, named; and a follower (`hyrec
// predict --follow`) started before the job serves strictly newer models as it trains, and ends scoring exactly as
// `hyrec predict` on the final export.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

// A job on `topic`, whose end is `end` (a loader.source.kafka key and value).
std::string WriteJob(const std::string& name, const std::string& brokers, const std::string& topic,
                     const std::string& dir, const std::string& extra = "", const std::string& end = "bounded: true") {
  const std::string path = ::testing::TempDir() + "/" + name + ".yaml";
  std::ofstream(path) << absl::StrCat(
      "loader:\n  source:\n    format: criteo\n    kafka: {brokers: '", brokers, "', topic: ", topic,
      ", group: hyrec-test, ", end, ", connect_timeout_seconds: 5, linger_ms: 20}\n",
      "  batch_size: 64\n  threads: 1\n  shuffle_window: 256\n",
      "model: {kind: dlrm, embedding_dim: 4, bottom: [8], top: [8]}\n", "ps: {shards: 2}\n",
      "train: {workers: 2, log_every_batches: 2}\n", "eval: {progressive_window: 512}\n", "checkpoint: {dir: ", dir,
      "/ckpt, every_steps: 4}\n", extra);
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

// Embedded, the stream ends where the topic ended at the start (bounded); with --processes, at
// an end_time that the record of id 768 is stamped with (the records after it are not trained).
TEST_P(StreamTrain, AStreamWithAnEndTrainsEveryRecordOnceAndResumesWithNothingLeft) {
  const bool processes = GetParam();
  MockKafka kafka;
  Produce(kafka, 1024);  // 16 batches of 64: 8 steps of 2 workers.
  const std::string dir = ::testing::TempDir() + (processes ? "/stream_processes" : "/stream_embedded");
  std::filesystem::remove_all(dir);
  const std::string end =
      processes ? absl::StrCat("end_time: '",
                               absl::FormatTime(absl::RFC3339_full, absl::FromUnixMillis(1700000000000 + 1000 * 768),
                                                absl::UTCTimeZone()),
                               "'")
                : "bounded: true";
  const std::string samples = processes ? "768" : "1024";
  const std::string job = WriteJob(processes ? "stream_p" : "stream_e", kafka.brokers(), "clicks", dir, "", end);
  const std::string report = dir + "_report.yaml";
  std::vector<std::string> argv = {HYREC_TRAIN_BINARY, "--config=" + job, "--plot=", "--report=" + report,
                                   "--progress=lines"};
  if (processes) argv.push_back("--processes");
  hyrec::testing::CommandResult r = RunCommand(argv);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), samples) << r.all();
  EXPECT_FALSE(ReportField(report, "checkpoint").empty()) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "progressive AUC")) << "each batch scored before it trains: " << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "freshness ")) << "event-time freshness: " << r.all();
  // The group heard of the checkpoints: each partition's committed offset is where the last
  // checkpoint's earliest window starts, so the offsets are at most a window (256 records)
  // behind what the job trained, and within the partitions.
  const std::map<int32_t, int64_t> committed = kafka.Committed("hyrec-test", "clicks", 3);
  ASSERT_EQ(committed.size(), 3u);
  int64_t behind = processes ? 768 : 1024;
  for (const auto& [p, offset] : committed) {
    EXPECT_GE(offset, 0) << "partition " << p;
    EXPECT_LE(offset, 342) << "partition " << p;
    behind -= offset;
  }
  EXPECT_LE(behind, 256) << "the committed offsets are a window behind the trained records at most";

  argv.push_back("--resume=latest");
  r = RunCommand(argv);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), samples) << "nothing left to train: " << r.all();
}

INSTANTIATE_TEST_SUITE_P(EmbeddedAndProcesses, StreamTrain, ::testing::Bool());

TEST(StreamFollow, AFollowerServesNewerModelsAsTheJobTrainsAndEndsOnTheFinalExport) {
  MockKafka kafka;
  Produce(kafka, 1024);
  const std::string dir = ::testing::TempDir() + "/stream_follow";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string job = WriteJob("stream_follow", kafka.brokers(), "clicks", dir,
                                   "export: {dir: " + dir + "/model, delta_every_steps: 1, base_every_deltas: 3}\n");
  // The follower reads its requests from a fifo, and starts before the job has any model.
  const std::string fifo = dir + "/requests";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::signal(SIGPIPE, SIG_IGN);  // A follower that died is an error below, not the test's end.
  SpawnOptions options;
  options.capture_stderr = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> follower = Subprocess::Spawn(
      {"/bin/sh", "-c",
       absl::StrCat("exec ", HYREC_PREDICT_BINARY, " --model=", dir, "/model --follow --poll_ms=20 < ", fifo)},
      options);
  ASSERT_TRUE(follower.ok()) << follower.status();
  const int requests = ::open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(requests, 0);
  absl::Mutex mu;
  std::vector<uint64_t> steps;  // Of each model the follower announced.
  std::string said;
  std::thread watch([&] {
    for (;;) {
      absl::StatusOr<std::string> line = (*follower)->ReadErrorLine(absl::Minutes(5));
      if (!line.ok()) return;
      absl::MutexLock lock(&mu);
      absl::StrAppend(&said, *line, "\n");
      uint64_t step = 0;
      const std::vector<std::string> words = absl::StrSplit(*line, ' ');
      if (words.size() > 2 && words[0] == "model" && words[1] == "step" && absl::SimpleAtoi(words[2], &step)) {
        steps.push_back(step);
      }
    }
  });
  hyrec::testing::CommandResult r =
      RunCommand({HYREC_TRAIN_BINARY, "--config=" + job, "--plot=", "--processes", "--progress=lines"});
  ASSERT_EQ(r.code, 0) << r.all();
  // 16 batches of 64 on 2 workers: the final export is of step 8.
  auto announced_final = [&] {
    absl::MutexLock lock(&mu);
    return !steps.empty() && steps.back() == 8;
  };
  for (int i = 0; i < 3000 && !announced_final(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    absl::MutexLock lock(&mu);
    ASSERT_FALSE(steps.empty()) << said;
    EXPECT_EQ(steps.back(), 8u) << said;
    for (size_t i = 1; i < steps.size(); ++i) EXPECT_GT(steps[i], steps[i - 1]) << said;
  }
  // Requests: the final model's scores, as `hyrec predict` gives them on the final export.
  const std::string input = dir + "/requests.tsv";
  std::string lines;
  for (int id = 2000; id < 2064; ++id) absl::StrAppend(&lines, hyrec::testing::CriteoRecord(id), "\n");
  std::ofstream(input) << lines;
  ASSERT_EQ(::write(requests, lines.data(), lines.size()), static_cast<ssize_t>(lines.size()));
  ::close(requests);
  std::vector<std::string> served;
  for (absl::StatusOr<std::string> line; (line = (*follower)->ReadLine(absl::Seconds(60))).ok();) {
    served.push_back(*line);
  }
  absl::StatusOr<int> code = (*follower)->Wait(absl::Seconds(30));
  watch.join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << said;
  std::string newest;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/model")) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "model-") && name > newest) newest = name;
  }
  ASSERT_EQ(newest.substr(0, 19), "model-000000000008-");
  hyrec::testing::CommandResult predicted =
      RunCommand({HYREC_PREDICT_BINARY, "--model=" + dir + "/model/" + newest, "--input=" + input});
  ASSERT_EQ(predicted.code, 0) << predicted.all();
  EXPECT_EQ(served, std::vector<std::string>(absl::StrSplit(absl::StripSuffix(predicted.out, "\n"), '\n')));
  EXPECT_EQ(served.size(), 64u);
}

// `hyrec predict --follow`'s flags: what it does not take is refused by name (exit 2) before it
// waits for any model.
TEST(StreamFollow, BadFlagsAreRefusedByName) {
  const std::string root = ::testing::TempDir() + "/stream_follow_flags";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  std::ofstream(root + "/MANIFEST") << "not read: its presence makes the directory one export";
  const std::string models = "--model=" + root + "/models";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--follow"}, "--model=DIR"},
      {{models, "--follow", "--input=x.tsv"}, "--input is not taken"},
      {{models, "--follow", "--keep=I1"}, "--keep is not taken"},
      {{models, "--follow", "--nodeltas"}, "--nodeltas is not taken"},
      {{models, "--follow", "--poll_ms=0"}, "--poll_ms"},
      {{"--model=" + root, "--follow"}, "is one export"},
  };
  for (const auto& [flags, said] : cases) {
    std::vector<std::string> argv = {HYREC_PREDICT_BINARY};
    argv.insert(argv.end(), flags.begin(), flags.end());
    hyrec::testing::CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.code, 2) << r.all();
    EXPECT_TRUE(absl::StrContains(r.err, said)) << said << ": " << r.all();
  }
}

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
