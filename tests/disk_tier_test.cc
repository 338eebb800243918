// The disk tier under the PS store (src/embedding_ps/disk_tier.h), on a real file with direct
// I/O: a row put is the row taken back (payload and score), through the open page, written
// pages and the cleaner, against a reference map under random puts, takes and erases; a full
// tier refuses a row with an error naming its file and loses none it holds; a flipped byte is
// found by its page's checksum and named; held pages are not reused.
#include "src/embedding_ps/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace hyrec::embedding_ps {
namespace {

std::string TierPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/disk_tier_test_", ::getpid(), "_", name);
}

// A row's payload of `bytes`, a function of (table, id, version).
std::string Payload(int table, uint64_t id, uint64_t version, uint32_t bytes) {
  std::string p(bytes, '\0');
  std::mt19937_64 rng(id * 1000003 + version * 7 + table);
  for (auto& c : p) c = static_cast<char>(rng());
  return p;
}

struct Row {
  uint64_t score = 0;
  std::string payload;
};

// Takes `ids` of `table`, returning what was found by id.
std::map<uint64_t, Row> TakeAll(DiskTier& tier, int table, const std::vector<uint64_t>& ids,
                                absl::Status* status = nullptr) {
  std::map<uint64_t, Row> got;
  const uint32_t bytes = table == 0 ? 36 : 100;
  absl::Status s = tier.Take(table, ids, [&](size_t i, uint64_t score, const char* payload) {
    EXPECT_EQ(got.count(ids[i]), 0u) << "found once";
    got[ids[i]] = Row{score, std::string(payload, bytes)};
  });
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
  return got;
}

std::unique_ptr<DiskTier> OpenTier(const std::string& name, uint64_t pages, int depth = 32) {
  DiskTierOptions o;
  o.path = TierPath(name);
  o.capacity_bytes = pages * DiskTier::kPageBytes;
  o.queue_depth = depth;
  auto tier = DiskTier::Open(o, {36, 100});
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? std::move(*tier) : nullptr;
}

TEST(DiskTier, ARowTakenIsTheRowPutAndIsThenGone) {
  auto tier = OpenTier("roundtrip", 256);
  ASSERT_NE(tier, nullptr);
  for (uint64_t id = 0; id < 5000; ++id) {
    ASSERT_TRUE(tier->Put(0, id, id * 3, Payload(0, id, 0, 36).data()).ok());
    if (id % 5 == 0) {
      ASSERT_TRUE(tier->Put(1, id, id, Payload(1, id, 0, 100).data()).ok());
    }
  }
  EXPECT_EQ(tier->rows(0), 5000u);
  EXPECT_EQ(tier->rows(1), 1000u);
  EXPECT_GT(tier->Stats().page_writes, 60u) << "most rows are on disk, not in the open pages";
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 5000; id += 2) ids.push_back(id);
  ids.push_back(999999);  // Never put: not found.
  const auto got = TakeAll(*tier, 0, ids);
  ASSERT_EQ(got.size(), 2500u);
  for (const auto& [id, row] : got) {
    EXPECT_EQ(row.score, id * 3);
    EXPECT_EQ(row.payload, Payload(0, id, 0, 36)) << id;
  }
  EXPECT_EQ(tier->rows(0), 2500u);
  EXPECT_FALSE(tier->Contains(0, 2));
  EXPECT_TRUE(tier->Contains(0, 3));
  EXPECT_TRUE(TakeAll(*tier, 0, {2, 4}).empty()) << "taken rows are gone";
  EXPECT_EQ(TakeAll(*tier, 0, {9, 9, 11, 9}).size(), 2u) << "an id asked for twice is taken once";
  EXPECT_EQ(tier->rows(0), 2498u);
  const auto other = TakeAll(*tier, 1, {0, 5, 7});
  ASSERT_EQ(other.size(), 2u) << "tables are apart";
  EXPECT_EQ(other.at(5).payload, Payload(1, 5, 0, 100));
  const DiskTierStats stats = tier->Stats();
  EXPECT_EQ(stats.takes, 2504u);
  EXPECT_GT(stats.page_reads, 0u);
  EXPECT_EQ(stats.bytes_read, stats.page_reads * DiskTier::kPageBytes);
}

// Random puts (new rows and new versions), takes and erases in a tier small enough that the
// cleaner runs many times: every take finds exactly the reference's latest version, and
// ForEach lists exactly the reference's rows.
TEST(DiskTier, RandomPutsTakesAndErasesMatchAReferenceThroughTheCleaner) {
  for (const int depth : {1, 8}) {
    auto tier = OpenTier(absl::StrCat("random_", depth), 64, depth);
    ASSERT_NE(tier, nullptr);
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> reference[2];  // id -> (version, score)
    std::mt19937_64 rng(depth);
    uint64_t version = 0;
    for (int step = 0; step < 40000; ++step) {
      const int t = rng() % 4 == 0 ? 1 : 0;
      const uint64_t id = rng() % (t == 0 ? 3000 : 400);
      const uint32_t bytes = t == 0 ? 36 : 100;
      const int op = static_cast<int>(rng() % 10);
      if (op < 6) {
        ++version;
        const absl::Status s = tier->Put(t, id, version * 11, Payload(t, id, version, bytes).data());
        if (s.ok()) {
          reference[t][id] = {version, version * 11};
        } else {
          ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
          ASSERT_EQ(reference[t].count(id), 0u) << "a held row's new version is never refused";
        }
      } else if (op < 9) {
        const auto got = TakeAll(*tier, t, {id});
        auto it = reference[t].find(id);
        ASSERT_EQ(got.size(), it != reference[t].end() ? 1u : 0u) << "step " << step;
        if (it != reference[t].end()) {
          ASSERT_EQ(got.at(id).payload, Payload(t, id, it->second.first, bytes)) << "step " << step;
          ASSERT_EQ(got.at(id).score, it->second.second);
          reference[t].erase(it);
        }
      } else {
        tier->Erase(t, id);
        reference[t].erase(id);
      }
    }
    for (int t = 0; t < 2; ++t) {
      std::map<uint64_t, uint64_t> listed;
      ASSERT_TRUE(tier->ForEach(t,
                                [&](uint64_t id, uint64_t score, const char*) {
                                  EXPECT_EQ(listed.count(id), 0u);
                                  listed[id] = score;
                                  return absl::OkStatus();
                                })
                      .ok());
      ASSERT_EQ(listed.size(), reference[t].size());
      for (const auto& [id, v] : reference[t]) EXPECT_EQ(listed[id], v.second);
    }
    const DiskTierStats stats = tier->Stats();
    EXPECT_GT(stats.cleaned_pages, 100u) << "the cleaner ran";
    EXPECT_LE(stats.used_pages, stats.pages);
  }
}

// Pages read ahead serve a later TakeMany only while current: random puts, erases and takes
// (which rewrite and clean pages) between a ReadAhead of some ids and the TakeMany of more of
// them (of both tables) never change what the take finds, the reference's latest versions; and a
// TakeMany right after its ReadAhead reads no page again.
TEST(DiskTier, PagesReadAheadServeTakesOnlyWhileCurrent) {
  auto tier = OpenTier("ahead", 64, 8);
  ASSERT_NE(tier, nullptr);
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> reference[2];  // id -> (version, score)
  std::mt19937_64 rng(5);
  uint64_t version = 0;
  auto put = [&](int t, uint64_t id) {
    ++version;
    const uint32_t bytes = t == 0 ? 36 : 100;
    if (tier->Put(t, id, version * 11, Payload(t, id, version, bytes).data()).ok())
      reference[t][id] = {version, version * 11};
  };
  for (int i = 0; i < 3000; ++i) put(i % 4 == 0 ? 1 : 0, rng() % 3000);
  DiskTier::PagesRead ahead;
  for (int round = 0; round < 300; ++round) {
    std::vector<uint64_t> ids[2];
    for (int t = 0; t < 2; ++t) {
      for (int k = 0; k < 40; ++k) ids[t].push_back(rng() % 3000);
    }
    // Ahead: the first half of each table's ids.
    const DiskTier::TakeCall half[2] = {{0, absl::MakeConstSpan(ids[0]).first(20)},
                                        {1, absl::MakeConstSpan(ids[1]).first(20)}};
    ASSERT_TRUE(tier->ReadAhead(half, &ahead).ok());
    const bool quiet = round % 3 == 0;
    if (quiet) {
      ASSERT_GT(ahead.size(), 0u);
    } else {
      for (int k = 0; k < 60; ++k) {
        const int t = rng() % 4 == 0 ? 1 : 0;
        const uint64_t id = rng() % 3000;
        if (k % 3 == 2) {
          tier->Erase(t, id);
          reference[t].erase(id);
        } else {
          put(t, id);
        }
      }
    }
    const uint64_t reads_before = tier->Stats().page_reads;
    const DiskTier::TakeCall calls[2] = {{0, quiet ? half[0].ids : ids[0]}, {1, quiet ? half[1].ids : ids[1]}};
    std::map<uint64_t, Row> got[2];
    ASSERT_TRUE(tier->TakeMany(
                        calls,
                        [&](size_t c, size_t i, uint64_t score, const char* payload) {
                          const uint64_t id = calls[c].ids[i];
                          EXPECT_EQ(got[c].count(id), 0u) << "found once";
                          got[c][id] = Row{score, std::string(payload, c == 0 ? 36 : 100)};
                        },
                        &ahead)
                    .ok())
        << "round " << round;
    if (quiet) EXPECT_EQ(tier->Stats().page_reads, reads_before) << "round " << round << ": every page was read ahead";
    for (int t = 0; t < 2; ++t) {
      for (const uint64_t id : std::set<uint64_t>(calls[t].ids.begin(), calls[t].ids.end())) {
        auto it = reference[t].find(id);
        if (it == reference[t].end()) {
          EXPECT_EQ(got[t].count(id), 0u) << "round " << round;
          continue;
        }
        ASSERT_EQ(got[t].count(id), 1u) << "round " << round << " table " << t << " id " << id;
        EXPECT_EQ(got[t].at(id).payload, Payload(t, id, it->second.first, t == 0 ? 36 : 100)) << "round " << round;
        EXPECT_EQ(got[t].at(id).score, it->second.second);
        reference[t].erase(it);
      }
    }
    for (int k = 0; k < 40; ++k) put(rng() % 4 == 0 ? 1 : 0, rng() % 3000);  // Refills.
  }
  EXPECT_GT(tier->Stats().cleaned_pages, 50u) << "the cleaner ran";
}

// A full tier refuses a new row, naming its file and capacity, and every row it held is still
// there; a new version of a held row is still accepted.
TEST(DiskTier, AFullTierRefusesNewRowsAndLosesNone) {
  auto tier = OpenTier("full", 16);
  ASSERT_NE(tier, nullptr);
  uint64_t id = 0;
  absl::Status refused;
  for (; id < 100000; ++id) {
    refused = tier->Put(0, id, id, Payload(0, id, 0, 36).data());
    if (!refused.ok()) break;
  }
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_NE(refused.message().find(TierPath("full")), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("ps.disk.capacity_bytes"), std::string::npos) << refused;
  EXPECT_GT(id, 500u) << "most of 16 pages of 72 rows";
  EXPECT_EQ(tier->rows(0), id);
  EXPECT_FALSE(tier->Contains(0, id));
  EXPECT_TRUE(tier->Put(0, 3, 77, Payload(0, 3, 1, 36).data()).ok()) << "a new version of a held row";
  EXPECT_EQ(tier->Stats().full_refusals, 1u);
  std::vector<uint64_t> ids(id);
  for (uint64_t i = 0; i < id; ++i) ids[i] = i;
  const auto got = TakeAll(*tier, 0, ids);
  ASSERT_EQ(got.size(), id);
  for (const auto& [i, row] : got) EXPECT_EQ(row.payload, Payload(0, i, i == 3 ? 1 : 0, 36)) << i;
}

// A byte flipped in the file: the take of a row on that page is DataLoss naming the file, the
// page and its offset; rows on other pages are taken, and the damaged page's rows stay held.
TEST(DiskTier, AFlippedByteIsFoundByItsPagesChecksumAndNamed) {
  auto tier = OpenTier("flip", 64);
  ASSERT_NE(tier, nullptr);
  for (uint64_t id = 0; id < 1000; ++id) ASSERT_TRUE(tier->Put(0, id, id, Payload(0, id, 0, 36).data()).ok());
  // Page 0 holds the first 72 rows; flip a byte of its 10th row's payload.
  const int fd = ::open(TierPath("flip").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t at = DiskTier::kPageHeaderBytes + 9 * 56 + 20;
  char byte;
  ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
  absl::Status status;
  const auto got = TakeAll(*tier, 0, {3, 500, 501}, &status);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find(TierPath("flip")), std::string::npos) << status;
  EXPECT_NE(status.message().find("page 0 (offset 0)"), std::string::npos) << status;
  EXPECT_EQ(got.size(), 2u) << "the other page's rows";
  EXPECT_TRUE(tier->Contains(0, 3)) << "still held: its take fails again, it is not dropped";
  EXPECT_EQ(tier->Stats().checksum_failures, 1u);
}

// While pages are held, a page whose rows are all taken is not written again, so a reader of
// the file as it was (a checkpoint's forked child) sees it unchanged; once released it is.
TEST(DiskTier, HeldPagesAreNotReused) {
  auto tier = OpenTier("hold", 16);
  ASSERT_NE(tier, nullptr);
  std::vector<uint64_t> first;
  for (uint64_t id = 0; id < 72 * 3; ++id) {
    ASSERT_TRUE(tier->Put(0, id, id, Payload(0, id, 0, 36).data()).ok());
    if (id < 72) first.push_back(id);
  }
  auto read_page0 = [&] {
    std::string page(DiskTier::kPageBytes, '\0');
    const int fd = ::open(TierPath("hold").c_str(), O_RDONLY);
    EXPECT_EQ(::pread(fd, page.data(), page.size(), 0), static_cast<ssize_t>(page.size()));
    ::close(fd);
    return page;
  };
  const std::string before = read_page0();
  tier->HoldPages();
  EXPECT_EQ(TakeAll(*tier, 0, first).size(), 72u);  // Page 0 is empty now.
  uint64_t id = 1000;
  absl::Status full;
  for (; full.ok() && id < 5000; ++id) full = tier->Put(0, id, id, Payload(0, id, 0, 36).data());
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_EQ(read_page0(), before) << "not reused while held";
  tier->ReleasePages();
  // New versions of held rows are taken even when the tier is full: their flushes reuse page 0.
  for (uint64_t v = 72; v < 72 * 3; ++v) ASSERT_TRUE(tier->Put(0, v, v, Payload(0, v, 1, 36).data()).ok());
  EXPECT_NE(read_page0(), before) << "reused once released";
}

StoreOptions TieredOptions(const std::string& name, uint64_t dram_rows, uint64_t disk_pages) {
  TableConfig t;
  t.name = "t";
  t.dim = 8;
  t.optimizer.kind = OptimizerKind::kAdagrad;
  t.eviction.policy = EvictionPolicy::kLfu;
  StoreOptions o;
  o.tables = {t};
  o.num_stripes = 4;
  o.capacity_rows = dram_rows;
  o.disk.path = TierPath(name);
  o.disk.capacity_bytes = disk_pages * DiskTier::kPageBytes;
  return o;
}

// (id -> weights and state, id -> score) of every row, as a snapshot holds them.
std::pair<std::map<uint64_t, std::vector<float>>, std::map<uint64_t, uint64_t>> Contents(
    const EmbeddingShardStore& store) {
  const StoreSnapshot snap = store.Snapshot();
  EXPECT_TRUE(snap.status.ok()) << snap.status;
  std::map<uint64_t, std::vector<float>> rows;
  std::map<uint64_t, uint64_t> scores;
  const StoreSnapshot::Table& t = snap.tables[0];
  const size_t floats = 16;  // dim 8, adagrad: 8 state floats.
  for (size_t i = 0; i < t.ids.size(); ++i) {
    EXPECT_EQ(rows.count(t.ids[i]), 0u) << "a row is in one tier";
    rows[t.ids[i]].assign(t.values.begin() + i * floats, t.values.begin() + (i + 1) * floats);
    scores[t.ids[i]] = t.scores[i];
  }
  return {rows, scores};
}

// A row moved to disk keeps its weights, optimizer state and lfu score there, and comes back
// with them when used.
TEST(StoreDiskTier, ARowMovedToDiskKeepsItsStateAndScore) {
  auto store = *EmbeddingShardStore::Create(TieredOptions("store_score", 64, 64));
  std::vector<float> rows(8);
  std::vector<float> grads(8, 0.25f);
  for (uint64_t use = 1; use <= 5; ++use) {
    ASSERT_TRUE(store->Lookup(0, std::vector<uint64_t>{7}, absl::MakeSpan(rows), nullptr).ok());
    ASSERT_TRUE(store->Update(0, std::vector<uint64_t>{7}, grads, UpdateId{1, use}, nullptr).ok());
  }
  const auto before = Contents(*store);
  // Many rows used more often than row 7 push it out of DRAM.
  for (uint64_t round = 0; round < 12; ++round) {
    std::vector<uint64_t> ids;
    for (uint64_t id = 100; id < 400; ++id) ids.push_back(id);
    std::vector<float> out(ids.size() * 8);
    ASSERT_TRUE(store->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
  }
  StoreStats stats = store->Stats();
  ASSERT_GT(stats.tables[0].disk_rows, 200u);
  const auto on_disk = Contents(*store);
  ASSERT_EQ(on_disk.first.at(7), before.first.at(7)) << "weights and state, on disk";
  ASSERT_EQ(on_disk.second.at(7), before.second.at(7)) << "its lfu score";
  std::vector<float> back(8);
  ASSERT_TRUE(store->Lookup(0, std::vector<uint64_t>{7}, absl::MakeSpan(back), nullptr).ok());
  EXPECT_EQ(back, std::vector<float>(before.first.at(7).begin(), before.first.at(7).begin() + 8));
  EXPECT_EQ(Contents(*store).second.at(7), before.second.at(7) + 1) << "one use more";
  stats = store->Stats();
  EXPECT_GT(stats.tables[0].disk_reads, 0u);
  EXPECT_GT(stats.tables[0].dram_hits, 0u);
}

// DRAM's hits count the ids a lookup found in DRAM, not those read back for the call (through
// ReadBack, as the gRPC handlers and the in-process client do, or the call's own read-back); an
// update's ids are neither lookups nor hits.
TEST(StoreDiskTier, DramHitsAreTheIdsFoundInDram) {
  StoreOptions options = TieredOptions("store_hits", 128, 64);
  options.tables[0].eviction.policy = EvictionPolicy::kLru;
  auto store = *EmbeddingShardStore::Create(options);
  std::vector<float> rows(8);
  std::vector<uint64_t> ids;
  for (uint64_t id = 100; id < 140; ++id) ids.push_back(id);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(store->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
  EXPECT_EQ(store->Stats().tables[0].dram_hits, 0u) << "new rows";
  for (const bool read_back_first : {true, false}) {
    for (uint64_t id = 1000; id < 1300; ++id) {  // Pushes 100..139 out again.
      ASSERT_TRUE(store->Lookup(0, std::vector<uint64_t>{id}, absl::MakeSpan(rows), nullptr).ok());
    }
    const TableStats before_call = store->Stats().tables[0];
    if (read_back_first) {
      const EmbeddingShardStore::TableIds call{0, ids};
      ASSERT_TRUE(store->ReadBack(absl::MakeConstSpan(&call, 1)).ok());
    }
    ASSERT_TRUE(store->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
    const TableStats after_call = store->Stats().tables[0];
    const uint64_t read = after_call.disk_reads - before_call.disk_reads;
    EXPECT_GT(read, 0u) << "some of the rows were on disk";
    EXPECT_EQ(after_call.dram_hits - before_call.dram_hits, ids.size() - read);
    EXPECT_EQ(after_call.lookups - before_call.lookups, ids.size());
    ASSERT_TRUE(store->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
    std::vector<float> ones(ids.size() * 8, 1.0f);
    ASSERT_TRUE(store->Update(0, ids, ones, UpdateId{}, nullptr).ok());
    const TableStats again = store->Stats().tables[0];
    EXPECT_EQ(again.disk_reads, after_call.disk_reads) << "they fit DRAM now";
    EXPECT_EQ(again.dram_hits - after_call.dram_hits, ids.size()) << "the lookup's; the update's are no lookups";
    EXPECT_EQ(again.lookups - after_call.lookups, ids.size()) << "an update is no lookup";
    EXPECT_EQ(again.updates - after_call.updates, ids.size());
  }
}

// A full tier: a lookup that would create rows is refused whole, naming the tier, and every row
// the store held before is still there, unchanged; rows already held are still served.
TEST(StoreDiskTier, AFullDiskRefusesNewRowsAndLosesNothing) {
  auto store = *EmbeddingShardStore::Create(TieredOptions("store_full", 64, 8));
  absl::Status refused;
  uint64_t next = 0;
  for (int call = 0; call < 1000 && refused.ok(); ++call) {
    std::vector<uint64_t> ids(16);
    for (auto& id : ids) id = next++;
    std::vector<float> out(ids.size() * 8);
    refused = store->Lookup(0, ids, absl::MakeSpan(out), nullptr);
    if (refused.ok()) {
      std::vector<float> grads(out.size(), 0.5f);
      ASSERT_TRUE(store->Update(0, ids, grads, UpdateId{1, static_cast<uint64_t>(call + 1)}, nullptr).ok());
    }
  }
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_NE(refused.message().find(TierPath("store_full")), std::string::npos) << refused;
  const uint64_t held = next - 16;
  const auto contents = Contents(*store);
  ASSERT_EQ(contents.first.size(), held) << "the refused call created nothing";
  for (uint64_t id = 0; id < held; ++id) {
    ASSERT_EQ(contents.first.count(id), 1u) << id;
    std::vector<float> initial(8);
    InitialRow(store->table(0), id, initial.data());
    EXPECT_NE(contents.first.at(id)[0], initial[0]) << "updated once: " << id;
  }
  std::vector<float> out(8);
  EXPECT_TRUE(store->Lookup(0, std::vector<uint64_t>{3}, absl::MakeSpan(out), nullptr).ok()) << "a held row";
  EXPECT_GT(store->Stats().disk.full_refusals, 0u);
}

TEST(DiskTier, BadOptionsAreRefused) {
  DiskTierOptions o;
  o.path = TierPath("bad");
  o.capacity_bytes = 2 * DiskTier::kPageBytes;
  EXPECT_TRUE(absl::IsInvalidArgument(DiskTier::Open(o, {36, 100}).status())) << "too few pages";
  o.capacity_bytes = 1 << 20;
  EXPECT_TRUE(absl::IsInvalidArgument(DiskTier::Open(o, {5000}).status())) << "a row larger than a page";
  o.queue_depth = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(DiskTier::Open(o, {36}).status()));
  o.queue_depth = 8;
  const std::string file = TierPath("a_file");
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  o.path = file + "/tier";  // Its directory would be a file.
  EXPECT_FALSE(DiskTier::Open(o, {36}).ok());
  ::unlink(file.c_str());
}

}  // namespace
}  // namespace hyrec::embedding_ps
