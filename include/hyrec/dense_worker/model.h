// Dense models: torch::nn::Modules mapping (dense features, pooled embeddings per slot) to logits.
//
// Any module with this forward can be trained by hyrec (include/hyrec/dense_worker/trainer.h):
//
//   torch::Tensor forward(torch::Tensor dense,                       // [B, num_dense]
//                         const std::vector<torch::Tensor>& pooled); // per slot [B, dim]
//                                                                    // -> logits [B]
//
// Two are provided: DLRM (Naumov et al. 2019: bottom MLP on dense features, pairwise dot
// interactions of the bottom output and the slot embeddings, top MLP) and DCN-v2 (Wang et al.
// 2021: cross layers x_{l+1} = x0 * (W x_l + b) + x_l beside a deep MLP). A program registers
// models of its own under a name (model_registry.h), which `model.kind` then selects.
#ifndef HYREC_DENSE_WORKER_MODEL_H_
#define HYREC_DENSE_WORKER_MODEL_H_

#include <torch/torch.h>

#include <vector>

namespace hyrec::dense_worker {

// The interface every model implements.
class DenseModelImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) = 0;
};

struct DlrmOptions {
  int num_dense = 13;  // 0: no bottom MLP; the embeddings interact alone.
  int num_slots = 26;
  int embedding_dim = 16;  // The interaction dim.
  // Per slot, its pooled embedding's dim; empty: embedding_dim for every slot. A slot of another
  // dim is projected to embedding_dim by a learned linear map (no bias) before the interactions.
  std::vector<int> slot_dims;
  std::vector<int> bottom = {512, 256};  // Hidden sizes; a last layer maps to embedding_dim.
  std::vector<int> top = {512, 256};     // Hidden sizes; a last layer maps to 1.
};

class DlrmImpl : public DenseModelImpl {
 public:
  explicit DlrmImpl(const DlrmOptions& options);
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override;

 private:
  DlrmOptions options_;
  torch::nn::Sequential bottom_{nullptr};
  std::vector<torch::nn::Linear> projections_;  // Per slot; empty modules for slots of embedding_dim.
  torch::nn::Sequential top_{nullptr};
  torch::Tensor pair_rows_, pair_cols_;  // Upper-triangle indices of the interaction matrix.
};
TORCH_MODULE(Dlrm);

struct DcnOptions {
  int num_dense = 13;
  std::vector<int> slot_dims = std::vector<int>(26, 16);
  int cross_layers = 3;
  std::vector<int> deep = {256, 128};
};

class DcnV2Impl : public DenseModelImpl {
 public:
  explicit DcnV2Impl(const DcnOptions& options);
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override;

 private:
  std::vector<torch::nn::Linear> cross_;
  torch::nn::Sequential deep_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(DcnV2);

// An MLP: Linear+ReLU per hidden size, then Linear to `out` (no activation).
torch::nn::Sequential Mlp(int in, const std::vector<int>& hidden, int out);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_MODEL_H_
