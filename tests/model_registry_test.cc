// Models of one's own: registered by name, built from the job's features, trained by hyrec's
// entry point with everything `hyrec train` offers (embedded and --processes); and every way a
// model can fail (a shape error in forward, an allocation that fails, a factory's own error, an
// unknown kind) is a clear error with its exit code, never an abort.
#include "hyrec/dense_worker/model_registry.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/dense_worker/checkpoint.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/dense_worker/worker.h"
#include "run_command.h"

namespace hyrec::dense_worker {
namespace {

constexpr char kData[] = R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 40960, num_slots: 3, num_dense: 4, vocabulary: 200, seed: 4}
  batch_size: 256
  threads: 1
features: [user, item, category]
eval: {samples: 4000}
ps: {shards: 2}
)";

std::string Job(const std::string& name, const std::string& model, int workers = 1) {
  const std::string path = ::testing::TempDir() + "/registry_" + name + ".yaml";
  std::ofstream(path) << kData << model << "train: {workers: " << workers
                      << ", dense_learning_rate: 0.005, log_every_batches: 40}\n";
  return path;
}

struct Outcome {
  int code = -1;
  std::string out;  // stdout and stderr
};

Outcome RunTrainer(std::vector<std::string> args) {
  args.insert(args.begin(), HYREC_CUSTOM_TRAINER);
  const hyrec::testing::CommandResult r = hyrec::testing::RunCommand(args);
  return Outcome{r.code, r.all()};
}

double HeldOutAuc(const std::string& out) {
  const size_t at = out.find("held-out AUC ");
  return at == std::string::npos ? 0 : std::atof(out.c_str() + at + 13);
}

TEST(ModelRegistry, AProgramsOwnModelTrainsAsHyrecTrainDoes) {
  const std::string job = Job("tiny", "model: {kind: tiny_two_tower, options: {width: 24, user_features: 1}}\n");
  Outcome r = RunTrainer({"--config=" + job, "--plot=", "--progress=lines"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "tiny_two_tower: width 24, 1 user feature(s) of 3")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "hyrec train: tiny_two_tower, 1 worker(s)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "summary: 40960 samples")) << r.out;
  EXPECT_GT(HeldOutAuc(r.out), 0.6) << r.out;
  // The same program is every role of --processes: its workers know its models.
  const std::string two = Job("tiny_two", "model: {kind: tiny_two_tower, options: {width: 24}}\n", 2);
  r = RunTrainer({"--config=" + two, "--processes", "--plot=", "--progress=lines"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "processes: 2 PS")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "summary: 40960 samples")) << r.out;
  EXPECT_GT(HeldOutAuc(r.out), 0.6) << r.out;
  // Its roles take hyrec's flags.
  r = RunTrainer({"ps", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "usage: hyrec ps")) << r.out;
  r = RunTrainer({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--processes")) << r.out;
}

// The program that trained its own model scores it: `custom_trainer export|predict|eval` are
// hyrec's one-shot roles with its models known, its help names it, and the summary points at it.
// hyrec's own predict says which program can score such an export.
TEST(ModelRegistry, AProgramsOwnModelIsScoredByThatProgram) {
  const std::string dir = ::testing::TempDir() + "/registry_scored";
  std::filesystem::remove_all(dir);
  const std::string data = HYREC_SOURCE_DIR "/examples/data/";
  const std::string job = dir + ".yaml";
  std::ofstream(job) << "loader:\n  source:\n    format: csv\n    files: [" << data << "clicks_train.csv]\n"
                     << "    csv:\n      header: true\n      columns:\n"
                     << "        - {name: id, type: ignore}\n        - {name: click, type: label, positives: [\"1\"], "
                        "negatives: [\"0\"]}\n"
                     << "        - {name: hour, type: dense, transform: standardize, mean: 11.5, stddev: 6.9}\n"
                     << "        - {name: price, type: dense, transform: log1p}\n"
                     << "        - {name: site, type: categorical}\n        - {name: app, type: categorical}\n"
                     << "        - {name: device_type, type: ignore}\n        - {name: tags, type: ignore}\n"
                     << "        - {name: interests, type: ignore}\n"
                     << "  batch_size: 128\n  threads: 1\n  epochs: 2\n"
                     << "eval: {files: [" << data << "clicks_test.csv]}\n"
                     << "model: {kind: tiny_two_tower, embedding_dim: 8, options: {width: 16, user_features: 1}}\n"
                     << "train: {dense_learning_rate: 0.005}\n"
                     << "checkpoint: {dir: " << dir << "/ckpt}\nexport: {dir: " << dir << "/model}\n";
  const std::string report = dir + "/report.yaml";
  Outcome r = RunTrainer({"--config=" + job, "--plot=", "--progress=lines", "--report=" + report});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "(custom_trainer predict --model=" + dir + "/model/")) << r.out;
  // The export is the best evaluation's model (here the only, final, one).
  const std::string trained = hyrec::testing::ReportField(report, "best_auc");
  const double trained_auc = std::atof(trained.c_str());
  EXPECT_GT(trained_auc, 0.6) << r.out;

  r = RunTrainer({"eval", "--model=" + dir + "/model", "--input=" + data + "clicks_test.csv"});
  ASSERT_EQ(r.code, 0) << r.out;
  double auc = 0;
  ASSERT_NE(r.out.find("auc: "), std::string::npos) << r.out;
  auc = std::atof(r.out.c_str() + r.out.find("auc: ") + 5);
  EXPECT_NEAR(auc, trained_auc, 1e-6) << r.out;
  r = RunTrainer({"predict", "--model=" + dir + "/model", "--input=" + data + "clicks_test.csv"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "1000 samples scored")) << r.out;
  std::vector<std::string> labelled;  // The probabilities, one a line (the rest is stderr's).
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    double p = 0;
    if (absl::SimpleAtod(line, &p)) labelled.emplace_back(line);
  }
  ASSERT_EQ(labelled.size(), 1000u) << r.out;

  // Data to score has no label column; --keep passes columns through, as csv with a header.
  const std::string unlabelled = dir + "/unlabelled.csv";
  {
    std::ifstream in(data + "clicks_test.csv");
    std::ofstream out(unlabelled);
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> fields = absl::StrSplit(line, ',');
      fields.erase(fields.begin() + 1);  // click
      out << absl::StrJoin(fields, ",") << "\n";
    }
  }
  r = RunTrainer({"predict", "--model=" + dir + "/model", "--input=" + unlabelled, "--keep=id,site"});
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> rows;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "id,") || absl::StartsWith(line, "r")) rows.emplace_back(line);
  }
  ASSERT_EQ(rows.size(), 1001u) << r.out;
  EXPECT_EQ(rows[0], "id,site,probability");
  EXPECT_EQ(rows[1], "r4000,site01.example," + labelled[0]) << r.out;
  for (size_t i = 1; i < rows.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(rows[i], ',');
    ASSERT_EQ(cells.size(), 3u) << rows[i];
    EXPECT_EQ(cells[0], absl::StrCat("r", 4000 + i - 1)) << rows[i];
    EXPECT_EQ(cells[2], labelled[i - 1]) << rows[i];  // The same scores as with the labels.
  }
  r = RunTrainer({"predict", "--model=" + dir + "/model", "--input=" + unlabelled, "--keep=id,nope"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "kept column 'nope' is not in the header")) << r.out;
  // eval needs the labels.
  r = RunTrainer({"eval", "--model=" + dir + "/model", "--input=" + unlabelled});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "csv column 'click' is not in the header")) << r.out;
  r = RunTrainer({"export", "--config=" + job, "--out=" + dir + "/again"});
  EXPECT_EQ(r.code, 0) << r.out;
  r = RunTrainer({"predict", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "usage: custom_trainer predict")) << r.out;
  r = RunTrainer({"--help"});
  EXPECT_TRUE(absl::StrContains(r.out, "custom_trainer worker|ps|loader|predict|eval|export --help")) << r.out;

  const hyrec::testing::CommandResult other = hyrec::testing::RunCommand(
      {HYREC_LAUNCHER_BINARY, "predict", "--model=" + dir + "/model", "--input=" + data + "clicks_test.csv"});
  EXPECT_EQ(other.code, 2) << other.all();
  EXPECT_TRUE(absl::StrContains(other.err, "model.kind 'tiny_two_tower' is not a registered model")) << other.err;
  EXPECT_TRUE(absl::StrContains(other.err, "score this export with the program that trained it")) << other.err;
  std::filesystem::remove_all(dir);
}

TEST(ModelRegistry, ModelFailuresAreErrorsWithTheirExitCodes) {
  // A shape error in forward: invalid input (2), naming the batch and the model.
  Outcome r = RunTrainer({"--config=" + Job("bad", "model: {kind: bad_shape}\n"), "--plot="});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "batch 0: forward of model 'bad_shape'")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "cannot be multiplied")) << r.out;
  // The same in a worker thread of an embedded job with two workers (once std::terminate).
  r = RunTrainer({"--config=" + Job("bad_two", "model: {kind: bad_shape}\n", 2), "--plot="});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "forward of model 'bad_shape'")) << r.out;
  // An allocation that fails while the model is built: transient (3), the next machine may do.
  r = RunTrainer({"--config=" + Job("huge", "model: {kind: huge}\n"), "--plot="});
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "building model 'huge'")) << r.out;
  // The model's own settings are checked by its factory.
  r = RunTrainer({"--config=" + Job("options", "model: {kind: tiny_two_tower, options: {widht: 3}}\n"), "--plot="});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "model.options.widht")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "did you mean 'width'?")) << r.out;
  // An unknown kind is refused before anything starts, naming what there is.
  r = RunTrainer({"--config=" + Job("unknown", "model: {kind: three_tower}\n"), "--plot="});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out,
                                "model.kind 'three_tower' is not a registered model (bad_shape, dcn, deepfm, dlrm, "
                                "fm, huge, lr, tiny_two_tower, torchscript, wide_deep)"))
      << r.out;
}

TEST(ModelRegistry, RegistersOnceAndBuildsFromThePlan) {
  EXPECT_TRUE(IsRegisteredModel("dlrm"));
  EXPECT_TRUE(IsRegisteredModel("dcn"));
  EXPECT_EQ(RegisterModel("dlrm",
                          [](const ModelContext&) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
                            return absl::InternalError("never");
                          })
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(RegisterModel("", nullptr).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(RegisterModel("refuses", [](const ModelContext& c) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
                return absl::InvalidArgumentError(absl::StrCat("needs 2 features, has ", c.slot_dims.size()));
              }).ok());
  ASSERT_TRUE(RegisterModel("throws", [](const ModelContext&) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
                throw std::runtime_error("a user's exception");
              }).ok());
  auto plan = job::Plan(*job::ParseJobSpecText(std::string(kData) + "model: {kind: refuses}\n", "job.yaml"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto made = MakeModel(plan->workers[0]);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(made.status().message(), "building model 'refuses': needs 2 features, has 3");
  plan->workers[0].model.kind = "throws";
  made = MakeModel(plan->workers[0]);
  EXPECT_EQ(made.status().message(), "building model 'throws': a user's exception");
  plan->workers[0].model.kind = "dlrm";
  ModelContext c = ContextFor(plan->workers[0]);
  EXPECT_EQ(c.feature_names, (std::vector<std::string>{"user", "item", "category"}));
  EXPECT_EQ(c.slot_dims, (std::vector<int>{16, 16, 16}));
  EXPECT_EQ(c.num_dense, 4);
  EXPECT_TRUE(c.options.IsMap());
  made = MakeModel(plan->workers[0]);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_GT((*made)->parameters().size(), 4u);
}

// One training step of `model` with `optimizer` on a fixed batch.
void Step(DenseModelImpl& model, torch::optim::Optimizer& optimizer, const ModelContext& c) {
  torch::manual_seed(11);
  const torch::Tensor dense = torch::randn({32, c.num_dense});
  std::vector<torch::Tensor> pooled;
  for (int d : c.slot_dims) pooled.push_back(torch::randn({32, d}));
  optimizer.zero_grad();
  model.forward(dense, pooled).sum().backward();
  optimizer.step();
}

std::string ModelBytes(DenseModelImpl& model) {
  torch::serialize::OutputArchive archive;
  model.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// A cut copies the dense state in the pause and serializes the copy later: the model's bytes
// are those Module::save writes at the copy, whatever training does after it, and the copy
// resumes a model and optimizer to continue exactly as the original, for every built-in model
// and dense optimizer.
TEST(DenseCopy, SerializesLaterWhatTheModelAndOptimizerHeldAtTheCopy) {
  for (const std::string kind : {"dlrm", "dcn", "deepfm", "wide_deep", "fm", "lr"}) {
    for (const std::string opt : {"adam", "adamw", "adagrad", "sgd"}) {
      SCOPED_TRACE(kind + " with " + opt);
      auto plan = job::Plan(
          *job::ParseJobSpecText(absl::StrCat(kData, "model: {kind: ", kind, "}\ntrain: {dense_optimizer: {kind: ", opt,
                                              opt == "sgd" ? ", momentum: 0.9" : "", "}}\n"),
                                 "job.yaml"));
      ASSERT_TRUE(plan.ok()) << plan.status();
      const job::WorkerPlan& w = plan->workers[0];
      const ModelContext c = ContextFor(w);
      auto make = [&]() {
        std::shared_ptr<DenseModelImpl> model = *MakeModel(w);
        std::unique_ptr<torch::optim::Optimizer> optimizer =
            *MakeDenseOptimizer(w.dense_optimizer, model->parameters());
        return std::make_pair(model, std::move(optimizer));
      };
      auto [model, optimizer] = make();
      Step(*model, *optimizer, c);
      const std::string at_copy = ModelBytes(*model);
      absl::StatusOr<std::shared_ptr<const DenseCopy>> copy = CopyDenseState(*model, optimizer.get(), TrainState());
      ASSERT_TRUE(copy.ok()) << copy.status();
      Step(*model, *optimizer, c);  // Training goes on before the copy is serialized.
      absl::StatusOr<DenseState> state = SerializeDenseCopy(**copy);
      ASSERT_TRUE(state.ok()) << state.status();
      EXPECT_TRUE(state->model == at_copy);
      auto [resumed, resumed_optimizer] = make();
      ASSERT_TRUE(ApplyDenseState(*state, *resumed, resumed_optimizer.get(), /*restore_rng=*/false).ok());
      Step(*resumed, *resumed_optimizer, c);
      EXPECT_TRUE(ModelBytes(*resumed) == ModelBytes(*model)) << "the resumed step differs";
    }
  }
}

}  // namespace
}  // namespace hyrec::dense_worker
