// KafkaReader and the loader's Kafka source against librdkafka's mock cluster (the real protocol
// on loopback): every record once and in offset order, partitions split between members,
// resuming from a cut's offsets, offsets committed to the group only when asked, broker errors
// ridden out, and bad settings, missing topics, unreachable brokers and deleted offsets refused
// clearly; the loader's workers get every record once across a stop and a resume from their
// positions, with the records' times.
#include "src/data_loader/kafka_reader.h"

#include "hyrec/data_loader/loader.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "kafka_mock.h"
#include "kafka_proxy.h"

namespace hyrec::data_loader {
namespace {

using hyrec::testing::MockKafka;

constexpr int kFetchApiKey = 1;  // Kafka's Fetch request.

KafkaOptions Options(const MockKafka& kafka, const std::string& topic) {
  KafkaOptions o;
  o.brokers = kafka.brokers();
  o.topic = topic;
  o.group = "hyrec-test";
  o.connect_timeout = absl::Seconds(20);
  return o;
}

// `per_partition` records in each of `partitions`, valued "p<partition>-<i>".
void Fill(MockKafka& kafka, const std::string& topic, int partitions, int per_partition) {
  ASSERT_TRUE(kafka.CreateTopic(topic, partitions));
  for (int i = 0; i < per_partition; ++i) {
    for (int p = 0; p < partitions; ++p) {
      ASSERT_TRUE(kafka.Produce(topic, p, absl::StrCat("p", p, "-", i), 1700000000000 + i));
    }
  }
  ASSERT_TRUE(kafka.Flush());
}

// Polls until `want` records came or 30 s passed.
std::vector<KafkaRecord> ReadN(KafkaReader& reader, size_t want) {
  std::vector<KafkaRecord> out;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (out.size() < want && absl::Now() < deadline) {
    const absl::Status s = reader.Poll(&out, want - out.size(), absl::Milliseconds(200));
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
  }
  return out;
}

// Each partition's records are offsets 0.. in order with the values Fill wrote.
void ExpectInOrder(const std::vector<KafkaRecord>& records, std::map<int32_t, int64_t> next) {
  for (const KafkaRecord& r : records) {
    ASSERT_EQ(r.offset, next[r.partition]) << "partition " << r.partition;
    EXPECT_EQ(r.value, absl::StrCat("p", r.partition, "-", r.offset));
    EXPECT_EQ(r.timestamp_ms, 1700000000000 + r.offset);
    ++next[r.partition];
  }
}

TEST(KafkaReader, ReadsEveryRecordOnceInOffsetOrder) {
  MockKafka kafka;
  Fill(kafka, "clicks", 3, 100);
  auto reader = KafkaReader::Open(Options(kafka, "clicks"), 0, 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->partitions(), (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE((*reader)->Seek({}).ok());
  std::vector<KafkaRecord> got = ReadN(**reader, 300);
  ASSERT_EQ(got.size(), 300u);
  ExpectInOrder(got, {});
  std::vector<KafkaRecord> more;
  ASSERT_TRUE((*reader)->Poll(&more, 10, absl::Milliseconds(300)).ok());
  EXPECT_TRUE(more.empty()) << "nothing was read twice";
  EXPECT_EQ((*reader)->positions(), (PartitionOffsets{{0, 100}, {1, 100}, {2, 100}}));
  absl::StatusOr<int64_t> lag = (*reader)->Lag();
  ASSERT_TRUE(lag.ok()) << lag.status();
  EXPECT_EQ(*lag, 0);
}

TEST(KafkaReader, MembersShareThePartitionsWithoutOverlap) {
  MockKafka kafka;
  Fill(kafka, "clicks", 3, 40);
  auto a = KafkaReader::Open(Options(kafka, "clicks"), 0, 2);
  auto b = KafkaReader::Open(Options(kafka, "clicks"), 1, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->partitions(), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ((*b)->partitions(), (std::vector<int32_t>{1}));
  ASSERT_TRUE((*a)->Seek({}).ok());
  ASSERT_TRUE((*b)->Seek({}).ok());
  std::vector<KafkaRecord> ra = ReadN(**a, 80), rb = ReadN(**b, 40);
  ASSERT_EQ(ra.size(), 80u);
  ASSERT_EQ(rb.size(), 40u);
  for (const KafkaRecord& r : ra) EXPECT_NE(r.partition, 1);
  for (const KafkaRecord& r : rb) EXPECT_EQ(r.partition, 1);
  ExpectInOrder(ra, {});
  ExpectInOrder(rb, {});
}

// A reader started at a cut's positions reads exactly the records after them; the group's
// committed offsets play no part, and change only when Commit is called.
TEST(KafkaReader, ResumesAtTheCutsOffsetsAndCommitsOnlyWhenAsked) {
  MockKafka kafka;
  Fill(kafka, "clicks", 2, 50);
  PartitionOffsets cut;
  {
    auto first = KafkaReader::Open(Options(kafka, "clicks"), 0, 1);
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->Seek({}).ok());
    ASSERT_EQ(ReadN(**first, 30).size(), 30u);
    cut = (*first)->positions();
    int64_t read = 0;
    for (const auto& [p, offset] : cut) read += offset;
    EXPECT_EQ(read, 30);
    ASSERT_EQ(ReadN(**first, 20).size(), 20u);             // Read past the cut: a crash loses these.
    ASSERT_TRUE((*first)->Commit({{0, 1}, {1, 1}}).ok());  // An older cut's, committed.
  }
  auto again = KafkaReader::Open(Options(kafka, "clicks"), 0, 1);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Seek(cut).ok());
  std::vector<KafkaRecord> rest = ReadN(**again, 70);
  ASSERT_EQ(rest.size(), 70u);
  ExpectInOrder(rest, std::map<int32_t, int64_t>(cut.begin(), cut.end()));
  absl::StatusOr<int64_t> lag = (*again)->Lag();
  ASSERT_TRUE(lag.ok());
  EXPECT_EQ(*lag, 0);
  EXPECT_TRUE((*again)->Commit((*again)->positions()).ok());
}

TEST(KafkaReader, BrokerErrorsWhileFetchingAreRiddenOut) {
  MockKafka kafka;
  Fill(kafka, "clicks", 2, 60);
  rd_kafka_mock_push_request_errors(kafka.cluster(), kFetchApiKey, 4, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH);
  auto reader = KafkaReader::Open(Options(kafka, "clicks"), 0, 1);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->Seek({}).ok());
  std::vector<KafkaRecord> got = ReadN(**reader, 120);
  ASSERT_EQ(got.size(), 120u);
  ExpectInOrder(got, {});
}

TEST(KafkaReader, OffsetsOutsideThePartitionAreDataLoss) {
  MockKafka kafka;
  Fill(kafka, "clicks", 2, 5);
  auto reader = KafkaReader::Open(Options(kafka, "clicks"), 0, 1);
  ASSERT_TRUE(reader.ok());
  const absl::Status ahead = (*reader)->Seek({{0, 2}, {1, 9}});
  EXPECT_EQ(ahead.code(), absl::StatusCode::kDataLoss) << ahead;
  EXPECT_TRUE(absl::StrContains(ahead.message(), "partition 1")) << ahead;
  EXPECT_TRUE(absl::StrContains(ahead.message(), "0 to 5")) << ahead;
  const absl::Status behind = (*reader)->Seek({{0, -7}});
  EXPECT_EQ(behind.code(), absl::StatusCode::kDataLoss) << behind;
}

// The mock cluster creates any topic it is asked about; a cluster that does not (the default
// of a production one, and what the reader asks for) answers as set here.
TEST(KafkaReader, AMissingTopicIsNotFoundNamingIt) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 1));
  rd_kafka_mock_topic_set_error(kafka.cluster(), "no-such-topic", RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  KafkaOptions o = Options(kafka, "no-such-topic");
  o.connect_timeout = absl::Seconds(3);
  auto reader = KafkaReader::Open(o, 0, 1);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound) << reader.status();
  EXPECT_TRUE(absl::StrContains(reader.status().message(), "'no-such-topic'")) << reader.status();
}

TEST(KafkaReader, UnreachableBrokersAreUnavailableWithinTheTimeout) {
  KafkaOptions o;
  o.brokers = absl::StrCat("127.0.0.1:", hyrec::PickFreeLoopbackPort());  // Nobody listens.
  o.topic = "clicks";
  o.group = "g";
  o.connect_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto reader = KafkaReader::Open(o, 0, 1);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kUnavailable) << reader.status();
  EXPECT_TRUE(absl::StrContains(reader.status().message(), o.brokers)) << reader.status();
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(o.connect_timeout));
}

TEST(KafkaReader, BadSettingsAndMembersAreRefusedByName) {
  KafkaOptions o;
  o.brokers = "127.0.0.1:1";
  o.topic = "clicks";
  o.group = "g";
  o.properties["security.protocol"] = "carrier-pigeon";
  auto bad = KafkaReader::Open(o, 0, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "'security.protocol'")) << bad.status();
  o.properties.clear();
  EXPECT_EQ(KafkaReader::Open(o, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  o.group.clear();
  EXPECT_TRUE(absl::StrContains(KafkaReader::Open(o, 0, 1).status().message(), "group"));
}

LoaderOptions StreamLoader(const MockKafka& kafka) {
  LoaderOptions o;
  o.source.format = Format::kCriteo;
  o.source.kafka = Options(kafka, "clicks");
  o.source.kafka->linger = absl::Milliseconds(50);
  o.source.keep = {"I1"};
  o.batch_size = 32;
  o.num_workers = 2;
  o.shuffle_window = 128;
  o.num_shards = 2;
  return o;
}

// Reads worker streams in turn until `total` ids were seen (or 30 s passed), at most
// `per_worker` batches each; fails on an id seen twice.
void ReadIds(Loader& loader, std::set<std::string>* seen, size_t total, size_t per_worker, uint64_t* newest_time) {
  std::vector<size_t> read(2, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (seen->size() < total && absl::Now() < deadline && (read[0] < per_worker || read[1] < per_worker)) {
    for (int w = 0; w < 2; ++w) {
      if (read[w] >= per_worker) continue;
      Batch b;
      const absl::Status s = loader.stream(w)->Next(&b, absl::Seconds(30));
      ASSERT_TRUE(s.ok()) << s;
      ++read[w];
      EXPECT_EQ(b.batch_id % 2, static_cast<uint64_t>(w));
      *newest_time = std::max(*newest_time, b.data_time);
      for (const std::string& id : b.kept) EXPECT_TRUE(seen->insert(id).second) << "record " << id << " twice";
    }
  }
}

TEST(KafkaLoader, WorkersGetEveryRecordOnceAcrossAStopAndAResume) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 3));
  const int records = 640;  // 20 batches of 32.
  for (int id = 0; id < records; ++id) {
    ASSERT_TRUE(kafka.Produce("clicks", id % 3, hyrec::testing::CriteoRecord(id), 1700000000000 + 1000 * int64_t{id}));
  }
  ASSERT_TRUE(kafka.Flush());
  std::set<std::string> seen;
  uint64_t newest = 0;
  std::vector<ReaderPosition> positions;
  {
    auto loader = Loader::Start(StreamLoader(kafka), {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    ReadIds(**loader, &seen, records, 3, &newest);  // 6 of the 20 batches; more are read ahead.
    ASSERT_EQ(seen.size(), 6u * 32);
    for (int w = 0; w < 2; ++w) positions.push_back((*loader)->stream(w)->Position());
    EXPECT_FALSE(positions[0].partitions.empty()) << positions[0].DebugString();
    // Consumer lag, as asked at some window: the records not yet in a window (whole batches).
    const int64_t lag = (*loader)->Stats().stream_lag;
    EXPECT_GE(lag, 0);
    EXPECT_LE(lag, records - 32);
    EXPECT_EQ(lag % 32, 0) << lag;
  }
  auto resumed = Loader::Start(StreamLoader(kafka), positions);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ReadIds(**resumed, &seen, records, records, &newest);
  EXPECT_EQ(seen.size(), static_cast<size_t>(records)) << "every record once";
  EXPECT_EQ(newest, 1700000000u + records - 1) << "the batches carry the records' times";
}

// Reads both workers' streams in turn until each ends; returns how one ended (OUT_OF_RANGE: the
// end of the stream). Adds the ids read to `seen` (failing on one seen twice) and counts samples.
absl::Status ReadToEnd(Loader& loader, std::set<std::string>* seen, uint64_t* samples) {
  absl::Status end;
  for (bool open = true; open;) {
    open = false;
    for (int w = 0; w < 2; ++w) {
      Batch b;
      const absl::Status s = loader.stream(w)->Next(&b, absl::Seconds(30));
      if (!s.ok()) {
        end = s;
        continue;
      }
      open = true;
      if (samples != nullptr) *samples += b.batch_size;
      if (seen == nullptr) continue;
      for (const std::string& id : b.kept) EXPECT_TRUE(seen->insert(id).second) << "record " << id << " twice";
    }
  }
  return end;
}

// end_offsets: each partition's records before its offset, and then the end; a partition it does
// not name stops the loader at its start, named.
TEST(KafkaLoader, EndOffsetsEndEachPartitionWhereTheyName) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 3));
  for (int id = 0; id < 600; ++id) {  // Record id: partition id % 3, offset id / 3.
    ASSERT_TRUE(kafka.Produce("clicks", id % 3, hyrec::testing::CriteoRecord(id), 1700000000000 + id));
  }
  ASSERT_TRUE(kafka.Flush());
  const std::map<int32_t, int64_t> ends = {{0, 150}, {1, 77}, {2, 0}};
  std::set<std::string> want;
  for (int id = 0; id < 600; ++id) {
    if (id / 3 < ends.at(id % 3)) want.insert(absl::StrCat(id));
  }
  LoaderOptions o = StreamLoader(kafka);
  o.source.kafka->end_offsets = ends;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::set<std::string> seen;
  const absl::Status end = ReadToEnd(**loader, &seen, nullptr);
  EXPECT_TRUE(absl::IsOutOfRange(end)) << end;
  EXPECT_EQ(seen, want);

  o.source.kafka->end_offsets.erase(1);
  auto refused = Loader::Start(o, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), "end_offsets names no end for partition 1 of topic 'clicks'"))
      << refused.status();
}

// end_time: a partition ends before its first record stamped at or after end_time, in offset
// order (a later record stamped earlier is not read); a partition without one (a quiet
// partition, an empty one) ends once the clock is past end_time; a resumed loader ends where the
// first would have.
TEST(KafkaLoader, EndTimeEndsEachPartitionAtItsFirstRecordAtOrAfterIt) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 3));
  const int64_t t = absl::ToUnixMillis(absl::Now() + absl::Seconds(3));
  const absl::Time end_time = absl::FromUnixMillis(t);  // The records' resolution.
  std::set<std::string> want;
  // Partition 0: 300 records stamped before end_time, 50 at or after it, then one stamped before
  // it again (late). Partition 1: 100 records, all before. Partition 2: none.
  int id = 0;
  for (int i = 0; i < 300; ++i, ++id) {
    ASSERT_TRUE(kafka.Produce("clicks", 0, hyrec::testing::CriteoRecord(id), t - 300000 + 1000 * i));
    want.insert(absl::StrCat(id));
  }
  for (int i = 0; i < 50; ++i, ++id) ASSERT_TRUE(kafka.Produce("clicks", 0, hyrec::testing::CriteoRecord(id), t + i));
  ASSERT_TRUE(kafka.Produce("clicks", 0, hyrec::testing::CriteoRecord(id++), t - 1));
  for (int i = 0; i < 100; ++i, ++id) {
    ASSERT_TRUE(kafka.Produce("clicks", 1, hyrec::testing::CriteoRecord(id), t - 200000 + 1000 * i));
    want.insert(absl::StrCat(id));
  }
  ASSERT_TRUE(kafka.Flush());
  LoaderOptions o = StreamLoader(kafka);
  o.source.kafka->end_time = end_time;
  std::set<std::string> seen;
  std::vector<ReaderPosition> positions;
  {
    auto loader = Loader::Start(o, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    uint64_t newest = 0;
    ReadIds(**loader, &seen, want.size(), 3, &newest);
    ASSERT_EQ(seen.size(), 6u * 32);
    for (int w = 0; w < 2; ++w) positions.push_back((*loader)->stream(w)->Position());
  }
  auto resumed = Loader::Start(o, positions);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const absl::Status end = ReadToEnd(**resumed, &seen, nullptr);
  EXPECT_TRUE(absl::IsOutOfRange(end)) << end;
  EXPECT_GE(absl::Now(), end_time) << "partitions 1 and 2 end only once the clock is past end_time";
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), seen.begin(), seen.end(), std::back_inserter(missing));
  std::set_difference(seen.begin(), seen.end(), want.begin(), want.end(), std::back_inserter(extra));
  EXPECT_TRUE(missing.empty() && extra.empty())
      << "not read: " << absl::StrJoin(missing, " ") << "; read past the end: " << absl::StrJoin(extra, " ");
}

// The partitions that `positions` name.
std::set<int32_t> Partitions(const std::vector<ReaderPosition>& positions) {
  std::set<int32_t> named;
  for (const ReaderPosition& p : positions) {
    for (const PartitionRange& r : p.partitions) named.insert(r.partition);
  }
  return named;
}

// A partition added to the topic while the loader runs is found (within the loader's 10 s
// metadata refresh) and read from its first record, every record once, and a loader resumed
// from positions that name it reads on where they say. The mock cluster cannot add partitions,
// so the topic has four from the start and a protocol proxy shows clients two, then four.
TEST(KafkaLoader, APartitionAddedWhileRunningIsRead) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 4));
  hyrec::testing::KafkaPartitionProxy proxy(kafka.brokers(), "clicks", 2);
  int id = 0;
  auto produce = [&](std::vector<int> partitions, int records) {
    for (int i = 0; i < records; ++i, ++id) {
      ASSERT_TRUE(kafka.Produce("clicks", partitions[i % partitions.size()], hyrec::testing::CriteoRecord(id),
                                1700000000000 + id));
    }
    ASSERT_TRUE(kafka.Flush());
  };
  produce({0, 1}, 320);
  LoaderOptions o = StreamLoader(kafka);
  o.source.kafka->brokers = proxy.address();
  std::set<std::string> seen;
  uint64_t newest = 0;
  std::vector<ReaderPosition> positions;
  {
    auto loader = Loader::Start(o, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    ReadIds(**loader, &seen, 320, 5, &newest);
    ASSERT_EQ(seen.size(), 320u);
    ASSERT_EQ(Partitions({(*loader)->stream(0)->Position()}), (std::set<int32_t>{0, 1})) << "the topic shows two";
    proxy.ShowPartitions(4);
    produce({2, 3}, 320);
    ReadIds(**loader, &seen, 640, 10, &newest);
    ASSERT_EQ(seen.size(), 640u) << "the records of the added partitions";
    for (int w = 0; w < 2; ++w) positions.push_back((*loader)->stream(w)->Position());
  }
  EXPECT_EQ(Partitions(positions), (std::set<int32_t>{0, 1, 2, 3}));
  produce({0, 1, 2, 3}, 256);
  auto resumed = Loader::Start(o, positions);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ReadIds(**resumed, &seen, 896, 8, &newest);
  EXPECT_EQ(seen.size(), 896u) << "every record once";
}

// Malformed records are counted and skipped within max_bad_fraction, named by topic, partition
// and offset; beyond it the streams fail with DATA_LOSS naming them.
TEST(KafkaLoader, MalformedRecordsAreCountedAndBounded) {
  for (const int every : {20, 2}) {
    SCOPED_TRACE(absl::StrCat("one record in ", every, " malformed"));
    MockKafka kafka;
    ASSERT_TRUE(kafka.CreateTopic("clicks", 1));
    const int records = 640;
    int good = 0;
    for (int id = 0; id < records; ++id) {
      const bool bad = id % every == every - 1;
      good += bad ? 0 : 1;
      ASSERT_TRUE(kafka.Produce("clicks", 0, bad ? "not a criteo line" : hyrec::testing::CriteoRecord(id)));
    }
    ASSERT_TRUE(kafka.Flush());
    LoaderOptions o = StreamLoader(kafka);
    o.source.kafka->bounded = true;
    o.max_bad_fraction = 0.1;
    o.min_lines_for_bad_check = 100;
    auto loader = Loader::Start(o, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    uint64_t samples = 0;
    const absl::Status end = ReadToEnd(**loader, nullptr, &samples);
    if (every == 20) {
      EXPECT_TRUE(absl::IsOutOfRange(end)) << end;
      EXPECT_EQ(samples, static_cast<uint64_t>(good));
      const LoaderStats stats = (*loader)->Stats();
      EXPECT_EQ(stats.bad_lines, static_cast<uint64_t>(records - good));
      ASSERT_FALSE(stats.first_bad.empty());
      // Named by topic, partition and offset: one of the malformed ones (offsets 19, 39, ...).
      const size_t at = stats.first_bad[0].find("clicks[0]@");
      ASSERT_NE(at, std::string::npos) << stats.first_bad[0];
      int offset = -1;
      ASSERT_TRUE(absl::SimpleAtoi(stats.first_bad[0].substr(at + 10, stats.first_bad[0].find(':') - at - 10), &offset))
          << stats.first_bad[0];
      EXPECT_EQ(offset % 20, 19) << stats.first_bad[0];
    } else {
      EXPECT_TRUE(absl::IsDataLoss(end)) << end;
      EXPECT_TRUE(absl::StrContains(end.message(), "clicks[0]@")) << end;
    }
  }
}

TEST(KafkaLoader, AStreamSourceIsCheckedAtStart) {
  MockKafka kafka;
  ASSERT_TRUE(kafka.CreateTopic("clicks", 1));
  LoaderOptions o = StreamLoader(kafka);
  o.source.files = {"day_0.gz"};
  EXPECT_EQ(Loader::Start(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = StreamLoader(kafka);
  o.epochs = 3;
  EXPECT_EQ(Loader::Start(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = StreamLoader(kafka);
  o.source.kafka->brokers = absl::StrCat("127.0.0.1:", hyrec::PickFreeLoopbackPort());
  o.source.kafka->connect_timeout = absl::Seconds(1);
  EXPECT_EQ(Loader::Start(o, {}).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hyrec::data_loader
