// One PS shard killed (SIGKILL) under a stream of updates and restarted with --recover: it loads
// the checkpoint its update log starts from, replays the log, and the client, which waits for it
// and resends what was not acknowledged, goes on. Every acknowledged update is in the final rows
// and none is applied twice: with SGD at learning rate 1 and gradients of 1 on rows that start at
// 0, each row reads exactly minus the number of updates. A shard restarted without its state is
// refused by the client, naming why.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "embedding.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "run_command.h"

namespace hyrec::embedding_ps {
namespace {

absl::Status UpdateEvery(EmbeddingClient& client, uint64_t sequence);
void UpdateEvery(EmbeddingClient& client, uint64_t first, uint64_t last);

class PsRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteJob("{shards: 2}"); }

  void WriteJob(const std::string& ps) {
    dir_ = ::testing::TempDir() + "/ps_recovery_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    job_ = dir_ + "/job.yaml";
    std::ofstream(job_) << "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n"
                        << "features: [f]\n"
                        << "tables: [{name: counts, features: [f], dim: 1, initializer: zeros,\n"
                        << "          optimizer: {kind: sgd, learning_rate: 1}}]\n"
                        << "ps: " << ps << "\nsecurity: {mode: none}\n"
                        << "checkpoint: {dir: " << dir_ << "/ckpt}\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Starts shard `i` (on `port`, 0: any) and returns its port.
  int StartShard(int i, int port, bool recover) {
    std::vector<std::string> argv = {HYREC_PS_BINARY, "--config=" + job_, absl::StrCat("--shard_index=", i),
                                     absl::StrCat("--port=", port), "--log_level=info"};
    if (recover) argv.push_back("--recover");
    auto p = Subprocess::Spawn(argv);
    EXPECT_TRUE(p.ok()) << p.status();
    auto listening = WaitForListeningPort(**p, absl::Seconds(30));
    EXPECT_TRUE(listening.ok()) << listening.status();
    shards_[i] = std::move(*p);
    return listening.ok() ? *listening : 0;
  }

  // Starts both shards fresh (addresses_ then names them); returns shard 1's port.
  int StartBoth() {
    const int port0 = StartShard(0, 0, false);
    const int port1 = StartShard(1, 0, false);
    addresses_ = {absl::StrCat("127.0.0.1:", port0), absl::StrCat("127.0.0.1:", port1)};
    return port1;
  }

  void Kill(int i) {
    shards_[i]->Signal(SIGKILL);
    (void)shards_[i]->Wait(absl::Seconds(10));
  }

  // A checkpoint of both shards, committed as worker 0 commits one.
  void Checkpoint(EmbeddingClient& client, uint64_t step) {
    const std::string name = CheckpointDirName(kCheckpointPrefix, step, step);
    ASSERT_TRUE(client.BeginCut(CutKind::kCheckpoint, name, step, absl::Seconds(30)).ok());
    auto files = client.AwaitCut(step, absl::Seconds(30));
    ASSERT_TRUE(files.ok()) << files.status();
    CheckpointManifest m;
    m.step = step;
    m.num_shards = 2;
    m.num_workers = 1;
    uint64_t rows = 0;
    for (const ShardFileInfo& f : *files) {
      m.files.push_back(f.file);
      rows += f.table_rows[0];
    }
    m.tables.push_back({"counts", 1, "sgd", rows});
    ASSERT_TRUE(CommitManifest(Env::Default(), JoinPath(dir_ + "/ckpt", name), m).ok());
  }

  // Updates 1..100, a checkpoint, then updates 101..400 streaming while shard 1 (on port1) is
  // killed and restarted with --recover; each call waits and resends.
  void StreamThroughAKill(EmbeddingClient& client, int port1) {
    UpdateEvery(client, 1, 100);
    Checkpoint(client, 1);  // The log's next segment starts from it.
    std::atomic<uint64_t> acknowledged{100};
    std::thread stream([&] {
      for (uint64_t s = 101; s <= 400; ++s) {
        const absl::Status status = UpdateEvery(client, s);
        ASSERT_TRUE(status.ok()) << "update " << s << ": " << status;
        acknowledged = s;
      }
    });
    while (acknowledged < 180) absl::SleepFor(absl::Milliseconds(1));
    Kill(1);
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_EQ(StartShard(1, port1, /*recover=*/true), port1);
    stream.join();
    ASSERT_EQ(acknowledged.load(), 400u);
  }

  std::string dir_, job_;
  std::unique_ptr<Subprocess> shards_[2];
  std::vector<std::string> addresses_;
};

ClientOptions WaitingClient() {
  ClientOptions o;
  o.call_timeout = absl::Seconds(60);
  o.max_attempts = 1 << 20;
  return o;
}

std::vector<uint64_t> Ids() {
  std::vector<uint64_t> ids;
  for (uint64_t id = 1; id <= 16; ++id) ids.push_back(id * 7919);  // On both shards.
  return ids;
}

// Worker 0's update `sequence`: a gradient of 1 to every id of Ids().
absl::Status UpdateEvery(EmbeddingClient& client, uint64_t sequence) {
  const std::vector<uint64_t> ids = Ids();
  return client.Update("counts", ids, std::vector<float>(ids.size(), 1.0f), UpdateId{0, sequence});
}

// Worker 0's updates `first` to `last`, each acknowledged.
void UpdateEvery(EmbeddingClient& client, uint64_t first, uint64_t last) {
  for (uint64_t s = first; s <= last; ++s) ASSERT_TRUE(UpdateEvery(client, s).ok()) << "update " << s;
}

// Every id of Ids() reads `value`: minus the updates applied to it (SGD at learning rate 1).
void ExpectEveryRow(EmbeddingClient& client, float value) {
  const std::vector<uint64_t> ids = Ids();
  std::vector<float> rows(ids.size());
  ASSERT_TRUE(client.Lookup("counts", ids, absl::MakeSpan(rows)).ok());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(rows[i], value) << "id " << ids[i];
}

TEST_F(PsRecoveryTest, EveryAcknowledgedUpdateSurvivesAKilledShardAndNoneIsAppliedTwice) {
  const int port1 = StartBoth();
  auto client = ConnectEmbeddingClient(addresses_, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  auto update = [&](uint64_t sequence) { return UpdateEvery(**client, sequence); };
  StreamThroughAKill(**client, port1);
  ExpectEveryRow(**client, -400.0f);
  // A resend of an applied update after the crash is recognized and not applied again.
  ASSERT_TRUE(update(400).ok());
  ASSERT_TRUE(update(399).ok());
  ExpectEveryRow(**client, -400.0f);

  // A second checkpoint truncates the log at the first: the segment that started from nothing goes.
  const std::string log1 = dir_ + "/ckpt/update-log/ps-1";
  EXPECT_TRUE(std::filesystem::exists(log1 + "/log-00000000000000000001.wal"));
  Checkpoint(**client, 2);
  ASSERT_TRUE(update(401).ok());
  Checkpoint(**client, 3);
  EXPECT_FALSE(std::filesystem::exists(log1 + "/log-00000000000000000001.wal"));
  // Killed again after the truncation: it recovers from the second checkpoint and what followed.
  Kill(1);
  ASSERT_EQ(StartShard(1, port1, /*recover=*/true), port1);
  ExpectEveryRow(**client, -401.0f);

  // Restarted without --recover, the shard starts afresh: the client refuses to go on with it.
  Kill(1);
  ASSERT_EQ(StartShard(1, port1, /*recover=*/false), port1);
  const absl::Status refused = update(402);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("restarted without recovering its rows"), std::string::npos) << refused;
}

// The same with a disk tier under 4 rows of DRAM a shard (one stripe, so that every new row
// evicts): of each shard's 8 rows, 4 are on disk at any time and every update moves rows between
// the tiers; the killed shard recovers every acknowledged update from its checkpoint (which cut
// both tiers) and its log.
TEST_F(PsRecoveryTest, AShardWithADiskTierRecoversEveryAcknowledgedUpdate) {
  WriteJob(absl::StrCat("{shards: 2, capacity_rows: 4, num_stripes: 1, disk: {dir: ", ::testing::TempDir(),
                        "/ps_recovery_tier_", getpid(), ", capacity_bytes: 1048576}}"));
  const std::string tier_dir = absl::StrCat(::testing::TempDir(), "/ps_recovery_tier_", getpid());
  std::filesystem::create_directories(tier_dir);
  const int port1 = StartBoth();
  EXPECT_TRUE(std::filesystem::exists(tier_dir + "/ps-1.tier")) << "the shard keeps its tier there";
  auto client = ConnectEmbeddingClient(addresses_, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  StreamThroughAKill(**client, port1);
  ExpectEveryRow(**client, -400.0f);
  ASSERT_TRUE(UpdateEvery(**client, 400).ok());
  ExpectEveryRow(**client, -400.0f);  // A resend is not applied again.
  std::filesystem::remove_all(tier_dir);
}

// A second `hyrec ps` for a shard that serves (the same job, any port) is refused before it
// touches the shard's update log, naming the process that owns it; the live shard goes on
// logging, and after a kill -9 it recovers every update it acknowledged, before the second
// start and after it.
TEST_F(PsRecoveryTest, ASecondPsForAServingShardIsRefusedAndTheLogKeepsEveryUpdate) {
  const int port1 = StartBoth();
  auto client = ConnectEmbeddingClient(addresses_, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  UpdateEvery(**client, 1, 100);

  for (const bool recover : {false, true}) {
    SCOPED_TRACE(recover ? "--recover" : "a fresh start");
    std::vector<std::string> argv = {HYREC_PS_BINARY, "--config=" + job_, "--shard_index=1", "--port=0"};
    if (recover) argv.push_back("--recover");
    SpawnOptions capture;
    capture.capture_stderr = true;
    auto second = Subprocess::Spawn(argv, capture);
    ASSERT_TRUE(second.ok()) << second.status();
    std::string err;
    for (absl::StatusOr<std::string> line; (line = (*second)->ReadErrorLine(absl::Seconds(30))).ok();) {
      err += *line + "\n";
    }
    const absl::StatusOr<int> code = (*second)->Wait(absl::Seconds(10));
    if (!code.ok()) (*second)->Signal(SIGKILL);  // It serves: the shard has two owners.
    EXPECT_EQ(code.ok() ? *code : -1, 2) << err;
    EXPECT_NE(err.find("the update log " + dir_ + "/ckpt/update-log/ps-1 belongs to a shard that runs"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(absl::StrCat("pid ", shards_[1]->pid())), std::string::npos) << err;
  }
  UpdateEvery(**client, 101, 200);
  Kill(1);
  ASSERT_EQ(StartShard(1, port1, /*recover=*/true), port1);
  ExpectEveryRow(**client, -200.0f);
}

// A shard lost while its run goes on (worker 0 holds checkpoint.dir) and restarted by hand
// without --recover is refused (exit 2) naming its log and --recover, instead of deleting the
// updates it acknowledged; restarted with --recover it serves them all.
TEST_F(PsRecoveryTest, AFreshStartOverALiveRunsLogIsRefusedNamingRecover) {
  const int port1 = StartBoth();
  auto client = ConnectEmbeddingClient(addresses_, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  UpdateEvery(**client, 1, 50);
  auto run = ClaimCheckpointDir(Env::Default(), dir_ + "/ckpt", "0123456789abcdef");  // As worker 0 does.
  ASSERT_TRUE(run.ok()) << run.status();
  Kill(1);
  const testing::CommandResult fresh =
      testing::RunCommand({HYREC_PS_BINARY, "--config=" + job_, "--shard_index=1", absl::StrCat("--port=", port1)});
  EXPECT_EQ(fresh.code, 2) << fresh.all();
  EXPECT_NE(fresh.err.find("the update log " + dir_ + "/ckpt/update-log/ps-1 holds"), std::string::npos) << fresh.all();
  EXPECT_NE(fresh.err.find("restart this shard with --recover"), std::string::npos) << fresh.all();
  EXPECT_NE(fresh.err.find("a run of job 0123456789abcdef"), std::string::npos) << fresh.all();
  ASSERT_EQ(StartShard(1, port1, /*recover=*/true), port1);
  ExpectEveryRow(**client, -50.0f);
}

// A shard frozen (SIGSTOP) and replaced where the lock does not reach (another host: here its
// LOCK file is removed) stops (exit 2) at the first update it is sent after it wakes, before it
// logs or answers it; the shard that took over holds every acknowledged update.
TEST_F(PsRecoveryTest, AShardReplacedWhileFrozenStopsAtItsNextUpdate) {
  const int port1 = StartBoth();
  auto client = ConnectEmbeddingClient(addresses_, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  UpdateEvery(**client, 1, 20);
  std::unique_ptr<Subprocess> old = std::move(shards_[1]);
  old->Signal(SIGSTOP);
  std::filesystem::remove(dir_ + "/ckpt/update-log/ps-1/LOCK");
  const int port = StartShard(1, 0, /*recover=*/true);
  ASSERT_NE(port, 0);
  old->Signal(SIGCONT);

  proto::UpdateRequest stale;  // From a worker that still calls the old address.
  stale.set_table("counts");
  stale.set_worker_id(0);
  stale.set_sequence(21);
  const std::vector<uint64_t> one_id = {Ids()[0]};
  const float grad = 1.0f;
  stale.set_ids(std::string(reinterpret_cast<const char*>(one_id.data()), 8));
  stale.set_grads(std::string(reinterpret_cast<const char*>(&grad), 4));
  auto stub = proto::EmbeddingService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port1), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::UpdateResponse response;
  EXPECT_FALSE(stub->Update(&context, stale, &response).ok()) << "the old shard acknowledged an update";
  const absl::StatusOr<int> code = old->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);

  auto now = ConnectEmbeddingClient({addresses_[0], absl::StrCat("127.0.0.1:", port)}, WaitingClient());
  ASSERT_TRUE(now.ok()) << now.status();
  ExpectEveryRow(**now, -20.0f);
}

// One flipped byte in the middle of a killed shard's log, with acknowledged records after it:
// `hyrec checkpoint verify` names the segment, record and offset, and --recover refuses (exit 2)
// with the same words instead of serving without the updates after it; the log is left as it was.
TEST_F(PsRecoveryTest, DamageInTheMiddleOfTheLogRefusesRecoveryAndVerifyNamesIt) {
  StartBoth();
  auto client = ConnectEmbeddingClient(addresses_, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  UpdateEvery(**client, 1, 300);
  Kill(1);
  const std::string log1 = dir_ + "/ckpt/update-log/ps-1";
  const std::string segment = log1 + "/log-00000000000000000001.wal";
  const testing::CommandResult intact = testing::RunCommand({HYREC_CHECKPOINT_BINARY, "verify", log1});
  EXPECT_EQ(intact.code, 0) << intact.all();
  EXPECT_NE(intact.out.find("intact (update log: 1 segment(s), 300 record(s)"), std::string::npos) << intact.all();

  std::string bytes = *ReadFileToString(Env::Default(), segment, 1 << 24);
  bytes[bytes.size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), segment, bytes).ok());
  const testing::CommandResult verify = testing::RunCommand({HYREC_CHECKPOINT_BINARY, "verify", log1});
  EXPECT_EQ(verify.code, 5) << verify.all();
  EXPECT_NE(verify.err.find(segment + ": record 1"), std::string::npos) << verify.all();
  EXPECT_NE(verify.err.find("is damaged, and whole records of later groups follow it"), std::string::npos)
      << verify.all();
  const testing::CommandResult recover = testing::RunCommand(
      {HYREC_PS_BINARY, "--config=" + job_, "--shard_index=1", "--port=0", "--recover", "--log_level=info"});
  EXPECT_EQ(recover.code, 2) << recover.all();
  EXPECT_NE(recover.err.find("is damaged, and whole records of later groups follow it"), std::string::npos)
      << recover.all();
  EXPECT_EQ(recover.out.find("listening on"), std::string::npos) << recover.all();
  EXPECT_EQ(*ReadFileToString(Env::Default(), segment, 1 << 24), bytes) << "the log is left as it was";
}

// A shard whose store passes 64 MiB cuts its checkpoint by forking, inside the serving process:
// the files hold the rows as they were at the cut, while the shards go on updating every row
// before the writes are awaited.
TEST_F(PsRecoveryTest, ALargeShardCutsItsCheckpointByForkingWhileItServes) {
  std::ofstream(job_) << "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n"
                      << "features: [f]\n"
                      << "tables: [{name: wide, features: [f], dim: 256, optimizer: {kind: adagrad}}]\n"
                      << "ps: {shards: 2}\nsecurity: {mode: none}\n"
                      << "checkpoint: {dir: " << dir_ << "/ckpt}\n";
  const int port0 = StartShard(0, 0, false);
  const int port1 = StartShard(1, 0, false);
  auto client =
      ConnectEmbeddingClient({absl::StrCat("127.0.0.1:", port0), absl::StrCat("127.0.0.1:", port1)}, WaitingClient());
  ASSERT_TRUE(client.ok()) << client.status();
  // 80,000 rows of 2 KiB (256 weights and as many Adagrad sums): about 80 MiB a shard.
  constexpr size_t kRows = 80000, kChunk = 4096, kDim = 256;
  std::vector<uint64_t> ids(kRows);
  for (size_t i = 0; i < kRows; ++i) ids[i] = i * 7919 + 1;
  std::vector<float> at_cut(kRows * kDim);
  auto chunk = [&](size_t begin) { return absl::MakeConstSpan(ids).subspan(begin, std::min(kChunk, kRows - begin)); };
  for (size_t begin = 0; begin < kRows; begin += kChunk) {
    ASSERT_TRUE(
        (*client)
            ->Lookup("wide", chunk(begin), absl::MakeSpan(at_cut).subspan(begin * kDim, chunk(begin).size() * kDim))
            .ok());
  }
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const ShardStats& s : *stats) ASSERT_GE(s.store.bytes, 64u << 20) << "shard " << s.shard_index;

  const std::string name = CheckpointDirName(kCheckpointPrefix, 7, 7);
  ASSERT_TRUE((*client)->BeginCut(CutKind::kCheckpoint, name, 7, absl::Seconds(30)).ok());
  const std::vector<float> ones(kChunk * kDim, 1.0f);
  for (size_t begin = 0; begin < kRows; begin += kChunk) {
    const auto part = chunk(begin);
    ASSERT_TRUE((*client)
                    ->Update("wide", part, absl::MakeConstSpan(ones).first(part.size() * kDim), UpdateId{0, 1 + begin})
                    .ok());
  }
  auto files = (*client)->AwaitCut(7, absl::Seconds(60));
  ASSERT_TRUE(files.ok()) << files.status();
  CheckpointManifest m;
  m.step = 7;
  m.num_shards = 2;
  m.num_workers = 1;
  for (const ShardFileInfo& f : *files) m.files.push_back(f.file);
  const std::string dir = JoinPath(dir_ + "/ckpt", name);
  ASSERT_TRUE(CommitManifest(Env::Default(), dir, m).ok());

  TableConfig wide;
  wide.name = "wide";
  wide.dim = kDim;
  wide.optimizer.kind = OptimizerKind::kAdagrad;
  StoreOptions options;
  options.tables = {wide};
  std::vector<float> restored(kRows * kDim);
  for (int k = 0; k < 2; ++k) {
    auto store = *EmbeddingShardStore::Create(options);
    ASSERT_TRUE(RestoreShard(Env::Default(), dir, m, k, 2, store.get()).ok());
    for (size_t i = 0; i < kRows; ++i) {
      if (ShardForId(ids[i], 2) != k) continue;
      ASSERT_TRUE(store->Lookup(0, {ids[i]}, absl::MakeSpan(restored).subspan(i * kDim, kDim), nullptr).ok());
    }
  }
  EXPECT_TRUE(restored == at_cut) << "the checkpoint does not hold the rows of the cut";
  std::vector<float> now(kChunk * kDim);
  ASSERT_TRUE((*client)->Lookup("wide", chunk(0), absl::MakeSpan(now)).ok());
  EXPECT_NE(now[0], at_cut[0]);  // The shards went on meanwhile.
}

}  // namespace
}  // namespace hyrec::embedding_ps
