// Random reads of rows from local disk, the way a disk tier under the PS store would serve the
// rows a lookup misses in DRAM, beside the disk's own random-read floor at the same file size and
// queue depth, measured in the same run.
// Floor: the most 4 KiB random blocks a second the device gives at queue depth `--depth` over
// the file, the better of two ways with no library in the way: `--depth` threads each with one
// pread(O_DIRECT) at a time, and one thread keeping `--depth` O_DIRECT reads in flight through
// io_uring (liburing). A row costs one block read, so a reader's rows/s divides by it.
// Readers measured against it: hyrec's disk tier (src/embedding_ps/disk_tier.h) taking
// `--depth` random rows at a time (each put back, untimed), with the floor taken again on the
// tier's own file; and RocksDB (one key a row; direct reads, an 8 MiB block cache, no
// compression), MultiGet of `--depth` random keys at a time from one thread. Target >= 0.5.
//
//   build/benchmarks/disk_read_benchmark [--dir=/tmp] [--rows=20000000] [--row_bytes=48]
//                                        [--depth=32] [--seconds=5]
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/table.h"
#include "src/embedding_ps/disk_tier.h"

namespace {

constexpr size_t kBlock = 4096;

struct Flags {
  std::string dir = "/tmp";
  uint64_t rows = 20000000;
  int row_bytes = 48;
  int depth = 32;
  double seconds = 5;
};

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A 4 KiB-aligned buffer.
std::unique_ptr<char, decltype(&std::free)> Aligned(size_t bytes) {
  return {static_cast<char*>(std::aligned_alloc(kBlock, bytes)), &std::free};
}

// Writes `rows` rows packed into blocks; returns the blocks written.
uint64_t WriteBlockFile(const std::string& path, const Flags& f) {
  const uint64_t per_block = kBlock / f.row_bytes;
  const uint64_t blocks = (f.rows + per_block - 1) / per_block;
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) return 0;
  std::vector<char> chunk(kBlock * 256);
  std::mt19937_64 rng(1);
  for (uint64_t b = 0; b < blocks; b += 256) {
    for (auto& c : chunk) c = static_cast<char>(rng());
    const size_t n = std::min<uint64_t>(256, blocks - b) * kBlock;
    if (::write(fd, chunk.data(), n) != static_cast<ssize_t>(n)) {
      ::close(fd);
      return 0;
    }
  }
  ::fsync(fd);
  ::close(fd);
  return blocks;
}

// `depth` threads of pread(O_DIRECT) of random blocks; blocks/s.
double Floor(const std::string& path, uint64_t blocks, const Flags& f) {
  std::atomic<uint64_t> done{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < f.depth; ++t) {
    threads.emplace_back([&, t] {
      const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
      auto buf = Aligned(kBlock);
      std::mt19937_64 rng(100 + t);
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (::pread(fd, buf.get(), kBlock, static_cast<off_t>(rng() % blocks * kBlock)) != kBlock) break;
        ++n;
      }
      done += n;
      ::close(fd);
    });
  }
  const double start = Now();
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  return done / (Now() - start);
}

// io_uring: one thread keeps `depth` random block reads in flight; blocks/s.
double Uring(const std::string& path, uint64_t blocks, const Flags& f) {
  io_uring ring;
  if (io_uring_queue_init(f.depth, &ring, 0) != 0) return -1;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  auto bufs = Aligned(kBlock * f.depth);
  std::mt19937_64 rng(7);
  auto submit = [&](int slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd, bufs.get() + slot * kBlock, kBlock, rng() % blocks * kBlock);
    io_uring_sqe_set_data64(sqe, slot);
  };
  for (int s = 0; s < f.depth; ++s) submit(s);
  io_uring_submit(&ring);
  uint64_t rows = 0;
  const double start = Now();
  const double end = start + f.seconds;
  while (Now() < end) {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0 || cqe->res != static_cast<int>(kBlock)) break;
    const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
    io_uring_cqe_seen(&ring, cqe);
    ++rows;
    submit(slot);
    io_uring_submit(&ring);
  }
  const double rate = rows / (Now() - start);
  io_uring_queue_exit(&ring);
  ::close(fd);
  return rate;
}

// hyrec's disk tier holding `rows` rows of row_bytes - 8 payload bytes (the id is the rest):
// rows/s of Take of `depth` random rows at a time; `floor` gets the better floor on its file.
double Tier(const std::string& path, const Flags& f, double* floor) {
  using hyrec::embedding_ps::DiskTier;
  const uint32_t payload = static_cast<uint32_t>(f.row_bytes - 8);
  const uint64_t per_page = (DiskTier::kPageBytes - DiskTier::kPageHeaderBytes) / (16 + ((payload + 7) & ~7u));
  hyrec::embedding_ps::DiskTierOptions o;
  o.path = path;
  o.queue_depth = f.depth;
  o.capacity_bytes = (f.rows / per_page / 85 * 100 + 64) * DiskTier::kPageBytes;
  auto tier = DiskTier::Open(o, {payload});
  if (!tier.ok()) {
    std::fprintf(stderr, "disk_read_benchmark: %s\n", tier.status().ToString().c_str());
    return -1;
  }
  std::string row(payload, 'r');
  for (uint64_t id = 0; id < f.rows; ++id) {
    if (!(*tier)->Put(0, id, 0, row.data()).ok()) return -1;
  }
  const uint64_t pages = (*tier)->Stats().used_pages;
  *floor = std::max(Floor(path, pages, f), Uring(path, pages, f));
  std::mt19937_64 rng(13);
  std::vector<uint64_t> ids(f.depth);
  std::vector<std::string> taken(f.depth);
  uint64_t rows = 0;
  double busy = 0;
  const double end = Now() + f.seconds;
  while (Now() < end) {
    for (auto& id : ids) id = rng() % f.rows;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const double start = Now();
    absl::Status s = (*tier)->Take(0, ids, [&](size_t i, uint64_t, const char* p) { taken[i].assign(p, payload); });
    busy += Now() - start;
    if (!s.ok()) return -1;
    rows += ids.size();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!(*tier)->Put(0, ids[i], 0, taken[i].data()).ok()) return -1;
    }
    ids.resize(f.depth);
  }
  return rows / busy;
}

std::string Key(uint64_t id) { return std::string(reinterpret_cast<const char*>(&id), sizeof(id)); }

// RocksDB: `rows` keys written once (bulk, compacted), then MultiGet of `depth` random keys at a
// time; rows/s.
double Rocks(const std::string& path, const Flags& f) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.use_direct_reads = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.compression = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(8 << 20);
  table.block_size = kBlock;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* raw = nullptr;
  if (!rocksdb::DB::Open(o, path, &raw).ok()) return -1;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value(f.row_bytes - 8, 'x');
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  for (uint64_t id = 0; id < f.rows; ++id) {
    if (!db->Put(w, Key(id), value).ok()) return -1;
  }
  db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr);
  std::mt19937_64 rng(9);
  std::vector<std::string> keys(f.depth);
  std::vector<rocksdb::Slice> slices(f.depth);
  std::vector<rocksdb::PinnableSlice> values(f.depth);
  std::vector<rocksdb::Status> statuses(f.depth);
  uint64_t rows = 0;
  const double start = Now();
  const double end = start + f.seconds;
  rocksdb::ReadOptions r;
  r.fill_cache = false;
  while (Now() < end) {
    for (int i = 0; i < f.depth; ++i) {
      keys[i] = Key(rng() % f.rows);
      slices[i] = keys[i];
    }
    db->MultiGet(r, db->DefaultColumnFamily(), f.depth, slices.data(), values.data(), statuses.data());
    for (int i = 0; i < f.depth; ++i) {
      if (!statuses[i].ok()) return -1;
      values[i].Reset();
    }
    rows += f.depth;
  }
  return rows / (Now() - start);
}

bool Parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = false;
    if (absl::StartsWith(a, "--dir=")) ok = !(f->dir = a.substr(6)).empty();
    if (absl::StartsWith(a, "--rows=")) ok = absl::SimpleAtoi(a.substr(7), &f->rows) && f->rows >= 1000;
    if (absl::StartsWith(a, "--row_bytes=")) {
      ok = absl::SimpleAtoi(a.substr(12), &f->row_bytes) && f->row_bytes >= 16 && f->row_bytes <= 4096;
    }
    if (absl::StartsWith(a, "--depth="))
      ok = absl::SimpleAtoi(a.substr(8), &f->depth) && f->depth >= 1 && f->depth <= 256;
    if (absl::StartsWith(a, "--seconds=")) ok = absl::SimpleAtod(a.substr(10), &f->seconds) && f->seconds > 0;
    if (!ok) {
      std::fprintf(stderr, "disk_read_benchmark: bad argument %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, &f)) return 2;
  const std::string base = f.dir + "/hyrec_disk_read_benchmark";
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  const std::string file = base + "/blocks";
  const uint64_t blocks = WriteBlockFile(file, f);
  if (blocks == 0) {
    std::fprintf(stderr, "disk_read_benchmark: cannot write %s\n", file.c_str());
    return 1;
  }
  std::printf("%llu rows of %d bytes: %llu blocks of 4 KiB (%.2f GiB), queue depth %d\n",
              static_cast<unsigned long long>(f.rows), f.row_bytes, static_cast<unsigned long long>(blocks),
              blocks * kBlock / 1073741824.0, f.depth);
  const double threads = Floor(file, blocks, f);
  std::printf("pread(O_DIRECT), %d threads           %10.0f blocks/s\n", f.depth, threads);
  const double uring = Uring(file, blocks, f);
  std::printf("io_uring, %d in flight, one thread    %10.0f blocks/s\n", f.depth, uring);
  const double floor = std::max(threads, uring);
  std::printf("floor                                 %10.0f blocks/s\n", floor);
  double tier_floor = 0;
  const double tier = Tier(base + "/tier", f, &tier_floor);
  std::printf(
      "hyrec disk tier, %d rows a take        %10.0f rows/s  %.2f of the floor on its own file (%.0f blocks/s)\n",
      f.depth, tier, tier / tier_floor, tier_floor);
  const double rocks = Rocks(base + "/rocksdb", f);
  std::printf("rocksdb MultiGet of %d, one thread     %10.0f rows/s  %.2f of the floor\n", f.depth, rocks,
              rocks / floor);
  std::filesystem::remove_all(base);
  return uring > 0 && tier > 0 && rocks > 0 ? 0 : 1;
}
