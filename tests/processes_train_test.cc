// The cluster topology on one machine: `hyrec train --processes` runs 2 PS processes, a loader
// process and 2 worker processes on loopback (real gRPC, real Gloo), and reaches the AUC band.
#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"

namespace {

TEST(ProcessesTraining, TwoPsOneLoaderTwoWorkersReachTheBand) {
  const std::string config = ::testing::TempDir() + "/processes.yaml";
  std::ofstream(config) << R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 600000, vocabulary: 500, zipf: 1.05, seed: 3}
  batch_size: 512
  threads: 1
eval: {samples: 40000}
model: {kind: dlrm, embedding_dim: 16, bottom: [64, 32], top: [64, 32]}
ps: {shards: 2, optimizer: adagrad, learning_rate: 0.05}
train: {workers: 2, embedding_staleness: 4, dense_optimizer: adam, dense_learning_rate: 0.004, log_every_batches: 1000}
)";
  auto train = hyrec::Subprocess::Spawn({HYREC_TRAIN_BINARY, "--processes", "--config=" + config});
  ASSERT_TRUE(train.ok());
  double auc = 0, teacher = 0;
  bool saw_processes = false;
  for (;;) {
    auto line = (*train)->ReadLine(absl::Minutes(4));
    if (!line.ok()) break;
    std::printf("%s\n", line->c_str());
    saw_processes |= line->find("processes: 2 PS") != std::string::npos;
    std::sscanf(line->c_str(), "  held-out AUC %lf", &auc);
    std::sscanf(line->c_str(), "  teacher AUC %lf", &teacher);
  }
  auto code = (*train)->Wait(absl::Minutes(1));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(saw_processes);
  EXPECT_GT(teacher, 0.8);
  EXPECT_GT(auc, teacher - 0.02);
}

}  // namespace
