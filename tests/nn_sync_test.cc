// nn_sync with real Gloo process groups: ranks as threads and as processes.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "nn_sync_test_model.h"

namespace hyrec::nn_sync {
namespace {

SyncOptions Options(int rank, int world, int port) {
  SyncOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.timeout = absl::Seconds(20);
  o.bucket_bytes = 1024;  // Several buckets for this small model.
  return o;
}

class NnSyncThreads : public ::testing::TestWithParam<int> {};

TEST_P(NnSyncThreads, ReplicasStayIdenticalAndMatchOneProcessOnTheWholeBatch) {
  const int world = GetParam();
  const int port = hyrec::PickFreeLoopbackPort();
  const int steps = 5;
  std::vector<torch::Tensor> finals(world);
  torch::Tensor initial;
  std::vector<absl::Status> results(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto sync = DenseSync::Create(Options(r, world, port));
      if (!sync.ok()) {
        results[r] = sync.status();
        return;
      }
      TinyMlp model{nullptr};
      {
        static std::mutex global_rng;  // Module initialization draws from the global generator.
        std::lock_guard<std::mutex> lock(global_rng);
        torch::manual_seed(77 + r);
        model = TinyMlp();
        if (r == 0) initial = Flat(model).clone();
      }
      results[r] = TrainSynced(**sync, model, steps);
      finals[r] = Flat(model);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  for (int r = 1; r < world; ++r) EXPECT_TRUE(torch::equal(finals[0], finals[r])) << "rank " << r;

  // One process, rank 0's initial parameters, all ranks' samples in one batch.
  torch::manual_seed(77);
  TinyMlp single;
  ASSERT_TRUE(torch::equal(Flat(single), initial));
  torch::optim::SGD optimizer(single->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < world; ++r) {
      auto [x, y] = RankBatch(r, step);
      xs.push_back(x);
      ys.push_back(y);
    }
    optimizer.zero_grad();
    torch::binary_cross_entropy_with_logits(single->forward(torch::cat(xs)), torch::cat(ys)).backward();
    optimizer.step();
  }
  EXPECT_TRUE(torch::allclose(Flat(single), finals[0], 1e-5, 1e-6))
      << "max difference " << (Flat(single) - finals[0]).abs().max().item<float>();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NnSyncThreads, ::testing::Values(1, 2, 4));

std::vector<std::unique_ptr<Subprocess>> SpawnRanks(int world, int steps, int timeout_ms) {
  const int port = hyrec::PickFreeLoopbackPort();
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < world; ++r) {
    auto p = Subprocess::Spawn({HYREC_NN_SYNC_WORKER, std::to_string(r), std::to_string(world), std::to_string(port),
                                std::to_string(steps), std::to_string(timeout_ms)});
    EXPECT_TRUE(p.ok());
    ranks.push_back(std::move(*p));
  }
  return ranks;
}

// The last line a rank prints that starts with `prefix`.
std::string LineStarting(Subprocess& p, const std::string& prefix, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    auto line = p.ReadLine(deadline - absl::Now());
    if (!line.ok()) return "";
    if (line->rfind(prefix, 0) == 0 || line->rfind("error", 0) == 0) return *line;
  }
}

TEST(NnSyncProcesses, ReplicasInSeparateProcessesEndIdentical) {
  auto ranks = SpawnRanks(3, 6, 20000);
  std::vector<std::string> params;
  for (auto& r : ranks) params.push_back(LineStarting(*r, "params", absl::Seconds(60)));
  for (auto& r : ranks) {
    auto code = r->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }
  ASSERT_EQ(params[0].rfind("params", 0), 0u) << params[0];
  EXPECT_EQ(params[0], params[1]);
  EXPECT_EQ(params[0], params[2]);
}

TEST(NnSyncProcesses, AKilledRankMakesTheOthersFailWithinTwiceTheTimeout) {
  const absl::Duration timeout = absl::Seconds(3);
  auto ranks = SpawnRanks(3, 1000000, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  for (auto& r : ranks) ASSERT_EQ(LineStarting(*r, "step 2", absl::Seconds(60)).rfind("step", 0), 0u);
  ranks[2]->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  for (int r = 0; r < 2; ++r) {
    const std::string line = LineStarting(*ranks[r], "error", 2 * timeout + absl::Seconds(1));
    EXPECT_EQ(line.rfind("error", 0), 0u) << "rank " << r << " printed '" << line << "'";
    auto code = ranks[r]->Wait(2 * timeout + absl::Seconds(1));
    ASSERT_TRUE(code.ok()) << "rank " << r << " still running";
    EXPECT_EQ(*code, 1);
  }
  EXPECT_LT(absl::Now() - killed, 2 * timeout + absl::Seconds(1));
}

TEST(NnSync, RendezvousWithAMissingPeerFailsWithinTheTimeout) {
  SyncOptions o = Options(0, 2, hyrec::PickFreeLoopbackPort());
  o.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto sync = DenseSync::Create(o);
  EXPECT_FALSE(sync.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_NE(sync.status().message().find("rendezvous"), std::string::npos) << sync.status();
}

// ProcessGroupNCCL, world size 1 (one GPU holds one rank): the synced step equals a plain local
// step on the GPU. Runs where LibTorch has CUDA and a GPU is present (the CUDA build).
TEST(NnSync, NcclOnOneGpuMatchesALocalStep) {
  if (!torch::cuda::is_available()) {
    SyncOptions o = Options(0, 1, hyrec::PickFreeLoopbackPort());
    o.backend = SyncBackend::kNccl;
    EXPECT_FALSE(DenseSync::Create(o).ok());  // No NCCL without CUDA: an error, not a crash.
    GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  }
  const torch::Device gpu(torch::kCUDA, 0);
  SyncOptions o = Options(0, 1, hyrec::PickFreeLoopbackPort());
  o.device_is_cuda = true;  // kAuto picks NCCL.
  auto sync = DenseSync::Create(o);
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ((*sync)->backend_name(), "nccl");
  torch::manual_seed(5);
  TinyMlp synced, local;
  torch::manual_seed(5);
  local = TinyMlp();
  synced->to(gpu);
  local->to(gpu);
  ASSERT_TRUE((*sync)->BroadcastParameters(synced->parameters()).ok());
  (*sync)->AttachToParameters(synced->parameters());
  torch::optim::SGD synced_opt(synced->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD local_opt(local->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = RankBatch(0, step);
    x = x.to(gpu);
    y = y.to(gpu);
    synced_opt.zero_grad();
    torch::binary_cross_entropy_with_logits(synced->forward(x), y).backward();
    ASSERT_TRUE((*sync)->FinishGradientSync().ok());
    synced_opt.step();
    local_opt.zero_grad();
    torch::binary_cross_entropy_with_logits(local->forward(x), y).backward();
    local_opt.step();
  }
  auto a = synced->parameters(), b = local->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].device().is_cuda());
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "parameter " << i;
  }
  torch::Tensor v = torch::full({3}, 2.0, torch::TensorOptions().device(gpu));
  ASSERT_TRUE((*sync)->AllreduceMean(v).ok());
  EXPECT_TRUE(torch::allclose(v.cpu(), torch::full({3}, 2.0)));
}

TEST(NnSync, OptionsFromTheEnvironment) {
  std::map<std::string, std::string> env = {
      {"RANK", "3"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "trainer-0.svc"}, {"MASTER_PORT", "23456"}};
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  SyncOptions o;
  ASSERT_TRUE(o.ReadEnvironment(getenv).ok());
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.master_addr, "trainer-0.svc");
  EXPECT_EQ(o.master_port, 23456);
  EXPECT_TRUE(o.Validate().ok());
  env["RANK"] = "three";
  EXPECT_NE(o.ReadEnvironment(getenv).message().find("RANK='three'"), std::string::npos);
  o.rank = 9;
  EXPECT_NE(o.Validate().message().find("rank 9 is not in [0, 8)"), std::string::npos);
}

}  // namespace
}  // namespace hyrec::nn_sync
