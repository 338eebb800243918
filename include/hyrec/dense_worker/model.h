// Dense models: torch::nn::Modules mapping (dense features, pooled embeddings per slot) to logits.
//
// Any module with this forward can be trained by hyrec (include/hyrec/dense_worker/trainer.h):
//
//   torch::Tensor forward(torch::Tensor dense,                       // [B, num_dense]
//                         const std::vector<torch::Tensor>& pooled); // per slot [B, dim]
//                                                                    // -> logits [B]
//
// Provided: DLRM (Naumov et al. 2019: bottom MLP on dense features, pairwise dot interactions of
// the bottom output and the slot embeddings, top MLP), DCN-v2 (Wang et al. 2021: cross layers
// x_{l+1} = x0 * (W x_l + b) + x_l beside a deep MLP), logistic regression (the sum of every
// pooled embedding coordinate plus a linear map of the dense features: with dim-1 tables, a
// linear model whose per-id weights live on the PS), and the models with a wide part, whose
// per-id linear weights are dim-1 PS tables (job_plan.h, UsesWideTables): Wide & Deep (Cheng et
// al. 2016), FM (Rendle 2010) and DeepFM (Guo et al. 2017). Each works with or without dense
// features, and with or without sparse ones. A program registers models of
// its own under a name (model_registry.h), which `model.kind` then selects.
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
  // 0: no bottom MLP; the top MLP takes the (projected) embeddings beside their interactions.
  int num_dense = 13;
  int num_slots = 26;
  int embedding_dim = 16;  // The interaction dim.
  // Per slot, its pooled embedding's dim; empty: embedding_dim for every slot. A slot of another
  // dim is projected to embedding_dim by a learned linear map (no bias) before the interactions.
  std::vector<int> slot_dims;
  std::vector<int> bottom = {512, 256};  // Hidden sizes; a last layer maps to embedding_dim.
  std::vector<int> top = {512, 256};     // Hidden sizes; a last layer maps to 1.
  double dropout = 0;                    // After every hidden layer, while training.
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
  // The same as flat indices into a row of the [F, F] matrix (not a buffer: checkpoints hold the
  // two above); index_select on them, and its index_add backward, costs less than the 2-d
  // advanced index.
  torch::Tensor pair_flat_;
};
TORCH_MODULE(Dlrm);

struct DcnOptions {
  int num_dense = 13;
  std::vector<int> slot_dims = std::vector<int>(26, 16);
  int cross_layers = 3;
  std::vector<int> deep = {256, 128};
  double dropout = 0;  // After every hidden layer of the deep MLP, while training.
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

// logit = bias + w . dense + sum over slots of the sum of the pooled embedding's coordinates.
class LogisticRegressionImpl : public DenseModelImpl {
 public:
  explicit LogisticRegressionImpl(int num_dense);
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override;

 private:
  torch::nn::Linear linear_{nullptr};  // num_dense -> 1; none without dense features.
  torch::Tensor bias_;                 // Without dense features.
};
TORCH_MODULE(LogisticRegression);

// The models with a wide part. pooled holds the deep slots' embeddings, then `wide_slots` dim-1
// pooled weights (the same features' ids in the wide tables). logit =
//   linear:  b + w . dense + sum of the wide weights                      (every kind)
//   fm:      1/2 sum_k ((sum_s v_sk)^2 - sum_s v_sk^2), v_s the embeddings (fm, deepfm)
//            (projected to embedding_dim when their dim differs)
//   deep:    an MLP (hidden sizes `deep`, then 1) over [dense, embeddings] (wide_deep, deepfm)
struct WideOptions {
  int num_dense = 13;
  std::vector<int> slot_dims = std::vector<int>(26, 16);  // The deep slots'.
  int wide_slots = 26;
  int embedding_dim = 16;  // fm: the pairwise term's dim.
  std::vector<int> deep = {256, 128};
  double dropout = 0;
  bool fm = false;
  bool deep_part = true;
};

class WideModelImpl : public DenseModelImpl {
 public:
  explicit WideModelImpl(const WideOptions& options);
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override;

 private:
  WideOptions options_;
  torch::nn::Linear linear_{nullptr};           // num_dense -> 1; none without dense features.
  torch::Tensor bias_;                          // Without dense features.
  std::vector<torch::nn::Linear> projections_;  // fm: per deep slot; empty for slots of embedding_dim.
  torch::nn::Sequential deep_{nullptr};
};
TORCH_MODULE(WideModel);

// An MLP: Linear+ReLU (+ Dropout when dropout > 0) per hidden size, then Linear to `out` (no
// activation).
torch::nn::Sequential Mlp(int in, const std::vector<int>& hidden, int out, double dropout = 0);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_MODEL_H_
