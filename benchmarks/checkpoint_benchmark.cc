// Checkpoint write and load of one PS shard, beside the disk's own floor, and the training pause
// a checkpoint costs the default job.
//
//   build/benchmarks/checkpoint_benchmark [--rows=10000000] [--dim=64] [--dir=/tmp/hyrec-ckpt-bench]
//
// (1) A store of --rows rows of --dim with Adagrad state (dim + dim floats a row) is copied
//     (Snapshot: what a checkpoint holds the shard for), written as a shard file (synced) and
//     restored into a new store (checked against its manifest entry, parsed, inserted). The
//     floors, on the same disk in the same binary: the snapshot's own arrays written sequentially
//     with one fdatasync, and that file read back sequentially into new memory of its size; both
//     files are evicted from the page cache before they are read. Targets: write and load each
//     >= 0.5 of their floor.
// (2) The default job (examples/configs/synthetic.yaml's model and PS, 240,000 samples) trained
//     with a checkpoint every 100 steps: the training pause per checkpoint (drain, positions, the
//     in-memory copies) beside the time the checkpoint takes to write. Target: <= 0.25.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/hash.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "hyrec/job/job_plan.h"

namespace hyrec {
namespace {

double Since(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// Drops a file's pages from the page cache, so that the next read comes from the disk.
void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

embedding_ps::StoreOptions StoreFor(int dim) {
  embedding_ps::TableConfig table;
  table.name = "t";
  table.dim = dim;
  table.optimizer.kind = embedding_ps::OptimizerKind::kAdagrad;
  embedding_ps::StoreOptions o;
  o.tables = {table};
  return o;
}

// The floor of a write: the snapshot's own arrays (the bytes a shard file holds) written
// sequentially in 4 MiB appends and synced once.
double FloorWrite(const std::string& path, const embedding_ps::StoreSnapshot& snap) {
  const absl::Time start = absl::Now();
  auto file = *Env::Default()->NewWritableFile(path);
  for (const embedding_ps::StoreSnapshot::Table& t : snap.tables) {
    for (absl::string_view bytes :
         {absl::string_view(reinterpret_cast<const char*>(t.ids.data()), t.ids.size() * 8),
          absl::string_view(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4)}) {
      for (size_t done = 0; done < bytes.size(); done += 4 << 20) (void)file->Append(bytes.substr(done, 4 << 20));
    }
  }
  (void)file->Sync();
  (void)file->Close();
  return Since(start);
}

// The floor of a load: the file read sequentially in 4 MiB reads (after its pages are evicted)
// into memory of its size, as a restore must hold what it reads (new memory, like a new store's).
double FloorRead(const std::string& path, uint64_t bytes) {
  Evict(path);
  const absl::Time start = absl::Now();
  auto in = *Env::Default()->NewSequentialFile(path);
  std::unique_ptr<char[]> memory(new char[bytes]);
  for (uint64_t done = 0; done < bytes;) {
    absl::StatusOr<size_t> got = in->Read(memory.get() + done, std::min<uint64_t>(4 << 20, bytes - done));
    if (!got.ok() || *got == 0) break;
    done += *got;
  }
  return Since(start);
}

// Looks up and updates `batch` stored rows at random (ids Mix64(1..rows)); seconds taken.
double TrainBatch(embedding_ps::EmbeddingShardStore* store, uint64_t rows, int dim, size_t batch, uint64_t* seed) {
  std::vector<uint64_t> ids(batch);
  for (uint64_t& id : ids) id = Mix64(Mix64(++*seed) % rows + 1);
  std::vector<float> values(batch * dim);
  std::vector<float> grads(batch * dim, 0.001f);
  const absl::Time start = absl::Now();
  (void)store->Lookup(0, ids, absl::MakeSpan(values), nullptr);
  (void)store->Update(0, ids, grads, {}, nullptr);
  return Since(start);
}

uint64_t MinorFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_minflt);
}

// The cut a checkpoint takes of this store (forked: the store is frozen while the process forks)
// and what training pays while the child writes: batches of random stored rows looked up and
// updated during the write beside the same before it, and the pages the parent copied.
bool ForkedCutRun(const std::shared_ptr<embedding_ps::EmbeddingShardStore>& store, uint64_t rows, int dim,
                  const std::string& dir) {
  constexpr size_t kBatch = 4096;
  uint64_t seed = 0;
  double before_s = 0;
  const uint64_t faults_before = MinorFaults();
  for (int i = 0; i < 50; ++i) before_s += TrainBatch(store.get(), rows, dim, kBatch, &seed);
  const double faults_a_batch = static_cast<double>(MinorFaults() - faults_before) / 50;
  embedding_ps::ShardCheckpointer cutter(store, 0, 1);
  const uint64_t faults = MinorFaults();
  const absl::Time start = absl::Now();
  if (absl::Status s = cutter.Begin(dir, 1, embedding_ps::CutKind::kCheckpoint); !s.ok()) {
    std::cerr << s << "\n";
    return false;
  }
  const double pause_s = Since(start);
  double during_s = 0;
  int batches = 0;
  absl::StatusOr<embedding_ps::ShardFileInfo> info;
  for (;;) {
    info = cutter.Await(1, absl::ZeroDuration());
    if (!absl::IsDeadlineExceeded(info.status())) break;
    during_s += TrainBatch(store.get(), rows, dim, kBatch, &seed);
    ++batches;
  }
  const double write_s = Since(start);
  const double copied = std::max(0.0, static_cast<double>(MinorFaults() - faults) - faults_a_batch * batches);
  if (!info.ok()) {
    std::cerr << info.status() << "\n";
    return false;
  }
  std::filesystem::remove_all(dir);
  const double ns_before = 1e9 * before_s / (50.0 * kBatch);
  const double ns_during = batches > 0 ? 1e9 * during_s / (static_cast<double>(batches) * kBatch) : 0;
  std::printf(
      "cut (%s): training paused %.1f ms (target <= 500, not growing with the shard); the child wrote %.0f MB in "
      "%.2f s\n",
      cutter.last_forked() ? "forked" : "copied in memory", 1000 * pause_s, info->file.length / 1e6, write_s);
  std::printf(
      "  while it wrote: %d batches of %zu rows, lookup+update %.0f ns a row (%.0f before the cut, ratio %.2f); "
      "%.0f pages copied on write in the parent (page faults beyond those of as many batches before)\n",
      batches, kBatch, ns_during, ns_before, ns_during > 0 ? ns_before / ns_during : 0.0, copied);
  return true;
}

int StoreRun(uint64_t rows, int dim, const std::string& dir) {
  std::shared_ptr<embedding_ps::EmbeddingShardStore> store = *embedding_ps::EmbeddingShardStore::Create(StoreFor(dim));
  const int floats = 2 * dim;  // Adagrad: the weights and one accumulator each.
  absl::Time start = absl::Now();
  {
    constexpr uint64_t kChunk = 1 << 16;
    std::vector<uint64_t> ids(kChunk);
    std::vector<float> values(kChunk * floats, 0.5f);
    for (uint64_t begin = 0; begin < rows; begin += kChunk) {
      const uint64_t n = std::min(kChunk, rows - begin);
      for (uint64_t i = 0; i < n; ++i) ids[i] = Mix64(begin + i + 1);
      ids.resize(n);
      values.resize(n * floats);
      if (!store->RestoreRows(0, ids, values).ok()) return kExitFailure;
    }
  }
  std::printf("filled %llu rows of dim %d (Adagrad) in %.1f s\n", static_cast<unsigned long long>(rows), dim,
              Since(start));
  if (!ForkedCutRun(store, rows, dim, JoinPath(dir, "cut"))) return kExitFailure;
  start = absl::Now();
  absl::StatusOr<embedding_ps::ShardFileInfo> info;
  double snapshot_s = 0, write_s = 0, floor_write_s = 0;
  const std::string floor = JoinPath(dir, "floor.bin");
  {
    const embedding_ps::StoreSnapshot snap = store->Snapshot();
    snapshot_s = Since(start);
    floor_write_s = FloorWrite(floor, snap);
    start = absl::Now();
    info = embedding_ps::WriteShardFile(Env::Default(), dir, 0, 1, store->tables(), snap);
    write_s = Since(start);
  }
  if (!info.ok()) {
    std::cerr << info.status() << "\n";
    return kExitFailure;
  }
  store.reset();
  CheckpointManifest m;
  m.num_shards = 1;
  m.files = {info->file};
  const std::string shard = JoinPath(dir, info->file.name);
  const double floor_read_s = FloorRead(floor, Env::Default()->GetFileSize(floor).value_or(0));
  (void)Env::Default()->DeleteFile(floor);
  Evict(shard);
  auto restored = *embedding_ps::EmbeddingShardStore::Create(StoreFor(dim));
  start = absl::Now();
  const absl::Status loaded = embedding_ps::RestoreShard(Env::Default(), dir, m, 0, 1, restored.get());
  const double load_s = Since(start);
  if (!loaded.ok() || restored->Stats().rows != rows) {
    std::cerr << "restore failed: " << loaded << "\n";
    return kExitFailure;
  }
  restored.reset();
  const uint64_t bytes = info->file.length;
  (void)Env::Default()->DeleteFile(shard);
  const double mb = bytes / 1e6;
  std::printf("shard file: %.0f MB\n", mb);
  std::printf("  snapshot (in memory)  %7.2f s  %8.0f MB/s\n", snapshot_s, mb / snapshot_s);
  std::printf("  write    checkpoint   %7.2f s  %8.0f MB/s   floor %8.0f MB/s   ratio %.2f (target >= 0.5)\n", write_s,
              mb / write_s, mb / floor_write_s, floor_write_s / write_s);
  std::printf("  load     checkpoint   %7.2f s  %8.0f MB/s   floor %8.0f MB/s   ratio %.2f (target >= 0.6)\n", load_s,
              mb / load_s, mb / floor_read_s, floor_read_s / load_s);
  return kExitOk;
}

int PauseRun(const std::string& dir) {
  const std::string text = absl::StrCat(
      "loader:\n  source: {format: synthetic, synthetic: {num_samples: 240000, vocabulary: 2000, zipf: 1.05, seed: "
      "1}}\n  batch_size: 512\n  threads: 1\n  epochs: 1\n  shuffle_window: 65536\n",
      "eval: {samples: 0}\nmodel: {kind: dlrm, embedding_dim: 16, bottom: [64, 32], top: [64, 32]}\n",
      "ps: {shards: 2, optimizer: adagrad, learning_rate: 0.05}\n",
      "train: {workers: 1, embedding_staleness: 4, dense_optimizer: adam, dense_learning_rate: 0.002, "
      "log_every_batches: 100000}\n",
      "checkpoint: {dir: ", dir, "/job, every_steps: 100, keep_last: 2, at_end: false}\n");
  absl::StatusOr<job::JobPlan> plan = job::Plan(*job::ParseJobSpecText(text, "checkpoint_benchmark"));
  if (!plan.ok()) {
    std::cerr << plan.status() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<dense_worker::TrainReport> r = dense_worker::RunTrainJob(*plan, {});
  if (!r.ok() || r->checkpoints == 0) {
    std::cerr << "training failed: " << r.status() << "\n";
    return kExitFailure;
  }
  const double pause = r->checkpoint_pause_seconds / r->checkpoints;
  const double write = r->checkpoint_write_seconds / r->checkpoints;
  std::printf(
      "default job, %d checkpoints of %llu steps each 100: training paused %.1f ms per checkpoint; writing "
      "took %.1f ms; ratio %.2f (target <= 0.15)\n",
      r->checkpoints, static_cast<unsigned long long>(r->stats.batches), 1000 * pause, 1000 * write, pause / write);
  return kExitOk;
}

}  // namespace
}  // namespace hyrec

int main(int argc, char** argv) {
  uint64_t rows = 10'000'000;
  int dim = 64;
  std::string dir = "/tmp/hyrec-ckpt-bench";
  std::string only = "all";
  hyrec::FlagSet flags("checkpoint_benchmark", "Checkpoint write and load beside the disk's floor; training pause.");
  flags.Uint64("rows", &rows, "Rows of the shard.");
  flags.Int("dim", &dim, "Their dim (Adagrad: as many state floats).", 1, 4096);
  flags.String("dir", &dir, "DIR", "Where the files go (removed at the end).");
  flags.Choice("only", &only, {"all", "store", "pause"}, "One part only.");
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  int code = hyrec::kExitOk;
  if (only != "pause") code = hyrec::StoreRun(rows, dim, dir);
  if (code == hyrec::kExitOk && only != "store") code = hyrec::PauseRun(dir);
  std::filesystem::remove_all(dir);
  return code;
}
