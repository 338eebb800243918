// PS shards in checkpoints, exports and deltas: the shard files (docs/checkpoint-format.md), how
// a shard restores from a checkpoint saved with any number of shards, and ShardCheckpointer, which
// cuts a store at once and writes the cut in the background.
//
//   ShardCheckpointer ckpt(store, /*shard=*/0, /*num_shards=*/2);
//   HYREC_RETURN_IF_ERROR(ckpt.Begin("ckpt/ckpt-000000000100-...", /*id=*/100, CutKind::kCheckpoint));
//   ... updates may go on: the cut is taken ...
//   HYREC_ASSIGN_OR_RETURN(ShardFileInfo info, ckpt.Await(100, absl::Minutes(10)));
//
//   // A new shard 1 of 3 from a checkpoint of 4 shards: every row whose ShardForId(id, 3) is 1,
//   // with its optimizer state.
//   HYREC_RETURN_IF_ERROR(RestoreShard(env, dir, manifest, /*shard=*/1, /*num_shards=*/3, store.get()));
#ifndef HYREC_EMBEDDING_PS_SHARD_CHECKPOINT_H_
#define HYREC_EMBEDDING_PS_SHARD_CHECKPOINT_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace hyrec::embedding_ps {

enum class CutKind { kCheckpoint, kDelta };

// "ps-<shard>-of-<num_shards>.blk" (checkpoint), "rows-<shard>-of-<n>.blk" (export),
// "delta-<shard>-of-<n>.blk" (delta).
std::string ShardFileName(CutKind kind, int shard, int num_shards);
std::string ExportFileName(int shard, int num_shards);

// What a shard wrote: its file and the rows per table (in the store's table order).
struct ShardFileInfo {
  FileEntry file;
  std::vector<uint64_t> table_rows;
};

absl::StatusOr<ShardFileInfo> WriteShardFile(Env* env, const std::string& dir, int shard, int num_shards,
                                             const std::vector<TableConfig>& tables, const StoreSnapshot& snapshot);
absl::StatusOr<ShardFileInfo> WriteDeltaFile(Env* env, const std::string& dir, int shard, int num_shards,
                                             const std::vector<TableConfig>& tables, const StoreDelta& delta);

// Restores shard `shard` of `num_shards` from the checkpoint in `dir` (its manifest already
// read), whatever its shard count: every row whose ShardForId(id, num_shards) is `shard`, with
// its optimizer state, matched to the store's tables by name. Each file is checked against the
// manifest before any of it is restored (DATA_LOSS naming the file and offset). A checkpoint table
// of another dim or optimizer is InvalidArgument; a store table the checkpoint lacks starts empty.
absl::Status RestoreShard(Env* env, const std::string& dir, const CheckpointManifest& manifest, int shard,
                          int num_shards, EmbeddingShardStore* store);

// What a checkpoint's shard file says each worker's updates of each table came to: the updates
// the shard applied since the job began (StoreSnapshot::Dedup::applied) and the highest
// sequence among them. Checked against `expect` (its manifest entry) when given.
struct AppliedUpdates {
  std::string table;
  uint32_t worker = 0;
  uint64_t applied = 0;
  uint64_t highest = 0;
};
absl::StatusOr<std::vector<AppliedUpdates>> ReadAppliedUpdates(Env* env, const std::string& path,
                                                               const FileEntry* expect);

// Rows as an export or a delta holds them, weights only.
struct ExportedTable {
  std::string name;
  int dim = 0;
  std::vector<uint64_t> ids;
  std::vector<float> weights;        // ids.size() * dim
  std::vector<uint64_t> tombstones;  // Deltas only.
};

// Writes the export file of one checkpoint shard file (weights only, same tables), checking the
// shard file against its manifest entry as it reads it.
absl::StatusOr<FileEntry> ExportShardFile(Env* env, const std::string& checkpoint_dir, const FileEntry& shard_file,
                                          const std::string& out_dir, const std::string& out_name);

// Reads an export or delta rows file (kind kExportRows or kDeltaRows), calling `table` once per
// block (rows or tombstones of one table). Checked as RestoreShard checks, against `expect` (its
// manifest entry) when given.
absl::Status ReadRowsFile(Env* env, const std::string& path, FileKind kind, const FileEntry* expect,
                          const std::function<absl::Status(ExportedTable&)>& table);

struct ShardCheckpointerOptions {
  // A checkpoint of a store holding at least this many bytes (StoreStats::bytes) is cut by
  // forking: the store is frozen only while the process forks, and the child writes the shard
  // file from its copy-on-write view of the store, so the pause does not grow with the store
  // (the parent pays a page copy on the first write to each page while the child runs, and the
  // pages it copies are the memory the cut costs). A smaller store, a delta, or an Env other
  // than Env::Default() (whose files a child's writes would bypass) is copied in memory
  // (Snapshot) during the pause and written by a thread. 0: always fork.
  uint64_t fork_min_bytes = 64ull << 20;
};

// Cuts a store (at once: the store is frozen only for the cut itself) and writes the cut in the
// background, one cut at a time. Thread-safe.
class ShardCheckpointer {
 public:
  ShardCheckpointer(std::shared_ptr<EmbeddingShardStore> store, int shard, int num_shards, Env* env = Env::Default(),
                    ShardCheckpointerOptions options = {});
  ~ShardCheckpointer();

  // Takes the cut now and starts writing it into `dir` (created when missing). FailedPrecondition
  // while an earlier write is still running; the caller awaits it first. Unavailable when the
  // process cannot fork (the cut is not taken).
  absl::Status Begin(const std::string& dir, uint64_t id, CutKind kind);
  // The result of cut `id`'s write: DEADLINE_EXCEEDED while it runs past `timeout`, NotFound for an
  // id never begun (or superseded by a later one).
  absl::StatusOr<ShardFileInfo> Await(uint64_t id, absl::Duration timeout);
  // Whether the last cut begun was written by a forked child.
  bool last_forked() const;

 private:
  void Join();
  absl::Status BeginForked(const std::string& dir, uint64_t id);
  void Started(uint64_t id, bool forked, std::function<absl::StatusOr<ShardFileInfo>()> write);

  const std::shared_ptr<EmbeddingShardStore> store_;
  const int shard_;
  const int num_shards_;
  Env* const env_;
  const ShardCheckpointerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  uint64_t id_ = 0;
  bool running_ = false;
  bool forked_ = false;
  absl::StatusOr<ShardFileInfo> result_ = absl::NotFoundError("no checkpoint begun");
  std::thread writer_;
  // Kept between cuts that copy in memory, so that the next copy lands in pages already faulted in.
  std::shared_ptr<StoreSnapshot> spare_;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_SHARD_CHECKPOINT_H_
