// Every built-in model kind (DLRM, DCN-v2, logistic regression, Wide & Deep, DeepFM, FM) trains
// end to end on every format, through the job plan and RunTrainJob as
// `hyrec train` runs it: Criteo, libsvm (one weighted multi-hot feature, and index ranges),
// libffm (fields from 1), csv with a header (every column type), csv with dense columns only and
// with sparse columns only, and the synthetic source. The files are generated with a learnable
// label, so each run must also beat chance on its held-out file. Then the quality settings:
// early stopping stops, and dropout and weight decay change what is trained.
#include <unistd.h>
#include <filesystem>

#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/dense_worker/monitor.h"
#include "hyrec/dense_worker/predictor.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::dense_worker {
namespace {

std::string Path(const std::string& name) { return ::testing::TempDir() + "/formats_" + name; }

// One record with a known signal: a user in [0, 30), an item in [0, 40), two dense values; the
// label's logit adds a user effect, an item effect and the first dense value (so that a linear
// model can learn it too).
struct Record {
  int label, user, item;
  double x0, x1;
};

std::vector<Record> Records(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Record> out;
  for (int i = 0; i < n; ++i) {
    Record r;
    r.user = static_cast<int>(rng() % 30);
    r.item = static_cast<int>(rng() % 40);
    r.x0 = static_cast<double>(rng() % 1000) / 100.0;
    r.x1 = static_cast<double>(rng() % 100);
    const double logit = (r.user % 3 == 0 ? 1.5 : -0.8) + (r.item % 4 == 0 ? 1.5 : -0.6) + 0.3 * (r.x0 - 5);
    r.label = std::uniform_real_distribution<double>(0, 1)(rng) < 1 / (1 + std::exp(-logit)) ? 1 : 0;
    out.push_back(r);
  }
  return out;
}

using Writer = std::string (*)(const Record&);

std::string Criteo(const Record& r) {
  std::string line = absl::StrCat(r.label, "\t", static_cast<int>(r.x0 * 10), "\t", static_cast<int>(r.x1));
  for (int k = 2; k < 13; ++k) line += "\t";
  line += absl::StrCat("\t", absl::Hex(r.user), "\t", absl::Hex(1000 + r.item));
  for (int k = 2; k < 26; ++k) line += "\t";
  return line;
}
std::string Libsvm(const Record& r) {
  return absl::StrCat(r.label, " ", 1 + r.user, ":1 ", 100 + r.item, ":1 500:", r.x0 / 10);
}
std::string Libffm(const Record& r) { return absl::StrCat(r.label, " 1:", r.user, ":1 2:", r.item, ":1"); }
std::string Csv(const Record& r) {
  return absl::StrCat("\"r,", r.user, "\",", r.label, ",", r.x0, ",", r.x1, ",u", r.user, ",i", r.item, "|x",
                      r.item % 5, ",w", r.user % 7, ":0.5;w", r.item % 7, ":2");
}
std::string CsvDense(const Record& r) {
  return absl::StrCat(r.label, ",", r.x0, ",", r.user % 3 == 0 ? 1 : 0, ",", r.item % 4 == 0 ? 1 : 0);
}
std::string CsvSparse(const Record& r) { return absl::StrCat(r.label, "\t", r.user, "\t", r.item); }

std::string WriteData(const std::string& name, Writer writer, const std::string& header, int n, uint64_t seed) {
  const std::string path = Path(name);
  std::ofstream out(path);
  if (!header.empty()) out << header << "\n";
  for (const Record& r : Records(n, seed)) out << writer(r) << "\n";
  return path;
}

struct Format {
  std::string name;
  Writer writer;
  std::string header;
  std::string source;  // The loader.source keys beside format and files.
};

std::vector<Format> Formats() {
  return {
      {"criteo", Criteo, "", "format: criteo"},
      {"libsvm", Libsvm, "", "format: libsvm"},
      {"libsvm_ranges", Libsvm, "", "format: libsvm, index_ranges: [[1, 99], [100, 499], [500, 500]]"},
      {"libffm", Libffm, "", "format: libffm, num_slots: 2, field_base: 1"},
      {"csv", Csv, "id,click,x0,x1,user,items,weighted",
       "format: csv, csv: {columns: [{name: id, type: ignore}, {name: click, type: label}, "
       "{name: x0, type: dense, transform: standardize, mean: 5, stddev: 3}, {name: x1, type: dense, transform: "
       "log1p}, {name: user, type: categorical}, {name: items, type: multi}, {name: weighted, type: weighted, "
       "separator: ';'}]}"},
      {"csv_dense_only", CsvDense, "",
       "format: csv, csv: {header: false, columns: [{index: 0, type: label}, {index: 1, type: dense}, {index: 2, "
       "type: dense}, {index: 3, type: dense}]}"},
      {"csv_sparse_only", CsvSparse, "",
       "format: csv, csv: {header: false, delimiter: \"\\t\", columns: [{index: 0, type: label}, {index: 1, type: "
       "categorical}, {index: 2, type: categorical}]}"},
  };
}

std::string JobText(const std::string& source, const std::string& model, const std::string& extra) {
  return absl::StrCat("loader:\n  source: {", source, "}\n  batch_size: 64\n  threads: 1\n  epochs: 3\n",
                      "  shuffle_window: 1024\n", "model: {kind: ", model,
                      ", embedding_dim: 4, bottom: [8], top: [16, 8], cross_layers: 2}\n",
                      "ps: {shards: 2, optimizer: adagrad, learning_rate: 0.1}\n",
                      "train: {dense_optimizer: adam, dense_learning_rate: 0.01, log_every_batches: 1000}\n", extra);
}

const char* const kModels[] = {"dlrm", "dcn", "lr", "wide_deep", "deepfm", "fm"};

absl::StatusOr<TrainReport> Train(const std::string& text) {
  absl::StatusOr<job::JobSpec> spec = job::ParseJobSpecText(text, "job.yaml");
  if (!spec.ok()) return spec.status();
  absl::StatusOr<job::JobPlan> plan = job::Plan(*spec);
  if (!plan.ok()) return plan.status();
  return RunTrainJob(*plan, {});
}

TEST(Formats, EveryModelTrainsOnEveryFormat) {
  for (const Format& f : Formats()) {
    const std::string train = WriteData(f.name + "_train", f.writer, f.header, 1200, 1);
    const std::string test = WriteData(f.name + "_test", f.writer, f.header, 400, 2);
    const std::string source = absl::StrCat(f.source, ", files: [", train, "]");
    for (const std::string model : kModels) {
      SCOPED_TRACE(f.name + " / " + model);
      absl::StatusOr<TrainReport> r = Train(JobText(source, model, "eval: {files: [" + test + "]}\n"));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->samples, 3600u);
      EXPECT_TRUE(std::isfinite(r->mean_loss_last));
      ASSERT_TRUE(r->has_final_eval);
      EXPECT_EQ(r->final_eval.samples, 400u);
      EXPECT_GT(r->final_eval.auc, 0.6) << "log loss " << r->final_eval.log_loss;
    }
  }
  // And the synthetic source, with and without dense features.
  for (const std::string dense : {"13", "0"}) {
    for (const std::string model : kModels) {
      SCOPED_TRACE("synthetic num_dense " + dense + " / " + model);
      absl::StatusOr<TrainReport> r =
          Train(JobText(absl::StrCat("format: synthetic, synthetic: {num_samples: 3000, num_dense: ", dense,
                                     ", num_slots: 4, vocabulary: 200}"),
                        model, "eval: {samples: 1000}\n"));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->samples, 9000u);
      EXPECT_GT(r->final_eval.auc, 0.55);
    }
  }
}

// 64 noisy rows trained for 30 epochs at high learning rates overfit: the held-out log loss
// stops improving, and patience 2 stops the job two evaluations after its best one. Without
// patience every epoch is trained.
TEST(Quality, EarlyStoppingStopsOncePatienceRunsOut) {
  const std::string train = WriteData("es_train", Csv, Formats()[4].header, 64, 3);
  const std::string test = WriteData("es_test", Csv, Formats()[4].header, 400, 4);
  std::string text =
      JobText(absl::StrCat(Formats()[4].source, ", files: [", train, "]"), "dlrm",
              absl::StrCat("eval: {files: [", test, "], every_epoch: true, patience: 2, metric: log_loss}\n"));
  text = absl::StrReplaceAll(text, {{"epochs: 3", "epochs: 30"},
                                    {"batch_size: 64", "batch_size: 16"},
                                    {"learning_rate: 0.1", "learning_rate: 0.5"},
                                    {"dense_learning_rate: 0.01", "dense_learning_rate: 0.05"},
                                    {"log_every_batches: 1000", "log_every_batches: 1000, embedding_staleness: 0"}});
  absl::StatusOr<TrainReport> stopped = Train(text);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_TRUE(stopped->stopped_early);
  EXPECT_LT(stopped->samples, 30u * 64);
  EXPECT_EQ(stopped->samples % 64, 0u);  // It stops at an epoch's end, where it evaluated.
  const auto& evals = stopped->evals;
  ASSERT_GE(evals.size(), 3u);
  ASSERT_TRUE(stopped->has_best_eval);
  // The best evaluation is the one two before the stop; the last is the final one (nothing was
  // trained after it, so it is not taken again).
  EXPECT_EQ(stopped->best_eval_samples, evals[evals.size() - 3].first) << "evaluations: " << evals.size();
  EXPECT_EQ(evals.back().first, stopped->samples);
  EXPECT_EQ(stopped->final_eval.log_loss, evals.back().second.log_loss);
  for (size_t k = 0; k + 1 < evals.size(); ++k) {
    EXPECT_GE(evals[k].second.log_loss, stopped->best_eval.log_loss);
  }
  // Two workers (Gloo on loopback) stop together on worker 0's decision.
  absl::StatusOr<TrainReport> two =
      Train(absl::StrReplaceAll(text, {{"embedding_staleness: 0", "embedding_staleness: 0, workers: 2"}}));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->stopped_early);
  EXPECT_LT(two->samples, 30u * 64);
  EXPECT_EQ(two->samples % 64, 0u);
  absl::StatusOr<TrainReport> full = Train(absl::StrReplaceAll(text, {{", patience: 2", ""}}));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(full->stopped_early);
  EXPECT_EQ(full->samples, 30u * 64);
  EXPECT_EQ(full->evals.size(), 30u);  // 29 epoch ends and the final one.

  // Without early stopping but with checkpoints, the export is still the best evaluation's model
  // (its checkpoint outlives keep_last: 1), and the report says so.
  const std::string dir = Path("best_export");
  std::filesystem::remove_all(dir);
  absl::StatusOr<TrainReport> kept =
      Train(absl::StrCat(absl::StrReplaceAll(text, {{", patience: 2", ""}}), "checkpoint: {dir: ", dir,
                         "/ckpt, every_steps: 40, keep_last: 1}\nexport: {dir: ", dir, "/model}\n"));
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(kept->has_best_eval);
  EXPECT_LT(kept->best_eval_samples, kept->samples);  // The model overfits: the best is not the last.
  EXPECT_NE(kept->best_eval.log_loss, kept->final_eval.log_loss);
  EXPECT_EQ(kept->export_reason, TrainReport::ExportReason::kBestEvaluation);
  EXPECT_EQ(kept->export_samples, kept->best_eval_samples);
  EXPECT_EQ(kept->export_checkpoint, kept->best_checkpoint);
  EXPECT_TRUE(std::filesystem::exists(kept->best_checkpoint)) << kept->best_checkpoint;
  EXPECT_NE(kept->best_checkpoint, kept->last_checkpoint);
  absl::StatusOr<std::unique_ptr<Predictor>> exported = Predictor::Load(dir + "/model");
  ASSERT_TRUE(exported.ok()) << exported.status();
  std::vector<float> logits, labels;
  absl::StatusOr<Evaluation> scored = (*exported)->Score({test}, &logits, &labels);
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_NEAR(scored->log_loss, kept->best_eval.log_loss, 1e-5);
  EXPECT_EQ(scored->auc, kept->best_eval.auc);
  EXPECT_TRUE(absl::StrContains(ExportedModel(*kept), "the best held-out evaluation's model")) << ExportedModel(*kept);
  std::filesystem::remove_all(dir);
}

TEST(Quality, DropoutAndWeightDecayChangeTraining) {
  const std::string train = WriteData("reg_train", Csv, Formats()[4].header, 640, 5);
  const std::string base =
      absl::StrReplaceAll(JobText(absl::StrCat(Formats()[4].source, ", files: [", train, "]"), "dlrm", ""),
                          {{"log_every_batches: 1000", "log_every_batches: 1000, embedding_staleness: 0"}});
  absl::StatusOr<TrainReport> plain = Train(base);
  absl::StatusOr<TrainReport> again = Train(base);
  absl::StatusOr<TrainReport> dropout =
      Train(absl::StrReplaceAll(base, {{"cross_layers: 2", "cross_layers: 2, dropout: 0.5"}}));
  absl::StatusOr<TrainReport> decay = Train(absl::StrReplaceAll(
      base, {{"dense_optimizer: adam", "dense_optimizer: {kind: adamw, learning_rate: 0.01, weight_decay: 0.5}"},
             {", dense_learning_rate: 0.01", ""}}));
  ASSERT_TRUE(plain.ok() && again.ok() && dropout.ok() && decay.ok())
      << plain.status() << again.status() << dropout.status() << decay.status();
  EXPECT_EQ(plain->dense_fingerprint, again->dense_fingerprint);  // Deterministic: a change is the setting's.
  EXPECT_NE(plain->dense_fingerprint, dropout->dense_fingerprint);
  EXPECT_NE(plain->dense_fingerprint, decay->dense_fingerprint);
}

// The shipped csv example (examples/configs/clicks-csv.yaml and its generated click log) trains
// and learns its signal.
// A csv time column ages a ttl table by data time, end to end: sample times reach the batches,
// their lookups and the PS stores. Users 0..999 appear in the first half of a day of clicks,
// users 1000..1029 throughout; with a TTL of an hour the job ends holding only the rows used in
// its last hour (the checkpoint at the end shows it), where without the TTL it holds all.
TEST(Formats, ATimeColumnExpiresTtlRowsByDataTime) {
  const std::string path = Path("timed.csv");
  {
    std::ofstream out(path);
    out << "t,click,user\n";
    std::mt19937_64 rng(4);
    for (int i = 0; i < 4000; ++i) {
      const int user = i < 2000 && i % 2 == 0 ? static_cast<int>(rng() % 1000) : 1000 + static_cast<int>(rng() % 30);
      out << 1'700'000'000 + 20 * i << "," << (user % 3 == 0 ? 1 : 0) << ",u" << user << "\n";
    }
  }
  for (const std::string eviction : {"lru", "{policy: ttl, ttl_seconds: 3600}"}) {
    SCOPED_TRACE(eviction);
    const std::string dir = Path("timed_checkpoints");
    std::filesystem::remove_all(dir);
    const std::string text = absl::StrCat(
        "loader:\n  source: {format: csv, files: [", path,
        "], csv: {columns: [{name: t, type: time}, {name: click, type: label}, {name: user, type: categorical}]}}\n",
        "  batch_size: 100\n  threads: 1\n  epochs: 1\n  shuffle_window: 200\n",
        "tables: [{name: user, features: [user], dim: 4, eviction: ", eviction, "}]\n",
        "model: {kind: lr}\nps: {shards: 2, optimizer: adagrad, learning_rate: 0.1}\n", "checkpoint: {dir: ", dir,
        ", every_steps: 1000}\n");
    absl::StatusOr<TrainReport> r = Train(text);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->last_checkpoint.empty());
    absl::StatusOr<CheckpointManifest> manifest = ReadManifest(Env::Default(), r->last_checkpoint);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    embedding_ps::TableConfig table;
    table.name = "user";
    table.dim = 4;
    if (eviction != "lru") {
      table.eviction.policy = embedding_ps::EvictionPolicy::kTtl;
      table.eviction.ttl_seconds = 3600;
    }
    uint64_t rows = 0;
    for (int shard = 0; shard < 2; ++shard) {
      embedding_ps::StoreOptions options;
      options.tables = {table};
      auto store = *embedding_ps::EmbeddingShardStore::Create(options);
      ASSERT_TRUE(
          embedding_ps::RestoreShard(Env::Default(), r->last_checkpoint, *manifest, shard, 2, store.get()).ok());
      rows += store->Stats().rows;
      if (eviction != "lru") EXPECT_EQ(store->data_time(0), 1'700'000'000u + 20 * 3999);
    }
    if (eviction == "lru") {
      EXPECT_GT(rows, 600u);
    } else {
      EXPECT_LE(rows, 30u);
      EXPECT_GE(rows, 25u);
    }
  }
}

TEST(Formats, TheCsvExampleTrains) {
  ASSERT_EQ(chdir(HYREC_SOURCE_DIR), 0);
  absl::StatusOr<job::JobSpec> spec = job::LoadJobSpec("examples/configs/clicks-csv.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Its checkpoints and export go to a temporary directory, not into the checkout.
  const std::string out = ::testing::TempDir() + "/formats_clicks";
  std::filesystem::remove_all(out);
  spec->checkpoint.dir = out + "/checkpoints";
  spec->serving.dir = out + "/model";
  absl::StatusOr<job::JobPlan> plan = job::Plan(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workers[0].feature_names,
            (std::vector<std::string>{"site", "app", "device_type", "tags", "interests"}));
  absl::StatusOr<TrainReport> r = RunTrainJob(*plan, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples, 4u * 4000);
  ASSERT_TRUE(r->has_final_eval);
  EXPECT_EQ(r->final_eval.samples, 1000u);
  EXPECT_GT(r->final_eval.auc, 0.65);
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace hyrec::dense_worker
