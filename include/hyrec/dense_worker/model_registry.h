// The model registry: dense models by name, as `model.kind` selects them.
//
// A program registers its own torch::nn::Module (a DenseModelImpl, model.h) under a name and then
// runs hyrec's entry point (train_main.h); a job with `model.kind: <name>` trains it with
// everything `hyrec train` offers (flags, YAML, progress, metrics, plot, evaluation, several
// workers, --processes):
//
//   struct Wide : DenseModelImpl {   // the dense features and every pooled embedding, one layer
//     Wide(int in) { linear = register_module("linear", torch::nn::Linear(in, 1)); }
//     torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override {
//       std::vector<torch::Tensor> parts = {dense};
//       parts.insert(parts.end(), pooled.begin(), pooled.end());
//       return linear->forward(torch::cat(parts, 1)).squeeze(1);
//     }
//     torch::nn::Linear linear{nullptr};
//   };
//   int main(int argc, char** argv) {
//     absl::Status s = RegisterModel("wide", [](const ModelContext& c) ->
//     absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
//       int extra = 0;  // model.options.extra
//       HYREC_RETURN_IF_ERROR(hyrec::ReadScalar(c.options, "extra", "model.options", &extra));
//       int in = c.num_dense + extra;
//       for (int d : c.slot_dims) in += d;
//       return std::make_shared<Wide>(in);
//     });
//     return s.ok() ? TrainMain(argc, argv) : 2;
//   }
//
// The built-in kinds (dlrm, dcn, lr, wide_deep, deepfm, fm, and torchscript: a module written in
// Python, torchscript_model.h) are registered from the start.
// Thread-safe.
#ifndef HYREC_DENSE_WORKER_MODEL_REGISTRY_H_
#define HYREC_DENSE_WORKER_MODEL_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/yaml_config.h"  // model.options, read with CheckKeys and ReadScalar
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/train_main.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::dense_worker {

// What a model is built from: the job's features and their dims, and the model section.
struct ModelContext {
  int num_dense = 0;                       // Dense features per sample (0 for sparse-only data).
  std::vector<std::string> feature_names;  // Per slot, in the order forward's `pooled` has them.
  std::vector<int> slot_dims;              // Per slot: the dim of its pooled embedding.
  int wide_slots = 0;                      // Trailing dim-1 wide slots (job::WorkerPlan::wide_slots).
  job::ModelSpec spec;                     // kind, embedding_dim, bottom, top, cross_layers.
  YAML::Node options;                      // model.options: a mapping (empty when absent).
};

using ModelFactory = std::function<absl::StatusOr<std::shared_ptr<DenseModelImpl>>(const ModelContext&)>;

// Registers `factory` as model kind `kind` (a non-empty name). AlreadyExists when taken.
absl::Status RegisterModel(const std::string& kind, ModelFactory factory);

// Registered kinds, sorted.
std::vector<std::string> RegisteredModels();
bool IsRegisteredModel(const std::string& kind);

// The context a worker's plan gives its model.
ModelContext ContextFor(const job::WorkerPlan& plan);

// Builds the worker's model with the factory its plan names. NotFound (naming the registered
// kinds) for an unknown kind; a LibTorch exception or std::exception from the factory (a shape
// error, an allocation that fails) becomes InvalidArgument or ResourceExhausted naming the model.
absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeModel(const job::WorkerPlan& plan);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_MODEL_REGISTRY_H_
