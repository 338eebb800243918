#include "hyrec/dense_worker/predictor.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/program.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/dense_worker/checkpoint.h"
#include "hyrec/dense_worker/model_registry.h"
#include "hyrec/dense_worker/torchscript_model.h"
#include "hyrec/dense_worker/worker.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "src/dense_worker/torch_status.h"

namespace hyrec::dense_worker {
namespace {

Env* EnvOr(Env* env) { return env != nullptr ? env : Env::Default(); }

constexpr uint64_t kMaxModelBytes = 64ull << 30;

// Reads every rows file of a directory (export or delta) into `rows`, each checked against the
// manifest as it is read.
absl::Status FoldRowsFiles(Env* env, const std::string& dir, const CheckpointManifest& m, FileKind kind,
                           absl::string_view prefix, ServingRows* rows) {
  for (const FileEntry& f : m.files) {
    if (!absl::StartsWith(f.name, prefix)) continue;
    HYREC_RETURN_IF_ERROR(
        embedding_ps::ReadRowsFile(env, JoinPath(dir, f.name), kind, &f, [&](embedding_ps::ExportedTable& t) {
          auto& table = rows->tables[t.name];
          for (uint64_t id : t.tombstones) table.erase(id);
          for (size_t i = 0; i < t.ids.size(); ++i) {
            table[t.ids[i]].assign(t.weights.begin() + i * t.dim, t.weights.begin() + (i + 1) * t.dim);
          }
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServingRows> ReadExport(Env* env, const std::string& dir) {
  env = EnvOr(env);
  // One pass: the rows are new, so a file that fails its check leaves nothing behind.
  HYREC_ASSIGN_OR_RETURN(const CheckpointManifest m, ReadManifest(env, dir));
  if (m.kind != "export") return absl::InvalidArgumentError(absl::StrCat(dir, " is a ", m.kind, ", not an export"));
  ServingRows rows;
  HYREC_ASSIGN_OR_RETURN(rows.model, ReadListedFile(env, dir, m, kModelFileName, kMaxModelBytes));
  if (m.Find(kTorchScriptFileName) != nullptr) {
    HYREC_ASSIGN_OR_RETURN(rows.script, ReadListedFile(env, dir, m, kTorchScriptFileName, kMaxModelBytes));
  }
  HYREC_RETURN_IF_ERROR(FoldRowsFiles(env, dir, m, FileKind::kExportRows, "rows-", &rows));
  rows.step = m.step;
  rows.samples = m.samples;
  rows.created_unix_ms = m.created_unix_ms;
  rows.delta_sequence = m.delta_sequence;
  rows.job_yaml = m.job_yaml;
  return rows;
}

absl::Status ApplyDelta(Env* env, const std::string& dir, ServingRows* rows) {
  env = EnvOr(env);
  // Verified whole first: the delta is folded into rows already serving, which a bad file must
  // leave as they were.
  HYREC_ASSIGN_OR_RETURN(const CheckpointManifest m, VerifyCheckpoint(env, dir));
  if (m.kind != "delta") return absl::InvalidArgumentError(absl::StrCat(dir, " is a ", m.kind, ", not a delta"));
  if (m.delta_sequence != rows->delta_sequence + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is delta ", m.delta_sequence, "; the rows need delta ", rows->delta_sequence + 1, " next"));
  }
  HYREC_ASSIGN_OR_RETURN(std::string model, ReadListedFile(env, dir, m, kModelFileName, kMaxModelBytes));
  HYREC_RETURN_IF_ERROR(FoldRowsFiles(env, dir, m, FileKind::kDeltaRows, "delta-", rows));
  rows->model = std::move(model);
  rows->step = m.step;
  rows->samples = m.samples;
  rows->created_unix_ms = m.created_unix_ms;
  rows->delta_sequence = m.delta_sequence;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> DeltasAfter(Env* env, const std::string& export_root, uint64_t sequence) {
  env = EnvOr(env);
  std::map<uint64_t, std::vector<std::string>> numbered;
  for (const std::string& name : ListCheckpointDirs(env, export_root, kDeltaPrefix)) {
    uint64_t seq = 0;
    if (!DeltaSequenceOf(name, &seq)) continue;
    if (seq > sequence) numbered[seq].push_back(name);
  }
  // Per number, the committed delta (the newest by its manifest when a resumed job wrote it
  // again), or "" while none is.
  std::vector<std::pair<uint64_t, std::string>> committed;
  for (const auto& [seq, names] : numbered) {
    std::string best;
    uint64_t best_ms = 0;
    for (const std::string& name : names) {
      const std::string dir = JoinPath(export_root, name);
      if (!env->FileExists(JoinPath(dir, kManifestName))) continue;
      HYREC_ASSIGN_OR_RETURN(const CheckpointManifest m, ReadManifest(env, dir));
      if (best.empty() || m.created_unix_ms >= best_ms) {
        best = dir;
        best_ms = m.created_unix_ms;
      }
    }
    committed.emplace_back(seq, best);
  }
  std::vector<std::string> out;
  uint64_t next = sequence + 1;
  for (size_t i = 0; i < committed.size(); ++i) {
    const auto& [seq, dir] = committed[i];
    if (seq == next && !dir.empty()) {
      out.push_back(dir);
      ++next;
      continue;
    }
    // Delta `next` is missing or not committed: a gap once a later one is committed.
    for (size_t j = i; j < committed.size(); ++j) {
      if (committed[j].second.empty() || committed[j].first == next) continue;
      return absl::DataLossError(absl::StrCat(
          export_root, ": delta ", next, " is ", seq == next ? "not committed" : "missing", " but ",
          committed[j].second, " (delta ", committed[j].first, ") is: the deltas after ", next - 1,
          " cannot be applied (a newer export, which the job writes at its next checkpoint, ends the gap)"));
    }
    break;
  }
  return out;
}

absl::StatusOr<int> ApplyDeltas(Env* env, const std::string& export_root, ServingRows* rows) {
  env = EnvOr(env);
  HYREC_ASSIGN_OR_RETURN(const std::vector<std::string> deltas, DeltasAfter(env, export_root, rows->delta_sequence));
  for (const std::string& dir : deltas) HYREC_RETURN_IF_ERROR(ApplyDelta(env, dir, rows));
  return static_cast<int>(deltas.size());
}

absl::StatusOr<std::string> ResolveExport(Env* env, const std::string& path) {
  env = EnvOr(env);
  if (env->FileExists(JoinPath(path, kManifestName))) return path;
  CheckpointManifest m;
  return ResolveCheckpoint(env, path, kExportPrefix, "latest", &m);
}

absl::StatusOr<std::unique_ptr<Predictor>> Predictor::Load(const std::string& path, Env* env) {
  HYREC_ASSIGN_OR_RETURN(const std::string dir, ResolveExport(env, path));
  HYREC_ASSIGN_OR_RETURN(const ServingRows rows, ReadExport(env, dir));
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<Predictor> p, FromRows(rows, rows.job_yaml));
  p->dir_ = dir;
  return p;
}

absl::StatusOr<std::unique_ptr<Predictor>> Predictor::FromRows(const ServingRows& rows, const std::string& job_yaml) {
  std::unique_ptr<Predictor> p(new Predictor());
  HYREC_ASSIGN_OR_RETURN(const job::JobSpec spec, job::ParseJobSpecText(job_yaml, "the export's job"));
  HYREC_ASSIGN_OR_RETURN(p->plan_, job::Plan(spec));
  // One unbounded store of weights: the job's tables without optimizer state.
  embedding_ps::StoreOptions store_options = p->plan_.ps[0].store;
  store_options.capacity_rows = 0;
  store_options.capacity_bytes = 0;
  store_options.track_changes = false;
  for (embedding_ps::TableConfig& t : store_options.tables) {
    t.optimizer = embedding_ps::OptimizerConfig();
    t.optimizer.kind = embedding_ps::OptimizerKind::kSgd;
    t.capacity_rows = 0;
  }
  HYREC_ASSIGN_OR_RETURN(auto store, embedding_ps::EmbeddingShardStore::Create(store_options));
  for (const auto& [name, table] : rows.tables) {
    HYREC_ASSIGN_OR_RETURN(const int t, store->TableIndex(name));
    const int dim = store->table(t).dim;
    std::vector<uint64_t> ids;
    std::vector<float> weights;
    for (const auto& [id, w] : table) {
      if (static_cast<int>(w.size()) != dim) {
        return absl::DataLossError(absl::StrCat("table '", name, "': a row of ", w.size(), " weights, dim ", dim));
      }
      ids.push_back(id);
      weights.insert(weights.end(), w.begin(), w.end());
    }
    HYREC_RETURN_IF_ERROR(store->RestoreRows(t, ids, weights));
  }
  std::vector<std::shared_ptr<embedding_ps::EmbeddingShardStore>> stores;
  stores.push_back(std::move(store));
  HYREC_ASSIGN_OR_RETURN(p->rows_, embedding_ps::NewInProcessEmbeddingClient(std::move(stores)));
  // A TorchScript model's structure is the export's own module (model.path may be gone).
  absl::StatusOr<std::shared_ptr<DenseModelImpl>> model =
      !rows.script.empty() && p->plan_.workers[0].model.kind == "torchscript"
          ? TorchScriptModelFromBytes(rows.script, absl::StrCat("the export's ", kTorchScriptFileName),
                                      ContextFor(p->plan_.workers[0]))
          : MakeModel(p->plan_.workers[0]);
  if (absl::IsNotFound(model.status())) {
    // A model of one's own: only the program that registered it knows it.
    return absl::FailedPreconditionError(absl::StrCat(
        model.status().message(), " in ", ProgramName(),
        ": score this export with the program that trained it, which offers the same command (`<that program> ",
        "predict|eval --model=...`, dense_worker/train_main.h)"));
  }
  HYREC_RETURN_IF_ERROR(model.status());
  p->model_ = std::move(*model);
  DenseState dense;
  dense.model = rows.model;
  HYREC_RETURN_IF_ERROR(ApplyDenseState(dense, *p->model_, nullptr, /*restore_rng=*/false));
  p->model_->eval();
  return p;
}

namespace {

// Passes a stream's batches on, keeping their kept values in order.
class KeepingStream final : public data_loader::BatchStream {
 public:
  KeepingStream(data_loader::BatchStream* stream, std::vector<std::string>* kept) : stream_(stream), kept_(kept) {}
  absl::Status Next(data_loader::Batch* batch, absl::Duration timeout) override {
    absl::Status s = stream_->Next(batch, timeout);
    if (s.ok() && kept_ != nullptr) {
      kept_->insert(kept_->end(), std::make_move_iterator(batch->kept.begin()),
                    std::make_move_iterator(batch->kept.end()));
      batch->kept.clear();
    }
    return s;
  }
  data_loader::ReaderPosition Position() const override { return stream_->Position(); }

 private:
  data_loader::BatchStream* stream_;
  std::vector<std::string>* kept_;
};

}  // namespace

absl::StatusOr<Evaluation> Predictor::Score(const std::vector<std::string>& files, std::vector<float>* logits,
                                            std::vector<float>* labels) {
  return Score(files, ScoreOptions(), logits, labels, nullptr);
}

namespace {

// The job's source as scoring reads it: its format and columns, labels optional or not, `keep`'s
// columns passed through, and no stream (a stream job's model scores lines in its records'
// format).
data_loader::SourceConfig ScoringSource(data_loader::SourceConfig source, bool label_optional,
                                        std::vector<std::string> keep) {
  source.criteo.label_optional = label_optional;
  source.libsvm.label_optional = label_optional;
  source.csv.label_optional = label_optional;
  source.keep = std::move(keep);
  source.kafka.reset();
  return source;
}

}  // namespace

absl::StatusOr<Evaluation> Predictor::Score(const std::vector<std::string>& files, const ScoreOptions& score,
                                            std::vector<float>* logits, std::vector<float>* labels,
                                            std::vector<std::string>* kept) {
  data_loader::LoaderOptions o = plan_.loader.options;
  o.source = ScoringSource(o.source, score.label_optional, score.keep);
  if (kept != nullptr) kept->clear();
  if (o.source.format == data_loader::Format::kSynthetic) {
    return absl::InvalidArgumentError("the export's job reads a synthetic source; give it a file format to score");
  }
  o.source.files = files;
  o.source.skip_bad_files = false;
  o.num_workers = 1;
  o.num_shards = 1;
  o.shuffle = false;
  o.epochs = 1;
  o.drop_last = false;
  o.max_bad_fraction = 0;
  o.min_lines_for_bad_check = 1;
  HYREC_ASSIGN_OR_RETURN(auto loader, data_loader::Loader::Start(o, {}));
  const TrainerOptions options = TrainerOptionsFor(plan_.workers[0], torch::kCPU);
  absl::StatusOr<Evaluation> e;
  HYREC_RETURN_IF_ERROR(GuardTorch("scoring", [&] {
    KeepingStream stream(loader->stream(0), kept);
    e = Evaluate(&stream, rows_.get(), options, *model_, logits, labels);
    return absl::OkStatus();
  }));
  return e;
}

namespace {

// The one batch of lines being scored.
class OneBatch final : public data_loader::BatchStream {
 public:
  explicit OneBatch(data_loader::Batch batch) : batch_(std::move(batch)) {}
  absl::Status Next(data_loader::Batch* batch, absl::Duration) override {
    if (done_) return absl::OutOfRangeError("the lines were scored");
    done_ = true;
    *batch = std::move(batch_);
    return absl::OkStatus();
  }
  data_loader::ReaderPosition Position() const override { return {}; }

 private:
  data_loader::Batch batch_;
  bool done_ = false;
};

}  // namespace

absl::StatusOr<data_loader::SourceConfig> Predictor::LineSource(const std::string& header) const {
  data_loader::SourceConfig source = ScoringSource(plan_.loader.options.source, /*label_optional=*/true, {});
  if (source.format == data_loader::Format::kSynthetic) {
    return absl::InvalidArgumentError("the export's job reads a synthetic source; it has no lines to score");
  }
  if (source.format == data_loader::Format::kCsv) {
    std::vector<std::string> fields;
    if (source.csv.header) HYREC_RETURN_IF_ERROR(data_loader::SplitCsvLine(header, source.csv, &fields));
    HYREC_RETURN_IF_ERROR(source.csv.Resolve(source.csv.header ? &fields : nullptr));
  }
  return source;
}

absl::Status Predictor::ScoreLines(const data_loader::SourceConfig& source, const std::vector<std::string>& lines,
                                   std::vector<float>* logits) {
  logits->clear();
  if (lines.empty()) return absl::OkStatus();
  std::vector<data_loader::Sample> samples(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::Status s = data_loader::ParseSourceLine(source, lines[i], &samples[i]);
    if (!s.ok()) return Annotate(s, absl::StrCat("line ", i + 1));
  }
  const data_loader::LoaderOptions& o = plan_.loader.options;
  data_loader::Batch batch;
  data_loader::BuildBatch(samples, samples.size(), source.num_dense(), source.num_slots(), o.slot_tables,
                          o.num_tables(), /*num_shards=*/1, &batch, o.slot_copies);
  const TrainerOptions options = TrainerOptionsFor(plan_.workers[0], torch::kCPU);
  return GuardTorch("scoring", [&] {
    OneBatch stream(std::move(batch));
    return Evaluate(&stream, rows_.get(), options, *model_, logits, nullptr).status();
  });
}

}  // namespace hyrec::dense_worker
