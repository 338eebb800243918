// nn_sync with real Gloo process groups: ranks as threads and as processes.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deadline.h"
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

// A rank's write to a lost peer's socket is an error the heal handles, as in the worker processes
// (InstallStopSignalHandlers ignores SIGPIPE there), not the end of the test binary.
const bool kSigpipeIgnored = [] {
  signal(SIGPIPE, SIG_IGN);
  return true;
}();

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

// Copies rank 0's parameters into every rank's through BroadcastBytes (as a healed group hands
// its dense state to a replacement).
absl::Status ShareParameters(DenseSync& sync, TinyMlp& model) {
  torch::NoGradGuard no_grad;
  torch::Tensor flat = Flat(model).contiguous();
  std::string bytes(reinterpret_cast<const char*>(flat.data_ptr<float>()), flat.numel() * sizeof(float));
  absl::Status s = sync.BroadcastBytes(&bytes, 0);
  if (!s.ok()) return s;
  if (bytes.size() != flat.numel() * sizeof(float)) return absl::InternalError("short broadcast");
  int64_t offset = 0;
  for (auto& p : model->parameters()) {
    p.copy_(torch::from_blob(bytes.data() + offset * sizeof(float), p.sizes(), torch::kFloat));
    offset += p.numel();
  }
  return absl::OkStatus();
}

// Steps [first, last) of synchronous SGD; a failed allreduce regroups (when `heal`) and the
// step is taken again, once the group shared rank 0's parameters.
absl::Status TrainHealing(DenseSync& sync, TinyMlp& model, torch::optim::SGD& optimizer, int first, int last,
                          const std::function<void(int)>& after_step = nullptr) {
  for (int step = first; step < last; ++step) {
    auto [x, y] = RankBatch(sync.rank(), step);
    optimizer.zero_grad();
    torch::binary_cross_entropy_with_logits(model->forward(x), y).backward();
    absl::Status s = sync.FinishGradientSync();
    if (!s.ok()) {
      s = sync.Regroup(absl::Seconds(20));
      if (s.ok()) s = ShareParameters(sync, model);
      if (!s.ok()) return s;
      --step;
      continue;
    }
    optimizer.step();
    if (after_step) after_step(step);
  }
  return absl::OkStatus();
}

TEST(NnSyncHeal, ALostRankIsReplacedInTheNextGenerationAndTheReplicasEndIdentical) {
  const int world = 3, steps = 6, lost_after = 2;
  const int port = hyrec::PickFreeLoopbackPort();
  std::vector<torch::Tensor> finals(world);
  std::vector<absl::Status> results(world, absl::OkStatus());
  std::vector<int> generations(world, -1);
  bool replaced = false;
  std::mutex init;
  std::atomic<int> past_shared_steps{0};  // Survivors that completed step lost_after - 1.
  auto model_for = [&](int seed) {
    std::lock_guard<std::mutex> lock(init);
    torch::manual_seed(seed);
    return TinyMlp();
  };
  // A rank of the first generation: joins, takes rank 0's parameters and trains `until` steps
  // (healing on the way); a survivor keeps what it ended with.
  auto first_generation = [&](int r, int until, bool survivor) {
    auto sync = DenseSync::Create(Options(r, world, port));
    if (!sync.ok()) {
      results[r] = sync.status();
      return;
    }
    TinyMlp model = model_for(5 + r);
    results[r] = (*sync)->BroadcastParameters(model->parameters());
    (*sync)->AttachToParameters(model->parameters());
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    std::function<void(int)> after_step = [&](int step) {
      if (survivor && step == lost_after - 1) ++past_shared_steps;
    };
    if (results[r].ok()) results[r] = TrainHealing(**sync, model, optimizer, 0, until, after_step);
    if (!survivor) {
      // The lost rank leaves once every survivor completed the steps it took part in: a survivor
      // whose allreduce of such a step failed while a peer's completed would retake a step that
      // peer had taken (the worker settles that case; this loop does not).
      for (const absl::Time limit = absl::Now() + absl::Seconds(20);
           past_shared_steps < world - 1 && absl::Now() < limit;) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      return;
    }
    generations[r] = (*sync)->generation();
    finals[r] = Flat(model);
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < world - 1; ++r) ranks.emplace_back([&, r] { first_generation(r, steps, true); });
  ranks.emplace_back([&] {
    const int r = world - 1;
    // The lost rank: trains two steps, then its process group goes (its sockets close).
    first_generation(r, lost_after, false);
    if (!results[r].ok()) return;
    // Its replacement: a fresh model, the group's parameters, then the remaining steps.
    auto sync = DenseSync::Create(Options(r, world, port));
    if (!sync.ok()) {
      results[r] = sync.status();
      return;
    }
    replaced = (*sync)->replacement();
    TinyMlp model = model_for(99);
    (*sync)->AttachToParameters(model->parameters());
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    results[r] = ShareParameters(**sync, model);
    if (results[r].ok()) results[r] = TrainHealing(**sync, model, optimizer, lost_after, steps);
    generations[r] = (*sync)->generation();
    finals[r] = Flat(model);
  });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  EXPECT_TRUE(replaced);
  for (int r = 0; r < world; ++r) EXPECT_EQ(generations[r], 1) << "rank " << r;
  for (int r = 1; r < world; ++r) EXPECT_TRUE(torch::equal(finals[0], finals[r])) << "rank " << r;
  // The same steps without a loss: the healed group trained exactly them.
  const int port2 = hyrec::PickFreeLoopbackPort();
  std::vector<torch::Tensor> calm(world);
  std::vector<std::thread> again;
  for (int r = 0; r < world; ++r) {
    again.emplace_back([&, r] {
      auto sync = DenseSync::Create(Options(r, world, port2));
      ASSERT_TRUE(sync.ok()) << sync.status();
      TinyMlp model = model_for(5 + r);
      ASSERT_TRUE(TrainSynced(**sync, model, steps).ok());
      calm[r] = Flat(model);
    });
  }
  for (auto& t : again) t.join();
  EXPECT_TRUE(torch::allclose(finals[0], calm[0], 1e-5, 1e-6));
}

TEST(NnSyncHeal, RegroupWithoutAReplacementFailsWithinItsTimeout) {
  const int world = 2;
  const int port = hyrec::PickFreeLoopbackPort();
  absl::Status healed;
  absl::Duration took;
  // The lost rank leaves only once the survivor's group is built: leaving while the survivor's
  // side of the connection is still being set up fails the survivor's creation instead.
  std::promise<void> created;
  std::future<void> survivor_created = created.get_future();
  std::thread survivor([&] {
    auto sync = DenseSync::Create(Options(0, world, port));
    created.set_value();
    ASSERT_TRUE(sync.ok()) << sync.status();
    const absl::Time start = absl::Now();
    healed = (*sync)->Regroup(absl::Seconds(2));
    took = absl::Now() - start;
  });
  std::thread lost([&] {
    auto sync = DenseSync::Create(Options(1, world, port));
    survivor_created.wait_for(std::chrono::seconds(30));
    ASSERT_TRUE(sync.ok()) << sync.status();
  });
  lost.join();
  survivor.join();
  EXPECT_EQ(healed.code(), absl::StatusCode::kDeadlineExceeded) << healed;
  EXPECT_NE(healed.message().find("generation 1"), std::string::npos) << healed;
  EXPECT_LT(took, hyrec::testing::Bounded(absl::Seconds(2)));
}

// A survivor in no collective (waiting for its next batch) learns from the rendezvous that a
// lost rank's replacement waits for the next generation, and regroups with it.
TEST(NnSyncHeal, ASurvivorOutsideACollectiveSeesAWaitingReplacement) {
  const int world = 2;
  const int port = hyrec::PickFreeLoopbackPort();
  auto first = std::async(std::launch::async, [&] { return DenseSync::Create(Options(1, world, port)); });
  auto survivor = DenseSync::Create(Options(0, world, port));
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  {
    auto lost = first.get();  // Rank 1 of generation 0, gone at the end of this block.
    ASSERT_TRUE(lost.ok()) << lost.status();
  }
  absl::StatusOr<bool> waiting = (*survivor)->ReplacementWaiting();
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_FALSE(*waiting);
  auto replacement = std::async(std::launch::async, [&] { return DenseSync::Create(Options(1, world, port)); });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline && !(waiting = (*survivor)->ReplacementWaiting()).value_or(true)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_TRUE(*waiting);
  ASSERT_TRUE((*survivor)->Regroup(absl::Seconds(10)).ok());
  auto joined = replacement.get();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE((*joined)->replacement());
  EXPECT_EQ((*survivor)->generation(), 1);
  EXPECT_EQ((*joined)->generation(), 1);
  // Both ask about the generation after theirs now: nobody waits for it.
  EXPECT_FALSE((*survivor)->ReplacementWaiting().value_or(true));
  EXPECT_FALSE((*joined)->ReplacementWaiting().value_or(true));
}

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
    auto code = ranks[r]->Wait(hyrec::testing::Bounded(2 * timeout));
    ASSERT_TRUE(code.ok()) << "rank " << r << " still running";
    EXPECT_EQ(*code, 1);
  }
  EXPECT_LT(absl::Now() - killed, hyrec::testing::Bounded(2 * timeout));
}

TEST(NnSync, RendezvousWithAMissingPeerFailsWithinTheTimeout) {
  SyncOptions o = Options(0, 2, hyrec::PickFreeLoopbackPort());
  o.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto sync = DenseSync::Create(o);
  EXPECT_FALSE(sync.ok());
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(o.timeout));
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
