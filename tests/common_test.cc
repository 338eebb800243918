#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "hyrec/common/crc32c.h"
#include "hyrec/common/enum_names.h"
#include "hyrec/common/env.h"
#include "hyrec/common/finite.h"
#include "hyrec/common/fp16.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/ownership.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/staleness_window.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/common/zipf.h"

namespace hyrec {
namespace {

TEST(EnvLogFile, WritesOnlyAtSyncInWholePaddedBlocksAndCloseCutsThePadding) {
  const std::string dir = ::testing::TempDir() + "/env_log_file";
  std::filesystem::remove_all(dir);
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirs(dir).ok());
  const std::string path = dir + "/log";
  auto file = env->NewLogFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string expected;
  for (int round = 0; round < 4; ++round) {
    // Records of awkward sizes, so that groups end inside blocks and cross them.
    const std::string record(1000 + 3001 * round, static_cast<char>('a' + round));
    ASSERT_TRUE((*file)->Append(record).ok());
    ASSERT_TRUE((*file)->Append("|").ok());
    expected += record + "|";
    EXPECT_LT(*env->GetFileSize(path), expected.size()) << "Append only buffers";
    ASSERT_TRUE((*file)->Sync().ok());
    const std::string on_disk = *ReadFileToString(env, path, 1 << 20);
    ASSERT_GE(on_disk.size(), expected.size());
    EXPECT_EQ(on_disk.substr(0, expected.size()), expected) << "round " << round;
    // Direct writes end at a block boundary, padded with zeros (buffered ones where the file
    // system refuses direct I/O, with no padding).
    EXPECT_TRUE(on_disk.size() == expected.size() ||
                (on_disk.size() % kLogFileBlock == 0 && on_disk.size() - expected.size() < kLogFileBlock))
        << on_disk.size();
    EXPECT_EQ(on_disk.find_first_not_of('\0', expected.size()), std::string::npos);
  }
  ASSERT_TRUE((*file)->Append("tail").ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*ReadFileToString(env, path, 1 << 20), expected + "tail") << "Close writes the rest, unpadded";
  ASSERT_TRUE(env->TruncateFile(path, 10).ok());
  EXPECT_EQ(*env->GetFileSize(path), 10u);
  std::filesystem::remove_all(dir);
}

// A probe sees a LockFile holder and names it, but not another probe: the shards of one job probe
// checkpoint.dir's LOCK at the same time, and none may take the others for a run.
TEST(EnvLock, AProbeSeesAHolderButNotAnotherProbe) {
  const std::string dir = ::testing::TempDir() + "/env_probe_lock";
  std::filesystem::remove_all(dir);
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirs(dir).ok());
  const std::string path = dir + "/LOCK";
  EXPECT_TRUE(env->ProbeLock(path).ok()) << "no file: nobody holds it";
  {
    auto held = env->LockFile(path, "a run of job 42");
    ASSERT_TRUE(held.ok()) << held.status();
    const absl::Status probe = env->ProbeLock(path);
    EXPECT_TRUE(absl::IsFailedPrecondition(probe)) << probe;
    EXPECT_NE(probe.message().find("a run of job 42"), absl::string_view::npos) << probe;
  }
  const int other = ::open(path.c_str(), O_RDONLY);  // Another probe, mid-probe.
  ASSERT_GE(other, 0);
  ASSERT_EQ(::flock(other, LOCK_SH | LOCK_NB), 0);
  EXPECT_TRUE(env->ProbeLock(path).ok()) << "probes do not see each other";
  EXPECT_TRUE(absl::IsFailedPrecondition(env->LockFile(path, "x").status())) << "a taker waits out a probe";
  ::close(other);
  EXPECT_EQ(*ReadFileToString(env, path, 100), "a run of job 42") << "probes write nothing";
  EXPECT_TRUE(env->LockFile(path, "x").ok());
  std::filesystem::remove_all(dir);
}

// Two holders of one epoch file, as a replaced role and its replacement on hosts sharing a
// volume: the second raises it, and the first learns so at its next read, once.
TEST(OwnershipEpoch, ANewHolderRaisesTheEpochAndTheOldOneLearnsItOnce) {
  const std::string dir = ::testing::TempDir() + "/ownership_epoch";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());
  OwnershipOptions options;
  options.path = dir + "/EPOCH";
  options.what = "the test's role";
  options.lease = absl::Hours(1);  // No re-read within the lease: CheckLease answers from memory.
  int lost = 0;
  options.on_lost = [&lost](const absl::Status&) { ++lost; };
  auto first = OwnershipEpoch::Take(options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->epoch(), 1u);
  EXPECT_EQ(*ReadFileToString(Env::Default(), options.path, 64), "1\n");
  EXPECT_GT((*first)->UntilServeable(), absl::Minutes(59)) << "a new holder waits out a former one's lease";
  EXPECT_TRUE((*first)->Check().ok());

  OwnershipOptions quick = options;
  quick.lease = absl::ZeroDuration();  // Every CheckLease reads the file.
  quick.on_lost = nullptr;
  auto second = OwnershipEpoch::Take(quick);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->epoch(), 2u);
  EXPECT_EQ((*second)->UntilServeable(), absl::ZeroDuration());
  EXPECT_TRUE((*second)->CheckLease().ok());

  EXPECT_TRUE((*first)->CheckLease().ok()) << "within its lease the first holder does not read the file";
  EXPECT_EQ(lost, 0);
  const absl::Status stale = (*first)->Check();
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_EQ(stale.message(), "the test's role was taken over by another process (its epoch is 2, this process's 1)");
  EXPECT_EQ(lost, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition((*first)->CheckLease())) << "lost for good";
  EXPECT_TRUE(absl::IsFailedPrecondition((*first)->Check()));
  EXPECT_EQ(lost, 1) << "on_lost is called once";

  // A file that holds no epoch is no holder's: DATA_LOSS at Take, a loss for a holder that reads it.
  std::ofstream(options.path, std::ios::trunc) << "garbage";
  EXPECT_TRUE(absl::IsDataLoss(OwnershipEpoch::Take(quick).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition((*second)->CheckLease()));
  std::filesystem::remove_all(dir);
}

TEST(Crc32c, MatchesTheStandardsCheckValues) {
  // "123456789" and RFC 3720's (iSCSI) test patterns.
  std::string zeros(32, '\0'), ones(32, '\xff'), ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  for (bool portable : {false, true}) {
    const auto crc = [&](absl::string_view s) {
      return portable ? hyrec::crc32c_internal::Portable(s, 0) : hyrec::Crc32c(s);
    };
    EXPECT_EQ(crc("123456789"), 0xE3069283u) << portable;
    EXPECT_EQ(crc(zeros), 0x8A9136AAu) << portable;
    EXPECT_EQ(crc(ones), 0x62A8AB43u) << portable;
    EXPECT_EQ(crc(ascending), 0x46DD794Eu) << portable;
    EXPECT_EQ(crc(""), 0u) << portable;
  }
}

TEST(Crc32c, CopyAndContinuationAgreeWithTheTableAtEveryLengthAndAlignment) {
  std::mt19937 random(5);
  std::string data(300, '\0');
  for (char& c : data) c = static_cast<char>(random());
  std::string dst(310, '\0');
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n = 0; n + offset <= data.size(); n += 7) {
      const absl::string_view piece(data.data() + offset, n);
      const uint32_t expected = hyrec::crc32c_internal::Portable(piece, 0);
      EXPECT_EQ(hyrec::Crc32c(piece), expected) << offset << " " << n;
      std::fill(dst.begin(), dst.end(), '\0');
      EXPECT_EQ(hyrec::Crc32cCopy(dst.data() + 1, piece), expected) << offset << " " << n;
      EXPECT_EQ(absl::string_view(dst.data() + 1, n), piece);
      EXPECT_EQ(dst[0], '\0');
      EXPECT_EQ(dst[n + 1], '\0') << "wrote past the copy";
      const size_t half = n / 2;
      EXPECT_EQ(hyrec::Crc32c(piece.substr(half), hyrec::Crc32c(piece.substr(0, half))), expected);
    }
  }
}

TEST(Fp16, RoundTripsRepresentableValuesExactly) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f /*2^-14*/, 5.9604645e-08f /*2^-24*/, 1000.5f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e6f), 0xfc00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(FloatToHalf(1e-9f), 0x0000);
}

TEST(Fp16, BulkConversionMatchesScalar) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  std::vector<float> in(1003);
  for (size_t i = 0; i < in.size(); ++i) in[i] = i % 3 == 0 ? dist(rng) * 1e-6f : dist(rng);
  std::vector<uint16_t> halves(in.size());
  FloatsToHalves(in.data(), halves.data(), in.size());
  std::vector<float> back(in.size());
  HalvesToFloats(halves.data(), back.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(halves[i], FloatToHalf(in[i])) << i << " " << in[i];
    const float expected = HalfToFloat(halves[i]);
    ASSERT_EQ(std::memcmp(&back[i], &expected, sizeof(float)), 0) << i;
  }
}

TEST(FirstNonFinite, FindsTheFirstNanOrInfinityAnywhere) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::signaling_NaN()};
  for (size_t n : {0, 1, 15, 16, 17, 33, 100}) {
    std::vector<float> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = (i % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::max() / (i + 1);
    EXPECT_EQ(FirstNonFinite(data.data(), n), n) << "all finite, n " << n;
    for (size_t at = 0; at < n; ++at) {
      for (float b : bad) {
        std::vector<float> copy = data;
        copy[at] = b;
        if (at + 1 < n) copy[n - 1] = b;  // A later one must not win.
        EXPECT_EQ(FirstNonFinite(copy.data(), n), at) << "n " << n << ", at " << at << ", value " << b;
      }
    }
  }
}

TEST(JumpConsistentHash, GrowingTheShardCountMovesOnlyToTheNewShard) {
  for (int n = 1; n < 12; ++n) {
    int moved = 0;
    const int ids = 20000;
    for (uint64_t id = 0; id < ids; ++id) {
      const int before = ShardForId(id, n);
      const int after = ShardForId(id, n + 1);
      ASSERT_GE(before, 0);
      ASSERT_LT(before, n);
      if (before != after) {
        ASSERT_EQ(after, n) << "id " << id << " moved between old shards";
        ++moved;
      }
    }
    const double expected = static_cast<double>(ids) / (n + 1);
    EXPECT_NEAR(moved, expected, 5 * std::sqrt(expected)) << "n=" << n;
  }
}

TEST(JumpConsistentHash, SpreadsIdsEvenly) {
  std::vector<int> counts(7);
  for (uint64_t id = 0; id < 70000; ++id) ++counts[ShardForId(id * 1000003, 7)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(Zipf, FollowsThePowerLaw) {
  const ZipfDistribution zipf(1'000'000, 1.05);
  std::mt19937_64 rng(3);
  std::vector<int> counts(4);
  const int draws = 400000;
  for (int i = 0; i < draws; ++i) {
    const uint64_t k = zipf(rng);
    ASSERT_GE(k, 1u);
    ASSERT_LE(k, 1'000'000u);
    if (k <= 3) ++counts[k];
  }
  // P(1) / P(2) = 2^1.05.
  EXPECT_NEAR(static_cast<double>(counts[1]) / counts[2], std::pow(2.0, 1.05), 0.08);
  EXPECT_NEAR(static_cast<double>(counts[1]) / counts[3], std::pow(3.0, 1.05), 0.12);
}

TEST(YamlConfig, UnknownKeyNamesLineAndSuggestion) {
  auto node = ParseYaml("a: 1\ncapacity_rwos: 5\n", "test.yaml");
  ASSERT_TRUE(node.ok());
  absl::Status s = CheckKeys(*node, "ps", {"a", "capacity_rows"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ps.capacity_rwos (line 2)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("did you mean 'capacity_rows'"), std::string::npos) << s;
}

TEST(YamlConfig, WrongTypeNamesKey) {
  auto node = ParseYaml("dim: sixteen\n", "t.yaml");
  ASSERT_TRUE(node.ok());
  int dim = 0;
  absl::Status s = ReadScalar(*node, "dim", "tables[0]", &dim);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tables[0].dim (line 1)"), std::string::npos) << s;
}

TEST(YamlConfig, SyntaxErrorNamesFileAndLine) {
  auto node = ParseYaml("a: 1\nb: [1, 2\n", "bad.yaml");
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().message().find("bad.yaml:"), std::string::npos) << node.status();
}

TEST(Subprocess, ReadsLinesAndExitCode) {
  auto p = Subprocess::Spawn({"/bin/sh", "-c", "echo first; echo 'x listening on 127.0.0.1:4321'; exit 3"});
  ASSERT_TRUE(p.ok()) << p.status();
  auto port = WaitForListeningPort(**p, absl::Seconds(5));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, 4321);
  auto code = (*p)->Wait(absl::Seconds(5));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 3);
}

TEST(Subprocess, ReadLineAndWaitHaveDeadlines) {
  auto p = Subprocess::Spawn({"/bin/sleep", "30"});
  ASSERT_TRUE(p.ok());
  const absl::Time start = absl::Now();
  EXPECT_EQ((*p)->ReadLine(absl::Milliseconds(200)).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*p)->Wait(absl::Milliseconds(200)).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Milliseconds(400)));  // Not the 30 s sleep.
  (*p)->Signal(SIGKILL);
  auto code = (*p)->Wait(absl::Seconds(5));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGKILL);
}

TEST(StalenessWindow, BoundsTheUpdatesALookupMayMiss) {
  const StalenessWindow sync(0);
  EXPECT_EQ(sync.depth(), 1u);
  EXPECT_EQ(sync.TrainedBefore(7), 7u);  // Every batch before it trained and acknowledged.
  EXPECT_EQ(sync.AckedBefore(7), 7u);
  EXPECT_EQ(sync.max_updates_in_flight(), 2);
  const StalenessWindow hybrid(4);
  EXPECT_EQ(hybrid.depth(), 2u);
  EXPECT_EQ(hybrid.TrainedBefore(3), 0u);  // The first s batches wait for nothing.
  EXPECT_EQ(hybrid.TrainedBefore(10), 6u);
  EXPECT_EQ(hybrid.AckedBefore(10), 6u);  // Batches 6..9: at most 4 batches of updates unapplied.
  EXPECT_EQ(hybrid.max_updates_in_flight(), 6);
  EXPECT_EQ(StalenessWindow(-3).staleness(), 0);
  EXPECT_EQ(StalenessWindow(7).depth(), 4u);
}

TEST(ProcessInfo, ReadsTheFieldsOfAProcessStatus) {
  std::vector<char> touched(8 << 20, 1);  // At least 8 MiB resident.
  const absl::StatusOr<uint64_t> rss = ProcessStatusBytes(getpid(), "VmRSS");
  ASSERT_TRUE(rss.ok()) << rss.status();
  EXPECT_GE(*rss, touched.size());
  const absl::StatusOr<uint64_t> peak = ProcessStatusBytes(getpid(), "VmHWM");
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_GE(*peak, *rss);
  const absl::StatusOr<std::string> threads = ProcessStatusField(getpid(), "Threads");
  ASSERT_TRUE(threads.ok()) << threads.status();
  EXPECT_GE(std::stoi(*threads), 1);
  EXPECT_TRUE(absl::IsNotFound(ProcessStatusField(getpid(), "NoSuchField").status()));
  EXPECT_FALSE(ProcessStatusBytes(getpid(), "Threads").ok()) << "not a kB field";
  EXPECT_TRUE(absl::IsNotFound(ProcessStatusField(-1, "VmRSS").status()));
}

enum class Shade { kLight, kDark, kNone };
constexpr EnumName<Shade> kShadeNames[] = {{Shade::kLight, "light"}, {Shade::kDark, "dark"}};

TEST(EnumNames, OneTableNamesParsesAndListsTheValues) {
  EXPECT_STREQ(NameOf(kShadeNames, Shade::kDark), "dark");
  EXPECT_STREQ(NameOf(kShadeNames, Shade::kNone), "unknown");
  EXPECT_EQ(NameList(kShadeNames), "light or dark");
  for (const EnumName<Shade>& entry : kShadeNames) {
    const absl::StatusOr<Shade> parsed = ParseName(kShadeNames, NameOf(kShadeNames, entry.value), "shade");
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, entry.value);
  }
  const absl::StatusOr<Shade> bad = ParseName(kShadeNames, "grey", "shade");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown shade 'grey' (expected light or dark)");
  Shade found = Shade::kNone;
  EXPECT_FALSE(FindName(kShadeNames, "Light", &found)) << "names are exact";
  EXPECT_EQ(found, Shade::kNone);
}

}  // namespace
}  // namespace hyrec
