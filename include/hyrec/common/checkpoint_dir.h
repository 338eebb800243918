// Checkpoint directories: the manifest that commits one, and how they are found, checked and
// retired. docs/checkpoint-format.md documents the layout and the guarantees.
//
// A checkpoint (or an export, or a delta) is a directory of block files (block_file.h) and one
// MANIFEST listing each with its length and crc32. The manifest is the commit point: data files
// are written under temporary names, synced and renamed; then the directory is synced, the
// manifest written to MANIFEST.tmp, synced, renamed and the directory synced again. A directory
// without a valid MANIFEST, or whose files do not match it, is not a checkpoint.
//
//   CheckpointManifest m;
//   m.step = 1200;
//   m.files = {shard0, shard1, dense};          // FileEntry from BlockWriter::Finish
//   HYREC_RETURN_IF_ERROR(CommitManifest(env, "ckpt/ckpt-000000001200-...", m));
//   HYREC_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpoint(env, "ckpt", "latest", &m));
#ifndef HYREC_COMMON_CHECKPOINT_DIR_H_
#define HYREC_COMMON_CHECKPOINT_DIR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/env.h"

namespace hyrec {

inline constexpr char kManifestName[] = "MANIFEST";
// Directory name prefixes: checkpoints under checkpoint.dir, exports and deltas under export.dir.
inline constexpr char kCheckpointPrefix[] = "ckpt";
inline constexpr char kExportPrefix[] = "model";
inline constexpr char kDeltaPrefix[] = "delta";
inline constexpr uint64_t kMaxManifestBytes = 64 << 20;
// In checkpoint.dir: the lock of the run that writes it, and the id of the job it belongs to.
inline constexpr char kLockFileName[] = "LOCK";
inline constexpr char kJobFileName[] = "JOB";

struct CheckpointManifest {
  std::string kind = "checkpoint";  // checkpoint | export | delta
  uint64_t step = 0;                // Optimizer steps of each worker at the cut.
  uint64_t samples = 0;             // Samples the job had trained at the cut.
  uint64_t created_unix_ms = 0;
  uint32_t num_shards = 0;
  uint32_t num_workers = 0;
  // A delta's own sequence number (1, 2, ...); for a checkpoint or export, the last delta taken
  // before its cut (a follower applies the deltas after it).
  uint64_t delta_sequence = 0;
  bool has_eval = false;  // The held-out evaluation at the cut, when there was one.
  double auc = 0;
  double log_loss = 0;
  std::string job_yaml;  // The job file the run was started with.
  std::string job_id;    // The job it belongs to (NewJobId); empty in manifests written before job ids.
  struct Table {
    std::string name;
    uint32_t dim = 0;
    std::string optimizer;
    uint64_t rows = 0;
  };
  std::vector<Table> tables;
  std::vector<FileEntry> files;

  const FileEntry* Find(const std::string& name) const;
};

std::string EncodeManifest(const CheckpointManifest& m);
// Parses a MANIFEST's bytes (`name` for messages): DATA_LOSS for anything malformed.
absl::StatusOr<CheckpointManifest> DecodeManifest(const std::string& name, std::string bytes);

// Syncs `dir` (the data files' renames), then writes its MANIFEST atomically.
absl::Status CommitManifest(Env* env, const std::string& dir, const CheckpointManifest& m);
absl::StatusOr<CheckpointManifest> ReadManifest(Env* env, const std::string& dir);
// The manifest, and every file it lists checked against its length and crc32.
absl::StatusOr<CheckpointManifest> VerifyCheckpoint(Env* env, const std::string& dir);

// Reads the file `name` the manifest lists, checked against its length and crc32 in the same
// pass: DATA_LOSS when it is missing from the manifest or the directory, or differs.
absl::StatusOr<std::string> ReadListedFile(Env* env, const std::string& dir, const CheckpointManifest& m,
                                           const std::string& name, uint64_t max_bytes);

// The directory name of a checkpoint: "<prefix>-<step, 12 digits>-<unix ms, 13 digits>", so that
// names sort by step, then by time.
std::string CheckpointDirName(const std::string& prefix, uint64_t step, uint64_t unix_ms);
// The sequence number a delta's directory name carries ("delta-<sequence, 12 digits>-<tag,
// digits>"); false for any other name.
bool DeltaSequenceOf(const std::string& name, uint64_t* sequence);
// The entries of `root` named "<prefix>-...", oldest first (by name); none when root is missing.
std::vector<std::string> ListCheckpointDirs(Env* env, const std::string& root, const std::string& prefix);

// A role's --resume value as it is to be used: "auto" becomes "latest" when `root` holds a
// committed checkpoint (a directory with a MANIFEST) and "" (start fresh) when it holds none, so that a restarted role
// resumes and a first start does not fail; anything else is returned as it is. A root whose committed checkpoints all
// fail to verify is not a fresh start: ResolveCheckpoint then fails and names them. `note` (optional) receives what was
// decided, for the role's log.
std::string ResolveResumeFlag(Env* env, const std::string& root, const std::string& prefix, const std::string& flag,
                              std::string* note);

// `which` is "latest" (the newest directory under `root` with the prefix whose checkpoint
// verifies and belongs to the directory's job, its JOB file, when it has one; each newer one that
// does not verify is logged to `skipped` and passed over) or a directory, of any job
// (its manifest must read and its files have their lengths; their contents are checked by
// whoever reads them, before use). NotFound when there is none.
absl::StatusOr<std::string> ResolveCheckpoint(Env* env, const std::string& root, const std::string& prefix,
                                              const std::string& which, CheckpointManifest* manifest,
                                              std::vector<std::string>* skipped = nullptr);

// Deletes the committed checkpoints under `root` older than the newest `keep_last`, except
// `keep` (e.g. the best evaluation's, kept beside them), and directories without a manifest that
// are older than `committed`, the checkpoint just committed (what failed writes left). Newer ones
// may still be being written, by this run or, after a resume into the same root, beside another
// run's later checkpoints that sort after them. Empty `committed`: the newest committed one. With
// a `job_id`, the committed checkpoints of other jobs (and those whose manifest does not read) are
// neither counted nor deleted. Call only once the newest manifest is durable.
absl::Status RetireCheckpoints(Env* env, const std::string& root, const std::string& prefix, int keep_last,
                               const std::string& keep, const std::string& committed = "",
                               const std::string& job_id = "");

// A new random job id: 16 hex digits.
std::string NewJobId();
// The job checkpoint.dir `root` belongs to (its JOB file); empty when it has none.
std::string CheckpointDirJob(Env* env, const std::string& root);
// Whether checkpoint `m` may be resumed as one of job `job_id`: the same job, or either unknown.
bool OfJob(const CheckpointManifest& m, const std::string& job_id);

// A run's hold on its checkpoint.dir: its LOCK, held until destroyed (or the process ends, however
// it ends), and the job id it wrote into JOB.
struct CheckpointDirClaim {
  std::unique_ptr<FileLock> lock;
  std::string job_id;
};
// Takes checkpoint.dir `root` (created when missing) for this run of job `job_id`: locks its LOCK
// (saying who holds it), waiting up to `wait` for a holder to go, then writes `job_id` into JOB.
// FAILED_PRECONDITION naming the holder when another run keeps it.
absl::StatusOr<CheckpointDirClaim> ClaimCheckpointDir(Env* env, const std::string& root, const std::string& job_id,
                                                      absl::Duration wait = absl::Seconds(5));

}  // namespace hyrec

#endif  // HYREC_COMMON_CHECKPOINT_DIR_H_
