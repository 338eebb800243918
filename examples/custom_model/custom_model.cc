// A two-tower model of one's own, trained by hyrec with everything `hyrec train` offers: the
// program registers it under a name and hands its command line to hyrec; a job with
// `model.kind: two_tower` then trains it (embedded or --processes, with progress, metrics, the
// plot and evaluations). See README.md.
#include <algorithm>
#include <iostream>

#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/dense_worker/model_registry.h"
#include "hyrec/dense_worker/train_main.h"

namespace {

using hyrec::dense_worker::DenseModelImpl;
using hyrec::dense_worker::ModelContext;

// The user tower reads the features named in model.options.user_features, the item tower the
// others (each with the dense features); the logit is the dot product of the two towers' outputs.
class TwoTower : public DenseModelImpl {
 public:
  TwoTower(const ModelContext& c, const std::vector<std::string>& user_features, int width) {
    int user_in = c.num_dense, item_in = c.num_dense;
    for (size_t s = 0; s < c.feature_names.size(); ++s) {
      const bool user =
          std::find(user_features.begin(), user_features.end(), c.feature_names[s]) != user_features.end();
      is_user_.push_back(user);
      (user ? user_in : item_in) += c.slot_dims[s];
    }
    user_ = register_module("user", hyrec::dense_worker::Mlp(user_in, {width}, width));
    item_ = register_module("item", hyrec::dense_worker::Mlp(item_in, {width}, width));
  }

  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override {
    std::vector<torch::Tensor> user = {dense}, item = {dense};
    for (size_t s = 0; s < pooled.size(); ++s) (is_user_[s] ? user : item).push_back(pooled[s]);
    return (user_->forward(torch::cat(user, 1)) * item_->forward(torch::cat(item, 1))).sum(1);
  }

 private:
  std::vector<bool> is_user_;  // Per feature.
  torch::nn::Sequential user_{nullptr}, item_{nullptr};
};

absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeTwoTower(const ModelContext& c) {
  std::vector<std::string> user_features;
  int width = 64;
  HYREC_RETURN_IF_ERROR(hyrec::CheckKeys(c.options, "model.options", {"user_features", "width"}));
  HYREC_RETURN_IF_ERROR(hyrec::ReadStringList(c.options, "user_features", "model.options", &user_features));
  HYREC_RETURN_IF_ERROR(hyrec::ReadScalar(c.options, "width", "model.options", &width));
  for (const std::string& f : user_features) {
    if (std::find(c.feature_names.begin(), c.feature_names.end(), f) == c.feature_names.end()) {
      return absl::InvalidArgumentError("model.options.user_features: '" + f + "' is not a feature of the job");
    }
  }
  if (user_features.empty() || user_features.size() == c.feature_names.size()) {
    return absl::InvalidArgumentError("model.options.user_features: name some of the job's features, not none or all");
  }
  return std::make_shared<TwoTower>(c, user_features, width);
}

}  // namespace

int main(int argc, char** argv) {
  absl::Status registered = hyrec::dense_worker::RegisterModel("two_tower", MakeTwoTower);
  if (!registered.ok()) {
    std::cerr << registered.message() << "\n";
    return 1;
  }
  return hyrec::dense_worker::TrainMain(argc, argv);
}
