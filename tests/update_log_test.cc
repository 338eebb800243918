// The PS update log (hyrec/embedding_ps/update_log.h): group commit from many threads, torn tails
// at every byte, damage elsewhere, failed appends and syncs through FaultInjectionEnv, what each
// sync policy keeps across a simulated power loss, and where a recovery starts.
#include "hyrec/embedding_ps/update_log.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "embedding.pb.h"
#include "fault_injection_env.h"
#include "gtest/gtest.h"
#include "hyrec/common/env.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "src/embedding_ps/handlers.h"

namespace hyrec::embedding_ps {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/update_log_test_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// A record's bytes; view() is what Append takes (it keeps no view past the call).
struct OwnedRecord {
  std::string table, ids, grads;
  uint32_t worker = 0;
  uint64_t sequence = 0;
  LoggedUpdate view() const { return LoggedUpdate{table, worker, sequence, 0, ids, grads}; }
};

OwnedRecord Record(uint32_t worker, uint64_t sequence) {
  OwnedRecord r;
  r.table = absl::StrCat("t", worker % 3);
  r.worker = worker;
  r.sequence = sequence;
  r.ids = std::string(8 * (1 + sequence % 5), static_cast<char>(sequence));
  r.grads = std::string(4 * (1 + sequence % 5), static_cast<char>(worker));
  return r;
}

// What a crash leaves of a log that is still open: a copy of its directory as the disk holds it.
std::string CrashCopy(const std::string& dir, const std::string& name) {
  const std::string copy = FreshDir(name);
  std::filesystem::copy(dir, copy);
  return copy;
}

// Appends worker 1's records 1 to `n` to `log` (whose groups are written at once: sync off),
// returning the size of its segment `path` after each.
std::vector<uint64_t> AppendNoting(UpdateLog& log, const std::string& path, uint64_t n) {
  std::vector<uint64_t> ends;
  for (uint64_t s = 1; s <= n; ++s) {
    EXPECT_TRUE(log.Append(Record(1, s).view()).ok()) << s;
    ends.push_back(*Env::Default()->GetFileSize(path));
  }
  return ends;
}

std::set<std::pair<uint32_t, uint64_t>> Replayed(const UpdateLog& log, uint64_t first, ReplayStats* stats) {
  ReplayStats local;
  if (stats == nullptr) stats = &local;
  std::set<std::pair<uint32_t, uint64_t>> seen;
  const absl::Status s = log.Replay(
      first,
      [&](const LoggedUpdate& u) {
        EXPECT_EQ(u.ids, Record(u.worker_id, u.sequence).ids);
        EXPECT_EQ(u.grads, Record(u.worker_id, u.sequence).grads);
        seen.emplace(u.worker_id, u.sequence);
        return absl::OkStatus();
      },
      stats);
  EXPECT_TRUE(s.ok()) << s;
  return seen;
}

TEST(UpdateLog, GroupCommitKeepsEveryRecordOfManyWriters) {
  UpdateLogOptions options;
  options.dir = FreshDir("group");
  options.segment_bytes = 16 << 10;  // Several segments.
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Reset("").ok());
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      for (uint64_t s = 1; s <= 200; ++s) ASSERT_TRUE((*log)->Append(Record(w, s).view()).ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE((*log)->Close().ok());
  ReplayStats stats;
  EXPECT_EQ(Replayed(**log, 1, &stats).size(), 1600u);
  EXPECT_EQ(stats.records, 1600u);
  EXPECT_EQ(stats.updates, 1600u);
  EXPECT_GT(stats.segments, 2u);
  EXPECT_EQ(stats.torn_bytes, 0u);
}

// One owner per log: a second Open of a directory whose log is open is refused, naming the
// holder; once the first is closed (or its process is gone) the directory opens again.
TEST(UpdateLog, ADirectoryHasOneOwnerUntilItsLogIsClosed) {
  UpdateLogOptions options;
  options.dir = FreshDir("owner");
  options.lock_wait = absl::Milliseconds(100);
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Reset("").ok());
  ASSERT_TRUE((*log)->Append(Record(1, 1).view()).ok());
  const absl::Status second = UpdateLog::Open(options).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(second)) << second;
  EXPECT_NE(second.message().find("belongs to a shard that runs"), std::string::npos) << second;
  EXPECT_NE(second.message().find(absl::StrCat("pid ", getpid(), " on ")), std::string::npos) << second;
  ASSERT_TRUE((*log)->Close().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*log)->Reset(""))) << "a closed log deletes nothing";
  auto reopened = UpdateLog::Open(options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ReplayStats stats;
  EXPECT_EQ(Replayed(**reopened, 1, &stats).size(), 1u);
}

// One part of an UpdateTables call: table `table`, one id, one gradient (dim 1, fp32).
proto::UpdateRequest Part(const std::string& table, uint64_t id, float grad, uint64_t sequence) {
  proto::UpdateRequest r;
  r.set_table(table);
  r.set_worker_id(0);
  r.set_sequence(sequence);
  r.set_precision(proto::PRECISION_FP32);
  r.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  r.set_grads(std::string(reinterpret_cast<const char*>(&grad), sizeof(grad)));
  return r;
}

std::unique_ptr<EmbeddingShardStore> CountingStore() {
  StoreOptions options;
  for (const char* name : {"t", "u"}) {
    TableConfig t;
    t.name = name;
    t.dim = 1;
    t.initializer.kind = InitializerKind::kZeros;
    t.optimizer.kind = OptimizerKind::kSgd;
    t.optimizer.learning_rate = 1.0f;
    options.tables.push_back(t);
  }
  auto store = EmbeddingShardStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

float RowOf(EmbeddingShardStore& store, int table, uint64_t id) {
  float row = 0;
  EXPECT_TRUE(store.Lookup(table, absl::MakeConstSpan(&id, 1), absl::MakeSpan(&row, 1), nullptr).ok());
  return row;
}

// A refused UpdateTables call is refused whole, whichever of its parts the store would refuse:
// no row moves, no dedup window marks its sequences, and the log holds no record of it, so the
// shard a recovery replays equals the live one row for row after every kind of refusal.
// Where the lock does not reach (another host on a volume without flock: here, the LOCK file is
// replaced under the owner), the process that takes the log over raises its epoch, and the old
// owner stops at its next write, rotation or deletion, saying so, without touching the log.
TEST(UpdateLog, AnOwnerReplacedWhereLocksDoNotReachStopsAtItsNextWrite) {
  UpdateLogOptions options;
  options.dir = FreshDir("fence");
  options.sync = LogSync::kOff;
  absl::Status fenced;
  int calls = 0;
  UpdateLogOptions first = options;
  first.on_fenced = [&](const absl::Status& s) {
    fenced = s;
    ++calls;
  };
  auto old = UpdateLog::Open(first);
  ASSERT_TRUE(old.ok()) << old.status();
  ASSERT_TRUE((*old)->Reset("").ok());
  ASSERT_TRUE((*old)->Append(Record(1, 1).view()).ok());
  std::filesystem::remove(options.dir + "/LOCK");
  auto now = UpdateLog::Open(options);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(Replayed(**now, 1, nullptr).size(), 1u);
  ASSERT_TRUE((*now)->StartWriting().ok());
  ASSERT_TRUE((*now)->Append(Record(2, 1).view()).ok());

  const absl::Status stale = (*old)->Append(Record(1, 2).view());
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_NE(stale.message().find("was taken over by another process (its epoch is 2, this process's 1): this process "
                                 "no longer owns the shard"),
            std::string::npos)
      << stale;
  EXPECT_EQ(calls, 1);
  EXPECT_NE(stale.message().find(fenced.message()), std::string::npos) << fenced;
  EXPECT_FALSE((*old)->Rotate("ckpt-x").ok());
  EXPECT_FALSE((*old)->Truncate([](const std::string&) { return true; }).ok());
  EXPECT_FALSE((*old)->Reset("").ok());
  EXPECT_EQ(calls, 1);
  ReplayStats stats;
  EXPECT_EQ(Replayed(**now, 1, &stats), (std::set<std::pair<uint32_t, uint64_t>>{{1, 1}, {2, 1}}));
  EXPECT_EQ(stats.segments, 2u);
}

TEST(UpdateLog, ARefusedCallChangesNothingAndLeavesNoRecord) {
  UpdateLogOptions options;
  options.dir = FreshDir("refusals");
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Reset("").ok());
  std::unique_ptr<EmbeddingShardStore> live = CountingStore();
  const RequestLimits limits;
  const auto call = [&](std::vector<proto::UpdateRequest> parts) {
    proto::UpdateTablesRequest request;
    for (proto::UpdateRequest& p : parts) *request.add_updates() = std::move(p);
    proto::UpdateTablesResponse response;
    return HandleUpdateTables(*live, limits, request, &response, log->get());
  };
  ASSERT_TRUE(call({Part("t", 7, 1, 1), Part("u", 7, 1, 5000)}).ok());
  const struct {
    const char* what;
    std::vector<proto::UpdateRequest> parts;
    absl::StatusCode code;
  } refusals[] = {
      {"a NaN in the second part",
       {Part("t", 7, 1, 30), Part("u", 7, std::nanf(""), 30)},
       absl::StatusCode::kInvalidArgument},
      {"an infinite gradient in the second part",
       {Part("t", 7, 1, 31), Part("u", 7, INFINITY, 31)},
       absl::StatusCode::kInvalidArgument},
      {"a sequence too old for its window in the second part",
       {Part("t", 7, 1, 32), Part("u", 7, 1, 5000 - 2000)},
       absl::StatusCode::kFailedPrecondition},
      {"an unknown table in the second part", {Part("t", 7, 1, 33), Part("v", 7, 1, 33)}, absl::StatusCode::kNotFound},
  };
  for (const auto& r : refusals) {
    SCOPED_TRACE(r.what);
    const absl::Status refused = call(r.parts);
    EXPECT_EQ(refused.code(), r.code) << refused;
    EXPECT_NE(refused.message().find("update 1 (table '"), std::string::npos) << refused;
    EXPECT_NE(refused.message().find("nothing was applied"), std::string::npos) << refused;
    EXPECT_EQ(RowOf(*live, 0, 7), -1.0f);
    EXPECT_EQ(RowOf(*live, 1, 7), -1.0f);
  }
  // The refused calls' sequences were not consumed: sent again, valid, each is applied once.
  proto::UpdateTablesRequest again;
  for (uint64_t s = 30; s <= 33; ++s) *again.add_updates() = Part("t", 7, 1, s);
  proto::UpdateTablesResponse response;
  ASSERT_TRUE(HandleUpdateTables(*live, limits, again, &response, log->get()).ok());
  for (const proto::UpdateResponse& u : response.updates()) EXPECT_FALSE(u.duplicate());
  EXPECT_EQ(RowOf(*live, 0, 7), -5.0f);

  // What a recovery replays: the same rows, and no refused record was logged to be refused again.
  ASSERT_TRUE((*log)->Close().ok());
  auto reopened = UpdateLog::Open(options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::unique_ptr<EmbeddingShardStore> recovered = CountingStore();
  ReplayStats stats;
  ASSERT_TRUE(ReplayInto(**reopened, 1, recovered.get(), &stats).ok());
  EXPECT_EQ(stats.records, 2u);
  EXPECT_EQ(stats.refused, 0u);
  EXPECT_EQ(RowOf(*recovered, 0, 7), RowOf(*live, 0, 7));
  EXPECT_EQ(RowOf(*recovered, 1, 7), RowOf(*live, 1, 7));
}

// A recovery replays the log into rows equal to the live ones, bit for bit, for every optimizer
// and row precision: an fp16 row's stochastic rounding draws from the row's id and bytes, so the
// same updates in the same order round the same way.
struct RowFormat {
  OptimizerKind kind;
  RowPrecision precision;
};

class ReplayEveryRowFormat : public ::testing::TestWithParam<RowFormat> {};

TEST_P(ReplayEveryRowFormat, ARecoveryRoundsAsTheLiveStoreDid) {
  UpdateLogOptions options;
  options.dir =
      FreshDir(absl::StrCat("rounding_", OptimizerName(GetParam().kind), "_", RowPrecisionName(GetParam().precision)));
  options.sync = LogSync::kOff;
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Reset("").ok());
  StoreOptions store;
  TableConfig t;
  t.name = "t";
  t.dim = 1;
  t.optimizer.kind = GetParam().kind;
  t.optimizer.learning_rate = 0.3f;
  t.precision = GetParam().precision;
  store.tables = {t};
  auto live = EmbeddingShardStore::Create(store);
  ASSERT_TRUE(live.ok()) << live.status();
  const RequestLimits limits;
  for (uint64_t s = 1; s <= 400; ++s) {
    proto::UpdateTablesRequest request;
    *request.add_updates() = Part("t", s % 37, 0.01f * std::sin(0.7f * s) + 0.0013f, s);
    proto::UpdateTablesResponse response;
    ASSERT_TRUE(HandleUpdateTables(**live, limits, request, &response, log->get()).ok());
  }
  ASSERT_TRUE((*log)->Close().ok());
  auto reopened = UpdateLog::Open(options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto recovered = EmbeddingShardStore::Create(store);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ReplayStats stats;
  ASSERT_TRUE(ReplayInto(**reopened, 1, recovered->get(), &stats).ok());
  EXPECT_EQ(stats.records, 400u);
  for (uint64_t id = 0; id < 37; ++id) EXPECT_EQ(RowOf(**recovered, 0, id), RowOf(**live, 0, id)) << "id " << id;
  EXPECT_EQ((*recovered)->Snapshot().tables[0].values, (*live)->Snapshot().tables[0].values) << "and their state";
}

INSTANTIATE_TEST_SUITE_P(Formats, ReplayEveryRowFormat,
                         ::testing::Values(RowFormat{OptimizerKind::kAdagrad, RowPrecision::kFp32},
                                           RowFormat{OptimizerKind::kAdagrad, RowPrecision::kFp16},
                                           RowFormat{OptimizerKind::kAdagradRowwise, RowPrecision::kFp16},
                                           RowFormat{OptimizerKind::kAdamRowwise, RowPrecision::kFp16},
                                           RowFormat{OptimizerKind::kSgd, RowPrecision::kFp16},
                                           RowFormat{OptimizerKind::kAdagradRowwise, RowPrecision::kInt8},
                                           RowFormat{OptimizerKind::kAdam, RowPrecision::kInt8}),
                         [](const ::testing::TestParamInfo<RowFormat>& info) {
                           return absl::StrCat(OptimizerName(info.param.kind), "_",
                                               RowPrecisionName(info.param.precision));
                         });

TEST(UpdateLog, ATornTailAtEveryByteDropsOnlyTheUnfinishedRecord) {
  UpdateLogOptions options;
  options.dir = FreshDir("torn");
  options.sync = LogSync::kOff;  // Each group written at once: the file's size says where each record ends.
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Reset("").ok());
  const std::string path = options.dir + "/log-00000000000000000001.wal";
  const uint64_t header = *Env::Default()->GetFileSize(path);
  const std::vector<uint64_t> ends = AppendNoting(**log, path, 3);  // The file's size after each.
  ASSERT_TRUE((*log)->Close().ok());
  const std::string whole = *ReadFileToString(Env::Default(), path, 1 << 20);
  for (uint64_t size = header; size <= whole.size(); ++size) {
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, whole.substr(0, size)).ok());
    auto reopened = UpdateLog::Open(options);
    ASSERT_TRUE(reopened.ok());
    ReplayStats stats;
    const size_t complete = std::upper_bound(ends.begin(), ends.end(), size) - ends.begin();
    EXPECT_EQ(Replayed(**reopened, 1, &stats).size(), complete) << "cut at " << size;
    EXPECT_EQ(stats.torn_bytes, size - (complete == 0 ? header : ends[complete - 1])) << "cut at " << size;
  }
  // A flipped byte in the last record is a torn tail too. StartWriting cuts it off before
  // segment 2 follows, so a second crash still replays segment 1 whole.
  std::string flipped = whole;
  flipped[whole.size() - 3] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, flipped).ok());
  auto reopened = UpdateLog::Open(options);
  ASSERT_TRUE(reopened.ok());
  ReplayStats stats;
  EXPECT_EQ(Replayed(**reopened, 1, &stats).size(), 2u);
  EXPECT_GT(stats.torn_bytes, 0u);
  ASSERT_TRUE((*reopened)->StartWriting().ok());  // Segment 2: segment 1 is no longer the last.
  EXPECT_EQ(*Env::Default()->GetFileSize(path), ends[1]);
  ASSERT_TRUE((*reopened)->Append(Record(2, 1).view()).ok());
  stats = ReplayStats();
  EXPECT_EQ(Replayed(**reopened, 1, &stats), (std::set<std::pair<uint32_t, uint64_t>>{{1, 1}, {1, 2}, {2, 1}}));
  EXPECT_EQ(stats.torn_bytes, 0u);
  // Damage in a segment that is not the last is no torn tail: DATA_LOSS, naming it.
  std::string damaged_bytes = *ReadFileToString(Env::Default(), path, 1 << 20);
  damaged_bytes[header + 10] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, damaged_bytes).ok());
  const absl::Status damaged = (*reopened)->Replay(
      1, [](const LoggedUpdate&) { return absl::OkStatus(); }, nullptr);
  EXPECT_TRUE(absl::IsDataLoss(damaged)) << damaged;
  EXPECT_NE(damaged.message().find("log-00000000000000000001.wal"), std::string::npos) << damaged;
}

// Damage followed by whole records of later groups is no torn tail, whichever byte of the
// record it hits: the records after it were acknowledged. The replay and StartWriting both
// refuse, naming the segment, the record and its offset, and cut nothing.
TEST(UpdateLog, DamageBeforeWholeRecordsOfLaterGroupsIsAnErrorNotATornTail) {
  UpdateLogOptions options;
  options.dir = FreshDir("damage");
  options.sync = LogSync::kOff;  // Each record its own group, written at once.
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Reset("").ok());
  const std::string path = options.dir + "/log-00000000000000000001.wal";
  const std::vector<uint64_t> ends = AppendNoting(**log, path, 300);  // The file's size after each.
  ASSERT_TRUE((*log)->Close().ok());
  const std::string whole = *ReadFileToString(Env::Default(), path, 1 << 24);
  const uint64_t start = ends[148];  // Where record 149 (the 150th) begins.
  for (const uint64_t at : {start + 1, start + 12, start + 27, start + 40, ends[149] - 1}) {
    SCOPED_TRACE(at - start);
    std::string flipped = whole;
    flipped[at] ^= 0x40;
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, flipped).ok());
    auto reopened = UpdateLog::Open(options);
    ASSERT_TRUE(reopened.ok());
    const absl::Status replay = (*reopened)->Replay(
        1, [](const LoggedUpdate&) { return absl::OkStatus(); }, nullptr);
    EXPECT_TRUE(absl::IsDataLoss(replay)) << replay;
    EXPECT_NE(replay.message().find(absl::StrCat(path, ": record 149 at offset ", start, " is damaged")),
              std::string::npos)
        << replay;
    EXPECT_NE(replay.message().find(absl::StrCat("(record 150 at offset ", ends[149], ")")), std::string::npos)
        << replay;
    const absl::Status start_writing = (*reopened)->StartWriting();
    EXPECT_TRUE(absl::IsDataLoss(start_writing)) << start_writing;
    EXPECT_EQ(*Env::Default()->GetFileSize(path), whole.size()) << "nothing is cut";
  }
  // The same byte flipped in the last record: nothing whole follows, so it is the torn tail.
  std::string flipped = whole;
  flipped[ends[298] + 40] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, flipped).ok());
  auto reopened = UpdateLog::Open(options);
  ASSERT_TRUE(reopened.ok());
  ReplayStats stats;
  EXPECT_EQ(Replayed(**reopened, 1, &stats).size(), 299u);
  EXPECT_EQ(stats.torn_bytes, whole.size() - ends[298]);
}

// Each segment names the lineage, record count and size of the one before it: a deleted, cut,
// renamed or foreign segment in the middle of the log refuses the replay, named, where the log
// before held every record.
TEST(UpdateLog, AMissingCutRenamedOrForeignSegmentRefusesTheReplayNamed) {
  const auto write_log = [](const std::string& dir) {
    UpdateLogOptions options;
    options.dir = dir;
    options.sync = LogSync::kOff;
    options.segment_bytes = 1;  // A new segment after every group: segments 1 to 5, the last empty.
    auto log = UpdateLog::Open(options);
    EXPECT_TRUE(log.ok());
    EXPECT_TRUE((*log)->Reset("").ok());
    for (uint64_t s = 1; s <= 4; ++s) EXPECT_TRUE((*log)->Append(Record(1, s).view()).ok());
    EXPECT_TRUE((*log)->Close().ok());
  };
  const std::string original = FreshDir("links"), foreign = FreshDir("links_foreign");
  write_log(original);
  write_log(foreign);
  const auto segment = [](const std::string& dir, int n) {
    return absl::StrCat(dir, "/log-0000000000000000000", n, ".wal");
  };
  const struct {
    const char* what;
    std::function<void(const std::string&)> damage;
    std::string message;
  } cases[] = {
      {"intact", [](const std::string&) {}, ""},
      {"segment 2 deleted", [&](const std::string& d) { std::filesystem::remove(segment(d, 2)); },
       "the update log is missing segment(s) 2 between"},
      {"segments 2 and 3 deleted",
       [&](const std::string& d) {
         std::filesystem::remove(segment(d, 2));
         std::filesystem::remove(segment(d, 3));
       },
       "the update log is missing segment(s) 2 to 3 between"},
      {"segment 2 cut after its header (a record boundary)",
       [&](const std::string& d) {  // Segment 5 is a header alone, as long as segment 2's.
         std::filesystem::resize_file(segment(d, 2), *Env::Default()->GetFileSize(segment(d, 5)));
       },
       "was cut, extended or replaced"},
      {"segment 2 of another log",
       [&](const std::string& d) {
         std::filesystem::copy_file(segment(foreign, 2), segment(d, 2),
                                    std::filesystem::copy_options::overwrite_existing);
       },
       "does not continue"},
      {"segments 2 and 3 swapped",
       [&](const std::string& d) {
         std::filesystem::rename(segment(d, 2), d + "/swap");
         std::filesystem::rename(segment(d, 3), segment(d, 2));
         std::filesystem::rename(d + "/swap", segment(d, 3));
       },
       "holds segment 3 of the log"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string dir = FreshDir("links_case");
    std::filesystem::copy(original, dir);
    c.damage(dir);
    UpdateLogOptions options;
    options.dir = dir;
    auto log = UpdateLog::Open(options);
    absl::Status replay = log.status();
    ReplayStats stats;
    if (log.ok()) replay = (*log)->Replay(1, nullptr, &stats);
    if (c.message.empty()) {
      EXPECT_TRUE(replay.ok()) << replay;
      EXPECT_EQ(stats.records, 4u);
      EXPECT_EQ(stats.segments, 5u);
    } else {
      EXPECT_TRUE(absl::IsDataLoss(replay)) << replay;
      EXPECT_NE(replay.message().find(c.message), std::string::npos) << replay;
    }
  }
}

TEST(UpdateLog, ARecordOfSeveralUpdatesIsReplayedWholeOrNotAtAll) {
  UpdateLogOptions options;
  options.dir = FreshDir("several");
  options.sync = LogSync::kOff;
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Reset("").ok());
  const std::string path = options.dir + "/log-00000000000000000001.wal";
  ASSERT_TRUE((*log)->Append(Record(1, 1).view()).ok());
  const uint64_t first_end = *Env::Default()->GetFileSize(path);
  const OwnedRecord a = Record(2, 1), b = Record(3, 1), c = Record(4, 1);  // One UpdateTables call's.
  const std::vector<LoggedUpdate> batch = {a.view(), b.view(), c.view()};
  ASSERT_TRUE((*log)->Append(batch, nullptr).ok());
  ASSERT_TRUE((*log)->Close().ok());
  ReplayStats stats;
  EXPECT_EQ(Replayed(**log, 1, &stats), (std::set<std::pair<uint32_t, uint64_t>>{{1, 1}, {2, 1}, {3, 1}, {4, 1}}));
  EXPECT_EQ(stats.records, 2u);
  EXPECT_EQ(stats.updates, 4u);
  const std::string whole = *ReadFileToString(Env::Default(), path, 1 << 20);
  for (uint64_t size = first_end; size < whole.size(); ++size) {  // Torn anywhere in the second record.
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, whole.substr(0, size)).ok());
    auto reopened = UpdateLog::Open(options);
    ASSERT_TRUE(reopened.ok());
    EXPECT_EQ(Replayed(**reopened, 1, nullptr), (std::set<std::pair<uint32_t, uint64_t>>{{1, 1}})) << size;
  }
  EXPECT_FALSE((*log)->Append(std::vector<LoggedUpdate>{}, nullptr).ok());
}

TEST(UpdateLog, ASegmentOfAnotherFormatVersionIsNamedNotReplayed) {
  UpdateLogOptions options;
  options.dir = FreshDir("version");
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Reset("").ok());
  ASSERT_TRUE((*log)->Close().ok());
  const std::string path = options.dir + "/log-00000000000000000001.wal";
  std::string bytes = *ReadFileToString(Env::Default(), path, 1 << 20);
  bytes[8] = 1;  // The version after the magic: format 1 (crc32, one update a record).
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, bytes).ok());
  const absl::Status s = UpdateLog::Open(options).status();  // What a restarted shard opens first.
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("format 1"), std::string::npos) << s;
}

TEST(UpdateLog, ACrashedSegmentsPaddingIsNoRecordAndASecondCrashLosesNothing) {
  UpdateLogOptions options;  // every_group: direct writes, padded to whole blocks.
  options.dir = FreshDir("padding");
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Reset("").ok());
  for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE((*log)->Append(Record(1, s).view()).ok());
  // The first crash: the disk holds the three records and the zeros of the last block.
  const std::string first = CrashCopy(options.dir, "padding_crash1");
  const std::string segment = "/log-00000000000000000001.wal";
  const uint64_t on_disk = *Env::Default()->GetFileSize(first + segment);
  EXPECT_EQ(on_disk % kLogFileBlock, 0u) << "direct writes cover whole blocks";
  UpdateLogOptions recovered = options;
  recovered.dir = first;
  auto reopened = UpdateLog::Open(recovered);
  ASSERT_TRUE(reopened.ok());
  ReplayStats stats;
  EXPECT_EQ(Replayed(**reopened, 1, &stats).size(), 3u);
  EXPECT_EQ(stats.torn_bytes, 0u) << "padding is not a torn record";
  ASSERT_TRUE((*reopened)->StartWriting().ok());
  EXPECT_LT(*Env::Default()->GetFileSize(first + segment), on_disk) << "the padding is cut off";
  ASSERT_TRUE((*reopened)->Append(Record(2, 1).view()).ok());
  // The second crash, before any checkpoint: segment 1 is no longer the last, and replays whole.
  recovered.dir = CrashCopy(first, "padding_crash2");
  auto again = UpdateLog::Open(recovered);
  ASSERT_TRUE(again.ok());
  stats = ReplayStats();
  EXPECT_EQ(Replayed(**again, 1, &stats), (std::set<std::pair<uint32_t, uint64_t>>{{1, 1}, {1, 2}, {1, 3}, {2, 1}}));
  EXPECT_EQ(stats.segments, 2u);
  // A clean close leaves no padding.
  ASSERT_TRUE((*log)->Close().ok());
  const std::string whole = *ReadFileToString(Env::Default(), options.dir + segment, 1 << 20);
  EXPECT_NE(whole.back(), '\0');
}

TEST(UpdateLog, AFailedWriteOrSyncAcknowledgesNothingAndStopsTheLog) {
  for (FaultInjectionEnv::Op op : {FaultInjectionEnv::kAppend, FaultInjectionEnv::kSync}) {
    FaultInjectionEnv env(Env::Default());
    UpdateLogOptions options;
    options.dir = FreshDir(absl::StrCat("fail", op));
    options.env = &env;
    auto log = UpdateLog::Open(options);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Reset("").ok());
    ASSERT_TRUE((*log)->Append(Record(1, 1).view()).ok());
    env.FailAfter(op, 0);
    int applied = 0;  // What the shard does while the record is written: it runs once, either way.
    EXPECT_FALSE((*log)->Append(Record(1, 2).view(), [&] { ++applied; }).ok()) << op;
    EXPECT_EQ(applied, 1);
    env.Heal();
    EXPECT_FALSE((*log)->Append(Record(1, 3).view()).ok()) << "a log that failed must be reopened";
    // What a power loss leaves: every acknowledged record (sequence 1), whatever was not synced.
    ASSERT_TRUE(env.DropUnsyncedData().ok());
    auto reopened = UpdateLog::Open(options);
    ASSERT_TRUE(reopened.ok());
    const auto seen = Replayed(**reopened, 1, nullptr);
    EXPECT_TRUE(seen.count({1, 1})) << op;
    EXPECT_FALSE(seen.count({1, 3})) << op;
  }
}

TEST(UpdateLog, WhatEachSyncPolicyKeepsAcrossAPowerLoss) {
  for (LogSync sync : {LogSync::kEveryGroup, LogSync::kOff}) {
    FaultInjectionEnv env(Env::Default());
    UpdateLogOptions options;
    options.dir = FreshDir(LogSyncName(sync));
    options.env = &env;
    options.sync = sync;
    auto log = UpdateLog::Open(options);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Reset("").ok());
    for (uint64_t s = 1; s <= 50; ++s) ASSERT_TRUE((*log)->Append(Record(1, s).view()).ok());
    ASSERT_TRUE(env.DropUnsyncedData().ok());  // No Close: the machine went down.
    auto reopened = UpdateLog::Open(options);
    ASSERT_TRUE(reopened.ok());
    const size_t kept = Replayed(**reopened, 1, nullptr).size();
    if (sync == LogSync::kEveryGroup) {
      EXPECT_EQ(kept, 50u) << "every acknowledged update survives";
    } else {
      EXPECT_EQ(kept, 0u) << "off keeps what the kernel wrote back; this Env writes back nothing unsynced";
    }
  }
}

TEST(UpdateLog, RecoveryStartsFromTheNewestUsableCheckpointAndTruncationFollowsCommits) {
  UpdateLogOptions options;
  options.dir = FreshDir("recovery");
  auto log = UpdateLog::Open(options);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Reset("").ok());
  const uint64_t lineage = (*log)->lineage();
  ASSERT_TRUE((*log)->Append(Record(1, 1).view()).ok());
  auto a = (*log)->Rotate("ckpt-a");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*log)->Append(Record(1, 2).view()).ok());
  auto b = (*log)->Rotate("ckpt-b");
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*log)->Append(Record(1, 3).view()).ok());
  std::set<std::string> committed;
  auto is_committed = [&](const std::string& name) { return committed.count(name) > 0; };
  // Nothing committed yet: from the empty store, every record.
  auto from = (*log)->FindRecovery(is_committed);
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(from->checkpoint, "");
  EXPECT_EQ(Replayed(**log, from->segment, nullptr).size(), 3u);
  committed = {"ckpt-a"};
  from = (*log)->FindRecovery(is_committed);
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(from->checkpoint, "ckpt-a");
  EXPECT_EQ(from->segment, *a);
  EXPECT_EQ(Replayed(**log, from->segment, nullptr), (std::set<std::pair<uint32_t, uint64_t>>{{1, 2}, {1, 3}}));
  ASSERT_TRUE((*log)->Truncate(is_committed).ok());
  EXPECT_EQ((*log)->Segments()->front().checkpoint, "ckpt-a");
  // The checkpoint the log starts from is gone (retired, corrupt): no recovery, and it says so.
  committed = {};
  EXPECT_TRUE(absl::IsDataLoss((*log)->FindRecovery(is_committed).status()));
  // The lineage survives a reopen (a recovery) and a Reset renews it.
  ASSERT_TRUE((*log)->Close().ok());
  auto reopened = UpdateLog::Open(options);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->lineage(), lineage);
  ASSERT_TRUE((*reopened)->Reset("").ok());
  EXPECT_NE((*reopened)->lineage(), lineage);
  EXPECT_EQ((*reopened)->Segments()->size(), 1u);
}

}  // namespace
}  // namespace hyrec::embedding_ps
