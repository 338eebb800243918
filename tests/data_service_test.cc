// The loader as a real `hyrec-loader` process: its streams over gRPC must equal the in-process
// loader's, survive a reconnect, resume from saved positions, and fail cleanly when it dies.
#include <signal.h>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data.pb.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/data_loader/config.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/data_loader/kafka_options.h"
#include "hyrec/job/job_plan.h"
#include "run_command.h"
#include "src/data_loader/batch_codec.h"
#include "stream_test_util.h"

namespace hyrec::data_loader {
namespace {

// Two workers, three PS shards: the loader groups each batch's ids for three shards.
constexpr char kConfig[] = R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 3000, vocabulary: 5000, seed: 5}
  batch_size: 100
  threads: 2
  epochs: 2
  shuffle_window: 500
  prefetch_batches: 2
ps: {shards: 3}
train: {workers: 2}
security: {mode: none}
)";

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// What the loader process runs: the loader's plan of the same job file.
LoaderOptions Options() {
  auto spec = job::ParseJobSpecText(kConfig, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = job::Plan(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->loader.options.num_workers, 2);
  EXPECT_EQ(plan->loader.options.num_shards, 3);
  return plan->loader.options;
}

struct LoaderProcess {
  std::unique_ptr<Subprocess> process;
  std::string address;
};

LoaderProcess StartLoader(const std::vector<std::string>& extra = {}, const char* config = kConfig) {
  std::vector<std::string> argv = {HYREC_LOADER_BINARY, "--port=0", "--host=127.0.0.1", "--log_level=warn",
                                   "--config=" + WriteConfig("loader.yaml", config)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  LoaderProcess p;
  auto process = Subprocess::Spawn(argv);
  EXPECT_TRUE(process.ok());
  p.process = std::move(*process);
  auto port = WaitForListeningPort(*p.process, absl::Seconds(20));
  EXPECT_TRUE(port.ok()) << port.status();
  p.address = absl::StrCat("127.0.0.1:", port.ok() ? *port : 0);
  return p;
}

void ExpectSame(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].batch_id, b[i].batch_id);
    ASSERT_EQ(a[i].labels, b[i].labels);
    ASSERT_EQ(a[i].dense, b[i].dense);
    ASSERT_EQ(a[i].slots.size(), b[i].slots.size());
    for (size_t s = 0; s < a[i].slots.size(); ++s) {
      ASSERT_EQ(a[i].slots[s].ids, b[i].slots[s].ids);
      ASSERT_EQ(a[i].slots[s].offsets, b[i].slots[s].offsets);
    }
    for (size_t t = 0; t < a[i].tables.size(); ++t) {
      ASSERT_EQ(a[i].tables[t].unique_ids, b[i].tables[t].unique_ids);
      ASSERT_EQ(a[i].tables[t].shard_offsets, b[i].tables[t].shard_offsets);
      ASSERT_EQ(a[i].tables[t].inverse, b[i].tables[t].inverse);
    }
    ASSERT_EQ(a[i].next_position, b[i].next_position);
  }
}

std::vector<std::vector<Batch>> InProcess() {
  auto loader = Loader::Start(Options(), {});
  EXPECT_TRUE(loader.ok());
  return DrainAll({(*loader)->stream(0), (*loader)->stream(1)});
}

TEST(DataService, RemoteStreamsEqualTheInProcessLoader) {
  LoaderProcess loader = StartLoader();
  auto s0 = ConnectBatchStream(loader.address, 0, {});
  auto s1 = ConnectBatchStream(loader.address, 1, {});
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  auto remote = DrainAll({s0->get(), s1->get()});
  auto local = InProcess();
  ExpectSame(remote[0], local[0]);
  ExpectSame(remote[1], local[1]);
  EXPECT_EQ(remote[0].size() + remote[1].size(), 60u);  // 2 epochs x 30 batches.
}

TEST(DataService, ABrokenStreamReconnectsWithoutLossOrRepeat) {
  LoaderProcess loader = StartLoader({"--replay_batches=64"});
  auto s0 = ConnectBatchStream(loader.address, 0, {});
  auto s1 = ConnectBatchStream(loader.address, 1, {});
  ASSERT_TRUE(s0.ok() && s1.ok());
  std::vector<std::vector<Batch>> got = DrainAll({s0->get(), s1->get()}, {5, 7});
  const ReaderPosition p0 = (*s0)->Position();
  Batch b;
  // Worker 0's stream breaks with batches in flight (prefetched, never read), then reconnects
  // asking for the batch after the last one it received.
  s0->reset();
  StreamClientOptions again;
  again.next_batch = static_cast<int64_t>(p0.next_batch);
  std::unique_ptr<BatchStream> reconnected;
  for (int attempt = 0; attempt < 50 && reconnected == nullptr; ++attempt) {
    auto s = ConnectBatchStream(loader.address, 0, again);
    ASSERT_TRUE(s.ok());
    absl::Status first = (*s)->Next(&b, absl::Seconds(10));
    if (first.ok()) {
      got[0].push_back(b);
      reconnected = std::move(*s);
    } else {
      // The server may not have noticed the broken stream yet.
      ASSERT_NE(first.message().find("already has an open stream"), std::string::npos) << first;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  ASSERT_NE(reconnected, nullptr);
  auto rest = DrainAll({reconnected.get(), s1->get()});
  for (int w = 0; w < 2; ++w) got[w].insert(got[w].end(), rest[w].begin(), rest[w].end());
  auto local = InProcess();
  ExpectSame(got[0], local[0]);
  ExpectSame(got[1], local[1]);
}

// Enough data that no stream of this job ends while the test runs.
constexpr char kLongConfig[] = R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 10000000, vocabulary: 5000, seed: 5}
  batch_size: 100
  threads: 2
  prefetch_batches: 2
ps: {shards: 3}
train: {workers: 2}
security: {mode: none}
)";

TEST(DataService, ASecondStreamForAWorkerIsRefusedWhileTheFirstIsOpen) {
  LoaderProcess loader = StartLoader({}, kLongConfig);
  auto s0 = ConnectBatchStream(loader.address, 0, {});
  auto s1 = ConnectBatchStream(loader.address, 1, {});
  ASSERT_TRUE(s0.ok() && s1.ok());
  Batch b;
  ASSERT_TRUE((*s0)->Next(&b, absl::Seconds(20)).ok());
  ASSERT_TRUE((*s1)->Next(&b, absl::Seconds(20)).ok());
  // The first stream stays open (its reader just stops reading): the second one waits for it
  // to end, then is refused, and the first one goes on undisturbed.
  auto dup = ConnectBatchStream(loader.address, 0, {});
  ASSERT_TRUE(dup.ok());
  const absl::Time start = absl::Now();
  const absl::Status refused = (*dup)->Next(&b, absl::Seconds(20));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("already has an open stream"), std::string::npos) << refused;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_TRUE((*s0)->Next(&b, absl::Seconds(20)).ok());
}

TEST(DataService, ResumesFromPositionsWrittenOnShutdown) {
  const std::string positions = ::testing::TempDir() + "/positions.txt";
  std::vector<std::vector<Batch>> got(2);
  {
    LoaderProcess loader = StartLoader({"--positions_out=" + positions});
    auto s0 = ConnectBatchStream(loader.address, 0, {});
    auto s1 = ConnectBatchStream(loader.address, 1, {});
    ASSERT_TRUE(s0.ok() && s1.ok());
    got = DrainAll({s0->get(), s1->get()}, {12, 13});
    // The loader's own positions run ahead of what the workers consumed (prefetch); the workers'
    // positions are what a checkpoint saves.
    std::ofstream(positions + ".workers") << FormatPositions({(*s0)->Position(), (*s1)->Position()});
    loader.process->Signal(SIGTERM);
    auto code = loader.process->Wait(absl::Seconds(10));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }
  std::ifstream written(positions);
  EXPECT_TRUE(written.good()) << "--positions_out was not written";
  LoaderProcess resumed = StartLoader({"--resume=" + positions + ".workers"});
  auto s0 = ConnectBatchStream(resumed.address, 0, {});
  auto s1 = ConnectBatchStream(resumed.address, 1, {});
  ASSERT_TRUE(s0.ok() && s1.ok());
  auto rest = DrainAll({s0->get(), s1->get()});
  for (int w = 0; w < 2; ++w) got[w].insert(got[w].end(), rest[w].begin(), rest[w].end());
  auto local = InProcess();
  ExpectSame(got[0], local[0]);
  ExpectSame(got[1], local[1]);
}

TEST(DataService, KilledLoaderEndsTheStreamWithAnError) {
  LoaderProcess loader = StartLoader();
  auto s0 = ConnectBatchStream(loader.address, 0, {});
  auto s1 = ConnectBatchStream(loader.address, 1, {});  // The loader reads once both came.
  ASSERT_TRUE(s0.ok() && s1.ok());
  Batch b;
  ASSERT_TRUE((*s0)->Next(&b, absl::Seconds(30)).ok());
  loader.process->Signal(SIGKILL);
  absl::Status s;
  const absl::Time start = absl::Now();
  while ((s = (*s0)->Next(&b, absl::Seconds(5))).ok()) {
  }
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsCancelled(s) || absl::IsInternal(s)) << s;
}

// A loader killed mid-job is replaced on its address, with the job's usual flags: the workers'
// streams reopen and report where they stand, and the new loader resumes each worker there,
// so the workers see exactly the batches of an undisturbed run, prefetched ones included.
TEST(DataService, AReplacedLoaderResumesEveryWorkerWhereItsStreamStands) {
  LoaderProcess first = StartLoader();
  const std::string port = first.address.substr(first.address.rfind(':') + 1);
  StreamClientOptions options;
  options.reconnect = true;
  auto s0 = ConnectBatchStream(first.address, 0, options);
  auto s1 = ConnectBatchStream(first.address, 1, options);
  ASSERT_TRUE(s0.ok() && s1.ok());
  std::vector<std::vector<Batch>> got = DrainAll({s0->get(), s1->get()}, {9, 4});
  first.process->Signal(SIGKILL);
  ASSERT_TRUE(first.process->Wait(absl::Seconds(10)).ok());
  // Each worker reads on its own, as worker processes do: the replacement begins reading only
  // once both streams reopened.
  std::vector<std::vector<Batch>> rest(2);
  std::vector<std::thread> readers;
  for (int w = 0; w < 2; ++w) {
    BatchStream* stream = w == 0 ? s0->get() : s1->get();
    readers.emplace_back([stream, out = &rest[w]] { *out = DrainAll({stream})[0]; });
  }
  absl::SleepFor(absl::Milliseconds(300));  // The streams notice the loss and retry meanwhile.
  LoaderProcess second = StartLoader({"--port=" + port});
  for (std::thread& t : readers) t.join();
  for (int w = 0; w < 2; ++w) got[w].insert(got[w].end(), rest[w].begin(), rest[w].end());
  auto local = InProcess();
  ExpectSame(got[0], local[0]);
  ExpectSame(got[1], local[1]);
}

// Two workers on a loader process, each having read 9 batches: worker 0's stream reconnects,
// worker 1's when `reconnect1`.
struct TwoWorkers {
  LoaderProcess first;
  std::string port;
  std::unique_ptr<BatchStream> s0, s1;
  std::vector<std::vector<Batch>> got;
};

TwoWorkers StartTwoWorkers(bool reconnect1) {
  TwoWorkers t;
  t.first = StartLoader();
  t.port = t.first.address.substr(t.first.address.rfind(':') + 1);
  StreamClientOptions options;
  options.reconnect = true;
  auto s0 = ConnectBatchStream(t.first.address, 0, options);
  auto s1 = ConnectBatchStream(t.first.address, 1, reconnect1 ? options : StreamClientOptions());
  EXPECT_TRUE(s0.ok() && s1.ok());
  if (!s0.ok() || !s1.ok()) return t;
  t.s0 = std::move(*s0);
  t.s1 = std::move(*s1);
  t.got = DrainAll({t.s0.get(), t.s1.get()}, {9, 9});
  return t;
}

// Worker 0 reads to the end beside worker 1's replacement (which has read `head` already): both
// see exactly the batches of an undisturbed run, the replacement from worker 1's batch 7 on.
void ExpectUndisturbedWithReplacement(TwoWorkers& t, BatchStream* replacement, std::vector<Batch> head) {
  std::vector<Batch> rest0;
  std::thread reader([&] { rest0 = DrainAll({t.s0.get()})[0]; });
  std::vector<Batch> rest1 = DrainAll({replacement})[0];
  rest1.insert(rest1.begin(), head.begin(), head.end());
  reader.join();
  t.got[0].insert(t.got[0].end(), rest0.begin(), rest0.end());
  auto local = InProcess();
  ExpectSame(t.got[0], local[0]);
  ExpectSame(rest1, std::vector<Batch>(local[1].begin() + 7, local[1].end()));
}

// A loader replaced while a worker is replaced too: the new worker knows the batch it wants but
// not its stream's position. The new loader reads that batch from the latest window known to
// hold it (here the surviving worker's) and serves it exactly the batches of an undisturbed run
// from there. The survivor does not read until the replacement has its first batch (as in a
// healed group, where it waits for the replacement in the allreduce): its stream, paused on a
// full queue, must notice the lost loader and reopen by itself.
TEST(DataService, AReplacedLoaderServesAReplacementWorkerFromTheBatchItAsksFor) {
  TwoWorkers t = StartTwoWorkers(/*reconnect1=*/false);
  ASSERT_EQ(t.got.size(), 2u);
  const uint64_t wanted = t.got[1][7].batch_id;  // Two batches before worker 1's last.
  absl::SleepFor(absl::Milliseconds(300));       // Worker 0's queue fills: its call pauses.
  t.s1.reset();                                  // Worker 1 is lost with the loader.
  t.first.process->Signal(SIGKILL);
  ASSERT_TRUE(t.first.process->Wait(absl::Seconds(10)).ok());
  // An arrival grace longer than any reopen takes on a loaded machine: the new loader reads only
  // once worker 0's stream is back, however long its reopen takes.
  LoaderProcess second = StartLoader({"--port=" + t.port, "--log_level=info", "--arrival_grace_ms=600000"});
  StreamClientOptions again;
  again.next_batch = static_cast<int64_t>(wanted);
  auto replacement = ConnectBatchStream(second.address, 1, again);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  Batch head;
  ASSERT_TRUE((*replacement)->Next(&head, absl::Seconds(60)).ok()) << "the new loader waits for worker 0's stream";
  ExpectUndisturbedWithReplacement(t, replacement->get(), {std::move(head)});
}

// A loader replaced, then a worker lost after its stream reopened to the new loader: the
// replacement asks for the lost worker's last trained batch, which is before the last one its
// stream had received (the rest were queued). A reopened stream reports a position some batches
// back (and drops what it is sent again), so the new loader still holds that batch for the
// replacement, and both workers see exactly the batches of an undisturbed run.
TEST(DataService, AReplacementFindsItsLostWorkersLastTrainedBatchAfterTheLoaderWasReplaced) {
  TwoWorkers t = StartTwoWorkers(/*reconnect1=*/true);
  ASSERT_EQ(t.got.size(), 2u);
  const uint64_t wanted = t.got[1][7].batch_id;  // Worker 1's queue holds the batches after got[1][8].
  absl::SleepFor(absl::Milliseconds(300));
  t.first.process->Signal(SIGKILL);
  ASSERT_TRUE(t.first.process->Wait(absl::Seconds(10)).ok());
  LoaderProcess second = StartLoader({"--port=" + t.port, "--arrival_grace_ms=600000"});
  absl::SleepFor(absl::Seconds(2));  // Both streams reopen to it, and it serves them.
  t.s1.reset();                      // Worker 1 is lost.
  StreamClientOptions again;
  again.next_batch = static_cast<int64_t>(wanted);
  auto replacement = ConnectBatchStream(second.address, 1, again);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  ExpectUndisturbedWithReplacement(t, replacement->get(), {});
}

// A replacement worker lost before it trained a step, after its stream (opened at its lost
// worker's last trained batch, without a position) reopened to a new loader: the next
// replacement asks the new loader for that same batch. The reopened stream reported a position
// as far back as where the first batch it received starts (each batch says where it starts),
// so the new loader still holds that batch.
TEST(DataService, AReplacementLostBeforeItsFirstStepLeavesItsBatchForTheNext) {
  TwoWorkers t = StartTwoWorkers(/*reconnect1=*/false);
  ASSERT_EQ(t.got.size(), 2u);
  const uint64_t wanted = t.got[1][7].batch_id;
  t.s1.reset();  // Worker 1 is lost.
  StreamClientOptions first_replacement;
  first_replacement.next_batch = static_cast<int64_t>(wanted);
  first_replacement.reconnect = true;
  auto r1 = ConnectBatchStream(t.first.address, 1, first_replacement);
  ASSERT_TRUE(r1.ok()) << r1.status();
  Batch replayed;
  ASSERT_TRUE((*r1)->Next(&replayed, absl::Seconds(10)).ok());
  ASSERT_EQ(replayed.batch_id, wanted);
  absl::SleepFor(absl::Milliseconds(300));  // Its queue fills with the batches after.
  t.first.process->Signal(SIGKILL);
  ASSERT_TRUE(t.first.process->Wait(absl::Seconds(10)).ok());
  LoaderProcess second = StartLoader({"--port=" + t.port, "--arrival_grace_ms=600000"});
  absl::SleepFor(absl::Seconds(2));  // Both streams reopen to it, and it serves them.
  r1->reset();                       // The replacement is lost too.
  StreamClientOptions again;
  again.next_batch = static_cast<int64_t>(wanted);
  auto r2 = ConnectBatchStream(second.address, 1, again);
  ASSERT_TRUE(r2.ok()) << r2.status();
  ExpectUndisturbedWithReplacement(t, r2->get(), {});
}

// A worker that does not come within the loader's arrival grace (5 s) does not hold the others
// up; when it comes, asking for a later batch than its start (a replacement of a lost worker
// that trained some), it is read for from its start, and gets exactly the batches of an
// undisturbed run from the one it asked for.
TEST(DataService, ALateWorkerDoesNotHoldTheOthersUpAndGetsTheBatchItAsksFor) {
  LoaderProcess loader = StartLoader();
  auto s0 = ConnectBatchStream(loader.address, 0, {});
  ASSERT_TRUE(s0.ok());
  const absl::Time opened = absl::Now();
  Batch first;
  ASSERT_TRUE((*s0)->Next(&first, absl::Seconds(20)).ok());
  EXPECT_GE(absl::Now() - opened, absl::Seconds(4)) << "read before the grace ran out";
  std::vector<Batch> got0 = {std::move(first)};
  auto local = InProcess();
  StreamClientOptions late;
  late.next_batch = static_cast<int64_t>(local[1][5].batch_id);
  auto s1 = ConnectBatchStream(loader.address, 1, late);
  ASSERT_TRUE(s1.ok()) << s1.status();
  std::vector<std::vector<Batch>> rest = DrainAll({s0->get(), s1->get()});
  got0.insert(got0.end(), rest[0].begin(), rest[0].end());
  ExpectSame(got0, local[0]);
  ExpectSame(rest[1], std::vector<Batch>(local[1].begin() + 5, local[1].end()));
}

// A stream that does not reconnect, or a loader that never comes back, is an error within the
// caller's timeout, never a hang.
TEST(DataService, AReconnectingStreamGivesUpWithinItsTimeout) {
  // More batches than gRPC's windows can hold, so the stream cannot have reached its end before
  // the loader is killed.
  std::string config = kConfig;
  config.replace(config.find("num_samples: 3000"), 17, "num_samples: 300000");
  LoaderProcess loader = StartLoader({}, config.c_str());
  StreamClientOptions options;
  options.reconnect = true;
  auto s0 = ConnectBatchStream(loader.address, 0, options);
  auto s1 = ConnectBatchStream(loader.address, 1, options);
  ASSERT_TRUE(s0.ok() && s1.ok());
  DrainAll({s0->get(), s1->get()}, {2, 2});
  loader.process->Signal(SIGKILL);
  Batch b;
  absl::Status s;
  const absl::Time start = absl::Now();
  while ((s = (*s0)->Next(&b, absl::Seconds(3))).ok()) {
  }
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Seconds(3)));
  EXPECT_NE(s.message().find("was lost and did not come back within 3s"), std::string::npos) << s;
}

TEST(DataService, ConnectHasADeadline) {
  StreamClientOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto s = ConnectBatchStream("127.0.0.1:1", 0, options);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(options.connect_timeout));
}

// What a hostile or broken loader could send: each malformed batch is refused with DATA_LOSS
// naming its field, before the worker indexes anything with it.
TEST(DataService, AWorkerRefusesAMalformedBatchNamingTheField) {
  Batch good;
  good.batch_size = 2;
  good.num_dense = 1;
  good.labels = {0, 1};
  good.dense = {0.5f, 0.25f};
  good.slots.resize(1);
  good.slots[0].offsets = {0, 1, 3};
  good.slots[0].ids = {10, 11, 10};
  good.tables.resize(1);
  good.tables[0].unique_ids = {10, 11};
  good.tables[0].shard_offsets = {0, 1, 2};
  good.tables[0].inverse = {{0, 1, 0}};
  BatchShape shape;
  shape.num_dense = 1;
  shape.num_tables = 1;
  shape.num_shards = 2;
  shape.slot_tables = {0};
  ASSERT_TRUE(ValidateBatch(good, shape).ok()) << ValidateBatch(good, shape);
  {  // What crosses the wire comes back, the batch's data time with the rest.
    good.data_time = 1'700'000'123;
    proto::BatchProto wire;
    EncodeBatch(good, &wire);
    Batch back;
    ASSERT_TRUE(DecodeBatchMessage(wire.SerializeAsString(), shape, &back).ok());
    EXPECT_EQ(back.data_time, good.data_time);
    EXPECT_EQ(back.tables[0].unique_ids, good.tables[0].unique_ids);
  }
  auto refused = [&](const std::function<void(Batch*)>& spoil, const std::string& field) {
    Batch b = good;
    spoil(&b);
    const absl::Status s = ValidateBatch(b, shape);
    EXPECT_TRUE(absl::IsDataLoss(s)) << field << ": " << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  refused([](Batch* b) { b->slots.clear(); }, "slots");
  refused([](Batch* b) { b->tables[0].inverse[0][2] = 7; }, "tables[0].inverse[0][2]");
  refused([](Batch* b) { b->slots[0].offsets = {0, 3, 1}; }, "slots[0].offsets");
  refused([](Batch* b) { b->slots[0].offsets = {0, 1, 9}; }, "slots[0].offsets");
  refused([](Batch* b) { b->slots[0].offsets.pop_back(); }, "slots[0].offsets");
  refused([](Batch* b) { b->tables[0].inverse[0].pop_back(); }, "tables[0].inverse[0]");
  refused([](Batch* b) { b->tables[0].inverse.clear(); }, "tables[0].inverse[0]");
  refused([](Batch* b) { b->tables[0].shard_offsets = {0, 2}; }, "tables[0].shard_offsets");
  refused([](Batch* b) { b->dense.pop_back(); }, "dense");
  refused([](Batch* b) { b->num_dense = 3; }, "num_dense");
  refused([](Batch* b) { b->labels.push_back(1); }, "batch_size");
  refused([](Batch* b) { b->slots[0].weights = {1}; }, "slots[0].weights");
  refused([](Batch* b) { b->tables.clear(); }, "tables");
  // The same through the wire decoder: a message with an odd-length field, and one that does
  // not parse at all.
  proto::BatchProto message;
  message.set_batch_id(4);
  message.set_batch_size(2);
  message.set_labels(std::string(7, '\0'));
  Batch decoded;
  const absl::Status odd = DecodeBatchMessage(message.SerializeAsString(), shape, &decoded);
  EXPECT_TRUE(absl::IsDataLoss(odd)) << odd;
  EXPECT_NE(odd.message().find("labels"), std::string::npos) << odd;
  EXPECT_TRUE(absl::IsDataLoss(DecodeBatchMessage("\xff\xff\xff", shape, &decoded)));
}

TEST(DataService, BadConfigsAreReportedWithKeyAndLine) {
  const std::string path =
      WriteConfig("bad_loader.yaml", "loader:\n  source:\n    format: synthetic\n  batch_sise: 10\n");
  const hyrec::testing::CommandResult r = hyrec::testing::RunCommand({HYREC_LOADER_BINARY, "--config=" + path});
  const std::string output = r.all();
  EXPECT_EQ(r.code, 2);  // Invalid configuration.
  EXPECT_NE(output.find("loader.batch_sise (line 4): unknown key; did you mean 'batch_size'?"), std::string::npos)
      << output;
  auto root = ParseYaml("source: {format: parquet}\n", "t");
  EXPECT_NE(ParseLoaderConfig(*root, "").status().message().find("'parquet' is not"), std::string::npos);
  root = ParseYaml("source: {format: criteo}\n", "t");
  EXPECT_NE(ParseLoaderConfig(*root, "").status().message().find("needs at least one file"), std::string::npos);
  EXPECT_FALSE(ParsePositions("next_batch=1 epoch=x").ok());
  EXPECT_FALSE(ParsePositions("next_batch=1").ok());
  auto round = ParsePositions(FormatPositions({ReaderPosition(), ReaderPosition()}));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->size(), 2u);
}

// A stream source's position names its window's records per partition: the text form, the wire
// and the checkpoint's position files carry the ranges whole.
TEST(DataService, AStreamPositionTravelsWhole) {
  ReaderPosition p;
  p.next_batch = 9;
  p.window_global = 6;
  p.partitions = {{0, 10, 42}, {2, 0, 0}, {5, 7, 8}};
  auto text = ParsePositions(FormatPositions({p}));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->at(0), p);
  proto::ReaderPosition wire;
  ToProto(p, &wire);
  EXPECT_EQ(FromProto(wire), p);
  EXPECT_FALSE(ParsePositions(FormatPositions({ReaderPosition()}) +
                              "next_batch=0 epoch=0 window_batch=0 "
                              "window_global=0 file_index=0 byte_offset=0 line_number=1 partitions=0:9-3")
                   .ok())
      << "an end before its start";
  EXPECT_FALSE(ParsePartitionRanges("1:2").ok());
}

// What a cut commits to a stream's group: each partition's earliest window start over the
// workers; a partition one worker's window does not know yet is left out.
TEST(DataService, ACutCommitsTheEarliestWindowStartOfEachPartition) {
  ReaderPosition a, b;
  a.partitions = {{0, 100, 130}, {1, 40, 60}};
  b.partitions = {{0, 130, 150}, {1, 60, 60}, {2, 0, 9}};
  EXPECT_EQ(CutOffsets({a, b}), (std::map<int32_t, int64_t>{{0, 100}, {1, 40}}));
  EXPECT_TRUE(CutOffsets({ReaderPosition(), ReaderPosition()}).empty()) << "a file source's cut";
}

TEST(DataService, AKafkaSourceIsReadWithItsKeysChecked) {
  auto root = ParseYaml(
      "source:\n  format: criteo\n  kafka:\n    brokers: k:9092\n    topic: clicks\n    group: g\n"
      "    linger_ms: 20\n    properties: {security.protocol: ssl}\n",
      "t");
  ASSERT_TRUE(root.ok());
  absl::StatusOr<LoaderOptions> o = ParseLoaderConfig(*root, "loader");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->source.kafka.has_value());
  EXPECT_EQ(o->source.kafka->topic, "clicks");
  EXPECT_EQ(o->source.kafka->linger, absl::Milliseconds(20));
  EXPECT_EQ(o->source.kafka->properties.at("security.protocol"), "ssl");
  root = ParseYaml("source:\n  format: criteo\n  kafka: {brokers: k:9092, group: g}\n", "t");
  EXPECT_NE(
      ParseLoaderConfig(*root, "loader").status().message().find("loader.source.kafka (line 3): missing key 'topic'"),
      std::string::npos)
      << ParseLoaderConfig(*root, "loader").status();
  root = ParseYaml("source:\n  format: criteo\n  kafka: {brokers: k, topic: t, group: g, propertys: {}}\n", "t");
  EXPECT_NE(ParseLoaderConfig(*root, "loader").status().message().find("did you mean 'properties'"), std::string::npos)
      << ParseLoaderConfig(*root, "loader").status();
  root = ParseYaml("source:\n  format: synthetic\n  kafka: {brokers: k, topic: t, group: g}\n", "t");
  EXPECT_FALSE(ParseLoaderConfig(*root, "loader").ok());
}

// A stream's end: end_offsets per partition or an RFC 3339 end_time, at most one of the three
// ends, each bad value refused naming its key and line.
TEST(DataService, AKafkaSourcesEndIsReadWithItsKeysChecked) {
  const std::string head =
      "source:\n  format: criteo\n  kafka:\n    brokers: k:9092\n    topic: clicks\n    group: g\n";
  auto parse = [&](const std::string& end) {
    auto root = ParseYaml(head + end, "t");
    EXPECT_TRUE(root.ok()) << root.status();
    return ParseLoaderConfig(*root, "loader");
  };
  absl::StatusOr<LoaderOptions> o = parse("    end_offsets: {0: 500, 3: 0}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->source.kafka->end_offsets, (std::map<int32_t, int64_t>{{0, 500}, {3, 0}}));
  EXPECT_TRUE(o->source.kafka->ends());
  o = parse("    end_time: 2026-12-04T18:00:00Z\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->source.kafka->end_time, absl::FromUnixSeconds(1796407200));
  EXPECT_TRUE(o->source.kafka->ends());
  o = parse("    end_time: 2026-12-04T19:00:00.5+01:00\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->source.kafka->end_time, absl::FromUnixMillis(int64_t{1796407200500}));
  o = parse("");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->source.kafka->ends()) << "a stream without end";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"    end_offsets: {0: -1}\n", "loader.source.kafka.end_offsets.0 (line 7): an end offset is a non-negative"},
      {"    end_offsets: {x: 5}\n", "loader.source.kafka.end_offsets (line 7): a partition is a non-negative"},
      {"    end_offsets: [5]\n", "loader.source.kafka.end_offsets (line 7): expected a mapping"},
      {"    end_offsets: {}\n", "loader.source.kafka.end_offsets (line 7): expected a mapping"},
      {"    end_time: yesterday\n", "loader.source.kafka.end_time (line 7): expected an RFC 3339 time"},
      {"    end_time: 1796407200\n", "loader.source.kafka.end_time (line 7): expected an RFC 3339 time"},
      {"    bounded: true\n    end_time: 2026-12-04T18:00:00Z\n", "at most one of bounded, end_offsets and end_time"},
      {"    end_offsets: {0: 1}\n    end_time: 2026-12-04T18:00:00Z\n", "at most one of"},
      {"    end_offset: {0: 1}\n", "did you mean 'end_offsets'"},
  };
  for (const auto& [yaml, error] : refused) {
    o = parse(yaml);
    EXPECT_FALSE(o.ok()) << yaml;
    EXPECT_TRUE(absl::StrContains(o.status().message(), error)) << yaml << ": " << o.status();
  }
}

}  // namespace
}  // namespace hyrec::data_loader
