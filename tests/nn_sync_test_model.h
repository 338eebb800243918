// A small MLP and per-rank data shared by the nn_sync tests and their worker process.
#ifndef HYREC_TESTS_NN_SYNC_TEST_MODEL_H_
#define HYREC_TESTS_NN_SYNC_TEST_MODEL_H_

#include <torch/torch.h>

#include "absl/status/status.h"
#include "hyrec/nn_sync/dense_sync.h"

namespace hyrec::nn_sync {

struct TinyMlpImpl : torch::nn::Module {
  TinyMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(TinyMlp);

// Rank r's batch at step s: 16 samples, deterministic (a generator of its own: ranks that are
// threads of one process must not share the global one).
inline std::pair<torch::Tensor, torch::Tensor> RankBatch(int rank, int step) {
  at::Generator generator = at::detail::createCPUGenerator(1000 * step + rank);
  torch::Tensor x = torch::randn({16, 8}, generator);
  torch::Tensor y = (x.sum(1, true) > 0).to(torch::kFloat);
  return {x, y};
}

// `steps` synchronous SGD steps on this rank's data; the model's parameters are then equal on
// every rank.
inline absl::Status TrainSynced(DenseSync& sync, TinyMlp& model, int steps,
                                const std::function<void(int)>& after_step = nullptr) {
  absl::Status s = sync.BroadcastParameters(model->parameters());
  if (!s.ok()) return s;
  sync.AttachToParameters(model->parameters());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = RankBatch(sync.rank(), step);
    optimizer.zero_grad();
    torch::binary_cross_entropy_with_logits(model->forward(x), y).backward();
    s = sync.FinishGradientSync();
    if (!s.ok()) return s;
    optimizer.step();
    if (after_step) after_step(step);
  }
  return absl::OkStatus();
}

inline torch::Tensor Flat(TinyMlp& model) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : model->parameters()) parts.push_back(p.detach().reshape({-1}));
  return torch::cat(parts);
}

}  // namespace hyrec::nn_sync

#endif  // HYREC_TESTS_NN_SYNC_TEST_MODEL_H_
