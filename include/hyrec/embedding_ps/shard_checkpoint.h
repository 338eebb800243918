// PS shards in checkpoints, exports and deltas: the shard files (docs/checkpoint-format.md), how
// a shard restores from a checkpoint saved with any number of shards, and ShardCheckpointer, which
// snapshots a store at once and writes it in the background.
//
//   ShardCheckpointer ckpt(store, /*shard=*/0, /*num_shards=*/2);
//   HYREC_RETURN_IF_ERROR(ckpt.Begin("ckpt/ckpt-000000000100-...", /*id=*/100, CutKind::kCheckpoint));
//   ... updates may go on: the snapshot is in memory ...
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

// Snapshots a store at once and writes the snapshot in the background, one cut at a time.
// Thread-safe.
class ShardCheckpointer {
 public:
  ShardCheckpointer(std::shared_ptr<EmbeddingShardStore> store, int shard, int num_shards, Env* env = Env::Default());
  ~ShardCheckpointer();

  // Takes the snapshot (or the delta) now and starts writing it into `dir` (created when
  // missing). FailedPrecondition while an earlier write is still running; the caller awaits it
  // first.
  absl::Status Begin(const std::string& dir, uint64_t id, CutKind kind);
  // The result of cut `id`'s write: DEADLINE_EXCEEDED while it runs past `timeout`, NotFound for an
  // id never begun (or superseded by a later one).
  absl::StatusOr<ShardFileInfo> Await(uint64_t id, absl::Duration timeout);

 private:
  void Join();

  const std::shared_ptr<EmbeddingShardStore> store_;
  const int shard_;
  const int num_shards_;
  Env* const env_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  uint64_t id_ = 0;
  bool running_ = false;
  absl::StatusOr<ShardFileInfo> result_ = absl::NotFoundError("no checkpoint begun");
  std::thread writer_;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_SHARD_CHECKPOINT_H_
