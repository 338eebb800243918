// A program built on hyrec's C++ API, as a user's would be: it registers models of its own and
// runs hyrec's entry point, so `model.kind` selects them with everything `hyrec train` offers.
// Besides a real model (tiny_two_tower) it registers ones that fail in each way a user's model
// can, for model_registry_test.
#include <iostream>

#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/dense_worker/model_registry.h"
#include "hyrec/dense_worker/train_main.h"

namespace {

using hyrec::dense_worker::DenseModelImpl;
using hyrec::dense_worker::ModelContext;

// Two towers: the user features' pooled embeddings and the item features' (each with the dense
// features), each through an MLP of `width`, then their dot product.
struct TinyTwoTower : DenseModelImpl {
  TinyTwoTower(const ModelContext& c, int width, int user_features) : user_features(user_features) {
    int user_in = c.num_dense, item_in = c.num_dense;
    for (size_t s = 0; s < c.slot_dims.size(); ++s)
      (static_cast<int>(s) < user_features ? user_in : item_in) += c.slot_dims[s];
    user = register_module("user", hyrec::dense_worker::Mlp(user_in, {width}, width));
    item = register_module("item", hyrec::dense_worker::Mlp(item_in, {width}, width));
  }
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override {
    std::vector<torch::Tensor> u = {dense}, i = {dense};
    for (size_t s = 0; s < pooled.size(); ++s) (static_cast<int>(s) < user_features ? u : i).push_back(pooled[s]);
    return (user->forward(torch::cat(u, 1)) * item->forward(torch::cat(i, 1))).sum(1);
  }
  int user_features;
  torch::nn::Sequential user{nullptr}, item{nullptr};
};

// Multiplies the dense features by a matrix of the wrong shape: a shape error in forward.
struct BadShape : DenseModelImpl {
  BadShape() { w = register_parameter("w", torch::randn({5, 4})); }
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>&) override {
    return torch::matmul(dense, w).sum(1);
  }
  torch::Tensor w;
};

absl::Status Register() {
  HYREC_RETURN_IF_ERROR(hyrec::dense_worker::RegisterModel(
      "tiny_two_tower", [](const ModelContext& c) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
        int width = 16, user_features = 1;
        HYREC_RETURN_IF_ERROR(hyrec::CheckKeys(c.options, "model.options", {"width", "user_features"}));
        HYREC_RETURN_IF_ERROR(hyrec::ReadScalar(c.options, "width", "model.options", &width));
        HYREC_RETURN_IF_ERROR(hyrec::ReadScalar(c.options, "user_features", "model.options", &user_features));
        std::cerr << "tiny_two_tower: width " << width << ", " << user_features << " user feature(s) of "
                  << c.feature_names.size() << std::endl;
        return std::make_shared<TinyTwoTower>(c, width, user_features);
      }));
  HYREC_RETURN_IF_ERROR(hyrec::dense_worker::RegisterModel(
      "bad_shape", [](const ModelContext&) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
        return std::make_shared<BadShape>();
      }));
  // Asks LibTorch for 64 TiB of parameters: the allocation fails.
  HYREC_RETURN_IF_ERROR(hyrec::dense_worker::RegisterModel(
      "huge", [](const ModelContext&) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
        auto m = std::make_shared<BadShape>();
        m->w = m->register_parameter("huge", torch::empty({int64_t{1} << 44}));
        return m;
      }));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (absl::Status s = Register(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return hyrec::dense_worker::TrainMain(argc, argv);
}
