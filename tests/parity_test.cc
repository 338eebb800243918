// One job file, three ways to run it: embedded (`hyrec train`), every role a process
// (`hyrec train --processes`), and hand-started `hyrec ps` + `hyrec loader` + `hyrec worker`
// processes. Deterministic (staleness 0, fixed seeds, one worker), every way must give the same
// first-batch loss, the same held-out AUC and bit-identical dense parameters: a setting that one
// way drops or reads differently (the dense optimizer, an initializer, a table's dim or its
// admission) changes them and fails this test.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "yaml-cpp/yaml.h"

namespace {

using hyrec::Subprocess;

// Non-default everywhere a path could drift: the dense optimizer (SGD with momentum, a warm-up
// and cosine schedule), initializers, two tables of different dims (DLRM projects the narrower
// one), admission on one table, per-feature pooling, an FTRL table, three PS shards.
constexpr char kJob[] = R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 12800, num_slots: 4, num_dense: 5, vocabulary: 300, ids_per_sample: 2, seed: 11}
  batch_size: 256
  threads: 1
  shuffle_window: 2048
features: [user, item, history, context]
tables:
  - name: users
    features: [user]
    dim: 8
    initializer: {kind: normal, stddev: 0.05}
    admission: {min_count: 2}
    optimizer: {kind: adam, learning_rate: 0.01}
  - name: items
    features: [item, {name: history, pooling: mean}]
    dim: 16
  - name: context
    features: [{name: context, pooling: sqrtn}]
    dim: 16
    optimizer: {kind: ftrl, learning_rate: 0.1, ftrl_l1: 0.0001}
eval: {samples: 3000, every_batches: 20}
model: {kind: dlrm, embedding_dim: 16, bottom: [32], top: [32, 16]}
ps: {shards: 3, optimizer: adagrad, learning_rate: 0.05, init_stddev: 0.02}
# Hand-started services exit 0 once the workers are done; the launcher does not restart them.
cluster: {services_exit_when_done: true}
train:
  workers: 1
  embedding_staleness: 0
  seed: 7
  log_every_batches: 10
  dense_optimizer:
    kind: sgd
    learning_rate: 0.05
    momentum: 0.9
    weight_decay: 0.0001
    schedule: {kind: cosine, warmup_steps: 5}
)";

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/parity_" + name; }

std::string WriteJob(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

// Runs a process to its end, returning its exit code; its stdout is echoed.
int RunToEnd(const std::vector<std::string>& argv) {
  auto p = Subprocess::Spawn(argv);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return -1;
  for (;;) {
    auto line = (*p)->ReadLine(absl::Minutes(3));
    if (!line.ok()) break;
    std::printf("  | %s\n", line->c_str());
  }
  auto code = (*p)->Wait(absl::Minutes(1));
  return code.ok() ? *code : -1;
}

struct Report {
  double first_loss = 0;
  double auc = 0;
  double dense_sum = 0;
  std::string fingerprint;
  uint64_t samples = 0;
  uint64_t batches = 0;
};

Report ReadReport(const std::string& path) {
  Report r;
  YAML::Node n = YAML::LoadFile(path);
  r.first_loss = n["first_loss"].as<double>();
  r.auc = n["auc"].as<double>();
  r.dense_sum = n["dense_sum"].as<double>();
  r.fingerprint = n["dense_fingerprint"].as<std::string>();
  r.samples = n["samples"].as<uint64_t>();
  r.batches = n["batches"].as<uint64_t>();
  return r;
}

Report Embedded(const std::string& job, const std::string& name) {
  const std::string report = TempPath(name + ".report.yaml");
  EXPECT_EQ(RunToEnd({HYREC_TRAIN_BINARY, "--config=" + job, "--report=" + report, "--plot=", "--progress=lines"}), 0);
  return ReadReport(report);
}

Report Processes(const std::string& job, const std::string& name) {
  const std::string report = TempPath(name + ".report.yaml");
  EXPECT_EQ(RunToEnd({HYREC_TRAIN_BINARY, "--processes", "--config=" + job, "--report=" + report,
                      "--plot=", "--progress=lines"}),
            0);
  return ReadReport(report);
}

// hyrec ps x 3, hyrec loader and hyrec worker, started one by one as a person (or Kubernetes)
// would, each given only the job file, its index and where the others are.
// The job is secure by default: its certificates come from `hyrec certs`, given to each role.
// The services exit 0 by themselves once the worker is done (cluster.services_exit_when_done).
Report HandStarted(const std::string& job, const std::string& name, int shards) {
  const std::string certs = TempPath(name + "-certs");
  std::filesystem::remove_all(certs);
  EXPECT_EQ(RunToEnd({HYREC_CERTS_BINARY, "--dir=" + certs, "--config=" + job}), 0);
  std::vector<std::unique_ptr<Subprocess>> servers;
  std::vector<std::string> ps;
  for (int i = 0; i < shards; ++i) {
    auto p = Subprocess::Spawn({HYREC_PS_BINARY, "--config=" + job, absl::StrCat("--shard_index=", i),
                                "--host=127.0.0.1", "--port=0", "--log_level=warn", "--certs=" + certs});
    EXPECT_TRUE(p.ok());
    auto port = hyrec::WaitForListeningPort(**p, absl::Seconds(30));
    EXPECT_TRUE(port.ok()) << port.status();
    ps.push_back(absl::StrCat("127.0.0.1:", port.ok() ? *port : 0));
    servers.push_back(std::move(*p));
  }
  auto loader = Subprocess::Spawn(
      {HYREC_LOADER_BINARY, "--config=" + job, "--host=127.0.0.1", "--port=0", "--log_level=warn", "--certs=" + certs});
  EXPECT_TRUE(loader.ok());
  auto loader_port = hyrec::WaitForListeningPort(**loader, absl::Seconds(30));
  EXPECT_TRUE(loader_port.ok()) << loader_port.status();
  const std::string report = TempPath(name + ".report.yaml");
  EXPECT_EQ(RunToEnd({HYREC_WORKER_BINARY, "--config=" + job, "--rank=0", "--ps=" + absl::StrJoin(ps, ","),
                      absl::StrCat("--loader=127.0.0.1:", loader_port.ok() ? *loader_port : 0), "--report=" + report,
                      "--progress=lines", "--certs=" + certs}),
            0);
  absl::StatusOr<int> code = (*loader)->Wait(absl::Seconds(15));
  EXPECT_TRUE(code.ok() && *code == 0) << "the loader did not exit 0 by itself: " << code.status();
  for (auto& s : servers) {
    code = s->Wait(absl::Seconds(15));
    EXPECT_TRUE(code.ok() && *code == 0) << "a PS shard did not exit 0 by itself: " << code.status();
  }
  return ReadReport(report);
}

TEST(Parity, EmbeddedProcessesAndHandStartedRolesTrainTheSameModel) {
  const std::string job = WriteJob("job.yaml", kJob);
  const Report embedded = Embedded(job, "embedded");
  const Report processes = Processes(job, "processes");
  const Report hand = HandStarted(job, "hand", 3);
  EXPECT_EQ(embedded.samples, 12800u);
  EXPECT_EQ(embedded.batches, 50u);
  EXPECT_GT(embedded.auc, 0.6);  // It learned something: the comparison is not of untrained models.
  for (const Report* other : {&processes, &hand}) {
    EXPECT_EQ(other->samples, embedded.samples);
    EXPECT_EQ(other->batches, embedded.batches);
    EXPECT_EQ(other->first_loss, embedded.first_loss);  // Bit for bit: printed with 17 digits.
    EXPECT_EQ(other->auc, embedded.auc);
    EXPECT_EQ(other->dense_sum, embedded.dense_sum);
    EXPECT_EQ(other->fingerprint, embedded.fingerprint);
  }
  // The comparison can fail: another learning rate gives other parameters (and, through the
  // warm-up, the same first loss).
  std::string changed = kJob;
  changed.replace(changed.find("learning_rate: 0.05\n    momentum"), 19, "learning_rate: 0.04");
  const Report other = Embedded(WriteJob("changed.yaml", changed), "changed");
  EXPECT_EQ(other.first_loss, embedded.first_loss);
  EXPECT_NE(other.fingerprint, embedded.fingerprint);
}

// Two workers (Gloo between processes, or between threads embedded): both look up their first
// batch before any update, so the first loss agrees exactly; afterwards the two workers' updates
// to shared rows interleave differently from run to run, so the rest agrees only roughly.
// Without admission: which worker's lookup sees an id for the second time (and so creates its
// row) is itself a race.
TEST(Parity, TwoWorkersStartTheSameEmbeddedAndAsProcesses) {
  std::string two = kJob;
  two.replace(two.find("workers: 1"), 10, "workers: 2");
  two.erase(two.find("    admission: {min_count: 2}\n"), 30);
  const std::string job = WriteJob("two.yaml", two);
  const Report embedded = Embedded(job, "two_embedded");
  const Report processes = Processes(job, "two_processes");
  EXPECT_EQ(embedded.samples, 12800u);
  EXPECT_EQ(processes.samples, 12800u);
  EXPECT_EQ(embedded.batches, 25u);  // Per worker.
  EXPECT_EQ(processes.first_loss, embedded.first_loss);
  EXPECT_NEAR(processes.auc, embedded.auc, 0.02);
}

}  // namespace
