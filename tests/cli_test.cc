// The command line as a user meets it: every role's --help and --version, the documented exit
// codes (0 success, 2 invalid configuration or input, 3 transient, 130 interrupted), misspelled
// flags and bad values, job files of every wrong shape, and Ctrl-C on a running `hyrec train`.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "child_processes.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/process_info.h"
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
  for (const char* role :
       {"train", "ps", "loader", "worker", "k8s", "checkpoint", "export", "predict", "eval", "ps-demo"}) {
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

// A port another process holds: the role says which key or flag set it.
TEST(Cli, APortInUseNamesTheSettingThatChoseIt) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string taken = std::to_string(ntohs(address.sin_port));
  const std::string job = WriteFile("port_in_use.yaml", absl::StrCat(R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 1000, num_slots: 2, vocabulary: 100}
ps: {shards: 1}
security: {mode: none}
cluster: {ps: ["127.0.0.1:)",
                                                                     taken, R"("], loader: "127.0.0.1:)", taken, R"("}
)"));
  struct Case {
    std::vector<std::string> args;
    std::string setting;
  };
  for (const Case& c : std::vector<Case>{
           {{"ps", "--config=" + job, "--shard_index=0"}, "the port is set by cluster.ps[0] in " + job},
           {{"ps", "--config=" + job, "--shard_index=0", "--port=" + taken}, "the port is set by --port;"},
           {{"loader", "--config=" + job}, "the port is set by cluster.loader in " + job},
           {{"ps", "--config=" + job, "--shard_index=0", "--port=0", "--metrics_port=" + taken},
            "the port is set by --metrics_port"},
           {{"ps", "--config=" + job, "--shard_index=0", "--port=0", "--health_port=" + taken},
            "(--health_host, --health_port)"}}) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    const Outcome r = Hyrec(c.args);
    EXPECT_EQ(r.code, 3) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.setting)) << r.err;
  }
  ::close(fd);
}

TEST(Cli, EveryRoleHasHelpVersionAndTheCommonFlags) {
  for (const char* role : {"train", "ps", "loader", "worker", "export", "predict", "eval", "ps-demo"}) {
    Outcome r = Hyrec({role, "--help"});
    EXPECT_EQ(r.code, 0) << role << ": " << r.err;
    EXPECT_TRUE(absl::StartsWith(r.out, absl::StrCat("usage: hyrec ", role, " [flags]\n"))) << r.out;
    // The one-shot tools serve no metrics, so they take no metrics flags.
    const std::string name = role;
    const bool one_shot = name == "export" || name == "predict" || name == "eval";
    for (const char* flag : {"--log_level=", "--metrics_host=", "--metrics_port=", "--help", "--version"}) {
      const bool metrics = absl::StrContains(flag, "metrics");
      EXPECT_EQ(absl::StrContains(r.out, flag), !(one_shot && metrics)) << role << ", " << flag << "\n" << r.out;
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
  r = Hyrec({"k8s", "render", "--image_variant=rocm"});  // An enum flag, from its name table.
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--image_variant=rocm: not one of cpu, cuda")) << r.err;
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
  // hyrec plan: an unknown machine type names its flag; a plan without step costs says how to
  // get them.
  const std::string job = HYREC_SOURCE_DIR "/examples/configs/synthetic.yaml";
  r = Hyrec({"plan", "--config=" + job, "--measure_batches=1", "--worker_machine=a2-higgpu-1g"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err,
                                "--worker_machine=a2-higgpu-1g: not a machine type hyrec knows (did you "
                                "mean a2-highgpu-1g?)"))
      << r.err;
  r = Hyrec({"plan", "--config=" + job, "--measure_batches=1", "--calibration=/nonexistent/calibration.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "/nonexistent/calibration.yaml")) << r.err;
  r = Hyrec({"plan", "--config=" + job, "--measure_batches=1"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "throughput: not predicted; hyrec plan --calibrate --config=JOB")) << r.out;
}

// `hyrec certs --k8s` into a folder made for a smaller job names the missing identity and the
// ways out, instead of failing on the file it cannot read; with --add it signs them.
TEST(Cli, CertsForKubernetesFromAnotherJobsFolderNameWhatIsMissing) {
  const std::string dir = ::testing::TempDir() + "/cli_certs_smaller_job";
  std::filesystem::remove_all(dir);
  const std::string one = WriteFile("one_worker.yaml", "loader:\n  source: {format: synthetic}\n");
  const std::string cluster = HYREC_SOURCE_DIR "/examples/configs/cluster.yaml";  // Two workers.
  Outcome r = Hyrec({"certs", "--dir=" + dir, "--config=" + one});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Hyrec({"certs", "--dir=" + dir, "--config=" + cluster, "--k8s=user-item"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "holds a CA but no " + dir + "/worker-1.pem")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--add, or give a new --dir")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/k8s-secrets.yaml"));
  r = Hyrec({"certs", "--dir=" + dir, "--config=" + cluster, "--k8s=user-item", "--add"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/k8s-secrets.yaml"));
  std::filesystem::remove_all(dir);
}

// `hyrec certs --add` under a CA whose files were damaged is invalid input naming the file, not
// an unexpected failure (exit 1) quoting OpenSSL alone.
TEST(Cli, CertsAddUnderADamagedCaNamesTheFile) {
  const std::string dir = ::testing::TempDir() + "/cli_certs_damaged_ca";
  std::filesystem::remove_all(dir);
  ASSERT_EQ(Hyrec({"certs", "--dir=" + dir, "--workers=1", "--ps=1"}).code, 0);
  for (const std::string name : {"ca.key", "ca.pem"}) {
    SCOPED_TRACE(name);
    const std::string path = dir + "/" + name;
    std::ifstream in(path);
    const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::trunc) << "garbage";
    const Outcome r = Hyrec({"certs", "--dir=" + dir, "--add", "--workers=2", "--ps=1"});
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, path + " is not a PEM")) << r.err;
    std::ofstream(path, std::ios::trunc) << kept;
  }
  EXPECT_EQ(Hyrec({"certs", "--dir=" + dir, "--add", "--workers=2", "--ps=1"}).code, 0);
  std::filesystem::remove_all(dir);
}

// hyrec plan takes a PS process's memory from a calibration file, and --process_bytes over it.
TEST(Cli, PlanTakesTheCalibrationAndAFlagOverIt) {
  const std::string job = HYREC_SOURCE_DIR "/examples/configs/synthetic.yaml";
  const std::string calibration = WriteFile("calibration.yaml", "machine: here\ncpus: 2\nprocess_bytes: 23000000\n");
  Outcome r = Hyrec({"plan", "--config=" + job, "--measure_batches=1", "--json", "--calibration=" + calibration});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "\"process_bytes\":23000000,")) << r.out;
  r = Hyrec({"plan", "--config=" + job, "--measure_batches=1", "--json", "--calibration=" + calibration,
             "--process_bytes=1000000000"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "\"process_bytes\":1000000000,")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "\"process_bytes\":23000000,")) << r.out;
}

// `hyrec k8s render --out` writes its file whole or not at all: a write that fails (a full disk;
// here the temporary file cannot be made) leaves the previous render as it was.
TEST(Cli, AFailedRenderLeavesThePreviousFileWhole) {
  const std::string dir = ::testing::TempDir() + "/cli_render_out";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/user-item.yaml.tmp");
  std::ofstream(dir + "/user-item.yaml") << "the previous render\n";
  const std::vector<std::string> render = {"k8s",
                                           "render",
                                           "--config=" HYREC_SOURCE_DIR "/examples/configs/cluster.yaml",
                                           "--name=user-item",
                                           "--image=registry.example/hyrec@sha256:" + std::string(64, '0'),
                                           "--out=" + dir};
  Outcome r = Hyrec(render);
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "--out")) << r.all();
  std::ifstream previous(dir + "/user-item.yaml");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(previous), {}), "the previous render\n");
  std::filesystem::remove_all(dir + "/user-item.yaml.tmp");
  r = Hyrec(render);
  EXPECT_EQ(r.code, 0) << r.all();
  std::ifstream rendered(dir + "/user-item.yaml");
  EXPECT_TRUE(absl::StartsWith(std::string(std::istreambuf_iterator<char>(rendered), {}), "# hyrec job 'user-item'"));
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
      {"loader:\n  source: {format: synthetic}\nps: {learning_rate: .inf}\n",
       "ps.learning_rate (line 3): must be finite and > 0"},
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
  // A path to something that is not a job file is read only so far.
  for (const std::string role : {"train", "plan", "ps"}) {
    Outcome r = Hyrec({role, "--config=/dev/zero"});
    EXPECT_EQ(r.code, 2) << role << ": " << r.all();
    EXPECT_TRUE(absl::StrContains(r.err, "config file '/dev/zero' holds more than 16777216 bytes")) << r.all();
  }
}

TEST(Cli, ALostPeerIsTransient) {
  // A worker waits for its peers (still starting, or restoring) up to the job's startup timeout.
  const std::string job = WriteFile(
      "peer.yaml",
      "loader:\n  source: {format: synthetic}\nsecurity: {mode: none}\ncluster: {startup_timeout_seconds: 5}\n");
  const int dead = hyrec::PickFreeLoopbackPort();
  const absl::Time start = absl::Now();
  Outcome r = Hyrec({"worker", "--config=" + job, absl::StrCat("--ps=127.0.0.1:", dead, ",127.0.0.1:", dead),
                     absl::StrCat("--loader=127.0.0.1:", dead)});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "cluster.startup_timeout_seconds")) << r.err;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// A job long enough to be interrupted, with `extra` keys (written to `name`).
std::string LongJob(const std::string& extra = "", const std::string& name = "long.yaml") {
  return WriteFile(name, R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 50000000, vocabulary: 1000}
  batch_size: 256
  threads: 1
eval: {samples: 2000}
model: {bottom: [16], top: [16]}
train: {workers: 2, log_every_batches: 10}
)" + extra);
}

// Starts `hyrec train` on `job` in a process group of its own (as a shell does) and waits for
// training.
std::unique_ptr<hyrec::Subprocess> StartTraining(const std::vector<std::string>& extra,
                                                 const std::string& job = LongJob()) {
  std::vector<std::string> argv = {HYREC_TRAIN_BINARY, "--config=" + job, "--progress=lines", "--plot="};
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
    // Every worker stops after its batch and exits 130: none is reported as failed or killed.
    EXPECT_FALSE(absl::StrContains(*line, " failed (") || absl::StrContains(*line, "killed by signal")) << *line;
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

// A libsvm file with a learnable label: a user and an item id per line.
std::string WriteLibsvm(const std::string& name, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string text;
  for (int i = 0; i < n; ++i) {
    const int user = static_cast<int>(rng() % 30), item = static_cast<int>(rng() % 40);
    const double logit = (user % 3 == 0 ? 1.5 : -0.8) + (item % 4 == 0 ? 1.5 : -0.6);
    const int label = std::uniform_real_distribution<double>(0, 1)(rng) < 1 / (1 + std::exp(-logit)) ? 1 : 0;
    absl::StrAppend(&text, label, " ", 1 + user, ":1 ", 100 + item, ":1\n");
  }
  return WriteFile(name, text);
}

using hyrec::testing::ReportField;
using hyrec::testing::Unquote;

// The whole life of a trained model from the command line: `hyrec train --processes` leaves
// checkpoints and an export; a run with other shard and worker counts resumes from the newest;
// `hyrec checkpoint` inspects and verifies (its exit code naming what is wrong); `hyrec predict`
// and `hyrec eval` use the export; and every bad path, flag or file is exit 2 with a message.
TEST(Cli, TrainResumeInspectPredictAndEval) {
  const std::string dir = ::testing::TempDir() + "/cli_model";
  std::filesystem::remove_all(dir);
  const std::string train = WriteLibsvm("model_train.svm", 1024, 1);
  const std::string heldout = WriteLibsvm("model_heldout.svm", 256, 2);
  auto job = [&](int shards, int workers) {
    return WriteFile(absl::StrCat("model_", shards, "_", workers, ".yaml"),
                     absl::StrCat("loader:\n  source: {format: libsvm, files: [", train,
                                  "]}\n  batch_size: 64\n  threads: 1\n  epochs: 2\n", "eval: {files: [", heldout,
                                  "]}\n", "model: {kind: dlrm, embedding_dim: 4, bottom: [8], top: [8]}\n",
                                  "ps: {shards: ", shards, "}\ntrain: {workers: ", workers, "}\n", "checkpoint: {dir: ",
                                  dir, "/ckpt, every_steps: 4, keep_last: 2}\n", "export: {dir: ", dir, "/model}\n"));
  };
  const std::string report = dir + "_report.yaml";
  Outcome r = RunCommand({HYREC_TRAIN_BINARY, "--processes", "--config=" + job(2, 2), "--plot=", "--report=" + report});
  ASSERT_EQ(r.code, 0) << r.all();
  const std::string checkpoint = Unquote(ReportField(report, "checkpoint"));
  const std::string exported = Unquote(ReportField(report, "export"));
  ASSERT_FALSE(checkpoint.empty()) << r.all();
  ASSERT_FALSE(exported.empty()) << r.all();
  EXPECT_EQ(ReportField(report, "samples"), "2048");
  const std::string trained_auc_text = ReportField(report, "best_auc");  // The exported model's.
  // keep_last 2: the older checkpoints are gone; the shards' update logs live beside them.
  int kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/ckpt")) {
    kept += e.is_directory() && absl::StartsWith(e.path().filename().string(), "ckpt-") ? 1 : 0;
  }
  EXPECT_EQ(kept, 2);
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/update-log/ps-1"));

  r = Hyrec({"checkpoint", "verify", checkpoint});
  EXPECT_EQ(r.code, 0) << r.all();
  r = Hyrec({"checkpoint", "inspect", checkpoint});
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(r.out, "checkpoint at step 16 (2048 samples trained)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "2 PS shard(s), 2 worker(s)")) << r.out;

  // Resumed with 3 shards and 1 worker from the newest: nothing left to train, which the summary
  // says in one line (no export, no plot). A newer directory whose manifest is corrupt is passed
  // over, and the launcher says so.
  const std::string corrupt = dir + "/ckpt/ckpt-999999999999-0000000000000";
  std::filesystem::create_directories(corrupt);
  std::ofstream(corrupt + "/MANIFEST") << "not a manifest";
  r = RunCommand(
      {HYREC_TRAIN_BINARY, "--processes", "--config=" + job(3, 1), "--plot=", "--resume=latest", "--report=" + report});
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(
      r.out, "\nsummary: nothing left to train: resumed from step 16 (2048 samples), at the end of the data\n"))
      << r.out;
  EXPECT_FALSE(absl::StrContains(r.all(), "export")) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "passing over a checkpoint that does not verify: " + corrupt)) << r.err;
  std::filesystem::remove_all(corrupt);
  EXPECT_EQ(ReportField(report, "samples"), "2048");

  // Predict and eval on the export: one probability a line; eval's AUC is the run's.
  r = Hyrec({"predict", "--model=" + dir + "/model", "--input=" + heldout});
  ASSERT_EQ(r.code, 0) << r.all();
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 256u);
  for (const std::string& line : lines) {
    double p = 0;
    ASSERT_TRUE(absl::SimpleAtod(line, &p)) << line;
    EXPECT_TRUE(p > 0 && p < 1) << line;
  }
  // The same data without its labels scores the same; libsvm has no columns to keep.
  {
    std::ifstream in(heldout);
    std::ofstream out(heldout + ".unlabelled");
    for (std::string line; std::getline(in, line);) out << line.substr(line.find(' ') + 1) << "\n";
  }
  Outcome unlabelled = Hyrec({"predict", "--model=" + dir + "/model", "--input=" + heldout + ".unlabelled"});
  ASSERT_EQ(unlabelled.code, 0) << unlabelled.all();
  EXPECT_EQ(unlabelled.out, r.out);
  unlabelled = Hyrec({"predict", "--model=" + dir + "/model", "--input=" + heldout, "--keep=label"});
  EXPECT_EQ(unlabelled.code, 2) << unlabelled.all();
  EXPECT_TRUE(absl::StrContains(unlabelled.err, "kept columns are for csv and criteo sources, not libsvm"))
      << unlabelled.err;
  r = Hyrec({"eval", "--model=" + exported, "--input=" + heldout});
  ASSERT_EQ(r.code, 0) << r.all();
  double auc = 0, trained_auc = 0;
  ASSERT_TRUE(absl::SimpleAtod(trained_auc_text, &trained_auc));
  ASSERT_EQ(std::sscanf(r.out.c_str(), "auc: %lf", &auc), 1) << r.out;
  EXPECT_GT(auc, 0.6);
  EXPECT_NEAR(auc, trained_auc, 1e-6);  // The run evaluated the same model in memory.

  // Bad input: exit 2, saying what and where.
  r = Hyrec({"predict", "--input=" + heldout});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--model=DIR is required")) << r.err;
  r = Hyrec({"predict", "--model=" + dir + "/nothing", "--input=" + heldout});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "no valid checkpoint under")) << r.err;
  const std::string garbage = WriteFile("model_garbage.svm", "1 3:1\nthis is not libsvm\n");
  r = Hyrec({"predict", "--model=" + exported, "--input=" + garbage});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "model_garbage.svm:2")) << r.err;
  r = Hyrec({"export", "--config=" + job(2, 2), "--checkpoint=" + dir + "/nothing"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "not a committed checkpoint")) << r.err;
  r = Hyrec({"train", "--config=" + LongJob(), "--resume=latest"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "needs a checkpoint directory")) << r.err;
  r = Hyrec({"checkpoint", "inspect"});
  EXPECT_EQ(r.code, 2);
  r = Hyrec({"checkpoint", "verify", dir});
  EXPECT_EQ(r.code, 2) << r.all();
  // A regular file is not a checkpoint (2), not one whose manifest is corrupt (4).
  r = Hyrec({"checkpoint", "verify", job(2, 2)});
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "is a file, not a checkpoint")) << r.err;
  r = Hyrec({"train", "--config=" + dir});
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "is a directory, not a YAML file")) << r.err;

  // verify's exit code says what failed: a manifest (4), a file (5).
  const std::string copy = dir + "/copy";
  std::filesystem::copy(checkpoint, copy);
  auto flip = [](const std::string& path, size_t at) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x08));
  };
  flip(copy + "/dense.blk", 40);
  r = Hyrec({"checkpoint", "verify", copy});
  EXPECT_EQ(r.code, 5) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "dense.blk")) << r.err;
  r = RunCommand({HYREC_TRAIN_BINARY, "--config=" + job(2, 2), "--plot=", "--resume=" + copy});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "dense.blk: offset")) << r.err;
  flip(copy + "/MANIFEST", 30);
  r = Hyrec({"checkpoint", "verify", copy});
  EXPECT_EQ(r.code, 4) << r.all();
}

using hyrec::testing::ChildWith;

// What a launcher wrote on stdout until it exited, and its exit code (-1: it did not exit).
struct Ending {
  int code = -1;
  std::vector<std::string> lines;
  bool Contains(absl::string_view text) const {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return absl::StrContains(l, text); });
  }
  bool StartsWith(absl::string_view text) const {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return absl::StartsWith(l, text); });
  }
  std::string tail() const { return lines.empty() ? "" : lines.back(); }
};

Ending ReadToExit(hyrec::Subprocess& p) {
  Ending e;
  for (absl::StatusOr<std::string> line; (line = p.ReadLine(absl::Seconds(60))).ok();) e.lines.push_back(*line);
  auto code = p.Wait(absl::Seconds(30));
  EXPECT_TRUE(code.ok()) << code.status();
  if (code.ok()) e.code = *code;
  return e;
}

// Reads `p` until two progress lines have followed a line that contains `note` (the first may
// have been on its way before it), keeping what it read in `lines`; returns how many followed.
int ReadTwoProgressLinesAfter(hyrec::Subprocess& p, absl::string_view note, std::vector<std::string>* lines) {
  int progress = -1;
  for (absl::StatusOr<std::string> line; progress < 2 && (line = p.ReadLine(absl::Seconds(60))).ok();) {
    lines->push_back(*line);
    if (absl::StrContains(*line, note)) progress = 0;
    if (progress >= 0 && absl::StartsWith(*line, "samples ")) ++progress;
  }
  return progress;
}

// Whether a committed checkpoint (a directory with its MANIFEST) appears under `dir` in time.
bool AwaitCommittedCheckpoint(const std::string& dir, absl::Duration timeout) {
  for (const absl::Time until = absl::Now() + timeout; absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(50));
    if (!std::filesystem::exists(dir)) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (std::filesystem::exists(e.path() / "MANIFEST")) return true;
    }
  }
  return false;
}

// A worker that stops (SIGSTOP) under --processes: the launcher's watchdog kills it within its
// timeout instead of waiting on it. Worker 1 is then replaced and heals from worker 0; with
// heal off (train.heal_timeout_seconds: 0) the job fails as transient.
TEST(Cli, AStoppedWorkerIsKilledWithinTheWatchdogTimeout) {
  for (const bool heal : {true, false}) {
    SCOPED_TRACE(heal ? "heal" : "no heal");
    std::string job = LongJob();
    if (!heal) {
      std::ifstream in(job);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      job = WriteFile(
          "long_no_heal.yaml",
          absl::StrReplaceAll(text, {{"log_every_batches: 10}", "log_every_batches: 10, heal_timeout_seconds: 0}"}}));
    }
    auto p = StartTraining({"--processes", "--watchdog_seconds=8"}, job);
    const pid_t worker = ChildWith(p->pid(), "--rank=1");
    ASSERT_GT(worker, 0);
    const absl::Time stopped = absl::Now();
    ASSERT_EQ(kill(worker, SIGSTOP), 0);
    if (heal) {
      // Replaced, and training goes on: two progress lines after the note.
      std::vector<std::string> lines;
      EXPECT_EQ(ReadTwoProgressLinesAfter(*p, "worker 1 exited (killed by signal 9); restarting it to heal", &lines),
                2);
      ControlC(*p);
      ExpectInterruptedSummary(*p);
    } else {
      const Ending end = ReadToExit(*p);
      EXPECT_EQ(end.code, 3);
      EXPECT_TRUE(end.Contains("worker 1 made no progress"));
    }
    EXPECT_LT(absl::Now() - stopped, absl::Seconds(40));
    EXPECT_NE(kill(worker, 0), 0);  // It is gone, not left stopped.
  }
}

// A worker told to stop while it waits for its peers (the PS, the loader, the rendezvous) has
// nothing to finish: it exits at once as interrupted, not after its timeouts as a failure.
TEST(Cli, AWorkerStoppedBeforeTrainingExitsInterruptedAtOnce) {
  const std::string job = WriteFile("waiting.yaml", "loader:\n  source: {format: synthetic}\nsecurity: {mode: none}\n");
  const int dead = hyrec::PickFreeLoopbackPort();
  auto p = hyrec::Subprocess::Spawn({HYREC_WORKER_BINARY, "--config=" + job, "--rank=0",
                                     absl::StrCat("--ps=127.0.0.1:", dead, ",127.0.0.1:", dead),
                                     absl::StrCat("--loader=127.0.0.1:", dead)});
  ASSERT_TRUE(p.ok()) << p.status();
  // Its stop handler installed (the process catches SIGTERM: /proc's SigCgt mask), it waits for
  // the PS shards.
  const auto catches_sigterm = [pid = (*p)->pid()] {
    const absl::StatusOr<std::string> caught = hyrec::ProcessStatusField(pid, "SigCgt");
    uint64_t mask = 0;
    return caught.ok() && absl::SimpleHexAtoi(*caught, &mask) && (mask >> (SIGTERM - 1) & 1) != 0;
  };
  for (const absl::Time limit = absl::Now() + absl::Seconds(60); !catches_sigterm() && absl::Now() < limit;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(catches_sigterm());
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Time stopped = absl::Now();
  (*p)->Signal(SIGTERM);
  auto code = (*p)->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 130);
  EXPECT_LT(absl::Now() - stopped, hyrec::testing::Bounded(absl::Seconds(1)));  // Not the PS start-up's 600 s.
}

// Worker 0 killed (SIGKILL) under --processes, in a job without checkpoints: nothing can heal
// it (it hosts the group's rendezvous) and the launcher exits with a documented code
// (transient), naming the worker and the signal, not with the worker's 137.
TEST(Cli, AKilledWorkerZeroEndsTheJobAsTransientNamingIt) {
  auto p = StartTraining({"--processes"});
  const pid_t worker = ChildWith(p->pid(), "--rank=0");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  const Ending end = ReadToExit(*p);
  EXPECT_EQ(end.code, 3);
  EXPECT_TRUE(end.Contains("worker 0 failed (killed by signal 9)"));
}

// A PS shard killed (SIGKILL) under --processes with the job's update log: the launcher restarts
// it with --recover on its port, the worker waits for it, and the job finishes every sample.
TEST(Cli, AKilledPsShardIsRestartedAndTheJobFinishes) {
  const std::string dir = ::testing::TempDir() + "/cli_ps_restart";
  std::filesystem::remove_all(dir);
  const std::string job = WriteFile("restart.yaml", absl::StrCat(R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 204800, num_slots: 4, num_dense: 4, vocabulary: 400, ids_per_sample: 2}
  batch_size: 256
  threads: 1
eval: {samples: 2000}
model: {embedding_dim: 8, bottom: [16], top: [16]}
ps: {shards: 2}
train: {workers: 1, embedding_staleness: 2, log_every_batches: 50}
checkpoint: {dir: )",
                                                                 dir, R"(, every_steps: 200}
)"));
  auto p = StartTraining({"--processes"}, job);
  const pid_t shard = ChildWith(p->pid(), "--shard_index=1");
  ASSERT_GT(shard, 0);
  ASSERT_EQ(kill(shard, SIGKILL), 0);
  const Ending end = ReadToExit(*p);
  EXPECT_EQ(end.code, 0);
  EXPECT_TRUE(end.Contains("PS shard 1 exited (killed by signal 9); restarting it"));
  EXPECT_TRUE(end.Contains("PS shard 1 recovered and serves again"));
  EXPECT_TRUE(end.StartsWith("summary: 204800 samples"));
  std::filesystem::remove_all(dir);
}

// A job of 153,600 synthetic samples (300 steps of two batches of 256) with `rest` (its train
// section and more) after the data and the model.
std::string TwoWorkerJob(const std::string& name, const std::string& rest) {
  return WriteFile(name, absl::StrCat(R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 153600, num_slots: 4, num_dense: 4, vocabulary: 400, ids_per_sample: 2}
  batch_size: 256
  threads: 1
eval: {samples: 2000}
model: {embedding_dim: 8, bottom: [16], top: [16]}
)",
                                      rest));
}

// ps.update_log.max_bytes bounds what a recovery replays: with no other checkpoint schedule,
// worker 0 cuts a checkpoint whenever a shard says its log passed the bound, and each cut starts
// the logs over.
TEST(Cli, AShardsLogPastItsBoundCutsACheckpoint) {
  const std::string dir = ::testing::TempDir() + "/cli_log_bound";
  std::filesystem::remove_all(dir);
  const std::string job =
      TwoWorkerJob("log_bound.yaml",
                   absl::StrCat("train: {workers: 2}\nps: {update_log: {max_bytes: 1048576}}\ncheckpoint: {dir: ", dir,
                                "/ckpt, at_end: false, on_interrupt: false}\n"));
  const std::string report = dir + "/report.yaml";
  std::filesystem::create_directories(dir);
  const Outcome r =
      Hyrec({"train", "--config=" + job, "--processes", "--progress=lines", "--plot=", "--report=" + report});
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.all().find("update log holds"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("(ps.update_log.max_bytes 1048576): cutting one"), std::string::npos) << r.all();
  EXPECT_GE(std::stoi(ReportField(report, "checkpoints")), 2) << r.all();
  for (int shard = 0; shard < 2; ++shard) {  // What a recovery would replay now: about twice the bound at most.
    uint64_t logged = 0;
    for (const auto& e : std::filesystem::directory_iterator(absl::StrCat(dir, "/ckpt/update-log/ps-", shard))) {
      if (absl::EndsWith(e.path().string(), ".wal")) logged += e.file_size();
    }
    EXPECT_LT(logged, 3u * 1048576) << "shard " << shard;
  }
}

// `hyrec train` with its stdout into a pipe of one page that no one reads (a stopped `| tee`,
// Ctrl-S), in a process group of its own, its stderr into `err_path`.
struct UnreadOutput {
  pid_t pid = -1;
  int read_end = -1;  // Held open and never read.
  ~UnreadOutput() {
    if (read_end >= 0) close(read_end);
  }
  // The exit code within `timeout` (128 + the signal that ended it), or -1.
  int Wait(absl::Duration timeout) {
    for (const absl::Time until = absl::Now() + timeout; absl::Now() < until;) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
};
std::unique_ptr<UnreadOutput> TrainWithUnreadStdout(std::vector<std::string> args, const std::string& err_path) {
  auto run = std::make_unique<UnreadOutput>();
  int fds[2];
  if (pipe(fds) != 0) return run;
  fcntl(fds[0], F_SETPIPE_SZ, 4096);
  args.insert(args.begin(), HYREC_TRAIN_BINARY);
  run->pid = fork();
  if (run->pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(err, 2);
    close(fds[0]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  run->read_end = fds[0];
  return run;
}

// An unread stdout holds nothing back: a --processes job trains every sample and exits 0,
// saying on stderr how many lines it dropped; an endless one stops on SIGINT within its grace.
TEST(Cli, AnUnreadStdoutFreezesNeitherTrainingNorTheStop) {
  const std::string dir = ::testing::TempDir() + "/cli_unread";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string job = TwoWorkerJob("unread.yaml", "train: {workers: 2, log_every_batches: 1}\n");
  auto finite = TrainWithUnreadStdout(
      {"--config=" + job, "--processes", "--progress=lines", "--plot=", "--report=" + dir + "/report.yaml"},
      dir + "/err1");
  ASSERT_GT(finite->pid, 0);
  EXPECT_EQ(finite->Wait(absl::Seconds(300)), 0);
  EXPECT_EQ(ReportField(dir + "/report.yaml", "samples"), "153600");
  std::ifstream err1(dir + "/err1");
  const std::string said((std::istreambuf_iterator<char>(err1)), {});
  EXPECT_NE(said.find("line(s) of output were dropped: stdout or stderr was not being read"), std::string::npos)
      << said;

  auto endless =
      TrainWithUnreadStdout({"--config=" + LongJob(), "--processes", "--progress=lines", "--plot="}, dir + "/err2");
  ASSERT_GT(endless->pid, 0);
  absl::SleepFor(absl::Seconds(15));  // Its stdout has long been full.
  kill(-endless->pid, SIGINT);
  EXPECT_EQ(endless->Wait(absl::Seconds(60)), 130);
}

// A loader killed (SIGKILL) or frozen (SIGSTOP) under --processes: the launcher restarts it on
// its port (the watchdog first kills a frozen one), the workers' streams reopen and report where
// they stand, and the job trains every sample once: the summary counts exactly the data's
// samples, none skipped and none repeated.
TEST(Cli, AKilledLoaderIsRestartedAndEverySampleIsTrainedOnce) {
  const std::string job =
      TwoWorkerJob("loader_restart.yaml", "ps: {shards: 1}\ntrain: {workers: 2, log_every_batches: 50}\n");
  // Killed, then (its replacement) frozen: the watchdog kills a stopped loader and it is
  // restarted the same way.
  for (const int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
    auto p = StartTraining({"--processes", "--watchdog_seconds=8"}, job);
    const pid_t loader = ChildWith(p->pid(), "hyrec-loader");
    ASSERT_GT(loader, 0);
    const absl::Time faulted = absl::Now();
    ASSERT_EQ(kill(loader, signal), 0);
    const Ending end = ReadToExit(*p);
    EXPECT_EQ(end.code, 0) << end.tail();
    EXPECT_TRUE(end.Contains("the loader exited (killed by signal 9); restarting it")) << end.tail();
    EXPECT_TRUE(end.Contains("the loader serves again")) << end.tail();
    EXPECT_TRUE(end.StartsWith("summary: 153600 samples")) << end.tail();
    EXPECT_LT(absl::Now() - faulted, absl::Seconds(60));
    EXPECT_NE(kill(loader, 0), 0);  // Gone, not left stopped.
  }
}

// A role waiting out its restart backoff holds up no other role's restart: the loader, lost
// again right after each of its restarts, waits 8 s before its fifth start; a PS shard killed
// meanwhile is back before it, and the job still trains every sample once.
TEST(Cli, ARoleInItsBackoffDelaysNoOtherRestart) {
  const std::string dir = ::testing::TempDir() + "/cli_backoff";
  std::filesystem::remove_all(dir);
  const std::string job = WriteFile("backoff.yaml", absl::StrCat(R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 460800, num_slots: 4, num_dense: 4, vocabulary: 400, ids_per_sample: 2}
  batch_size: 256
  threads: 1
eval: {samples: 2000}
model: {embedding_dim: 8, bottom: [16], top: [16]}
ps: {shards: 2}
train: {workers: 1, log_every_batches: 50}
checkpoint: {dir: )",
                                                                 dir, R"(, every_steps: 400}
)"));
  auto p = StartTraining({"--processes"}, job);
  std::vector<std::string> lines;
  const auto await = [&](absl::string_view text) {
    for (absl::StatusOr<std::string> line; (line = p->ReadLine(absl::Seconds(60))).ok();) {
      lines.push_back(*line);
      if (absl::StrContains(*line, text)) return true;
    }
    return false;
  };
  ASSERT_TRUE(await("samples "));
  for (int kills = 0; kills < 3; ++kills) {
    const pid_t loader = ChildWith(p->pid(), "hyrec-loader");
    ASSERT_GT(loader, 0);
    ASSERT_EQ(kill(loader, SIGKILL), 0);
    ASSERT_TRUE(await("the loader serves again")) << absl::StrJoin(lines, "\n");
  }
  const pid_t loader = ChildWith(p->pid(), "hyrec-loader");
  ASSERT_GT(loader, 0);
  ASSERT_EQ(kill(loader, SIGKILL), 0);
  ASSERT_TRUE(await("restarting it to resume every worker where its stream stands (in ")) << absl::StrJoin(lines, "\n");
  {  // The fourth restart in a row after short runs waits 8 s, spread by the policy's ±20%.
    const std::string& line = lines.back();
    const size_t from = line.find("(in ") + 4;
    absl::Duration backoff;
    ASSERT_TRUE(absl::ParseDuration(line.substr(from, line.find(';', from) - from), &backoff)) << line;
    EXPECT_GE(backoff, absl::Milliseconds(6400)) << line;
    EXPECT_LE(backoff, absl::Milliseconds(9600)) << line;
  }
  const size_t backoff_line = lines.size();
  const pid_t shard = ChildWith(p->pid(), "--shard_index=1");
  ASSERT_GT(shard, 0);
  ASSERT_EQ(kill(shard, SIGKILL), 0);
  ASSERT_TRUE(await("PS shard 1 recovered and serves again")) << absl::StrJoin(lines, "\n");
  for (size_t i = backoff_line; i < lines.size(); ++i) {
    EXPECT_FALSE(absl::StrContains(lines[i], "the loader serves again")) << lines[i];
  }
  const Ending end = ReadToExit(*p);
  EXPECT_EQ(end.code, 0) << end.tail();
  EXPECT_TRUE(end.Contains("the loader serves again")) << end.tail();
  EXPECT_TRUE(end.StartsWith("summary: 460800 samples")) << end.tail();
  std::filesystem::remove_all(dir);
}

// Worker 0 lost under --processes when the job keeps checkpoints: every role restarts from the
// latest one, and the job finishes, having trained every sample into its final model once (the
// summary's count continues from the checkpoint's).
TEST(Cli, ALostWorkerZeroFallsBackToTheLatestCheckpoint) {
  const std::string dir = ::testing::TempDir() + "/cli_worker_fallback";
  std::filesystem::remove_all(dir);
  const std::string job = TwoWorkerJob(
      "worker_fallback.yaml",
      absl::StrCat("train: {workers: 2, log_every_batches: 50}\ncheckpoint: {dir: ", dir, ", every_steps: 40}\n"));
  auto p = StartTraining({"--processes"}, job);
  ASSERT_TRUE(AwaitCommittedCheckpoint(dir, absl::Seconds(60)));
  const pid_t worker = ChildWith(p->pid(), "--rank=0");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  const Ending end = ReadToExit(*p);
  EXPECT_EQ(end.code, 0) << end.tail();
  EXPECT_TRUE(end.Contains("a worker was lost: every role restarts from the latest checkpoint")) << end.tail();
  EXPECT_TRUE(end.StartsWith("summary: 153600 samples")) << end.tail();
  std::filesystem::remove_all(dir);
}

// `--set` overrides reach every role: a launcher's plan and the loader, PS shards and workers it
// starts read the same job. Here the loader's sample count and the worker count come from
// overrides only; a role that ignored them would train another count of samples or not join.
// The test split one of them adds is scored with the model kept and reported apart from the
// held-out figure, embedded and through worker 0's events.
TEST(Cli, OverridesReachEveryRoleAndATestSplitIsReportedApart) {
  const std::string job = TwoWorkerJob("overrides.yaml", "train: {workers: 1, log_every_batches: 50}\n");
  for (const bool processes : {false, true}) {
    SCOPED_TRACE(processes ? "--processes" : "embedded");
    std::vector<std::string> argv = {HYREC_TRAIN_BINARY,
                                     "--config=" + job,
                                     "--progress=lines",
                                     "--plot=",
                                     "--set=loader.source.synthetic.num_samples=51200",
                                     "--set",
                                     "train.workers=2",
                                     "--set=eval.test_samples=3000"};
    if (processes) argv.push_back("--processes");
    const hyrec::testing::CommandResult r = hyrec::testing::RunCommand(argv);
    EXPECT_EQ(r.code, 0) << r.all();
    EXPECT_TRUE(absl::StartsWith(r.out, "hyrec train: dlrm, 2 worker(s)")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out,
                                  "\n  with --set loader.source.synthetic.num_samples=51200, --set train.workers=2, "
                                  "--set eval.test_samples=3000\n"))
        << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "\nsummary: 51200 samples")) << r.all();
    EXPECT_TRUE(absl::StrContains(r.out, "  held-out AUC ")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, " (3000 samples; the model evaluated at 51200 samples trained)\n")) << r.out;
    const size_t test = r.out.find("  test AUC 0.");
    ASSERT_NE(test, std::string::npos) << r.out;
    EXPECT_GT(std::stod(r.out.substr(test + 11, 6)), 0.6) << r.out;
  }
  const hyrec::testing::CommandResult bad =
      hyrec::testing::RunCommand({HYREC_TRAIN_BINARY, "--config=" + job, "--set=train.wrokers=2"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.err, "train.wrokers (--set): unknown key; did you mean 'workers'?")) << bad.all();
}

// Worker 1 lost under --processes (killed twice): each time the launcher starts a replacement,
// which joins worker 0's group in its next generation, takes the dense state from it and goes on
// from the lost worker's batch. No role restarts from a checkpoint, and the summary counts
// exactly the data's samples: none skipped, none trained twice. The replacement takes part in the
// job's later checkpoints, none of which fails.
TEST(Cli, ALostWorkerHealsFromItsLivePeerWithoutARollback) {
  const std::string dir = ::testing::TempDir() + "/cli_worker_heal";
  std::filesystem::remove_all(dir);
  const std::string job = TwoWorkerJob(
      "worker_heal.yaml",
      absl::StrCat("train: {workers: 2, log_every_batches: 20}\ncheckpoint: {dir: ", dir, ", every_steps: 30}\n"));
  auto p = StartTraining({"--processes", "--report=" + ::testing::TempDir() + "/heal.report"}, job);
  Ending end;
  for (int kill_count = 0; kill_count < 2; ++kill_count) {
    const pid_t worker = ChildWith(p->pid(), "--rank=1");
    ASSERT_GT(worker, 0);
    ASSERT_EQ(kill(worker, SIGKILL), 0);
    // The next kill once the replacement trains.
    EXPECT_EQ(ReadTwoProgressLinesAfter(*p, "restarting it to heal from its live peers", &end.lines), 2);
  }
  const Ending rest = ReadToExit(*p);
  end.lines.insert(end.lines.end(), rest.lines.begin(), rest.lines.end());
  EXPECT_EQ(rest.code, 0) << rest.tail();
  EXPECT_TRUE(end.Contains("worker 1 exited (killed by signal 9); restarting it to heal")) << rest.tail();
  EXPECT_FALSE(end.Contains("restarts from the latest checkpoint"));
  EXPECT_TRUE(end.StartsWith("summary: 153600 samples")) << rest.tail();
  EXPECT_TRUE(end.Contains("the workers' group healed 2 time(s)")) << rest.tail();
  EXPECT_TRUE(end.Contains("ckpt-000000000300-")) << rest.tail();  // The final step's.
  EXPECT_TRUE(end.Contains(" written this run, 0 failed;")) << rest.tail();
  std::filesystem::remove_all(dir);
}

// A checkpoint on demand: SIGUSR1 to `hyrec train`, embedded and with --processes (the launcher
// passes it to worker 0), cuts one at the next step while training goes on.
// Two runs of one job on one checkpoint.dir: the second (embedded or --processes) is refused with
// exit 2 naming the first, and deletes, resets and writes nothing there; the first keeps its
// checkpoint and stops as usual.
TEST(Cli, ASecondRunOnACheckpointDirIsRefusedNamingTheFirst) {
  const std::string dir = ::testing::TempDir() + "/cli_two_runs";
  std::filesystem::remove_all(dir);
  const std::string job =
      LongJob(absl::StrCat("checkpoint: {dir: ", dir, ", keep_last: 1, on_interrupt: false}\n"), "two_runs.yaml");
  auto first = StartTraining({}, job);
  kill(first->pid(), SIGUSR1);
  ASSERT_TRUE(AwaitCommittedCheckpoint(dir, absl::Seconds(60)));
  const std::vector<std::string> before = hyrec::ListCheckpointDirs(hyrec::Env::Default(), dir, "ckpt");
  const std::string job_id = hyrec::CheckpointDirJob(hyrec::Env::Default(), dir);
  EXPECT_EQ(job_id.size(), 16u) << job_id;
  for (const bool processes : {false, true}) {
    SCOPED_TRACE(processes ? "--processes" : "embedded");
    std::vector<std::string> argv = {HYREC_TRAIN_BINARY, "--config=" + job, "--progress=lines", "--plot="};
    if (processes) argv.push_back("--processes");
    const hyrec::testing::CommandResult second = hyrec::testing::RunCommand(argv);
    EXPECT_EQ(second.code, 2) << second.all();
    EXPECT_NE(second.err.find(absl::StrCat("checkpoint.dir ", dir, " is taken by another run: ")), std::string::npos)
        << second.all();
    EXPECT_NE(second.err.find(absl::StrCat("a run of job ", job_id, ": pid ", first->pid())), std::string::npos)
        << second.all();
    EXPECT_EQ(hyrec::CheckpointDirJob(hyrec::Env::Default(), dir), job_id);
  }
  EXPECT_EQ(hyrec::ListCheckpointDirs(hyrec::Env::Default(), dir, "ckpt"), before);
  ControlC(*first);
  ExpectInterruptedSummary(*first);
}

TEST(Cli, SigusrOneCutsACheckpoint) {
  for (const bool processes : {false, true}) {
    SCOPED_TRACE(processes ? "--processes" : "embedded");
    const std::string dir = ::testing::TempDir() + (processes ? "/cli_usr1_p" : "/cli_usr1_e");
    std::filesystem::remove_all(dir);
    const std::string job = LongJob(absl::StrCat("checkpoint: {dir: ", dir, ", on_interrupt: false}\n"), "usr1.yaml");
    auto p = StartTraining(processes ? std::vector<std::string>{"--processes"} : std::vector<std::string>{}, job);
    kill(p->pid(), SIGUSR1);
    EXPECT_TRUE(AwaitCommittedCheckpoint(dir, absl::Seconds(60)));
    ControlC(*p);
    ExpectInterruptedSummary(*p);
  }
}

}  // namespace
