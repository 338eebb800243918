// Checkpoint files and PS shard checkpoints without training: the block format detects every
// flipped byte and every truncation, manifests commit atomically under injected faults, shards
// restore exactly and reshard (4 -> 3, 2 -> 5) with their optimizer state, deltas bring an
// export's rows to a later snapshot, and loader positions remap to other worker counts.
#include <unistd.h>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "fault_injection_env.h"
#include "gtest/gtest.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/hash.h"
#include "hyrec/data_loader/positions.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"

namespace hyrec {
namespace {

using embedding_ps::CutKind;
using embedding_ps::EmbeddingShardStore;
using embedding_ps::OptimizerName;
using embedding_ps::RowPrecisionName;
using embedding_ps::StoreOptions;
using embedding_ps::TableConfig;

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/checkpoint_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadAll(const std::string& path) { return *ReadFileToString(Env::Default(), path, 1 << 30); }
void WriteAll(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, bytes).ok());
}

TEST(BlockFileTest, RoundTripsAndDetectsEveryFlippedByteAndTruncation) {
  const std::string dir = FreshDir("blocks");
  const std::string path = dir + "/f.blk";
  auto w = BlockWriter::Create(Env::Default(), path, FileKind::kDense);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Add(7, "hello").ok());
  ASSERT_TRUE((*w)->Add(8, std::string(40, 'x')).ok());
  absl::StatusOr<FileEntry> entry = (*w)->Finish();
  ASSERT_TRUE(entry.ok()) << entry.status();
  const std::string good = ReadAll(path);
  EXPECT_EQ(entry->length, good.size());
  EXPECT_EQ(entry->crc32, Crc32(good));
  auto parse = [](const std::string& bytes) -> absl::Status {
    auto r = BlockReader::FromString("f.blk", bytes, FileKind::kDense);
    if (!r.ok()) return r.status();
    Block b;
    for (;;) {
      absl::StatusOr<bool> more = (*r)->Next(&b);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
    }
  };
  ASSERT_TRUE(parse(good).ok());
  for (size_t i = 0; i < good.size(); ++i) {  // Header, lengths, payloads, checksums, end block.
    std::string bad = good;
    bad[i] ^= 0x10;
    const absl::Status s = parse(bad);
    EXPECT_TRUE(absl::IsDataLoss(s)) << "flip at " << i << ": " << s;
    EXPECT_NE(s.message().find("offset"), absl::string_view::npos) << s;
  }
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_TRUE(absl::IsDataLoss(parse(good.substr(0, n)))) << "truncated to " << n;
  }
  EXPECT_TRUE(absl::IsDataLoss(parse(good + "x")));
  EXPECT_TRUE(absl::IsDataLoss(BlockReader::FromString("f", good, FileKind::kManifest).status()));
}

// The prefetcher hands out a reader's blocks in order, and its error where the reader's comes;
// one left before the end stops.
TEST(BlockFileTest, ThePrefetcherReadsAheadWhatTheReaderReads) {
  std::vector<std::pair<uint32_t, std::string>> blocks;
  for (uint32_t i = 0; i < 50; ++i)
    blocks.emplace_back(1 + i % 5, std::string(100 + i * 37, static_cast<char>('a' + i % 26)));
  const std::string good = EncodeBlockFile(FileKind::kDense, blocks);
  for (const int depth : {1, 2, 4}) {
    BlockPrefetcher prefetch(*BlockReader::FromString("f.blk", good, FileKind::kDense), depth);
    size_t n = 0;
    for (const Block* b = nullptr;; ++n) {
      absl::StatusOr<bool> more = prefetch.Next(&b);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      ASSERT_LT(n, blocks.size());
      EXPECT_EQ(b->type, blocks[n].first);
      EXPECT_EQ(b->payload, blocks[n].second);
    }
    EXPECT_EQ(n, blocks.size());
    const Block* b = nullptr;
    EXPECT_FALSE(*prefetch.Next(&b));  // The end, again.
  }
  std::string bad = good;
  bad[good.size() / 2] ^= 1;
  {
    BlockPrefetcher prefetch(*BlockReader::FromString("f.blk", bad, FileKind::kDense));
    const Block* b = nullptr;
    absl::StatusOr<bool> more;
    size_t n = 0;
    while ((more = prefetch.Next(&b)).ok() && *more) ++n;
    EXPECT_TRUE(absl::IsDataLoss(more.status())) << more.status();
    EXPECT_GT(n, 0u);
    EXPECT_LT(n, blocks.size());
    EXPECT_TRUE(absl::IsDataLoss(prefetch.Next(&b).status()));
  }
  {
    BlockPrefetcher prefetch(*BlockReader::FromString("f.blk", good, FileKind::kDense), 1);
    const Block* b = nullptr;
    ASSERT_TRUE(*prefetch.Next(&b));
  }  // Destroyed with blocks unread: returns.
}

CheckpointManifest SampleManifest() {
  CheckpointManifest m;
  m.step = 42;
  m.samples = 4200;
  m.num_shards = 2;
  m.num_workers = 1;
  m.job_yaml = "loader: {}\n";
  m.tables.push_back({"user", 8, "adagrad", 10});
  m.files.push_back({"dense.blk", 100, 7});
  return m;
}

TEST(ManifestTest, RoundTripsAndRefusesEveryCorruption) {
  const std::string bytes = EncodeManifest(SampleManifest());
  absl::StatusOr<CheckpointManifest> m = DecodeManifest("M", bytes);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 42u);
  EXPECT_EQ(m->tables[0].name, "user");
  EXPECT_EQ(m->files[0].name, "dense.blk");
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x01;
    EXPECT_FALSE(DecodeManifest("M", bad).ok()) << "flip at " << i;
  }
  CheckpointManifest evil = SampleManifest();
  evil.files[0].name = "../outside";
  EXPECT_TRUE(absl::IsDataLoss(DecodeManifest("M", EncodeManifest(evil)).status()));
}

// The sparse optimizers and the row precision of the two tables the tests train. Every kind and
// precision goes through the restore, reshard and delta tests below (EveryOptimizer).
struct Optimizers {
  embedding_ps::OptimizerKind user = embedding_ps::OptimizerKind::kAdagrad;
  embedding_ps::OptimizerKind item = embedding_ps::OptimizerKind::kAdam;
  embedding_ps::RowPrecision precision = embedding_ps::RowPrecision::kFp32;
};

StoreOptions Options(uint64_t capacity = 0, bool track = false, Optimizers kinds = {}) {
  TableConfig user;
  user.name = "user";
  user.dim = 8;
  user.optimizer.kind = kinds.user;
  TableConfig item;
  item.name = "item";
  item.dim = 4;
  item.seed = 3;
  item.optimizer.kind = kinds.item;
  user.precision = item.precision = kinds.precision;
  StoreOptions o;
  o.tables = {user, item};
  o.num_stripes = 8;
  o.capacity_rows = capacity;
  o.track_changes = track;
  return o;
}

// Looks up and updates ids of both tables so that rows and optimizer state move.
void Train(EmbeddingShardStore* store, const std::vector<uint64_t>& ids, uint64_t sequence) {
  for (int t = 0; t < 2; ++t) {
    const int dim = store->table(t).dim;
    std::vector<float> rows(ids.size() * dim);
    ASSERT_TRUE(store->Lookup(t, ids, absl::MakeSpan(rows), nullptr).ok());
    std::vector<float> grads(rows.size());
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>((i * 7 + sequence) % 13) - 0.05f;
    ASSERT_TRUE(store->Update(t, ids, grads, embedding_ps::UpdateId{1, sequence}, nullptr).ok());
  }
}

// Every (table, id) -> its floats (weights and state).
std::map<std::pair<int, uint64_t>, std::vector<float>> Rows(const EmbeddingShardStore& store) {
  const embedding_ps::StoreSnapshot snap = store.Snapshot();
  std::map<std::pair<int, uint64_t>, std::vector<float>> out;
  for (size_t t = 0; t < snap.tables.size(); ++t) {
    const size_t floats = snap.tables[t].values.size() / std::max<size_t>(1, snap.tables[t].ids.size());
    for (size_t i = 0; i < snap.tables[t].ids.size(); ++i) {
      out[{static_cast<int>(t), snap.tables[t].ids[i]}].assign(snap.tables[t].values.begin() + i * floats,
                                                               snap.tables[t].values.begin() + (i + 1) * floats);
    }
  }
  return out;
}

// Writes a checkpoint of `stores` (shard k of stores.size()) into dir and commits its manifest.
CheckpointManifest WriteCheckpoint(Env* env, const std::string& dir,
                                   const std::vector<std::unique_ptr<EmbeddingShardStore>>& stores,
                                   absl::Status* status = nullptr, const std::string& job_id = "") {
  CheckpointManifest m;
  m.job_id = job_id;
  m.num_shards = static_cast<uint32_t>(stores.size());
  m.num_workers = 1;
  absl::Status s = env->CreateDirs(dir);
  for (size_t k = 0; k < stores.size() && s.ok(); ++k) {
    auto info = embedding_ps::WriteShardFile(env, dir, static_cast<int>(k), static_cast<int>(stores.size()),
                                             stores[k]->tables(), stores[k]->Snapshot());
    s = info.status();
    if (s.ok()) m.files.push_back(info->file);
  }
  if (s.ok()) s = CommitManifest(env, dir, m);
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
  return m;
}

std::vector<std::unique_ptr<EmbeddingShardStore>> Cluster(int shards, int ids, Optimizers kinds = {}) {
  std::vector<std::unique_ptr<EmbeddingShardStore>> stores;
  for (int k = 0; k < shards; ++k) stores.push_back(*EmbeddingShardStore::Create(Options(0, false, kinds)));
  for (int round = 1; round <= 3; ++round) {
    std::vector<std::vector<uint64_t>> per(shards);
    for (int i = 0; i < ids; ++i) {
      const uint64_t id = Mix64(i + 1) >> 20;
      per[ShardForId(id, shards)].push_back(id);
    }
    for (int k = 0; k < shards; ++k) Train(stores[k].get(), per[k], round);
  }
  return stores;
}

// --resume=auto: a fresh start where there is no committed checkpoint (none, or only a cut that
// never wrote its manifest), the newest otherwise; other values pass through.
TEST(ResumeFlagTest, AutoResumesOnlyFromACommittedCheckpoint) {
  const std::string root = FreshDir("resume_auto");
  Env* env = Env::Default();
  std::string note;
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "auto", &note), "");
  EXPECT_NE(note.find("starting fresh"), std::string::npos) << note;
  EXPECT_EQ(ResolveResumeFlag(env, "", kCheckpointPrefix, "auto", nullptr), "");
  const std::string torn = JoinPath(root, CheckpointDirName(kCheckpointPrefix, 5, 1));
  std::filesystem::create_directories(torn);
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "auto", nullptr), "");
  WriteAll(JoinPath(torn, kManifestName), "not a manifest");
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "auto", &note), "latest");
  EXPECT_NE(note.find("resuming"), std::string::npos) << note;
  // A committed but corrupt checkpoint is no fresh start: resolving it then fails, naming it.
  CheckpointManifest m;
  EXPECT_FALSE(ResolveCheckpoint(env, root, kCheckpointPrefix, "latest", &m).ok());
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "latest", nullptr), "latest");
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "/some/dir", nullptr), "/some/dir");
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "", nullptr), "");
}

class EveryOptimizer : public ::testing::TestWithParam<Optimizers> {};

TEST_P(EveryOptimizer, RestoresExactlyWithOptimizerState) {
  const std::string dir =
      FreshDir(absl::StrCat("exact_", OptimizerName(GetParam().user), RowPrecisionName(GetParam().precision)));
  auto stores = Cluster(2, 300, GetParam());
  const CheckpointManifest m = WriteCheckpoint(Env::Default(), dir, stores);
  for (int k = 0; k < 2; ++k) {
    auto restored = *EmbeddingShardStore::Create(Options(0, false, GetParam()));
    ASSERT_TRUE(
        embedding_ps::RestoreShard(Env::Default(), dir, *ReadManifest(Env::Default(), dir), k, 2, restored.get()).ok());
    EXPECT_EQ(Rows(*restored), Rows(*stores[k]));
    // The same next update gives the same rows (the optimizers' state came back).
    Train(restored.get(), {7, 8, 9}, 10);
    Train(stores[k].get(), {7, 8, 9}, 10);
    EXPECT_EQ(Rows(*restored), Rows(*stores[k]));
    // The dedup window came back: a repeat of an applied sequence is not applied again.
    embedding_ps::UpdateResult r;
    const std::vector<float> grad(8, 0.5f);
    ASSERT_TRUE(restored->Update(0, std::vector<uint64_t>{7}, grad, embedding_ps::UpdateId{1, 3}, &r).ok());
    EXPECT_TRUE(r.duplicate);
  }
  (void)m;
}

// Eviction scores travel through shard files: restored stores with lfu and ttl tables evict
// the same rows as the originals under the same later uses, and keep the tables' data time.
TEST(ShardCheckpointTest, RestoresEvictionScoresAndDataTime) {
  const std::string dir = FreshDir("policies");
  StoreOptions options = Options();
  options.tables[0].eviction.policy = embedding_ps::EvictionPolicy::kLfu;
  options.tables[0].eviction.lfu_aging_touches = 3;
  options.tables[0].capacity_rows = 60;
  options.tables[1].eviction.policy = embedding_ps::EvictionPolicy::kTtl;
  options.tables[1].eviction.ttl_seconds = 500;
  options.tables[1].capacity_rows = 60;
  std::vector<std::unique_ptr<EmbeddingShardStore>> stores;
  stores.push_back(*EmbeddingShardStore::Create(options));
  uint64_t now = 1'000'000;
  uint64_t sequence = 0;
  auto use = [&](EmbeddingShardStore* store, uint64_t id) {
    store->AdvanceDataTime(1, now);
    Train(store, {id}, ++sequence);
  };
  for (uint64_t i = 0; i < 2000; ++i) {
    now += 3;
    use(stores[0].get(), 1 + (Mix64(i) % 1000) * (Mix64(i) % 1000) / 5000);
  }
  WriteCheckpoint(Env::Default(), dir, stores);
  auto restored = *EmbeddingShardStore::Create(options);
  ASSERT_TRUE(
      embedding_ps::RestoreShard(Env::Default(), dir, *ReadManifest(Env::Default(), dir), 0, 1, restored.get()).ok());
  EXPECT_EQ(restored->data_time(1), now);
  EXPECT_EQ(Rows(*restored), Rows(*stores[0]));
  // The lfu table's counts come back as they were.
  auto counts = [](const EmbeddingShardStore& store) {
    const embedding_ps::StoreSnapshot snap = store.Snapshot();
    std::map<uint64_t, uint64_t> out;
    for (size_t k = 0; k < snap.tables[0].ids.size(); ++k) out[snap.tables[0].ids[k]] = snap.tables[0].scores[k];
    return out;
  };
  EXPECT_EQ(counts(*restored), counts(*stores[0]));
  const uint64_t base = sequence;
  for (uint64_t i = 0; i < 1000; ++i) {
    now += 3;
    const uint64_t id = 1 + (Mix64(i + 7777) % 1000) * (Mix64(i + 7777) % 1000) / 5000;
    sequence = base + i;
    use(stores[0].get(), id);
    sequence = base + i;
    use(restored.get(), id);
  }
  // The ttl table continues exactly as the original: the same rows expired and evicted by the
  // same later uses. (Which of several lfu rows of the least count goes first may differ.)
  auto ttl_rows = [](const EmbeddingShardStore& store) {
    auto rows = Rows(store);
    for (auto it = rows.begin(); it != rows.end();) it = it->first.first == 0 ? rows.erase(it) : std::next(it);
    return rows;
  };
  EXPECT_EQ(ttl_rows(*restored), ttl_rows(*stores[0]));
}

std::string FileBytes(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(Env::Default(), path, 1 << 30);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or("");
}

// A forked cut writes, from the child's view of the store frozen at Begin, the very file a
// Snapshot() taken then makes, while the parent goes on changing the store; lfu and ttl scores,
// data times, sketches and dedup windows included.
TEST(ShardCheckpointerTest, AForkedCutWritesTheStoreAsItWasAtBegin) {
  const std::string expect_dir = FreshDir("fork_expect");
  const std::string dir = FreshDir("fork_cut");
  StoreOptions options = Options();
  options.tables[0].eviction.policy = embedding_ps::EvictionPolicy::kLfu;
  options.tables[0].capacity_rows = 150;
  options.tables[0].admission.min_count = 2;
  options.tables[1].eviction.policy = embedding_ps::EvictionPolicy::kTtl;
  options.tables[1].eviction.ttl_seconds = 500;
  options.admission_sketch_counters = 1024;
  std::shared_ptr<EmbeddingShardStore> store = *EmbeddingShardStore::Create(options);
  uint64_t sequence = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    store->AdvanceDataTime(1, 1'000'000 + 7 * i);
    Train(store.get(), {Mix64(i) % 300, Mix64(i + 1) % 300, 1000 + i}, ++sequence);
  }
  const auto rows_then = Rows(*store);
  ASSERT_TRUE(embedding_ps::WriteShardFile(Env::Default(), expect_dir, 0, 1, store->tables(), store->Snapshot()).ok());

  embedding_ps::ShardCheckpointerOptions always_fork;
  always_fork.fork_min_bytes = 0;
  embedding_ps::ShardCheckpointer cutter(store, 0, 1, Env::Default(), always_fork);
  ASSERT_TRUE(cutter.Begin(dir, 1, embedding_ps::CutKind::kCheckpoint).ok());
  EXPECT_TRUE(cutter.last_forked());
  for (uint64_t i = 0; i < 200; ++i) {  // The parent goes on while the child writes.
    store->AdvanceDataTime(1, 2'000'000 + i);
    Train(store.get(), {Mix64(i + 9) % 300, 5000 + i}, ++sequence);
  }
  absl::StatusOr<embedding_ps::ShardFileInfo> info = cutter.Await(1, absl::Minutes(1));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NE(Rows(*store), rows_then);
  const std::string name = embedding_ps::ShardFileName(embedding_ps::CutKind::kCheckpoint, 0, 1);
  EXPECT_EQ(info->file.name, name);
  const std::string written = FileBytes(JoinPath(dir, name));
  EXPECT_EQ(written.size(), info->file.length);
  EXPECT_TRUE(written == FileBytes(JoinPath(expect_dir, name))) << "the forked cut differs from the snapshot";
  EXPECT_EQ(info->table_rows.size(), 2u);

  // It restores to the rows of the moment of the cut.
  CheckpointManifest m;
  m.num_shards = 1;
  m.num_workers = 1;
  m.files = {info->file};
  ASSERT_TRUE(CommitManifest(Env::Default(), dir, m).ok());
  auto restored = *EmbeddingShardStore::Create(options);
  ASSERT_TRUE(embedding_ps::RestoreShard(Env::Default(), dir, m, 0, 1, restored.get()).ok());
  EXPECT_EQ(Rows(*restored), rows_then);
}

// A store with a disk tier under a DRAM capacity of 120 rows holds the rows a store without
// bounds holds, bit for bit, most of them on disk; a forked cut of it writes both tiers as they
// were at Begin while the parent trains on, and restores into a store with or without a tier,
// and onto two shards with tiers.
TEST(ShardCheckpointerTest, AStoreWithADiskTierCutsBothTiersAndRestoresIntoEither) {
  const std::string dir = FreshDir("tier_cut");
  for (const auto precision : {embedding_ps::RowPrecision::kFp32, embedding_ps::RowPrecision::kFp16}) {
    Optimizers kinds{embedding_ps::OptimizerKind::kAdagradRowwise, embedding_ps::OptimizerKind::kAdam, precision};
    StoreOptions tiered_options = Options(120, false, kinds);
    tiered_options.disk.path = JoinPath(dir, absl::StrCat("tier_", RowPrecisionName(precision)));
    tiered_options.disk.capacity_bytes = 1 << 20;
    std::shared_ptr<EmbeddingShardStore> tiered = *EmbeddingShardStore::Create(tiered_options);
    auto reference = *EmbeddingShardStore::Create(Options(0, false, kinds));
    uint64_t sequence = 0;
    auto train_both = [&](uint64_t i) {
      const std::vector<uint64_t> ids = {Mix64(i) % 600, Mix64(i + 1) % 600, 10000 + i % 50};
      Train(tiered.get(), ids, ++sequence);
      Train(reference.get(), ids, sequence);
    };
    for (uint64_t i = 0; i < 400; ++i) train_both(i);
    const auto rows_then = Rows(*reference);
    ASSERT_EQ(Rows(*tiered), rows_then) << "every row, in DRAM or on disk";
    const embedding_ps::StoreStats stats = tiered->Stats();
    EXPECT_LE(stats.rows, 120u + 8) << "DRAM holds its capacity (a row a stripe over, at most)";
    EXPECT_GT(stats.tables[0].disk_rows, 200u);
    EXPECT_GT(stats.tables[0].disk_reads, 100u) << "rows came back from disk";
    EXPECT_EQ(stats.tables[0].disk_writes - stats.tables[0].disk_reads, stats.tables[0].disk_rows);
    EXPECT_GT(stats.disk.page_writes, 0u);

    embedding_ps::ShardCheckpointerOptions always_fork;
    always_fork.fork_min_bytes = 0;
    embedding_ps::ShardCheckpointer cutter(tiered, 0, 1, Env::Default(), always_fork);
    const std::string cut = JoinPath(dir, absl::StrCat("cut_", RowPrecisionName(precision)));
    ASSERT_TRUE(cutter.Begin(cut, 1, embedding_ps::CutKind::kCheckpoint).ok());
    EXPECT_TRUE(cutter.last_forked());
    for (uint64_t i = 400; i < 600; ++i) train_both(i);  // Rows move between the tiers meanwhile.
    absl::StatusOr<embedding_ps::ShardFileInfo> info = cutter.Await(1, absl::Minutes(1));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(Rows(*tiered), Rows(*reference));
    CheckpointManifest m;
    m.num_shards = 1;
    m.num_workers = 1;
    m.files = {info->file};
    ASSERT_TRUE(CommitManifest(Env::Default(), cut, m).ok());
    auto plain = *EmbeddingShardStore::Create(Options(0, false, kinds));
    ASSERT_TRUE(embedding_ps::RestoreShard(Env::Default(), cut, m, 0, 1, plain.get()).ok());
    EXPECT_EQ(Rows(*plain), rows_then) << "the cut is the moment of Begin";
    tiered_options.disk.path += "_restored";
    auto restored = *EmbeddingShardStore::Create(tiered_options);
    ASSERT_TRUE(embedding_ps::RestoreShard(Env::Default(), cut, m, 0, 1, restored.get()).ok());
    EXPECT_EQ(Rows(*restored), rows_then);
    EXPECT_GT(restored->Stats().tables[0].disk_rows, 200u) << "restored past DRAM onto disk";
    // Resharded onto two shards with tiers of DRAM 40 rows each: every row once, on its shard.
    std::map<std::pair<int, uint64_t>, std::vector<float>> resharded;
    for (int k = 0; k < 2; ++k) {
      StoreOptions shard_options = Options(40, false, kinds);
      shard_options.disk.path = absl::StrCat(tiered_options.disk.path, "_shard", k);
      shard_options.disk.capacity_bytes = 1 << 20;
      auto shard = *EmbeddingShardStore::Create(shard_options);
      ASSERT_TRUE(embedding_ps::RestoreShard(Env::Default(), cut, m, k, 2, shard.get()).ok());
      EXPECT_GT(shard->Stats().tables[0].disk_rows, 100u);
      for (auto& [key, value] : Rows(*shard)) {
        EXPECT_EQ(ShardForId(key.second, 2), k) << "id " << key.second << " on the wrong shard";
        EXPECT_TRUE(resharded.emplace(key, value).second);
      }
    }
    EXPECT_EQ(resharded, rows_then);
  }
}

// A child that cannot write its file reports why; the next cut works.
TEST(ShardCheckpointerTest, AForkedCutsFailureComesBackFromTheChild) {
  const std::string dir = FreshDir("fork_fail");
  std::shared_ptr<EmbeddingShardStore> store = *EmbeddingShardStore::Create(Options());
  Train(store.get(), {1, 2, 3}, 1);
  embedding_ps::ShardCheckpointerOptions always_fork;
  always_fork.fork_min_bytes = 0;
  embedding_ps::ShardCheckpointer cutter(store, 0, 1, Env::Default(), always_fork);
  const std::string name = embedding_ps::ShardFileName(embedding_ps::CutKind::kCheckpoint, 0, 1);
  std::filesystem::create_directories(JoinPath(dir, name + ".tmp"));  // The file cannot be created.
  ASSERT_TRUE(cutter.Begin(dir, 7, embedding_ps::CutKind::kCheckpoint).ok());
  absl::StatusOr<embedding_ps::ShardFileInfo> info = cutter.Await(7, absl::Minutes(1));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find(name), std::string::npos) << info.status();
  std::filesystem::remove_all(JoinPath(dir, name + ".tmp"));
  ASSERT_TRUE(cutter.Begin(dir, 8, embedding_ps::CutKind::kCheckpoint).ok());
  info = cutter.Await(8, absl::Minutes(1));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->table_rows, (std::vector<uint64_t>{3, 3}));
}

// A small store is copied in memory during the cut (no fork), into the memory of the previous
// cut's copy; every cut still holds the store as it was at its Begin.
TEST(ShardCheckpointerTest, ASmallStoreIsCopiedInMemory) {
  std::shared_ptr<EmbeddingShardStore> store = *EmbeddingShardStore::Create(Options());
  embedding_ps::ShardCheckpointer cutter(store, 0, 1);
  for (uint64_t cut = 1; cut <= 3; ++cut) {
    Train(store.get(), {cut, 100 + cut, 200}, cut);
    const auto rows_then = Rows(*store);
    const std::string dir = FreshDir(absl::StrCat("small_cut_", cut));
    ASSERT_TRUE(cutter.Begin(dir, cut, embedding_ps::CutKind::kCheckpoint).ok());
    EXPECT_FALSE(cutter.last_forked());
    Train(store.get(), {cut, 300 + cut}, 100 + cut);
    absl::StatusOr<embedding_ps::ShardFileInfo> info = cutter.Await(cut, absl::Minutes(1));
    ASSERT_TRUE(info.ok()) << info.status();
    CheckpointManifest m;
    m.num_shards = 1;
    m.num_workers = 1;
    m.files = {info->file};
    auto restored = *EmbeddingShardStore::Create(Options());
    ASSERT_TRUE(embedding_ps::RestoreShard(Env::Default(), dir, m, 0, 1, restored.get()).ok());
    EXPECT_EQ(Rows(*restored), rows_then);
  }
}

void ExpectReshard(int from, int to, Optimizers kinds) {
  const std::string dir = FreshDir(
      absl::StrCat("reshard_", from, "_", to, "_", OptimizerName(kinds.user), RowPrecisionName(kinds.precision)));
  auto stores = Cluster(from, 500, kinds);
  WriteCheckpoint(Env::Default(), dir, stores);
  std::map<std::pair<int, uint64_t>, std::vector<float>> before, after;
  for (auto& s : stores) {
    for (auto& [key, value] : Rows(*s)) before[key] = value;
  }
  const CheckpointManifest m = *ReadManifest(Env::Default(), dir);
  for (int k = 0; k < to; ++k) {
    auto restored = *EmbeddingShardStore::Create(Options(0, false, kinds));
    ASSERT_TRUE(embedding_ps::RestoreShard(Env::Default(), dir, m, k, to, restored.get()).ok());
    for (auto& [key, value] : Rows(*restored)) {
      EXPECT_EQ(ShardForId(key.second, to), k) << "id " << key.second << " on the wrong shard";
      EXPECT_TRUE(after.emplace(key, value).second);
    }
  }
  EXPECT_EQ(after, before);  // Every row once, with its weights and optimizer state.
}

TEST_P(EveryOptimizer, ReshardsFourToThree) { ExpectReshard(4, 3, GetParam()); }
TEST_P(EveryOptimizer, ReshardsTwoToFive) { ExpectReshard(2, 5, GetParam()); }

TEST(ShardCheckpointTest, CorruptionIsDetectedAndLatestFallsBack) {
  const std::string root = FreshDir("fallback");
  auto stores = Cluster(2, 200);
  const std::string older = JoinPath(root, CheckpointDirName(kCheckpointPrefix, 10, 1));
  const std::string newer = JoinPath(root, CheckpointDirName(kCheckpointPrefix, 20, 2));
  WriteCheckpoint(Env::Default(), older, stores);
  const CheckpointManifest m = WriteCheckpoint(Env::Default(), newer, stores);
  const std::string shard = JoinPath(newer, m.files[1].name);
  const std::string good = ReadAll(shard);
  for (const size_t offset : {size_t{3}, size_t{30}, good.size() / 2, good.size() - 2}) {
    std::string bad = good;
    bad[offset] ^= 0x40;
    WriteAll(shard, bad);
    auto store = *EmbeddingShardStore::Create(Options());
    const absl::Status s = embedding_ps::RestoreShard(Env::Default(), newer, m, 1, 2, store.get());
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find(m.files[1].name), absl::string_view::npos) << s;
    EXPECT_EQ(store->Stats().rows, 0u);  // Nothing of a bad file is loaded.
    CheckpointManifest chosen;
    std::vector<std::string> skipped;
    EXPECT_EQ(*ResolveCheckpoint(Env::Default(), root, kCheckpointPrefix, "latest", &chosen, &skipped), older);
    EXPECT_EQ(skipped.size(), 1u);
  }
  WriteAll(shard, good.substr(0, good.size() - 9));  // Truncated.
  CheckpointManifest chosen;
  EXPECT_EQ(*ResolveCheckpoint(Env::Default(), root, kCheckpointPrefix, "latest", &chosen), older);
  std::string manifest = ReadAll(JoinPath(newer, kManifestName));
  manifest[manifest.size() / 2] ^= 1;
  WriteAll(JoinPath(newer, kManifestName), manifest);
  EXPECT_TRUE(absl::IsDataLoss(VerifyCheckpoint(Env::Default(), newer).status()));
}

TEST(FaultInjectionTest, AFailedCheckpointLeavesThePreviousOneIntact) {
  const std::string root = FreshDir("faults");
  auto stores = Cluster(2, 100);
  const std::string first = JoinPath(root, CheckpointDirName(kCheckpointPrefix, 1, 1));
  WriteCheckpoint(Env::Default(), first, stores);
  int step = 2;
  for (const FaultInjectionEnv::Op op : {FaultInjectionEnv::kAppend, FaultInjectionEnv::kSync,
                                         FaultInjectionEnv::kRename, FaultInjectionEnv::kSyncDir}) {
    for (int after : {0, 1, 2}) {
      if (op == FaultInjectionEnv::kSyncDir && after == 2) continue;  // A commit syncs the directory twice.
      FaultInjectionEnv env(Env::Default());
      env.FailAfter(op, after);
      const std::string dir = JoinPath(root, CheckpointDirName(kCheckpointPrefix, step++, 1));
      absl::Status s;
      WriteCheckpoint(&env, dir, stores, &s);
      EXPECT_FALSE(s.ok()) << "op " << op << " after " << after;
      ASSERT_TRUE(env.DropUnsyncedData().ok());  // What a crash right then would leave.
      CheckpointManifest chosen;
      EXPECT_EQ(*ResolveCheckpoint(Env::Default(), root, kCheckpointPrefix, "latest", &chosen), first)
          << "op " << op << " after " << after;
    }
  }
  // A later good checkpoint retires the broken directories and keeps the last one.
  const std::string last = JoinPath(root, CheckpointDirName(kCheckpointPrefix, 99, 1));
  WriteCheckpoint(Env::Default(), last, stores);
  ASSERT_TRUE(RetireCheckpoints(Env::Default(), root, kCheckpointPrefix, 1, "").ok());
  EXPECT_EQ(ListCheckpointDirs(Env::Default(), root, kCheckpointPrefix),
            std::vector<std::string>{CheckpointDirName(kCheckpointPrefix, 99, 1)});
}

// A run resumed into a root that holds another run's later checkpoints: its cut still being
// written sorts before those, yet is not taken for what a failed write left.
TEST(CheckpointTest, RetiringKeepsACutInProgressThatSortsBeforeAnotherRunsLaterOnes) {
  const std::string root = FreshDir("retire_resumed");
  std::vector<std::unique_ptr<EmbeddingShardStore>> stores;
  stores.push_back(*EmbeddingShardStore::Create(Options()));
  const std::string later = CheckpointDirName(kCheckpointPrefix, 50, 1005);    // The first run's last.
  const std::string mine = CheckpointDirName(kCheckpointPrefix, 40, 1002);     // Just committed.
  const std::string writing = CheckpointDirName(kCheckpointPrefix, 50, 1003);  // No manifest yet.
  const std::string failed = CheckpointDirName(kCheckpointPrefix, 30, 1001);   // A failed write.
  WriteCheckpoint(Env::Default(), JoinPath(root, later), stores);
  WriteCheckpoint(Env::Default(), JoinPath(root, mine), stores);
  for (const std::string& d : {writing, failed}) ASSERT_TRUE(Env::Default()->CreateDirs(JoinPath(root, d)).ok());
  ASSERT_TRUE(RetireCheckpoints(Env::Default(), root, kCheckpointPrefix, 20, "", JoinPath(root, mine)).ok());
  EXPECT_EQ(ListCheckpointDirs(Env::Default(), root, kCheckpointPrefix),
            (std::vector<std::string>{mine, writing, later}));
}

// One run holds a checkpoint.dir at a time (its LOCK, naming the holder); the directory's JOB
// says whose checkpoints it holds: retention deletes only that job's, and "latest" and "auto"
// resume only from that job's, while a directory named explicitly resumes whatever job it is of.
TEST(CheckpointTest, ACheckpointDirHasOneRunAndRetentionAndLatestKeepToTheirJob) {
  Env* env = Env::Default();
  const std::string root = FreshDir("job_ids");
  auto first = ClaimCheckpointDir(env, root, "aaaa", absl::Milliseconds(100));
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::Status second = ClaimCheckpointDir(env, root, "bbbb", absl::Milliseconds(100)).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(second)) << second;
  EXPECT_NE(second.message().find(absl::StrCat("checkpoint.dir ", root, " is taken by another run")), std::string::npos)
      << second;
  EXPECT_NE(second.message().find(absl::StrCat("a run of job aaaa: pid ", getpid())), std::string::npos) << second;
  EXPECT_EQ(CheckpointDirJob(env, root), "aaaa") << "the refused run changed nothing";

  std::vector<std::unique_ptr<EmbeddingShardStore>> stores;
  stores.push_back(*EmbeddingShardStore::Create(Options()));
  const std::string a1 = CheckpointDirName(kCheckpointPrefix, 10, 1), a2 = CheckpointDirName(kCheckpointPrefix, 20, 2);
  WriteCheckpoint(env, JoinPath(root, a1), stores, nullptr, "aaaa");
  WriteCheckpoint(env, JoinPath(root, a2), stores, nullptr, "aaaa");
  first->lock.reset();  // Job aaaa's run ends; a run of a new job takes the directory.
  auto next = ClaimCheckpointDir(env, root, "bbbb", absl::Milliseconds(100));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(CheckpointDirJob(env, root), "bbbb");
  std::string note;
  EXPECT_EQ(ResolveResumeFlag(env, root, kCheckpointPrefix, "auto", &note), "") << "aaaa's are not bbbb's";
  EXPECT_NE(note.find("no checkpoint of the directory's job"), std::string::npos) << note;
  CheckpointManifest m;
  const absl::Status none = ResolveCheckpoint(env, root, kCheckpointPrefix, "latest", &m).status();
  EXPECT_TRUE(absl::IsNotFound(none)) << none;
  EXPECT_NE(none.message().find("2 belong to another job than the directory's (bbbb"), std::string::npos) << none;
  auto named = ResolveCheckpoint(env, root, kCheckpointPrefix, JoinPath(root, a2), &m);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(m.job_id, "aaaa");

  const std::string b1 = CheckpointDirName(kCheckpointPrefix, 5, 3), b2 = CheckpointDirName(kCheckpointPrefix, 6, 4);
  WriteCheckpoint(env, JoinPath(root, b1), stores, nullptr, "bbbb");
  WriteCheckpoint(env, JoinPath(root, b2), stores, nullptr, "bbbb");
  auto latest = ResolveCheckpoint(env, root, kCheckpointPrefix, "latest", &m);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, JoinPath(root, b2)) << "aaaa's sort later but are another job's";
  ASSERT_TRUE(RetireCheckpoints(env, root, kCheckpointPrefix, 1, "", JoinPath(root, b2), "bbbb").ok());
  EXPECT_EQ(ListCheckpointDirs(env, root, kCheckpointPrefix), (std::vector<std::string>{b2, a1, a2}));
}

TEST_P(EveryOptimizer, AnExportPlusItsDeltasEqualsTheLaterState) {
  const std::string dir =
      FreshDir(absl::StrCat("delta_", OptimizerName(GetParam().user), RowPrecisionName(GetParam().precision)));
  auto store = *EmbeddingShardStore::Create(Options(/*capacity=*/120, /*track=*/true, GetParam()));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 100; ++i) ids.push_back(i * 3);
  Train(store.get(), ids, 1);
  ASSERT_TRUE(store->TakeDelta().ok());  // The base: everything so far.
  std::map<std::pair<int, uint64_t>, std::vector<float>> follower;
  for (auto& [key, v] : Rows(*store)) follower[key] = v;
  for (int round = 0; round < 3; ++round) {
    std::vector<uint64_t> more;  // New ids evict old ones (capacity 120).
    for (uint64_t i = 0; i < 40; ++i) more.push_back(1000 + round * 100 + i);
    more.push_back(3);
    Train(store.get(), more, 2 + round);
    const std::string sub = JoinPath(dir, absl::StrCat("d", round));
    ASSERT_TRUE(Env::Default()->CreateDirs(sub).ok());
    auto delta = store->TakeDelta();
    ASSERT_TRUE(delta.ok());
    auto info = embedding_ps::WriteDeltaFile(Env::Default(), sub, 0, 1, store->tables(), *delta);
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_TRUE(
        embedding_ps::ReadRowsFile(
            Env::Default(), JoinPath(sub, info->file.name), FileKind::kDeltaRows, &info->file,
            [&](embedding_ps::ExportedTable& t) {
              const int ti = t.name == "user" ? 0 : 1;
              for (uint64_t id : t.tombstones) follower.erase({ti, id});
              for (size_t i = 0; i < t.ids.size(); ++i) {
                follower[{ti, t.ids[i]}].assign(t.weights.begin() + i * t.dim, t.weights.begin() + (i + 1) * t.dim);
              }
              return absl::OkStatus();
            })
            .ok());
  }
  std::map<std::pair<int, uint64_t>, std::vector<float>> expected;
  for (auto& [key, v] : Rows(*store)) {
    const int dim = key.first == 0 ? 8 : 4;
    expected[key].assign(v.begin(), v.begin() + dim);
  }
  for (auto& [key, v] : follower) v.resize(key.first == 0 ? 8 : 4);
  EXPECT_EQ(follower, expected);
  EXPECT_GT(store->Stats().tables[0].evictions, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, EveryOptimizer,
    ::testing::Values(Optimizers{embedding_ps::OptimizerKind::kAdagrad, embedding_ps::OptimizerKind::kAdam},
                      Optimizers{embedding_ps::OptimizerKind::kAdagradRowwise,
                                 embedding_ps::OptimizerKind::kAdamRowwise},
                      Optimizers{embedding_ps::OptimizerKind::kSgd, embedding_ps::OptimizerKind::kFtrl},
                      Optimizers{embedding_ps::OptimizerKind::kAdagrad, embedding_ps::OptimizerKind::kAdam,
                                 embedding_ps::RowPrecision::kFp16},
                      Optimizers{embedding_ps::OptimizerKind::kAdagradRowwise,
                                 embedding_ps::OptimizerKind::kAdamRowwise, embedding_ps::RowPrecision::kFp16},
                      Optimizers{embedding_ps::OptimizerKind::kAdagradRowwise, embedding_ps::OptimizerKind::kAdam,
                                 embedding_ps::RowPrecision::kInt8}),
    [](const ::testing::TestParamInfo<Optimizers>& info) {
      return absl::StrCat(OptimizerName(info.param.user), "_", OptimizerName(info.param.item), "_",
                          RowPrecisionName(info.param.precision));
    });

// A table's shard files, deltas and exports hold its weights in its precision: against fp32,
// fp16 rows take 2 bytes a weight less and int8 rows 3 a weight less but 8 a row more (their min
// and max); each table block names a precision other than fp32 (12 bytes more).
TEST(ShardCheckpointTest, ATablesFilesHoldItsWeightsInItsPrecision) {
  std::vector<uint64_t> lengths;
  for (const embedding_ps::RowPrecision precision :
       {embedding_ps::RowPrecision::kFp32, embedding_ps::RowPrecision::kFp16, embedding_ps::RowPrecision::kInt8}) {
    const Optimizers kinds{embedding_ps::OptimizerKind::kAdagradRowwise, embedding_ps::OptimizerKind::kAdam, precision};
    const std::string dir = FreshDir(absl::StrCat("packed_", RowPrecisionName(precision)));
    auto stores = Cluster(1, 300, kinds);
    const CheckpointManifest m = WriteCheckpoint(Env::Default(), dir, stores);
    lengths.push_back(m.files[0].length);
  }
  const uint64_t rows = 300;  // Of each table: the user table's dim 8 and the item table's dim 4.
  EXPECT_EQ(lengths[0] - lengths[1], rows * 2 * (8 + 4) - 2 * 12) << lengths[0] << " vs " << lengths[1];
  EXPECT_EQ(lengths[0] - lengths[2], rows * (3 * (8 + 4) - 2 * 8) - 2 * 12) << lengths[0] << " vs " << lengths[2];
}

TEST(PositionsTest, RemapsAConsistentCutToOtherWorkerCounts) {
  data_loader::ReaderPosition a, b;
  a.window_global = 8;
  a.next_batch = 10;
  b.window_global = 8;
  b.next_batch = 11;
  auto one = data_loader::RemapPositions({a, b}, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0].next_batch, 10u);
  auto three = data_loader::RemapPositions({a, b}, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ((*three)[0].next_batch, 12u);
  EXPECT_EQ((*three)[1].next_batch, 10u);
  EXPECT_EQ((*three)[2].next_batch, 11u);
  b.next_batch = 13;
  EXPECT_FALSE(data_loader::RemapPositions({a, b}, 1).ok());
}

}  // namespace
}  // namespace hyrec
