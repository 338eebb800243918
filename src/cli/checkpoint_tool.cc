// `hyrec checkpoint inspect DIR` and `hyrec checkpoint verify DIR`: what a checkpoint, export or
// delta directory holds (for a checkpoint, also each shard's count of every worker's applied
// updates), and whether all of it is intact. Links no LibTorch.
//
// verify's exit code says what failed: 0 intact; 2 not a checkpoint (no MANIFEST, bad usage);
// 4 the manifest is corrupt; 5 a listed file is missing, of the wrong length or checksum;
// 6 a file's blocks are malformed although its checksum matches (a writer's bug).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "hyrec/embedding_ps/update_log.h"
#include "src/cli/roles.h"

namespace hyrec::cli {
namespace {

constexpr int kExitManifestCorrupt = 4;
constexpr int kExitFileCorrupt = 5;
constexpr int kExitBlocksCorrupt = 6;

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: hyrec checkpoint inspect DIR    what a checkpoint, export or delta holds\n"
               "       hyrec checkpoint verify DIR     check every file (exit 0 intact, 2 not a checkpoint,\n"
               "                                       4 manifest corrupt, 5 a file corrupt or missing,\n"
               "                                       6 a file's blocks malformed); DIR may also be a\n"
               "                                       shard's update log (CHECKPOINT_DIR/update-log/ps-N)\n");
}

// The kind of a listed file, from its name; false for files that are not block files (model.pt).
bool KindOf(const std::string& name, FileKind* kind) {
  if (absl::StartsWith(name, "ps-"))
    *kind = FileKind::kPsShard;
  else if (name == "dense.blk")
    *kind = FileKind::kDense;
  else if (absl::StartsWith(name, "pos-"))
    *kind = FileKind::kPosition;
  else if (absl::StartsWith(name, "rows-"))
    *kind = FileKind::kExportRows;
  else if (absl::StartsWith(name, "delta-"))
    *kind = FileKind::kDeltaRows;
  else
    return false;
  return true;
}

// Exit 2 (with the reason on stderr) unless `dir` is a directory: a file or a missing path is
// not a checkpoint, rather than a checkpoint whose manifest is corrupt.
std::optional<int> NotADirectory(const char* command, const std::string& dir) {
  std::error_code error;
  if (std::filesystem::is_directory(dir, error)) return std::nullopt;
  std::cerr << "hyrec checkpoint " << command << ": '" << dir << "' is "
            << (std::filesystem::exists(dir, error) ? "a file" : "missing")
            << ", not a checkpoint, export or delta directory\n";
  return kExitInvalidInput;
}

int Inspect(const std::string& dir) {
  if (std::optional<int> code = NotADirectory("inspect", dir)) return *code;
  absl::StatusOr<CheckpointManifest> m = ReadManifest(Env::Default(), dir);
  if (!m.ok()) {
    std::cerr << "hyrec checkpoint: " << m.status().message() << "\n";
    return absl::IsNotFound(m.status()) ? kExitInvalidInput : kExitManifestCorrupt;
  }
  uint64_t bytes = 0;
  for (const FileEntry& f : m->files) bytes += f.length;
  std::cout << absl::StrFormat("%s: %s at step %d (%d samples trained), written %s\n", dir, m->kind, m->step,
                               m->samples, absl::FormatTime(absl::FromUnixMillis(m->created_unix_ms)));
  std::cout << absl::StrFormat("  %d PS shard(s), %d worker(s), delta sequence %d, %d files, %.1f MB\n", m->num_shards,
                               m->num_workers, m->delta_sequence, m->files.size(), bytes / 1e6);
  if (m->has_eval) std::cout << absl::StrFormat("  held-out AUC %.4f, log loss %.4f\n", m->auc, m->log_loss);
  for (const CheckpointManifest::Table& t : m->tables) {
    std::cout << absl::StrFormat("  table %-20s dim %-4d %d rows\n", t.name, t.dim, t.rows);
  }
  for (const FileEntry& f : m->files) {
    std::cout << absl::StrFormat("  file  %-20s %12d bytes  crc32 %08x\n", f.name, f.length, f.crc32);
  }
  // Each shard's count of every worker's updates it applied, per table: what the workers'
  // acknowledgements add up to when none was lost or applied twice.
  for (const FileEntry& f : m->files) {
    if (!absl::StartsWith(f.name, "ps-")) continue;
    absl::StatusOr<std::vector<embedding_ps::AppliedUpdates>> applied =
        embedding_ps::ReadAppliedUpdates(Env::Default(), JoinPath(dir, f.name), &f);
    if (!applied.ok()) {
      std::cerr << "hyrec checkpoint: " << applied.status().message() << "\n";
      return kExitFileCorrupt;
    }
    for (const embedding_ps::AppliedUpdates& a : *applied) {
      std::cout << absl::StrFormat("  applied %s worker %d table %s: %d updates (highest sequence %d)\n", f.name,
                                   a.worker, a.table, a.applied, a.highest);
    }
  }
  return kExitOk;
}

// Whether `dir` holds update log segments (and no manifest): a shard's update log.
bool IsUpdateLog(Env* env, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (!names.ok()) return false;
  bool segments = false;
  for (const std::string& name : *names) {
    if (name == "MANIFEST") return false;
    segments |= absl::StartsWith(name, "log-") && absl::EndsWith(name, ".wal");
  }
  return segments;
}

// Every record of every segment of a shard's update log, and each segment continuing the one
// before it: what a --recover of the shard would replay. Exit 5 when it would refuse.
int VerifyUpdateLog(const std::string& dir) {
  embedding_ps::UpdateLogOptions options;
  options.dir = dir;
  options.read_only = true;
  absl::StatusOr<std::unique_ptr<embedding_ps::UpdateLog>> log = embedding_ps::UpdateLog::Open(options);
  embedding_ps::ReplayStats stats;
  const absl::Status s = log.ok() ? (*log)->Replay(0, nullptr, &stats) : log.status();
  if (!s.ok()) {
    std::cerr << "hyrec checkpoint verify: " << s.message() << "\n";
    return kExitFileCorrupt;
  }
  std::cout << absl::StrFormat("%s: intact (update log: %d segment(s), %d record(s) of %d update(s)", dir,
                               stats.segments, stats.records, stats.updates);
  if (stats.torn_bytes > 0) {
    std::cout << absl::StrFormat(", and %d torn byte(s) at the end: a group cut by a crash, never acknowledged",
                                 stats.torn_bytes);
  }
  std::cout << ")\n";
  return kExitOk;
}

int Verify(const std::string& dir) {
  if (std::optional<int> code = NotADirectory("verify", dir)) return *code;
  Env* env = Env::Default();
  if (IsUpdateLog(env, dir)) return VerifyUpdateLog(dir);
  absl::StatusOr<CheckpointManifest> m = ReadManifest(env, dir);
  if (!m.ok()) {
    std::cerr << "hyrec checkpoint verify: " << m.status().message() << "\n";
    return absl::IsNotFound(m.status()) ? kExitInvalidInput : kExitManifestCorrupt;
  }
  for (const FileEntry& f : m->files) {
    const absl::Status s = VerifyFileEntry(env, dir, f);
    if (!s.ok()) {
      std::cerr << "hyrec checkpoint verify: " << s.message() << "\n";
      return kExitFileCorrupt;
    }
    FileKind kind;
    if (!KindOf(f.name, &kind)) continue;
    absl::StatusOr<std::unique_ptr<BlockReader>> r = BlockReader::Open(env, JoinPath(dir, f.name), kind);
    absl::Status walk = r.status();
    Block b;
    while (walk.ok()) {
      absl::StatusOr<bool> more = (*r)->Next(&b);
      walk = more.status();
      if (!more.ok() || !*more) break;
    }
    if (!walk.ok()) {
      std::cerr << "hyrec checkpoint verify: " << walk.message() << "\n";
      return kExitBlocksCorrupt;
    }
  }
  std::cout << dir << ": intact (" << m->kind << " at step " << m->step << ", " << m->files.size() << " files)\n";
  return kExitOk;
}

}  // namespace

int CheckpointMain(int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    Usage(stdout);
    return kExitOk;
  }
  if (argc != 3) {
    Usage(stderr);
    return kExitInvalidInput;
  }
  const std::string command = argv[1];
  if (command == "inspect") return Inspect(argv[2]);
  if (command == "verify") return Verify(argv[2]);
  std::cerr << "hyrec checkpoint: unknown command '" << command << "'\n";
  Usage(stderr);
  return kExitInvalidInput;
}

}  // namespace hyrec::cli
