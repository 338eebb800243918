// A dense model written in Python: examples/python_model/model.py scripts its module with
// Debian's python3-torch and writes its job; `hyrec train` trains it (embedded, then resumed
// under --processes), exports it as TorchScript again, and `hyrec predict` and `hyrec eval` score
// the export, eval reproducing the run's AUC. Python loads the export's module.pt back with
// torch.jit.load. A module whose forward does not fit the job is refused before training, naming
// model.path and what is wrong.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "run_command.h"

namespace {

using hyrec::testing::CommandResult;
using hyrec::testing::RunCommand;

CommandResult Hyrec(std::vector<std::string> args) {
  args.insert(args.begin(), HYREC_LAUNCHER_BINARY);
  return RunCommand(args);
}

CommandResult Python(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {HYREC_PYTHON};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

using hyrec::testing::ReportField;
using hyrec::testing::Unquote;

class TorchScriptModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/torchscript_model_test";
    std::filesystem::remove_all(dir_);
    const CommandResult torch = Python({"-c", "import torch; print(torch.__version__)"});
    ASSERT_EQ(torch.code, 0) << HYREC_PYTHON " cannot import torch (tools/test installs python3-torch): "
                             << torch.all();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(TorchScriptModel, TrainsResumesExportsAndIsScoredLikeABuiltInModel) {
  CommandResult r = Python({HYREC_SOURCE_DIR "/examples/python_model/model.py", "--out=" + dir_, "--epochs=2"});
  ASSERT_EQ(r.code, 0) << r.all();
  const std::string job = dir_ + "/job.yaml";
  const std::string report = dir_ + "/report.yaml";
  const std::string test = HYREC_SOURCE_DIR "/examples/data/clicks_test.csv";
  r = Hyrec({"train", "--config=" + job, "--plot=", "--progress=lines", "--report=" + report});
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "hyrec train: torchscript, 1 worker(s)")) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), "8000");
  double first_auc = 0;
  ASSERT_TRUE(absl::SimpleAtod(ReportField(report, "auc"), &first_auc)) << r.all();
  EXPECT_GT(first_auc, 0.65) << r.all();

  // Two more epochs, resumed from the checkpoint with two workers, every role a process.
  r = Hyrec({"train", "--config=" + job, "--processes", "--resume=latest", "--set=loader.epochs=4",
             "--set=train.workers=2", "--plot=", "--progress=lines", "--report=" + report});
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "resumed from step")) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), "16000");
  double trained_auc = 0;
  ASSERT_TRUE(absl::SimpleAtod(ReportField(report, "auc"), &trained_auc)) << r.all();
  EXPECT_GT(trained_auc, 0.65) << r.all();
  const std::string exported = Unquote(ReportField(report, "export"));
  ASSERT_TRUE(std::filesystem::exists(exported + "/module.pt")) << exported;

  r = Hyrec({"eval", "--model=" + exported, "--input=" + test});
  ASSERT_EQ(r.code, 0) << r.all();
  double auc = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "auc: %lf", &auc), 1) << r.out;
  // The export is the best held-out evaluation's model (which may be the final one).
  EXPECT_EQ(ReportField(report, "export_reason"), "best_evaluation");
  double best_auc = 0;
  ASSERT_TRUE(absl::SimpleAtod(ReportField(report, "best_auc"), &best_auc));
  EXPECT_GE(best_auc, trained_auc);
  EXPECT_NEAR(auc, best_auc, 1e-6) << r.all();
  r = Hyrec({"predict", "--model=" + dir_ + "/export", "--input=" + test});
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(r.out, '\n', absl::SkipEmpty())).size(), 1000u);

  // The export's module is TorchScript with the trained parameters: Python loads it and scores
  // samples with it (two samples of zeros, one logit each).
  r = Python(
      {"-c", absl::StrCat("import torch\n", "m = torch.jit.load(\"", exported, "/module.pt\")\n",
                          "dims = [8, 8, 4, 8, 8]\n", "out = m(torch.zeros(2, 2), [torch.zeros(2, d) for d in dims])\n",
                          "assert out.shape == (2,), out.shape\n", "print(\"scored\", out.shape[0])\n")});
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(r.out, "scored 2")) << r.all();
}

// What hyrec says, before training, of a module that does not fit the job.
TEST_F(TorchScriptModel, AModuleThatDoesNotFitTheJobIsRefusedNamingWhatIsWrong) {
  CommandResult r = Python({HYREC_SOURCE_DIR "/examples/python_model/model.py", "--out=" + dir_, "--epochs=1"});
  ASSERT_EQ(r.code, 0) << r.all();
  const std::string job = dir_ + "/job.yaml";
  const auto write = [&](const std::string& name, const std::string& forward) {
    const std::string path = dir_ + "/" + name + ".pt";
    const std::string script = dir_ + "/" + name + ".py";  // torch.jit.script reads the source file.
    std::ofstream(script) << "import torch\nfrom typing import List\nfrom torch import Tensor\n"
                          << "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                          << "        self.linear = torch.nn.Linear(2, 1)\n"
                          << forward << "torch.jit.save(torch.jit.script(M()), \"" << path << "\")\n";
    const CommandResult made = Python({script});
    EXPECT_EQ(made.code, 0) << made.all();
    return path;
  };
  const std::string one_argument =
      write("one_argument", "    def forward(self, dense: Tensor) -> Tensor:\n        return self.linear(dense)\n");
  const std::string two_logits = write("two_logits",
                                       "    def forward(self, dense: Tensor, pooled: List[Tensor]) -> Tensor:\n"
                                       "        return torch.cat([self.linear(dense), self.linear(dense)], 1)\n");
  const std::string wrong_width = write("wrong_width",
                                        "    def forward(self, dense: Tensor, pooled: List[Tensor]) -> Tensor:\n"
                                        "        return self.linear(torch.cat([dense] + pooled, 1)).squeeze(1)\n");
  struct Case {
    std::string path, says;
  };
  for (const Case& c : std::vector<Case>{
           {one_argument,
            "its forward takes 1 argument(s), not 2; hyrec calls forward(self, dense: Tensor, "
            "pooled: List[Tensor]) -> Tensor"},
           {two_logits,
            "samples of the job's 2 dense feature(s) and 5 slot(s) of dims [8, 8, 4, 8, 8] returned a tensor of shape "
            "[2, 2]; one logit a sample ([2] or [2, 1]) was expected"},
           {wrong_width,
            "a forward pass on 2 samples of the job's 2 dense feature(s) and 5 slot(s) of dims [8, 8, 4, "
            "8, 8]"},
           {dir_ + "/missing.pt", "cannot open it"},
           {job, "is not a TorchScript file"},
       }) {
    r = Hyrec({"train", "--config=" + job, "--set=model.path=" + c.path, "--plot="});
    EXPECT_EQ(r.code, 2) << c.path << ": " << r.all();
    EXPECT_TRUE(absl::StrContains(r.all(), "model.path '" + c.path + "'")) << r.all();
    EXPECT_TRUE(absl::StrContains(r.all(), c.says)) << r.all();
  }
  r = Hyrec({"train", "--config=" + job, "--set=model.kind=dlrm", "--plot="});
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "model.path")) << r.all();
  EXPECT_TRUE(absl::StrContains(r.all(), "is read only with model.kind: torchscript")) << r.all();
}

}  // namespace
