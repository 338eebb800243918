// The command line as a user meets it: every role's --help and --version, the documented exit
// codes (0 success, 2 invalid configuration or input, 3 transient, 130 interrupted), misspelled
// flags and bad values, job files of every wrong shape, and Ctrl-C on a running `hyrec train`.
#include <signal.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "run_command.h"

namespace {

using Outcome = hyrec::testing::CommandResult;
using hyrec::testing::RunCommand;

Outcome Hyrec(std::vector<std::string> args) {
  args.insert(args.begin(), HYREC_LAUNCHER_BINARY);
  return RunCommand(args);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/cli_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Cli, TheLauncherListsRolesAndItsVersion) {
  Outcome r = Hyrec({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* role : {"train", "ps", "loader", "worker", "ps-demo"}) {
    EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("  ", role, " "))) << role << "\n" << r.out;
  }
  EXPECT_TRUE(absl::StrContains(r.out, "exit codes: 0 success")) << r.out;
  r = Hyrec({"--version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "hyrec 0.")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "(" HYREC_BUILD_TYPE ")")) << r.out;
  r = Hyrec({});
  EXPECT_EQ(r.code, 2);
  r = Hyrec({"trian"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "unknown role 'trian'; did you mean 'train'?")) << r.err;
}

TEST(Cli, EveryRoleHasHelpVersionAndTheCommonFlags) {
  for (const char* role : {"train", "ps", "loader", "worker", "ps-demo"}) {
    Outcome r = Hyrec({role, "--help"});
    EXPECT_EQ(r.code, 0) << role << ": " << r.err;
    EXPECT_TRUE(absl::StartsWith(r.out, absl::StrCat("usage: hyrec ", role, " [flags]\n"))) << r.out;
    for (const char* flag : {"--log_level=", "--metrics_host=", "--metrics_port=", "--help", "--version"}) {
      EXPECT_TRUE(absl::StrContains(r.out, flag)) << role << " lacks " << flag << "\n" << r.out;
    }
    EXPECT_TRUE(absl::StrContains(r.out, "exit codes: 0 success")) << r.out;
    EXPECT_FALSE(absl::StrContains(r.out + r.err, "No flags matched")) << r.out;
    r = Hyrec({role, "--version"});
    EXPECT_EQ(r.code, 0) << role;
    EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("hyrec ", role, " 0."))) << r.out;
  }
}

TEST(Cli, BadFlagsAreInvalidInputWithASuggestion) {
  Outcome r = Hyrec({"train", "--confg=job.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "unknown flag --confg; did you mean --config?")) << r.err;
  r = Hyrec({"worker", "--config=x", "--log_level=wran"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err,
                                "--log_level=wran: not one of trace, debug, info, warn, error, critical, off; "
                                "did you mean 'warn'?"))
      << r.err;
  r = Hyrec({"loader", "--metrics_port=abc"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--metrics_port=abc: not an integer")) << r.err;
  r = Hyrec({"ps", "--metrics_port=-2"});
  EXPECT_EQ(r.code, 2);
  r = Hyrec({"ps-demo", "--shards=0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--shards=0: not in [1, 64]")) << r.err;
  r = Hyrec({"train", "job.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "unexpected argument 'job.yaml'")) << r.err;
  r = Hyrec({"train", "--config"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--config needs a value")) << r.err;
  r = Hyrec({"train"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--config=JOB.yaml is required")) << r.err;
  r = Hyrec({"train", "--config=/nonexistent/job.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot open config file '/nonexistent/job.yaml'")) << r.err;
  r = Hyrec({"train", "--config=x.yaml", "--ps_latency_ms=5"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--ps_latency_ms needs --processes")) << r.err;
}

// Job files that once aborted `hyrec train` (exit 134) or trained on a file named "null".
TEST(Cli, BadJobFilesAreInvalidInputNamingTheKeyAndLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"loader:\n  source:\n    format: criteo\n    files: [[a]]\n",
       "loader.source.files[0] (line 4): expected a plain value, found a list"},
      {"loader:\n  source:\n    format: criteo\n    files: [~]\n",
       "loader.source.files[0] (line 4): empty entry (~ or nothing)"},
      {"loader:\n  source: {format: criteo, files: [a.tsv]}\neval:\n  files: [{x: 1}]\n",
       "eval.files[0] (line 4): expected a plain value, found a mapping"},
      {"loader:\n  source: {format: synthetic}\nmodel:\n  bottom: [100000, 100000]\n",
       "model.bottom[0] (line 4): 100000 is not in [1, 65536]"},
      {"loader:\n  source: {format: synthetic}\nmodel:\n  bottom: [60000, 60000]\n  top: [60000]\n",
       "dense parameters, more than"},
      {"loader:\n  source: {format: synthetic}\nmodel: {kind: dlrm\n", "YAML syntax error"},
      {"loader:\n  source: {format: synthetic}\ntrain: {workers: two}\n", "train.workers (line 3): cannot read 'two'"},
      {"loader:\n  source: {format: synthetic}\ntrain: {device: gpu}\n",
       "train.device (line 3): 'gpu' is not cpu, cuda or auto"},
      {"loader:\n  source: {format: synthetic}\nmodel: {embeding_dim: 8}\n",
       "model.embeding_dim (line 3): unknown key; did you mean 'embedding_dim'?"},
  };
  for (size_t k = 0; k < std::size(cases); ++k) {
    const auto& [text, expected] = cases[k];
    const std::string path = WriteFile("bad.yaml", text);
    // Every role reads the job through the same plan; all four are tried on the first cases.
    const std::vector<std::string> roles =
        k < 3 ? std::vector<std::string>{"train", "worker", "ps", "loader"} : std::vector<std::string>{"train"};
    for (const std::string& role : roles) {
      Outcome r = Hyrec({role, "--config=" + path});
      EXPECT_EQ(r.code, 2) << role << ": " << text << r.err;
      EXPECT_TRUE(absl::StrContains(r.err, expected)) << role << ": " << text << "\n" << r.err;
      EXPECT_TRUE(absl::StrContains(r.err, path) || absl::StrContains(r.err, "cli_bad.yaml")) << r.err;
    }
  }
}

TEST(Cli, ALostPeerIsTransient) {
  const std::string job = WriteFile("peer.yaml", "loader:\n  source: {format: synthetic}\n");
  const int dead = hyrec::PickFreeLoopbackPort();
  const absl::Time start = absl::Now();
  Outcome r = Hyrec({"worker", "--config=" + job, absl::StrCat("--ps=127.0.0.1:", dead, ",127.0.0.1:", dead),
                     absl::StrCat("--loader=127.0.0.1:", dead)});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// A job long enough to be interrupted.
std::string LongJob() {
  return WriteFile("long.yaml", R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 50000000, vocabulary: 1000}
  batch_size: 256
  threads: 1
eval: {samples: 2000}
model: {bottom: [16], top: [16]}
train: {workers: 2, log_every_batches: 10}
)");
}

// Starts `hyrec train` in a process group of its own (as a shell does) and waits for training.
std::unique_ptr<hyrec::Subprocess> StartTraining(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {HYREC_TRAIN_BINARY, "--config=" + LongJob(), "--progress=lines", "--plot="};
  argv.insert(argv.end(), extra.begin(), extra.end());
  hyrec::SpawnOptions options;
  options.new_process_group = true;
  auto p = hyrec::Subprocess::Spawn(argv, options);
  EXPECT_TRUE(p.ok());
  for (;;) {
    auto line = (*p)->ReadLine(absl::Seconds(60));
    EXPECT_TRUE(line.ok()) << line.status();
    if (!line.ok() || absl::StartsWith(*line, "samples ")) break;
  }
  return std::move(*p);
}

// Ctrl-C: the terminal sends SIGINT to the whole foreground group.
void ControlC(hyrec::Subprocess& p) { kill(-p.pid(), SIGINT); }

void ExpectInterruptedSummary(hyrec::Subprocess& p) {
  bool summary = false;
  for (;;) {
    auto line = p.ReadLine(absl::Seconds(60));
    if (!line.ok()) break;
    if (absl::StartsWith(*line, "summary: ")) {
      summary = true;
      EXPECT_TRUE(absl::StrContains(*line, "(interrupted: stopped after the current batch)")) << *line;
    }
  }
  EXPECT_TRUE(summary);
  auto code = p.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 130);
}

TEST(Cli, ControlCStopsAfterTheCurrentBatchWithASummary) {
  auto embedded = StartTraining({});
  ControlC(*embedded);
  ExpectInterruptedSummary(*embedded);
  auto processes = StartTraining({"--processes"});
  ControlC(*processes);
  ExpectInterruptedSummary(*processes);
}

TEST(Cli, ASecondControlCStopsAtOnce) {
  auto p = StartTraining({});
  ControlC(*p);
  absl::SleepFor(absl::Milliseconds(200));  // Two signals sent at once may arrive as one.
  ControlC(*p);
  const absl::Time start = absl::Now();
  auto code = p->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 130);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
