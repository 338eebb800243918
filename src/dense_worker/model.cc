#include "hyrec/dense_worker/model.h"

namespace hyrec::dense_worker {
namespace {

// Registers module `m`'s b + w . dense term: a Linear "linear", or a parameter "bias" alone when
// there are no dense features (a Linear of no inputs cannot be initialized).
void RegisterLinearTerm(torch::nn::Module& m, int num_dense, torch::nn::Linear* linear, torch::Tensor* bias) {
  if (num_dense > 0) {
    *linear = m.register_module("linear", torch::nn::Linear(num_dense, 1));
  } else {
    *bias = m.register_parameter("bias", torch::zeros({1}));
  }
}

torch::Tensor LinearLogit(torch::nn::Linear& linear, const torch::Tensor& bias, const torch::Tensor& dense) {
  if (linear) return linear->forward(dense).squeeze(1);
  return bias.expand({dense.size(0)});
}

// Per slot, a learned map (no bias) "project<s>" from its dim to `dim`; an empty module for a
// slot that already has it.
std::vector<torch::nn::Linear> RegisterProjections(torch::nn::Module& m, const std::vector<int>& slot_dims, int dim) {
  std::vector<torch::nn::Linear> projections(slot_dims.size(), torch::nn::Linear(nullptr));
  for (size_t s = 0; s < slot_dims.size(); ++s) {
    if (slot_dims[s] == dim) continue;
    projections[s] = m.register_module("project" + std::to_string(s),
                                       torch::nn::Linear(torch::nn::LinearOptions(slot_dims[s], dim).bias(false)));
  }
  return projections;
}

torch::Tensor Projected(std::vector<torch::nn::Linear>& projections, size_t s, const torch::Tensor& x) {
  return s < projections.size() && projections[s] ? projections[s]->forward(x) : x;
}

}  // namespace

torch::nn::Sequential Mlp(int in, const std::vector<int>& hidden, int out, double dropout) {
  torch::nn::Sequential mlp;
  int width = in;
  for (int h : hidden) {
    mlp->push_back(torch::nn::Linear(width, h));
    mlp->push_back(torch::nn::ReLU());
    if (dropout > 0) mlp->push_back(torch::nn::Dropout(dropout));
    width = h;
  }
  mlp->push_back(torch::nn::Linear(width, out));
  return mlp;
}

DlrmImpl::DlrmImpl(const DlrmOptions& options) : options_(options) {
  if (options.num_dense > 0) {
    bottom_ = register_module("bottom", Mlp(options.num_dense, options.bottom, options.embedding_dim, options.dropout));
  }
  if (!options.slot_dims.empty() && static_cast<int>(options.slot_dims.size()) != options.num_slots) {
    throw std::invalid_argument("DlrmOptions: slot_dims needs one dim per slot");
  }
  projections_ = RegisterProjections(*this, options.slot_dims, options.embedding_dim);
  const int features = options.num_slots + (options.num_dense > 0 ? 1 : 0);
  const int pairs = features * (features - 1) / 2;
  const int first = options.embedding_dim * (options.num_dense > 0 ? 1 : options.num_slots);
  top_ = register_module("top", Mlp(first + pairs, options.top, 1, options.dropout));
  auto indices = torch::triu_indices(features, features, /*offset=*/1);
  // Buffers, so that model->to(device) moves them with the parameters.
  pair_rows_ = register_buffer("pair_rows", indices[0].contiguous());
  pair_cols_ = register_buffer("pair_cols", indices[1].contiguous());
}

torch::Tensor DlrmImpl::forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) {
  std::vector<torch::Tensor> features;
  torch::Tensor x;
  if (options_.num_dense > 0) {
    x = torch::relu(bottom_->forward(dense));  // [B, d]
    features.push_back(x);
  }
  for (size_t s = 0; s < pooled.size(); ++s) {
    features.push_back(Projected(projections_, s, pooled[s]));
  }
  torch::Tensor t = torch::stack(features, 1);         // [B, F, d]
  torch::Tensor z = torch::bmm(t, t.transpose(1, 2));  // [B, F, F]
  if (!pair_flat_.defined() || pair_flat_.device() != pair_rows_.device()) {
    pair_flat_ = pair_rows_ * static_cast<int64_t>(features.size()) + pair_cols_;
  }
  torch::Tensor interactions = z.flatten(1).index_select(1, pair_flat_);  // [B, P]
  // Without a bottom MLP the embeddings themselves join the interactions (one embedding alone
  // has none).
  torch::Tensor first = x.defined() ? x : t.flatten(1);
  return top_->forward(torch::cat({first, interactions}, 1)).squeeze(1);
}

DcnV2Impl::DcnV2Impl(const DcnOptions& options) {
  int width = options.num_dense;
  for (int d : options.slot_dims) width += d;
  for (int l = 0; l < options.cross_layers; ++l) {
    cross_.push_back(register_module("cross" + std::to_string(l), torch::nn::Linear(width, width)));
  }
  deep_ = register_module(
      "deep", Mlp(width, {options.deep.begin(), options.deep.end() - 1}, options.deep.back(), options.dropout));
  head_ = register_module("head", torch::nn::Linear(width + options.deep.back(), 1));
}

torch::Tensor DcnV2Impl::forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) {
  std::vector<torch::Tensor> parts = {dense};
  parts.insert(parts.end(), pooled.begin(), pooled.end());
  const torch::Tensor x0 = torch::cat(parts, 1);
  torch::Tensor x = x0;
  for (auto& layer : cross_) x = x0 * layer->forward(x) + x;
  torch::Tensor deep = torch::relu(deep_->forward(x0));
  return head_->forward(torch::cat({x, deep}, 1)).squeeze(1);
}

WideModelImpl::WideModelImpl(const WideOptions& options) : options_(options) {
  RegisterLinearTerm(*this, options.num_dense, &linear_, &bias_);
  if (options.fm) projections_ = RegisterProjections(*this, options.slot_dims, options.embedding_dim);
  int width = options.num_dense;
  for (int d : options.slot_dims) width += d;
  if (options.deep_part) deep_ = register_module("deep", Mlp(width, options.deep, 1, options.dropout));
}

torch::Tensor WideModelImpl::forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) {
  const size_t deep_slots = options_.slot_dims.size();
  torch::Tensor logit = LinearLogit(linear_, bias_, dense);
  for (size_t s = deep_slots; s < pooled.size(); ++s) logit = logit + pooled[s].squeeze(1);
  if (options_.fm && deep_slots > 0) {
    torch::Tensor sum, squares;
    for (size_t s = 0; s < deep_slots; ++s) {
      const torch::Tensor v = Projected(projections_, s, pooled[s]);
      sum = sum.defined() ? sum + v : v;
      squares = squares.defined() ? squares + v * v : v * v;
    }
    logit = logit + 0.5 * (sum * sum - squares).sum(1);
  }
  if (deep_) {
    std::vector<torch::Tensor> parts = {dense};
    parts.insert(parts.end(), pooled.begin(), pooled.begin() + static_cast<std::ptrdiff_t>(deep_slots));
    logit = logit + deep_->forward(torch::cat(parts, 1)).squeeze(1);
  }
  return logit;
}

LogisticRegressionImpl::LogisticRegressionImpl(int num_dense) {
  RegisterLinearTerm(*this, num_dense, &linear_, &bias_);
}

torch::Tensor LogisticRegressionImpl::forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) {
  torch::Tensor logit = LinearLogit(linear_, bias_, dense);
  for (const torch::Tensor& p : pooled) logit = logit + p.sum(1);
  return logit;
}

}  // namespace hyrec::dense_worker
