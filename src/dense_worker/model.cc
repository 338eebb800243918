#include "hyrec/dense_worker/model.h"

namespace hyrec::dense_worker {

torch::nn::Sequential Mlp(int in, const std::vector<int>& hidden, int out) {
  torch::nn::Sequential mlp;
  int width = in;
  for (int h : hidden) {
    mlp->push_back(torch::nn::Linear(width, h));
    mlp->push_back(torch::nn::ReLU());
    width = h;
  }
  mlp->push_back(torch::nn::Linear(width, out));
  return mlp;
}

DlrmImpl::DlrmImpl(const DlrmOptions& options) : options_(options) {
  if (options.num_dense > 0) {
    bottom_ = register_module("bottom", Mlp(options.num_dense, options.bottom, options.embedding_dim));
  }
  if (!options.slot_dims.empty() && static_cast<int>(options.slot_dims.size()) != options.num_slots) {
    throw std::invalid_argument("DlrmOptions: slot_dims needs one dim per slot");
  }
  projections_.resize(options.num_slots, torch::nn::Linear(nullptr));
  for (size_t s = 0; s < options.slot_dims.size(); ++s) {
    if (options.slot_dims[s] == options.embedding_dim) continue;
    projections_[s] = register_module(
        "project" + std::to_string(s),
        torch::nn::Linear(torch::nn::LinearOptions(options.slot_dims[s], options.embedding_dim).bias(false)));
  }
  const int features = options.num_slots + (options.num_dense > 0 ? 1 : 0);
  const int pairs = features * (features - 1) / 2;
  top_ = register_module("top", Mlp((options.num_dense > 0 ? options.embedding_dim : 0) + pairs, options.top, 1));
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
    features.push_back(s < projections_.size() && projections_[s] ? projections_[s]->forward(pooled[s]) : pooled[s]);
  }
  torch::Tensor t = torch::stack(features, 1);                                               // [B, F, d]
  torch::Tensor z = torch::bmm(t, t.transpose(1, 2));                                        // [B, F, F]
  torch::Tensor interactions = z.index({torch::indexing::Slice(), pair_rows_, pair_cols_});  // [B, P]
  return top_->forward(x.defined() ? torch::cat({x, interactions}, 1) : interactions).squeeze(1);
}

DcnV2Impl::DcnV2Impl(const DcnOptions& options) {
  int width = options.num_dense;
  for (int d : options.slot_dims) width += d;
  for (int l = 0; l < options.cross_layers; ++l) {
    cross_.push_back(register_module("cross" + std::to_string(l), torch::nn::Linear(width, width)));
  }
  deep_ = register_module("deep", Mlp(width, {options.deep.begin(), options.deep.end() - 1}, options.deep.back()));
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

}  // namespace hyrec::dense_worker
