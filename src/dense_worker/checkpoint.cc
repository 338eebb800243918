#include "hyrec/dense_worker/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/data_loader/positions.h"
#include "hyrec/dense_worker/model_registry.h"
#include "hyrec/dense_worker/torchscript_model.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "src/dense_worker/torch_status.h"

namespace hyrec::dense_worker {
namespace {

// Block types of the dense file.
constexpr uint32_t kStateBlock = 30;
constexpr uint32_t kModelBlock = 31;  // The archive's bytes, in order, over as many blocks as needed.
constexpr uint32_t kOptimizerBlock = 32;
constexpr uint32_t kRngBlock = 33;
constexpr size_t kChunkBytes = 256 << 20;
constexpr uint64_t kMaxDenseBytes = 64ull << 30;

Env* EnvOr(Env* env) { return env != nullptr ? env : Env::Default(); }

std::string EncodeState(const TrainState& s) {
  Encoder e;
  e.U64(s.step);
  e.U64(s.samples);
  e.U64(s.epoch);
  e.U32(s.has_best_eval ? 1 : 0);
  e.F64(s.best_auc);
  e.F64(s.best_log_loss);
  e.U64(s.best_eval_samples);
  e.U64(s.best_at_samples);
  e.U32(static_cast<uint32_t>(s.evals_without_gain));
  e.U64(s.delta_sequence);
  e.Bytes(s.best_checkpoint);
  return std::move(e.str());
}

bool DecodeState(absl::string_view bytes, TrainState* s) {
  Decoder d(bytes);
  s->step = d.U64();
  s->samples = d.U64();
  s->epoch = d.U64();
  s->has_best_eval = d.U32() != 0;
  s->best_auc = d.F64();
  s->best_log_loss = d.F64();
  s->best_eval_samples = d.U64();
  s->best_at_samples = d.U64();
  s->evals_without_gain = static_cast<int>(d.U32());
  s->delta_sequence = d.U64();
  s->best_checkpoint = d.Bytes();
  return d.done() && s->evals_without_gain >= 0 && s->best_checkpoint.size() < 4096;
}

absl::Status AddChunked(BlockWriter* w, uint32_t type, const std::string& bytes) {
  for (size_t begin = 0; begin < bytes.size(); begin += kChunkBytes) {
    HYREC_RETURN_IF_ERROR(w->Add(type, absl::string_view(bytes).substr(begin, kChunkBytes)));
  }
  return absl::OkStatus();
}

template <typename Save>
std::string ArchiveBytes(Save&& save) {
  torch::serialize::OutputArchive archive;
  save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

template <typename Load>
void LoadArchive(const std::string& bytes, Load&& load) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  load(archive);
}

// Writes `bytes` as a plain file named `name` in `dir`, durably but for the directory entry (the
// manifest's commit syncs the directory once for every file).
absl::StatusOr<FileEntry> WriteRawFile(Env* env, const std::string& dir, const std::string& name,
                                       const std::string& bytes) {
  HYREC_RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(dir, name), bytes, /*sync_dir=*/false));
  return FileEntry{name, bytes.size(), Crc32(bytes)};
}

// A file already written, made durable, with its length and crc32 (the small position files).
absl::StatusOr<FileEntry> EntryOf(Env* env, const std::string& dir, const std::string& name) {
  HYREC_RETURN_IF_ERROR(env->SyncFile(JoinPath(dir, name)));
  HYREC_ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(env, JoinPath(dir, name), 1 << 20));
  return FileEntry{name, bytes.size(), Crc32(bytes)};
}

uint64_t NowMs() { return static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())); }

}  // namespace

namespace {

// A module's tensors as Module::save writes them.
struct ModuleCopy {
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  std::vector<std::pair<std::string, ModuleCopy>> children;
};

// Copies tensors storage by storage: tensors that share a storage (views of one tensor) share
// their copy's, at the same offsets and strides, as the archive of the originals would hold them.
class StorageCopier {
 public:
  torch::Tensor Copy(const torch::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return t.defined() ? t.clone() : t;
    const c10::Storage& storage = t.storage();
    auto [it, fresh] = copies_.try_emplace(storage.unsafeGetStorageImpl());
    if (fresh) {
      const int64_t elements = static_cast<int64_t>(storage.nbytes() / t.element_size());
      it->second = torch::empty({0}, t.options()).set_(storage, 0, {elements}, {1}).clone();
    }
    torch::Tensor view =
        torch::empty({0}, t.options()).set_(it->second.storage(), t.storage_offset(), t.sizes(), t.strides());
    return view.requires_grad_(t.requires_grad());
  }

 private:
  std::map<const c10::StorageImpl*, torch::Tensor> copies_;
};

ModuleCopy CopyModule(const torch::nn::Module& module, StorageCopier* copier) {
  ModuleCopy copy;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    copy.parameters.emplace_back(p.key(), copier->Copy(p.value()));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    copy.buffers.emplace_back(b.key(), copier->Copy(b.value()));
  for (const auto& child : module.named_children()) {
    if (child.value()->is_serializable()) copy.children.emplace_back(child.key(), CopyModule(*child.value(), copier));
  }
  return copy;
}

void SaveModule(const ModuleCopy& copy, torch::serialize::OutputArchive& archive) {
  for (const auto& [key, tensor] : copy.parameters) archive.write(key, tensor);
  for (const auto& [key, tensor] : copy.buffers) archive.write(key, tensor, /*is_buffer=*/true);
  for (const auto& [key, child] : copy.children) {
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    SaveModule(child, child_archive);
    archive.write(key, child_archive);
  }
}

using OptimizerStateMap = ska::flat_hash_map<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>;

// The optimizer's state with every tensor cloned, and its parameter groups (the live parameters,
// whose TensorImpl addresses key the state, and copies of their options), saved as
// Optimizer::save does for optimizer type `Optim`.
template <typename Optim, typename State, typename Options>
std::function<void(torch::serialize::OutputArchive&)> CopyOptimizerOf(const Optim& optimizer, void (*deep)(State&)) {
  auto state = std::make_shared<OptimizerStateMap>();
  for (const auto& [key, param_state] : optimizer.state()) {
    std::unique_ptr<torch::optim::OptimizerParamState> c = param_state->clone();
    deep(static_cast<State&>(*c));
    (*state)[key] = std::move(c);
  }
  auto groups = std::make_shared<std::vector<torch::optim::OptimizerParamGroup>>();
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) groups->emplace_back(group);
  return [state, groups](torch::serialize::OutputArchive& archive) {
    archive.write("pytorch_version", c10::IValue("1.5.0"));
    torch::serialize::OutputArchive state_archive(archive.compilation_unit());
    torch::optim::detail::serialize<State>(state_archive, *state);
    archive.write("state", state_archive);
    torch::serialize::OutputArchive groups_archive(archive.compilation_unit());
    torch::optim::detail::serialize<Options>(groups_archive, *groups);
    archive.write("param_groups", groups_archive);
  };
}

torch::Tensor CloneIfDefined(const torch::Tensor& t) { return t.defined() ? t.clone() : t; }

template <typename State>
void DeepAdamLike(State& s) {
  s.exp_avg(CloneIfDefined(s.exp_avg()));
  s.exp_avg_sq(CloneIfDefined(s.exp_avg_sq()));
  s.max_exp_avg_sq(CloneIfDefined(s.max_exp_avg_sq()));
}
void DeepAdagrad(torch::optim::AdagradParamState& s) { s.sum(CloneIfDefined(s.sum())); }
void DeepSgd(torch::optim::SGDParamState& s) { s.momentum_buffer(CloneIfDefined(s.momentum_buffer())); }

// Null for an optimizer of another type.
std::function<void(torch::serialize::OutputArchive&)> CopyOptimizer(const torch::optim::Optimizer& optimizer) {
  namespace optim = torch::optim;
  if (const auto* o = dynamic_cast<const optim::Adam*>(&optimizer)) {
    return CopyOptimizerOf<optim::Adam, optim::AdamParamState, optim::AdamOptions>(*o, &DeepAdamLike);
  }
  if (const auto* o = dynamic_cast<const optim::AdamW*>(&optimizer)) {
    return CopyOptimizerOf<optim::AdamW, optim::AdamWParamState, optim::AdamWOptions>(*o, &DeepAdamLike);
  }
  if (const auto* o = dynamic_cast<const optim::Adagrad*>(&optimizer)) {
    return CopyOptimizerOf<optim::Adagrad, optim::AdagradParamState, optim::AdagradOptions>(*o, &DeepAdagrad);
  }
  if (const auto* o = dynamic_cast<const optim::SGD*>(&optimizer)) {
    return CopyOptimizerOf<optim::SGD, optim::SGDParamState, optim::SGDOptions>(*o, &DeepSgd);
  }
  return nullptr;
}

}  // namespace

struct DenseCopy {
  TrainState state;
  ModuleCopy model;
  std::function<void(torch::serialize::OutputArchive&)> save_optimizer;  // Null: optimizer_bytes.
  std::string optimizer_bytes;
  torch::Tensor rng;
};

absl::StatusOr<std::shared_ptr<const DenseCopy>> CopyDenseState(DenseModelImpl& model,
                                                                torch::optim::Optimizer* optimizer,
                                                                const TrainState& state) {
  auto copy = std::make_shared<DenseCopy>();
  copy->state = state;
  HYREC_RETURN_IF_ERROR(GuardTorch("copying the dense state", [&] {
    torch::NoGradGuard no_grad;
    StorageCopier copier;
    copy->model = CopyModule(model, &copier);
    if (optimizer != nullptr) {
      copy->save_optimizer = CopyOptimizer(*optimizer);
      if (copy->save_optimizer == nullptr) {
        copy->optimizer_bytes = ArchiveBytes([&](torch::serialize::OutputArchive& a) { optimizer->save(a); });
      }
    }
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    copy->rng = gen.get_state();
    return absl::OkStatus();
  }));
  return std::shared_ptr<const DenseCopy>(std::move(copy));
}

absl::StatusOr<DenseState> SerializeDenseCopy(const DenseCopy& copy) {
  DenseState d;
  d.state = copy.state;
  HYREC_RETURN_IF_ERROR(GuardTorch("saving the dense state", [&] {
    d.model = ArchiveBytes([&](torch::serialize::OutputArchive& a) { SaveModule(copy.model, a); });
    d.optimizer = copy.save_optimizer != nullptr ? ArchiveBytes(copy.save_optimizer) : copy.optimizer_bytes;
    d.rng = ArchiveBytes([&](torch::serialize::OutputArchive& a) { a.write("state", copy.rng); });
    return absl::OkStatus();
  }));
  return d;
}

absl::StatusOr<DenseState> CaptureDenseState(DenseModelImpl& model, torch::optim::Optimizer* optimizer,
                                             const TrainState& state) {
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<const DenseCopy> copy, CopyDenseState(model, optimizer, state));
  return SerializeDenseCopy(*copy);
}

absl::Status ApplyDenseState(const DenseState& dense, DenseModelImpl& model, torch::optim::Optimizer* optimizer,
                             bool restore_rng) {
  HYREC_RETURN_IF_ERROR(GuardTorch("loading the checkpoint's dense parameters", [&] {
    LoadArchive(dense.model, [&](torch::serialize::InputArchive& a) { model.load(a); });
    return absl::OkStatus();
  }));
  if (optimizer != nullptr && !dense.optimizer.empty()) {
    HYREC_RETURN_IF_ERROR(GuardTorch("loading the checkpoint's dense optimizer state", [&] {
      LoadArchive(dense.optimizer, [&](torch::serialize::InputArchive& a) { optimizer->load(a); });
      return absl::OkStatus();
    }));
  }
  if (restore_rng && !dense.rng.empty()) {
    HYREC_RETURN_IF_ERROR(GuardTorch("restoring the random generator", [&] {
      torch::Tensor rng;
      LoadArchive(dense.rng, [&](torch::serialize::InputArchive& a) { a.read("state", rng); });
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng);
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<FileEntry> WriteDenseFile(Env* env, const std::string& dir, const DenseState& dense) {
  HYREC_ASSIGN_OR_RETURN(auto w, BlockWriter::Create(env, JoinPath(dir, kDenseFileName), FileKind::kDense));
  HYREC_RETURN_IF_ERROR(w->Add(kStateBlock, EncodeState(dense.state)));
  HYREC_RETURN_IF_ERROR(AddChunked(w.get(), kModelBlock, dense.model));
  HYREC_RETURN_IF_ERROR(AddChunked(w.get(), kOptimizerBlock, dense.optimizer));
  HYREC_RETURN_IF_ERROR(w->Add(kRngBlock, dense.rng));
  return w->Finish();
}

absl::StatusOr<DenseState> ReadDenseFile(Env* env, const std::string& dir, const CheckpointManifest& manifest) {
  const FileEntry* entry = manifest.Find(kDenseFileName);
  if (entry == nullptr) return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no ", kDenseFileName));
  HYREC_ASSIGN_OR_RETURN(auto r, BlockReader::Open(env, JoinPath(dir, kDenseFileName), FileKind::kDense, entry));
  DenseState d;
  bool has_state = false;
  Block b;
  for (;;) {
    HYREC_ASSIGN_OR_RETURN(const bool more, r->Next(&b));
    if (!more) break;
    std::string* target = b.type == kModelBlock ? &d.model : b.type == kOptimizerBlock ? &d.optimizer : nullptr;
    if (b.type == kStateBlock) {
      if (has_state || !DecodeState(b.payload, &d.state)) {
        return absl::DataLossError(absl::StrCat(r->path(), ": offset ", b.offset, ": malformed state block"));
      }
      has_state = true;
    } else if (b.type == kRngBlock) {
      d.rng = std::move(b.payload);
    } else if (target != nullptr) {
      if (target->size() + b.payload.size() > kMaxDenseBytes) return absl::DataLossError("dense state over its cap");
      target->append(b.payload);
    } else {
      return absl::DataLossError(absl::StrCat(r->path(), ": offset ", b.offset, ": unknown block type ", b.type));
    }
  }
  if (!has_state || d.model.empty()) return absl::DataLossError(absl::StrCat(r->path(), ": no state or no model"));
  return d;
}

absl::StatusOr<CheckpointDirClaim> ClaimRunCheckpointDir(Env* env, const std::string& checkpoint_dir,
                                                         const ResumePoint* resume) {
  if (checkpoint_dir.empty()) return CheckpointDirClaim{};
  const bool resumed = resume != nullptr && !resume->manifest.job_id.empty();
  return ClaimCheckpointDir(EnvOr(env), checkpoint_dir, resumed ? resume->manifest.job_id : NewJobId());
}

absl::StatusOr<ResumePoint> LoadResumePoint(Env* env, const std::string& root, const std::string& which, int workers) {
  env = EnvOr(env);
  ResumePoint p;
  std::vector<std::string> skipped;
  absl::StatusOr<std::string> dir = ResolveCheckpoint(env, root, kCheckpointPrefix, which, &p.manifest, &skipped);
  for (const std::string& s : skipped)
    std::cerr << "hyrec: passing over a checkpoint that does not verify: " << s << "\n";
  if (!dir.ok()) return Annotate(dir.status(), "--resume");
  p.dir = *dir;
  if (p.manifest.kind != "checkpoint") {
    return absl::InvalidArgumentError(absl::StrCat("--resume ", p.dir, ": a ", p.manifest.kind, ", not a checkpoint"));
  }
  HYREC_ASSIGN_OR_RETURN(p.dense, ReadDenseFile(env, p.dir, p.manifest));
  HYREC_ASSIGN_OR_RETURN(p.positions, data_loader::ReadPositionFiles(env, p.dir, p.manifest, workers));
  return p;
}

absl::StatusOr<std::shared_ptr<embedding_ps::EmbeddingShardStore>> RestoreShardStore(Env* env, const std::string& dir,
                                                                                     const CheckpointManifest& manifest,
                                                                                     const job::PsShardPlan& shard) {
  HYREC_ASSIGN_OR_RETURN(auto store, embedding_ps::EmbeddingShardStore::Create(shard.store));
  HYREC_RETURN_IF_ERROR(
      embedding_ps::RestoreShard(EnvOr(env), dir, manifest, shard.shard_index, shard.num_shards, store.get()));
  return std::shared_ptr<embedding_ps::EmbeddingShardStore>(std::move(store));
}

namespace {

// A TorchScript model's module with the checkpoint's parameters, as TorchScript; empty for every
// other kind of model. Made before the export's directory, so that a failure leaves nothing.
absl::StatusOr<std::string> TorchScriptOf(const CheckpointManifest& m, const DenseState& dense) {
  HYREC_ASSIGN_OR_RETURN(const job::JobSpec spec, job::ParseJobSpecText(m.job_yaml, "the checkpoint's job"));
  if (spec.model.kind != "torchscript") return std::string();
  HYREC_ASSIGN_OR_RETURN(const job::JobPlan plan, job::Plan(spec));
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<DenseModelImpl> model, MakeModel(plan.workers[0]));
  HYREC_RETURN_IF_ERROR(ApplyDenseState(dense, *model, nullptr, /*restore_rng=*/false));
  return SerializeTorchScriptModel(*model);
}

}  // namespace

absl::StatusOr<std::string> ExportCheckpoint(Env* env, const std::string& checkpoint_dir,
                                             const std::string& export_root) {
  env = EnvOr(env);
  // Every file is checked against the manifest as it is read.
  HYREC_ASSIGN_OR_RETURN(const CheckpointManifest m, ReadManifest(env, checkpoint_dir));
  if (m.kind != "checkpoint") return absl::InvalidArgumentError(absl::StrCat(checkpoint_dir, " is not a checkpoint"));
  HYREC_ASSIGN_OR_RETURN(const DenseState dense, ReadDenseFile(env, checkpoint_dir, m));
  HYREC_ASSIGN_OR_RETURN(const std::string script, TorchScriptOf(m, dense));
  const std::string out = JoinPath(export_root, CheckpointDirName(kExportPrefix, m.step, NowMs()));
  HYREC_RETURN_IF_ERROR(env->CreateDirs(out));
  CheckpointManifest e = m;
  e.kind = "export";
  e.created_unix_ms = NowMs();
  e.files.clear();
  HYREC_ASSIGN_OR_RETURN(FileEntry model, WriteRawFile(env, out, kModelFileName, dense.model));
  e.files.push_back(model);
  if (!script.empty()) {
    HYREC_ASSIGN_OR_RETURN(FileEntry module, WriteRawFile(env, out, kTorchScriptFileName, script));
    e.files.push_back(module);
  }
  for (uint32_t s = 0; s < m.num_shards; ++s) {
    const std::string name = embedding_ps::ShardFileName(embedding_ps::CutKind::kCheckpoint, s, m.num_shards);
    const FileEntry* entry = m.Find(name);
    if (entry == nullptr) return absl::DataLossError(absl::StrCat(checkpoint_dir, ": the manifest lists no ", name));
    HYREC_ASSIGN_OR_RETURN(
        FileEntry rows,
        embedding_ps::ExportShardFile(env, checkpoint_dir, *entry, out, embedding_ps::ExportFileName(s, m.num_shards)));
    e.files.push_back(rows);
  }
  HYREC_RETURN_IF_ERROR(CommitManifest(env, out, e));
  return out;
}

namespace {

// The committed directories under `root` named with `prefix`, oldest first, with their manifests:
// those of job `job_id` (of any job when empty). One whose manifest does not read is left out.
std::vector<std::pair<std::string, CheckpointManifest>> CommittedDirs(Env* env, const std::string& root,
                                                                      const std::string& prefix,
                                                                      const std::string& job_id) {
  std::vector<std::pair<std::string, CheckpointManifest>> out;
  for (const std::string& name : ListCheckpointDirs(env, root, prefix)) {
    const std::string dir = JoinPath(root, name);
    if (!env->FileExists(JoinPath(dir, kManifestName))) continue;
    absl::StatusOr<CheckpointManifest> m = ReadManifest(env, dir);
    if (m.ok() && (job_id.empty() || m->job_id == job_id)) out.emplace_back(dir, *std::move(m));
  }
  return out;
}

}  // namespace

std::string FindExportOf(Env* env, const std::string& export_root, const std::string& checkpoint_dir) {
  env = EnvOr(env);
  absl::StatusOr<CheckpointManifest> c = ReadManifest(env, checkpoint_dir);
  if (!c.ok()) return "";
  for (const auto& [dir, e] : CommittedDirs(env, export_root, kExportPrefix, c->job_id)) {
    if (e.kind == "export" && e.job_id == c->job_id && e.step == c->step && e.samples == c->samples &&
        e.delta_sequence == c->delta_sequence) {
      return dir;
    }
  }
  return "";
}

absl::Status RetireExports(Env* env, const std::string& export_root, int keep_bases, const std::string& job_id) {
  env = EnvOr(env);
  std::vector<std::pair<std::string, uint64_t>> bases;  // Oldest first, with their delta_sequence.
  for (const auto& [dir, m] : CommittedDirs(env, export_root, kExportPrefix, job_id)) {
    if (m.kind == "export") bases.emplace_back(dir, m.delta_sequence);
  }
  if (bases.size() <= static_cast<size_t>(keep_bases)) return absl::OkStatus();
  const size_t first_kept = bases.size() - keep_bases;
  uint64_t held = bases[first_kept].second;
  for (size_t i = first_kept; i < bases.size(); ++i) held = std::min(held, bases[i].second);
  for (size_t i = 0; i < first_kept; ++i) HYREC_RETURN_IF_ERROR(DeleteDirAndFiles(env, bases[i].first));
  // A delta's manifest carries its own sequence number, as its directory's name does.
  for (const auto& [dir, m] : CommittedDirs(env, export_root, kDeltaPrefix, job_id)) {
    if (m.kind == "delta" && m.delta_sequence <= held) HYREC_RETURN_IF_ERROR(DeleteDirAndFiles(env, dir));
  }
  return absl::OkStatus();
}

// ---- JobCuts ----

// What worker 0's background commit and its training thread share.
struct JobCuts::Shared {
  std::mutex mu;
  std::string last_checkpoint;
  std::string best_checkpoint;
  int committed = 0;
  int failed = 0;
  int deltas = 0;             // Committed deltas.
  int deltas_since_base = 0;  // Committed since the last base export (compaction).
  // The next checkpoint is exported as a base: the run's first (followers start from a base), or
  // the first after a delta that failed.
  bool base_due = true;
  int bases = 0;             // Base exports written by compaction.
  double write_seconds = 0;  // Of the committed checkpoints: from the cut to the manifest's commit.
  absl::Status error;        // The last commit's failure, until reported.
};

JobCuts::JobCuts(Options options)
    : options_(std::move(options)), leader_(options_.plan->rank == 0), shared_(std::make_shared<Shared>()) {
  options_.env = EnvOr(options_.env);
}

JobCuts::~JobCuts() {
  if (commit_.joinable()) commit_.join();
}

absl::StatusOr<bool> JobCuts::Agree(bool ok) {
  if (options_.sync == nullptr) return ok;
  HYREC_ASSIGN_OR_RETURN(const int all,
                         options_.sync->AllMin(ok ? 1 : 0, absl::Seconds(options_.plan->checkpoint.timeout_seconds)));
  return all == 1;
}

absl::Status JobCuts::Failed(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    ++shared_->failed;
  }
  if (leader_) std::cerr << "hyrec: " << status.message() << "\n";
  if (options_.plan->checkpoint.fail_on_error) return status;
  return absl::OkStatus();
}

struct JobCuts::Commit {
  Env* env;
  std::string dir;   // The cut's directory,
  std::string root;  // under this one.
  uint64_t id;       // The shards' name for the cut.
  bool checkpoint;   // Else a delta.
  bool best;         // The best evaluation's checkpoint.
  absl::Time cut_at;
  CheckpointManifest manifest;  // Without its files and tables yet.
  std::shared_ptr<const DenseCopy> dense;
};

absl::Status JobCuts::WriteAndCommit(Commit& c, bool* committed, bool* awaited) {
  const job::WorkerPlan& plan = *options_.plan;
  CheckpointManifest& m = c.manifest;
  HYREC_ASSIGN_OR_RETURN(const DenseState state, SerializeDenseCopy(*c.dense));
  HYREC_ASSIGN_OR_RETURN(FileEntry dense_file, c.checkpoint ? WriteDenseFile(c.env, c.dir, state)
                                                            : WriteRawFile(c.env, c.dir, kModelFileName, state.model));
  *awaited = true;
  HYREC_ASSIGN_OR_RETURN(std::vector<embedding_ps::ShardFileInfo> shards,
                         options_.ps->AwaitCut(c.id, absl::Seconds(plan.checkpoint.timeout_seconds)));
  m.files.push_back(dense_file);
  for (size_t t = 0; t < plan.table_names.size(); ++t) {
    CheckpointManifest::Table table;
    table.name = plan.table_names[t];
    table.dim = static_cast<uint32_t>(plan.table_dims[t]);
    for (const embedding_ps::ShardFileInfo& info : shards) {
      if (t < info.table_rows.size()) table.rows += info.table_rows[t];
    }
    m.tables.push_back(table);
  }
  for (const embedding_ps::ShardFileInfo& info : shards) m.files.push_back(info.file);
  if (c.checkpoint) {
    for (int r = 0; r < plan.world_size; ++r) {
      HYREC_ASSIGN_OR_RETURN(FileEntry pos, EntryOf(c.env, c.dir, data_loader::PositionFileName(r)));
      m.files.push_back(pos);
    }
  }
  HYREC_RETURN_IF_ERROR(CommitManifest(c.env, c.dir, m));
  *committed = true;
  if (!c.checkpoint) return absl::OkStatus();
  std::string keep;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (c.best) shared_->best_checkpoint = c.dir;
    keep = shared_->best_checkpoint;
  }
  return RetireCheckpoints(c.env, c.root, kCheckpointPrefix, plan.checkpoint.keep_last, keep, c.dir, m.job_id);
}

// The stream's consumer group hears of the records a committed checkpoint holds. A failure is
// said and the job goes on: the checkpoint, not the group, is where a resumed job starts.
void JobCuts::CommitStreamOffsets(const Commit& c) {
  absl::Status s = [&]() -> absl::Status {
    HYREC_ASSIGN_OR_RETURN(const std::vector<data_loader::ReaderPosition> cut,
                           data_loader::ReadPositionFiles(c.env, c.dir, c.manifest, options_.plan->world_size));
    return data_loader::CommitCutOffsets(*options_.plan->stream, cut);
  }();
  if (!s.ok())
    std::cerr << "hyrec: checkpoint " << c.dir
              << ": its offsets were not committed to the stream's group: " << s.message() << "\n";
}

void JobCuts::RunCommit(Commit& c) {
  bool committed = false;
  bool awaited = false;  // The shards' part is done (or timed out): nothing more lands in dir.
  const absl::Status s = WriteAndCommit(c, &committed, &awaited);
  if (!s.ok() && !committed) {  // What the failed cut wrote, once the shards wrote theirs.
    if (!awaited) (void)options_.ps->AwaitCut(c.id, absl::Seconds(options_.plan->checkpoint.timeout_seconds));
    (void)DeleteDirAndFiles(c.env, c.dir);
  }
  if (s.ok() && c.checkpoint && options_.plan->stream.has_value()) CommitStreamOffsets(c);
  if (s.ok() && c.checkpoint) Compact(c);
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (s.ok() && c.checkpoint) {
    shared_->last_checkpoint = c.dir;
    ++shared_->committed;
    shared_->write_seconds += absl::ToDoubleSeconds(absl::Now() - c.cut_at);
  } else if (s.ok()) {
    ++shared_->deltas;
    ++shared_->deltas_since_base;
  } else {
    ++shared_->failed;
    // A failed delta's changes reach followers only through a base.
    if (!c.checkpoint) shared_->base_due = true;
    shared_->error = Annotate(s, absl::StrCat(c.checkpoint ? "checkpoint " : "delta ", c.dir));
    std::cerr << "hyrec: " << shared_->error.message() << "\n";
  }
}

void JobCuts::Compact(const Commit& c) {
  const job::ExportSpec& serving = options_.plan->serving;
  if (!serving.takes_deltas()) return;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    const bool due =
        shared_->base_due || (serving.base_every_deltas > 0 && shared_->deltas_since_base >= serving.base_every_deltas);
    if (!due) return;
  }
  absl::StatusOr<std::string> base = ExportCheckpoint(c.env, c.dir, serving.dir);
  absl::Status s = base.status();
  if (s.ok()) s = RetireExports(c.env, serving.dir, serving.keep_bases, options_.job_id);
  if (!s.ok()) {
    std::cerr << "hyrec: checkpoint " << c.dir << ": its base export for serving failed: " << s.message() << "\n";
    if (!base.ok()) return;
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->deltas_since_base = 0;
  shared_->base_due = false;
  ++shared_->bases;
}

absl::Status JobCuts::BeginLeaderPart(absl::Status local, bool checkpoint, const std::string& name,
                                      const std::string& dir, uint64_t id, bool best, const TrainState& state,
                                      DenseModelImpl& model, torch::optim::Optimizer* optimizer, bool* begun,
                                      std::shared_ptr<const DenseCopy>* dense) {
  const job::WorkerPlan& plan = *options_.plan;
  if (commit_.joinable()) commit_.join();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (plan.checkpoint.fail_on_error) local = shared_->error;
    shared_->error = absl::OkStatus();
  }
  TrainState s = state;
  s.delta_sequence = delta_sequence_;
  s.best_checkpoint = best && checkpoint ? dir : best_checkpoint();
  if (local.ok()) {
    local = options_.ps->BeginCut(checkpoint ? embedding_ps::CutKind::kCheckpoint : embedding_ps::CutKind::kDelta, name,
                                  id, absl::Seconds(plan.checkpoint.timeout_seconds));
    *begun = local.ok();
  }
  if (local.ok()) {
    absl::StatusOr<std::shared_ptr<const DenseCopy>> d = CopyDenseState(model, checkpoint ? optimizer : nullptr, s);
    local = d.status();
    if (d.ok()) *dense = std::move(*d);
  }
  return local;
}

CheckpointManifest JobCuts::ManifestOf(bool checkpoint, const TrainState& state, uint64_t delta_sequence,
                                       const Evaluation* eval) const {
  CheckpointManifest m;
  m.kind = checkpoint ? "checkpoint" : "delta";
  m.step = state.step;
  m.samples = state.samples;
  m.created_unix_ms = NowMs();
  m.num_shards = static_cast<uint32_t>(options_.ps->num_shards());
  m.num_workers = static_cast<uint32_t>(options_.plan->world_size);
  m.delta_sequence = delta_sequence;
  if (eval != nullptr) {
    m.has_eval = true;
    m.auc = eval->auc;
    m.log_loss = eval->log_loss;
  }
  m.job_yaml = options_.job_text;
  m.job_id = options_.job_id;
  return m;
}

absl::Status JobCuts::Cut(Kind kind, absl::Time began, const TrainState& state,
                          const data_loader::ReaderPosition& position, DenseModelImpl& model,
                          torch::optim::Optimizer* optimizer, const Evaluation* eval) {
  const absl::Time start = began;
  const job::WorkerPlan& plan = *options_.plan;
  Env* env = options_.env;
  const bool checkpoint = kind == Kind::kCheckpoint;
  ++cuts_;
  const uint64_t id = (static_cast<uint64_t>(options_.run_tag) << 24) + cuts_;
  const uint64_t tag = static_cast<uint64_t>(options_.run_tag) * 1000 + cuts_;
  const uint64_t sequence = delta_sequence_ + 1;
  const std::string name = checkpoint ? CheckpointDirName(kCheckpointPrefix, state.step, tag)
                                      : CheckpointDirName(kDeltaPrefix, sequence, tag);
  const std::string root = checkpoint ? plan.checkpoint.dir : plan.serving.dir;
  const std::string dir = JoinPath(root, name);
  const std::string what = absl::StrCat(checkpoint ? "checkpoint " : "delta ", dir);
  absl::Status local;
  if (checkpoint || leader_) local = env->CreateDirs(dir);
  // Not synced here: worker 0's commit syncs every position file, off the training path.
  if (local.ok() && checkpoint) {
    local = data_loader::WritePositionFile(env, dir, plan.rank, position, /*sync=*/false).status();
  }
  group_lost_ = false;
  absl::StatusOr<bool> agreed = Agree(local.ok());
  auto finish = [&](absl::Status s) {
    pause_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
    if (s.ok()) return s;
    return Failed(Annotate(s, what));
  };
  // A failed cut removes what it wrote (worker 0, once every worker is past its writes), so a
  // full disk does not stay full of it.
  auto discard = [&](bool begun) {
    if (!leader_) return;
    if (begun) (void)options_.ps->AwaitCut(id, absl::Seconds(plan.checkpoint.timeout_seconds));
    (void)DeleteDirAndFiles(env, dir);
  };
  // The agreement failed (a peer lost): the cut is abandoned, what it wrote removed.
  auto lost = [&](bool begun, const absl::Status& s) {
    group_lost_ = true;
    discard(begun);
    pause_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
    return Annotate(s, what);
  };
  if (!agreed.ok()) return lost(/*begun=*/false, agreed.status());
  bool all = *agreed;
  if (!all) {
    discard(/*begun=*/false);
    return finish(local.ok() ? absl::AbortedError("another worker could not write its loader position") : local);
  }
  // Worker 0: the previous commit must be done before the shards start on another cut. Its
  // failure, with fail_on_error, fails this cut on every worker (through the agreement below).
  std::shared_ptr<const DenseCopy> dense;
  bool begun = false;  // The shards are writing their part.
  const bool best =
      eval != nullptr && state.has_best_eval && eval->auc == state.best_auc && eval->log_loss == state.best_log_loss;
  if (leader_) {
    local = BeginLeaderPart(local, checkpoint, name, dir, id, best, state, model, optimizer, &begun, &dense);
  }
  agreed = Agree(local.ok());
  if (!agreed.ok()) return lost(begun, agreed.status());
  all = *agreed;
  if (!all) {
    discard(begun);
    return finish(local.ok() ? absl::AbortedError("the cut failed on worker 0") : local);
  }
  if (!checkpoint) delta_sequence_ = sequence;
  if (!leader_) return finish(absl::OkStatus());

  CheckpointManifest m = ManifestOf(checkpoint, state, checkpoint ? delta_sequence_ : sequence, eval);
  commit_ = std::thread([this, c = Commit{env, dir, root, id, checkpoint, best, absl::Now(), std::move(m),
                                          std::move(dense)}]() mutable { RunCommit(c); });
  return finish(absl::OkStatus());
}

absl::Status JobCuts::Finish() {
  if (commit_.joinable()) commit_.join();
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->error.ok() && options_.plan->checkpoint.fail_on_error) return shared_->error;
  return absl::OkStatus();
}

std::string JobCuts::last_checkpoint() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->last_checkpoint;
}

void JobCuts::Resume(const std::string& best_checkpoint, uint64_t delta_sequence, uint64_t cuts) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->best_checkpoint = best_checkpoint;
  delta_sequence_ = delta_sequence;
  cuts_ = cuts;
}

std::string JobCuts::best_checkpoint() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->best_checkpoint;
}

int JobCuts::committed() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->committed;
}

double JobCuts::write_seconds() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->write_seconds;
}

int JobCuts::bases() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->bases;
}

int JobCuts::failed() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->failed;
}

}  // namespace hyrec::dense_worker
