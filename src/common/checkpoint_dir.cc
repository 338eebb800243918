#include "hyrec/common/checkpoint_dir.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

// Block types of a MANIFEST.
constexpr uint32_t kMetaBlock = 1;
constexpr uint32_t kTableBlock = 2;
constexpr uint32_t kFileBlock = 3;
constexpr uint32_t kJobBlock = 4;  // The job id; absent in manifests written before job ids.
// Caps of what a manifest may list.
constexpr uint64_t kMaxNameBytes = 4096;
constexpr uint64_t kMaxJobYamlBytes = 16 << 20;

bool SafeName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name.find('/') == std::string::npos && name != "." && name != "..";
}

}  // namespace

const FileEntry* CheckpointManifest::Find(const std::string& name) const {
  for (const FileEntry& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string EncodeManifest(const CheckpointManifest& m) {
  std::vector<std::pair<uint32_t, std::string>> blocks;
  Encoder meta;
  meta.Bytes(m.kind);
  meta.U64(m.step);
  meta.U64(m.samples);
  meta.U64(m.created_unix_ms);
  meta.U32(m.num_shards);
  meta.U32(m.num_workers);
  meta.U64(m.delta_sequence);
  meta.U32(m.has_eval ? 1 : 0);
  meta.F64(m.auc);
  meta.F64(m.log_loss);
  meta.Bytes(m.job_yaml);
  blocks.emplace_back(kMetaBlock, std::move(meta.str()));
  if (!m.job_id.empty()) {
    Encoder job;
    job.Bytes(m.job_id);
    blocks.emplace_back(kJobBlock, std::move(job.str()));
  }
  for (const CheckpointManifest::Table& t : m.tables) {
    Encoder e;
    e.Bytes(t.name);
    e.U32(t.dim);
    e.Bytes(t.optimizer);
    e.U64(t.rows);
    blocks.emplace_back(kTableBlock, std::move(e.str()));
  }
  for (const FileEntry& f : m.files) {
    Encoder e;
    e.Bytes(f.name);
    e.U64(f.length);
    e.U32(f.crc32);
    blocks.emplace_back(kFileBlock, std::move(e.str()));
  }
  return EncodeBlockFile(FileKind::kManifest, blocks);
}

absl::StatusOr<CheckpointManifest> DecodeManifest(const std::string& name, std::string bytes) {
  HYREC_ASSIGN_OR_RETURN(auto reader, BlockReader::FromString(name, std::move(bytes), FileKind::kManifest));
  CheckpointManifest m;
  bool has_meta = false;
  Block b;
  for (;;) {
    HYREC_ASSIGN_OR_RETURN(const bool more, reader->Next(&b));
    if (!more) break;
    Decoder d(b.payload);
    auto bad = [&](absl::string_view what) {
      return absl::DataLossError(absl::StrCat(name, ": offset ", b.offset, ": ", what));
    };
    if (b.type == kMetaBlock) {
      if (has_meta) return bad("a second meta block");
      has_meta = true;
      m.kind = d.Bytes();
      m.step = d.U64();
      m.samples = d.U64();
      m.created_unix_ms = d.U64();
      m.num_shards = d.U32();
      m.num_workers = d.U32();
      m.delta_sequence = d.U64();
      m.has_eval = d.U32() != 0;
      m.auc = d.F64();
      m.log_loss = d.F64();
      m.job_yaml = d.Bytes();
      if (!d.done()) return bad("malformed meta block");
      if (m.kind != "checkpoint" && m.kind != "export" && m.kind != "delta") {
        return bad(absl::StrCat("unknown kind '", m.kind.substr(0, 32), "'"));
      }
      if (m.job_yaml.size() > kMaxJobYamlBytes) return bad("job text over its cap");
      if (m.num_shards > (1u << 16) || m.num_workers > (1u << 16)) return bad("implausible shard or worker count");
    } else if (b.type == kJobBlock) {
      if (!m.job_id.empty()) return bad("a second job block");
      m.job_id = d.Bytes();
      if (!d.done() || m.job_id.empty() || m.job_id.size() > 64) return bad("malformed job block");
    } else if (b.type == kTableBlock) {
      CheckpointManifest::Table t;
      t.name = d.Bytes();
      t.dim = d.U32();
      t.optimizer = d.Bytes();
      t.rows = d.U64();
      if (!d.done() || t.name.size() > kMaxNameBytes || t.optimizer.size() > 64) return bad("malformed table block");
      m.tables.push_back(std::move(t));
    } else if (b.type == kFileBlock) {
      FileEntry f;
      f.name = d.Bytes();
      f.length = d.U64();
      f.crc32 = d.U32();
      if (!d.done()) return bad("malformed file block");
      if (!SafeName(f.name) || f.name == kManifestName) {
        return bad(absl::StrCat("file name '", f.name.substr(0, 64), "' is not a plain name in the directory"));
      }
      if (m.Find(f.name) != nullptr) return bad(absl::StrCat("file '", f.name, "' listed twice"));
      m.files.push_back(std::move(f));
    } else {
      return bad(absl::StrCat("unknown block type ", b.type));
    }
  }
  if (!has_meta) return absl::DataLossError(absl::StrCat(name, ": no meta block"));
  return m;
}

absl::Status CommitManifest(Env* env, const std::string& dir, const CheckpointManifest& m) {
  HYREC_RETURN_IF_ERROR(env->SyncDir(dir));
  return WriteFileAtomically(env, JoinPath(dir, kManifestName), EncodeManifest(m));
}

absl::StatusOr<CheckpointManifest> ReadManifest(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  absl::StatusOr<std::string> bytes = ReadFileToString(env, path, kMaxManifestBytes);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) {
      return absl::NotFoundError(absl::StrCat("'", dir, "' is not a committed checkpoint: no ", kManifestName));
    }
    if (absl::IsFailedPrecondition(bytes.status())) return absl::DataLossError(bytes.status().message());
    return bytes.status();
  }
  return DecodeManifest(path, std::move(*bytes));
}

absl::StatusOr<CheckpointManifest> VerifyCheckpoint(Env* env, const std::string& dir) {
  HYREC_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(env, dir));
  for (const FileEntry& f : m.files) {
    absl::Status s = VerifyFileEntry(env, dir, f);
    if (absl::IsNotFound(s)) return absl::DataLossError(s.message());
    HYREC_RETURN_IF_ERROR(s);
  }
  return m;
}

absl::StatusOr<std::string> ReadListedFile(Env* env, const std::string& dir, const CheckpointManifest& m,
                                           const std::string& name, uint64_t max_bytes) {
  const std::string path = JoinPath(dir, name);
  const FileEntry* entry = m.Find(name);
  if (entry == nullptr) return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no ", name));
  absl::StatusOr<std::string> bytes = ReadFileToString(env, path, max_bytes);
  if (absl::IsNotFound(bytes.status())) return absl::DataLossError(absl::StrCat(path, ": listed but missing"));
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != entry->length || Crc32(*bytes) != entry->crc32) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes->size(), " bytes with crc32 ", Crc32(*bytes),
                                            "; the manifest says ", entry->length, " bytes, crc32 ", entry->crc32));
  }
  return bytes;
}

std::string CheckpointDirName(const std::string& prefix, uint64_t step, uint64_t unix_ms) {
  return absl::StrFormat("%s-%012d-%013d", prefix, step, unix_ms);
}

bool DeltaSequenceOf(const std::string& name, uint64_t* sequence) {
  const size_t at = sizeof(kDeltaPrefix);  // The prefix and its '-'.
  if (!absl::StartsWith(name, absl::StrCat(kDeltaPrefix, "-")) || name.size() < at + 14 || name[at + 12] != '-') {
    return false;
  }
  const absl::string_view tag = absl::string_view(name).substr(at + 13);
  if (!std::all_of(tag.begin(), tag.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  return std::all_of(name.begin() + at, name.begin() + at + 12, [](char c) { return c >= '0' && c <= '9'; }) &&
         absl::SimpleAtoi(name.substr(at, 12), sequence);
}

std::vector<std::string> ListCheckpointDirs(Env* env, const std::string& root, const std::string& prefix) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(root);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    if (absl::StartsWith(n, prefix + "-") && !absl::EndsWith(n, ".tmp")) out.push_back(n);
  }
  return out;  // GetChildren sorts.
}

std::string ResolveResumeFlag(Env* env, const std::string& root, const std::string& prefix, const std::string& flag,
                              std::string* note) {
  if (flag != "auto") return flag;
  // A directory without a MANIFEST is a cut that never committed (a crash while writing), not a
  // checkpoint to resume from.
  bool any = false;
  const std::string job = root.empty() ? "" : CheckpointDirJob(env, root);
  if (!root.empty()) {
    for (const std::string& dir : ListCheckpointDirs(env, root, prefix)) {
      const std::string path = JoinPath(root, dir);
      if (!env->FileExists(JoinPath(path, kManifestName))) continue;
      absl::StatusOr<CheckpointManifest> m = ReadManifest(env, path);
      any = any || !m.ok() || OfJob(*m, job);  // One that does not read is named by ResolveCheckpoint.
    }
  }
  if (note != nullptr) {
    *note = any ? absl::StrCat("--resume=auto: resuming from the newest checkpoint under ", root)
                : absl::StrCat("--resume=auto: no checkpoint", job.empty() ? "" : " of the directory's job", " under '",
                               root, "'; starting fresh");
  }
  return any ? "latest" : "";
}

absl::StatusOr<std::string> ResolveCheckpoint(Env* env, const std::string& root, const std::string& prefix,
                                              const std::string& which, CheckpointManifest* manifest,
                                              std::vector<std::string>* skipped) {
  if (which != "latest") {
    // Its files are checked against the manifest by whoever reads them: each role reads only
    // its own (a PS shard never reads the dense state).
    HYREC_ASSIGN_OR_RETURN(*manifest, ReadManifest(env, which));
    for (const FileEntry& f : manifest->files) {
      absl::StatusOr<uint64_t> size = env->GetFileSize(JoinPath(which, f.name));
      if (!size.ok() || *size != f.length) {
        return absl::DataLossError(
            absl::StrCat(JoinPath(which, f.name), ": missing or not of the manifest's ", f.length, " bytes"));
      }
    }
    return which;
  }
  if (root.empty()) return absl::InvalidArgumentError("'latest' needs a checkpoint directory (checkpoint.dir)");
  const std::vector<std::string> dirs = ListCheckpointDirs(env, root, prefix);
  const std::string job = prefix == kCheckpointPrefix ? CheckpointDirJob(env, root) : "";
  size_t other_jobs = 0;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string dir = JoinPath(root, *it);
    absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(env, dir);
    if (m.ok() && !OfJob(*m, job)) {
      ++other_jobs;
      continue;
    }
    if (m.ok()) {
      *manifest = std::move(*m);
      return dir;
    }
    if (skipped != nullptr) skipped->push_back(absl::StrCat(dir, ": ", m.status().message()));
  }
  return absl::NotFoundError(absl::StrCat(
      "no valid checkpoint under '", root, "'", dirs.empty() ? "" : absl::StrCat(" (", dirs.size(), " tried)"),
      other_jobs == 0 ? ""
                      : absl::StrCat("; ", other_jobs, " belong to another job than the directory's (", job,
                                     ", its JOB file): name one (--resume=DIR) to start from it")));
}

absl::Status RetireCheckpoints(Env* env, const std::string& root, const std::string& prefix, int keep_last,
                               const std::string& keep, const std::string& just_committed, const std::string& job_id) {
  const std::vector<std::string> dirs = ListCheckpointDirs(env, root, prefix);
  std::vector<bool> committed(dirs.size()), others(dirs.size());
  int newest_committed = -1;
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string path = JoinPath(root, dirs[i]);
    committed[i] = env->FileExists(JoinPath(path, kManifestName));
    if (committed[i] && !job_id.empty()) {
      absl::StatusOr<CheckpointManifest> m = ReadManifest(env, path);
      others[i] = !m.ok() || m->job_id != job_id;  // Another job's (or unreadable): neither counted nor deleted.
    }
    if (committed[i] && just_committed.empty() && !others[i]) newest_committed = static_cast<int>(i);
    if (!just_committed.empty() && (dirs[i] == just_committed || path == just_committed)) {
      newest_committed = static_cast<int>(i);
    }
  }
  int kept = 0;
  absl::Status first_error;
  for (int i = static_cast<int>(dirs.size()) - 1; i >= 0; --i) {
    const std::string dir = JoinPath(root, dirs[i]);
    bool remove = false;
    if (others[i]) continue;
    if (committed[i]) {
      if (dir == keep || dirs[i] == keep) continue;  // Kept beside the newest keep_last.
      remove = kept >= keep_last;
      if (!remove) ++kept;
    } else {
      remove = i < newest_committed;  // Newer ones may still be being written.
    }
    if (!remove) continue;
    // The manifest goes first: a directory half deleted is then never taken for a checkpoint.
    const std::string manifest = JoinPath(dir, kManifestName);
    absl::Status s = env->FileExists(manifest) ? env->DeleteFile(manifest) : absl::OkStatus();
    if (s.ok()) s = DeleteDirAndFiles(env, dir);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

std::string NewJobId() { return absl::StrFormat("%016x", RandomId()); }

std::string CheckpointDirJob(Env* env, const std::string& root) {
  absl::StatusOr<std::string> text = ReadFileToString(env, JoinPath(root, kJobFileName), 256);
  if (!text.ok()) return "";
  return std::string(absl::StripAsciiWhitespace(*text));
}

bool OfJob(const CheckpointManifest& m, const std::string& job_id) {
  return job_id.empty() || m.job_id.empty() || m.job_id == job_id;
}

absl::StatusOr<CheckpointDirClaim> ClaimCheckpointDir(Env* env, const std::string& root, const std::string& job_id,
                                                      absl::Duration wait) {
  HYREC_RETURN_IF_ERROR(Annotate(env->CreateDirs(root), "checkpoint.dir"));
  absl::StatusOr<std::unique_ptr<FileLock>> lock =
      LockFileWithin(env, JoinPath(root, kLockFileName), absl::StrCat("a run of job ", job_id), wait);
  if (absl::IsFailedPrecondition(lock.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir ", root, " is taken by another run: ", lock.status().message(),
        ". One run writes a checkpoint directory at a time; two would delete each other's checkpoints and reset "
        "each other's update logs. Stop that run first, or give this one another checkpoint.dir"));
  }
  HYREC_RETURN_IF_ERROR(lock.status());
  CheckpointDirClaim claim;
  claim.lock = std::move(*lock);
  HYREC_RETURN_IF_ERROR(
      Annotate(WriteFileAtomically(env, JoinPath(root, kJobFileName), job_id + "\n"), "checkpoint.dir's JOB file"));
  claim.job_id = job_id;
  return claim;
}

}  // namespace hyrec
