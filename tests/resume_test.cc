// Checkpoint, resume and export through RunTrainJob as `hyrec train` runs it:
// - resume exactness: a run that checkpoints at step K, resumed from there, ends with the dense
//   weights and embedding rows of the uninterrupted run (one worker, staleness 0), having
//   trained every remaining sample once;
// - resharding on load: the same checkpoint resumed with 3 PS shards and 2 workers, and a
//   2-worker checkpoint resumed with 1 worker, train every remaining sample once;
// - export: predict on the export gives the held-out AUC and log loss the trained model had in
//   memory, and the export of step K plus the deltas after it equals the final export;
// - following: a follower polling export.dir while the job trains takes strictly newer models and
//   ends on the final export's scores; compaction keeps export.keep_bases bases and the deltas
//   after the oldest; a gap in the deltas, or a delta with a flipped byte, is refused, naming it,
//   and the model stays as it was.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fault_injection_env.h"
#include "gtest/gtest.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/dense_worker/checkpoint.h"
#include "hyrec/dense_worker/follower.h"
#include "hyrec/dense_worker/predictor.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::dense_worker {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/resume_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// libsvm lines with a learnable label: a user id, an item id and one dense-like weighted index.
std::string WriteData(const std::string& path, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const int user = static_cast<int>(rng() % 30), item = static_cast<int>(rng() % 40);
    const double logit = (user % 3 == 0 ? 1.5 : -0.8) + (item % 4 == 0 ? 1.5 : -0.6);
    const int label = std::uniform_real_distribution<double>(0, 1)(rng) < 1 / (1 + std::exp(-logit)) ? 1 : 0;
    out << label << " " << 1 + user << ":1 " << 100 + item << ":1\n";
  }
  return path;
}

std::string Job(const std::string& dir, const std::string& source, int shards, int workers, const std::string& extra) {
  return absl::StrCat("loader:\n  source: {", source, "}\n  batch_size: 32\n  threads: 1\n  epochs: 2\n",
                      "  shuffle_window: 256\n", "model: {kind: dlrm, embedding_dim: 4, bottom: [8], top: [8]}\n",
                      "ps: {shards: ", shards, ", optimizer: adagrad, learning_rate: 0.1}\n",
                      "train: {workers: ", workers,
                      ", embedding_staleness: 0, dense_optimizer: adam, dense_learning_rate: 0.01, "
                      "log_every_batches: 1000}\n",
                      "checkpoint: {dir: ", dir, "/ckpt, every_steps: 10, keep_last: 20}\n", extra);
}

absl::StatusOr<TrainReport> RunJob(const std::string& text, const std::string& resume = "", Env* env = nullptr) {
  absl::StatusOr<job::JobSpec> spec = job::ParseJobSpecText(text, "job.yaml");
  if (!spec.ok()) return spec.status();
  absl::StatusOr<job::JobPlan> plan = job::Plan(*spec);
  if (!plan.ok()) return plan.status();
  TrainJobOptions options;
  options.resume = resume;
  if (env != nullptr) options.env = env;
  return RunTrainJob(*plan, options);
}

// The checkpoint of `step` under root.
std::string CheckpointAt(const std::string& root, uint64_t step) {
  for (const std::string& name : ListCheckpointDirs(Env::Default(), root, kCheckpointPrefix)) {
    absl::StatusOr<CheckpointManifest> m = ReadManifest(Env::Default(), JoinPath(root, name));
    if (m.ok() && m->step == step) return JoinPath(root, name);
  }
  return "";
}

// Every row of a checkpoint, weights and optimizer state, by (table, id).
std::map<std::pair<std::string, uint64_t>, std::vector<float>> CheckpointRows(const std::string& dir,
                                                                              const std::string& job_text) {
  const job::JobPlan plan = *job::Plan(*job::ParseJobSpecText(job_text, "job.yaml"));
  const CheckpointManifest m = *VerifyCheckpoint(Env::Default(), dir);
  std::map<std::pair<std::string, uint64_t>, std::vector<float>> rows;
  for (const job::PsShardPlan& shard : plan.ps) {
    auto store = RestoreShardStore(Env::Default(), dir, m, shard);
    EXPECT_TRUE(store.ok()) << store.status();
    const embedding_ps::StoreSnapshot snap = (*store)->Snapshot();
    for (size_t t = 0; t < snap.tables.size(); ++t) {
      const auto& table = snap.tables[t];
      const size_t floats = table.ids.empty() ? 0 : table.values.size() / table.ids.size();
      for (size_t i = 0; i < table.ids.size(); ++i) {
        rows[{(*store)->table(t).name, table.ids[i]}].assign(table.values.begin() + i * floats,
                                                             table.values.begin() + (i + 1) * floats);
      }
    }
  }
  return rows;
}

TEST(Resume, ContinuesExactlyAsTheUninterruptedRun) {
  const std::string dir = FreshDir("exact");
  const std::string data = WriteData(dir + "/train.svm", 800, 1);  // 25 batches an epoch, 50 in all.
  const std::string job = Job(dir, "format: libsvm, files: [" + data + "]", 2, 1, "");
  absl::StatusOr<TrainReport> full = RunJob(job);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->samples, 1600u);
  ASSERT_FALSE(full->last_checkpoint.empty());
  const std::string at20 = CheckpointAt(dir + "/ckpt", 20);
  ASSERT_FALSE(at20.empty());
  absl::StatusOr<TrainReport> resumed = RunJob(job, at20);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_step, 20u);
  EXPECT_EQ(resumed->samples, 1600u);              // 640 before the cut, 960 after: none twice, none lost.
  EXPECT_EQ(resumed->stats.samples, 1600u - 640);  // This run's own.
  EXPECT_EQ(resumed->dense_fingerprint, full->dense_fingerprint);
  EXPECT_EQ(CheckpointRows(resumed->last_checkpoint, job), CheckpointRows(full->last_checkpoint, job));
}

// A full disk: every cut that cannot be written removes what it wrote (dense file, shard files,
// positions), so the job goes on, and once there is room again the next cut commits. Every
// directory left under the root is a committed, verified checkpoint.
TEST(Resume, AFailedCutRemovesWhatItWrote) {
  // The first cut's appends, in order: its loader position (before the cut agrees), then the
  // dense file and the shards' files (while training goes on). Each fails in turn.
  // Full for the rest of the run (no later commit retires what failed cuts left), or for a while.
  for (const int failing : {-1, 2}) {
    for (const int skip : {0, 1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("appends before the full disk: ", skip, ", failing: ", failing));
      const std::string dir = FreshDir(absl::StrCat("full_disk_", skip, "_", failing));
      const std::string data = WriteData(dir + "/train.svm", 800, 1);
      const std::string job = Job(dir, "format: libsvm, files: [" + data + "]", 2, 1, "");  // 5 cuts.
      FaultInjectionEnv env(Env::Default());
      env.FailAfter(FaultInjectionEnv::kAppend, skip + 1, failing);  // The first: the run's JOB file.
      absl::StatusOr<TrainReport> report = RunJob(job, "", &env);
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_EQ(report->samples, 1600u);
      EXPECT_GT(report->checkpoint_failures, 0);
      EXPECT_EQ(report->checkpoints > 0, failing >= 0);
      int dirs = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir + "/ckpt")) {
        if (!e.is_directory()) continue;  // The run's LOCK and JOB.
        ++dirs;
        EXPECT_TRUE(VerifyCheckpoint(Env::Default(), e.path().string()).ok()) << e.path() << " was left behind";
      }
      EXPECT_EQ(dirs, report->checkpoints);
    }
  }
}

TEST(Resume, ReshardsPsShardsAndWorkers) {
  const std::string dir = FreshDir("reshard");
  const std::string data = WriteData(dir + "/train.svm", 1024, 2);  // 32 batches an epoch.
  const std::string source = "format: libsvm, files: [" + data + "]";
  absl::StatusOr<TrainReport> two = RunJob(Job(dir, source, 4, 2, ""));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->samples, 2048u);
  const std::string at10 = CheckpointAt(dir + "/ckpt", 10);  // 10 steps of 2 workers: 640 samples.
  ASSERT_FALSE(at10.empty());
  const auto saved = CheckpointRows(at10, Job(dir, source, 4, 2, ""));
  // 4 shards -> 3, 2 workers -> 1: every row of the checkpoint is in the new shards.
  EXPECT_EQ(CheckpointRows(at10, Job(dir, source, 3, 1, "")), saved);
  absl::StatusOr<TrainReport> one = RunJob(Job(dir, source, 3, 1, ""), at10);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->samples, 2048u);
  EXPECT_EQ(one->stats.samples, 2048u - 640);
  // 2 shards -> 5 shards, 1 worker -> 2 workers.
  const std::string at20 = CheckpointAt(dir + "/ckpt", 20);
  ASSERT_FALSE(at20.empty());
  absl::StatusOr<TrainReport> five = RunJob(Job(dir, source, 5, 2, ""), at20);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->samples, 2048u);
}

TEST(Export, PredictGivesTheTrainedModelsScoresAndDeltasReachTheFinalExport) {
  const std::string dir = FreshDir("export");
  const std::string data = WriteData(dir + "/train.svm", 900, 3);
  const std::string heldout = WriteData(dir + "/heldout.svm", 300, 4);
  const std::string job =
      Job(dir, "format: libsvm, files: [" + data + "]", 2, 1,
          absl::StrCat("eval: {files: [", heldout, "]}\nexport: {dir: ", dir, "/model, delta_every_steps: 10}\n"));
  absl::StatusOr<TrainReport> r = RunJob(job);  // 57 steps: the last checkpoint is the one at the end.
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_final_eval);
  ASSERT_FALSE(r->export_dir.empty());
  auto predictor = Predictor::Load(dir + "/model");
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  EXPECT_EQ((*predictor)->dir(), r->export_dir);
  std::vector<float> logits, labels;
  absl::StatusOr<Evaluation> scored = (*predictor)->Score({heldout}, &logits, &labels);
  ASSERT_TRUE(scored.ok()) << scored.status();
  ASSERT_EQ(logits.size(), 300u);
  EXPECT_EQ(data_loader::ExactAuc(logits, labels), r->final_eval.auc);
  EXPECT_EQ(scored->auc, r->final_eval.auc);
  EXPECT_NEAR(scored->log_loss, r->final_eval.log_loss, 1e-6);

  // The export of step 20 plus every delta after it is the final export.
  const std::string at20 = CheckpointAt(dir + "/ckpt", 20);
  ASSERT_FALSE(at20.empty());
  absl::StatusOr<std::string> early = ExportCheckpoint(Env::Default(), at20, dir + "/early");
  ASSERT_TRUE(early.ok()) << early.status();
  absl::StatusOr<ServingRows> follower = ReadExport(Env::Default(), *early);
  ASSERT_TRUE(follower.ok()) << follower.status();
  absl::StatusOr<int> applied = ApplyDeltas(Env::Default(), dir + "/model", &*follower);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_GE(*applied, 3);
  absl::StatusOr<ServingRows> last = ReadExport(Env::Default(), r->export_dir);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(follower->tables, last->tables);
  auto a = Predictor::FromRows(*follower, last->job_yaml);
  auto b = Predictor::FromRows(*last, last->job_yaml);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> la, lb, ya, yb;
  ASSERT_TRUE((*a)->Score({heldout}, &la, &ya).ok());
  ASSERT_TRUE((*b)->Score({heldout}, &lb, &yb).ok());
  EXPECT_EQ(la, lb);
}

// Every line of a file.
std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string BaseName(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// The export root's entries with `prefix`, as directories.
std::vector<std::string> Dirs(const std::string& root, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& name : ListCheckpointDirs(Env::Default(), root, prefix)) out.push_back(JoinPath(root, name));
  return out;
}

TEST(Follow, AFollowerTakesNewerModelsWhileTheJobTrainsAndEndsOnTheFinalExport) {
  const std::string dir = FreshDir("follow");
  const std::string data = WriteData(dir + "/train.svm", 900, 3);
  const std::string heldout = WriteData(dir + "/heldout.svm", 300, 4);
  // 57 steps: a delta every 3, a checkpoint every 10, a base after every 4 deltas, 2 bases kept.
  const std::string job =
      Job(dir, "format: libsvm, files: [" + data + "]", 2, 1,
          absl::StrCat("export: {dir: ", dir, "/model, delta_every_steps: 3, base_every_deltas: 4, keep_bases: 2}\n"));
  std::atomic<bool> done{false};
  std::vector<std::pair<uint64_t, uint64_t>> seen;  // (step, delta) of each model taken.
  absl::Status follow_error;
  std::thread follower_thread([&] {
    std::unique_ptr<Follower> follower;
    for (bool last = false; !last;) {
      last = done.load();
      if (follower == nullptr) {
        absl::StatusOr<std::unique_ptr<Follower>> f = Follower::Start(dir + "/model");
        if (absl::IsNotFound(f.status())) continue;
        if (!f.ok()) {
          follow_error = f.status();
          return;
        }
        follower = std::move(*f);
      } else {
        absl::StatusOr<bool> changed = follower->Poll();
        if (!changed.ok()) {
          follow_error = changed.status();
          return;
        }
        if (!*changed) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          continue;
        }
      }
      seen.emplace_back(follower->model()->step, follower->model()->delta_sequence);
    }
  });
  absl::StatusOr<TrainReport> r = RunJob(job);
  done = true;
  follower_thread.join();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(follow_error.ok()) << follow_error;
  ASSERT_GE(seen.size(), 1u);  // How many it sees depends on the machine; each is newer than the last.
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GT(seen[i].first, seen[i - 1].first) << "model " << i;
    EXPECT_GE(seen[i].second, seen[i - 1].second) << "model " << i;
  }
  EXPECT_EQ(seen.back().first, r->stats.batches);

  // Compaction: two bases left (the final export among them), and the deltas after the older.
  const std::vector<std::string> bases = Dirs(dir + "/model", kExportPrefix);
  ASSERT_EQ(bases.size(), 2u);
  EXPECT_EQ(bases.back(), r->export_dir);
  const CheckpointManifest older = *ReadManifest(Env::Default(), bases.front());
  const std::vector<std::string> deltas = Dirs(dir + "/model", kDeltaPrefix);
  ASSERT_FALSE(deltas.empty());
  for (const std::string& d : deltas) EXPECT_GT(ReadManifest(Env::Default(), d)->delta_sequence, older.delta_sequence);

  // A follower that starts now scores as `hyrec predict` on the final export, line by line too.
  absl::StatusOr<std::unique_ptr<Follower>> late = Follower::Start(dir + "/model");
  ASSERT_TRUE(late.ok()) << late.status();
  auto final_export = Predictor::Load(r->export_dir);
  ASSERT_TRUE(final_export.ok()) << final_export.status();
  std::vector<float> want, got, labels;
  ASSERT_TRUE((*final_export)->Score({heldout}, &want, &labels).ok());
  std::shared_ptr<const Follower::Model> m = (*late)->model();
  absl::StatusOr<data_loader::SourceConfig> source = m->predictor->LineSource("");
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(m->predictor->ScoreLines(*source, Lines(heldout), &got).ok());
  EXPECT_EQ(got, want);

  // From the older base: its deltas, one of them missing, then one damaged.
  auto copy_from_older_base = [&](const std::string& name) {
    const std::string root = dir + "/" + name;
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
    std::filesystem::copy(bases.front(), JoinPath(root, BaseName(bases.front())),
                          std::filesystem::copy_options::recursive);
    for (const std::string& d : deltas) {
      std::filesystem::copy(d, JoinPath(root, BaseName(d)), std::filesystem::copy_options::recursive);
    }
    return root;
  };
  ASSERT_GE(deltas.size(), 3u);
  const std::string gap = copy_from_older_base("gap");
  std::filesystem::remove_all(JoinPath(gap, BaseName(deltas[1])));
  absl::StatusOr<std::unique_ptr<Follower>> refused = Follower::Start(gap);
  EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find(absl::StrCat("delta ", older.delta_sequence + 2, " is missing")),
            std::string::npos)
      << refused.status();

  // Poll: the first delta applied, then the rest arrive with a flipped byte in one of them.
  const std::string flipped = copy_from_older_base("flipped");
  std::vector<std::string> later;
  for (size_t i = 1; i < deltas.size(); ++i) {
    const std::string d = JoinPath(flipped, BaseName(deltas[i]));
    later.push_back(d);
    std::filesystem::rename(d, dir + "/held-" + BaseName(d));
  }
  absl::StatusOr<std::unique_ptr<Follower>> f = Follower::Start(flipped);
  ASSERT_TRUE(f.ok()) << f.status();
  const uint64_t step = (*f)->model()->step;
  EXPECT_EQ((*f)->model()->delta_sequence, older.delta_sequence + 1);
  for (const std::string& d : later) std::filesystem::rename(dir + "/held-" + BaseName(d), d);
  std::string rows_file;
  for (const auto& e : std::filesystem::directory_iterator(later.front())) {
    if (absl::StartsWith(BaseName(e.path().string()), "delta-")) rows_file = e.path().string();
  }
  ASSERT_FALSE(rows_file.empty());
  std::string bytes = *ReadFileToString(Env::Default(), rows_file, 1 << 30);
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), rows_file, bytes).ok());
  absl::StatusOr<bool> poll = (*f)->Poll();
  EXPECT_TRUE(absl::IsDataLoss(poll.status())) << poll.status();
  EXPECT_NE(poll.status().message().find(BaseName(rows_file)), std::string::npos) << poll.status();
  EXPECT_EQ((*f)->model()->step, step);  // Unchanged.
}

TEST(Resume, RefusesACorruptCheckpointAndLatestFallsBack) {
  const std::string dir = FreshDir("corrupt");
  const std::string data = WriteData(dir + "/train.svm", 640, 5);
  const std::string job = Job(dir, "format: libsvm, files: [" + data + "]", 2, 1, "");
  ASSERT_TRUE(RunJob(job).ok());
  const std::string newest = ListCheckpointDirs(Env::Default(), dir + "/ckpt", kCheckpointPrefix).back();
  const std::string dense = JoinPath(JoinPath(dir + "/ckpt", newest), kDenseFileName);
  std::string bytes = *ReadFileToString(Env::Default(), dense, 1 << 30);
  bytes[bytes.size() / 2] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), dense, bytes).ok());
  absl::StatusOr<TrainReport> direct = RunJob(job, JoinPath(dir + "/ckpt", newest));
  EXPECT_TRUE(absl::IsDataLoss(direct.status())) << direct.status();
  absl::StatusOr<TrainReport> latest = RunJob(job, "latest");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_LT(latest->resumed_step, 40u);  // The checkpoint before the corrupt one.
  EXPECT_GT(latest->resumed_step, 0u);
}

}  // namespace
}  // namespace hyrec::dense_worker
