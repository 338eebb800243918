#include "hyrec/dense_worker/torchscript_model.h"

#include <torch/script.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "hyrec/common/status_macros.h"
#include "src/dense_worker/torch_status.h"

namespace hyrec::dense_worker {
namespace {

// The module's parameters and buffers are registered under their dotted names with each '.'
// written "__" (a torch::nn::Module name has no dots); they are the module's own tensors.
class TorchScriptModelImpl final : public DenseModelImpl {
 public:
  explicit TorchScriptModelImpl(torch::jit::Module module) : module_(std::move(module)) {
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      register_parameter(LocalName(p.name), p.value, p.value.requires_grad());
    }
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) register_buffer(LocalName(b.name), b.value);
  }

  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override {
    c10::List<torch::Tensor> slots;
    slots.reserve(pooled.size());
    for (const torch::Tensor& t : pooled) slots.push_back(t);
    torch::Tensor logits = module_.forward({std::move(dense), std::move(slots)}).toTensor();
    return logits.dim() == 2 && logits.size(1) == 1 ? logits.squeeze(1) : logits;
  }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_.train(on);
  }

  torch::jit::Module& module() { return module_; }

 private:
  static std::string LocalName(const std::string& dotted) { return absl::StrReplaceAll(dotted, {{".", "__"}}); }

  torch::jit::Module module_;
};

std::string Shape(const torch::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

constexpr char kSignature[] = "forward(self, dense: Tensor, pooled: List[Tensor]) -> Tensor";

// The signature of forward, then a forward pass on two samples of zeros in eval mode.
absl::Status Check(TorchScriptModelImpl& model, const ModelContext& c, const std::string& what) {
  c10::optional<torch::jit::Method> forward = model.module().find_method("forward");
  if (!forward.has_value()) return absl::InvalidArgumentError(absl::StrCat(what, " has no forward method"));
  const c10::FunctionSchema& schema = forward->function().getSchema();
  const auto& args = schema.arguments();
  std::string wrong;
  if (args.size() != 3) {
    wrong = absl::StrCat("takes ", args.size() - 1, " argument(s), not 2");
  } else if (!args[1].type()->isSubtypeOf(*c10::TensorType::get())) {
    wrong = absl::StrCat("takes its first argument ('", args[1].name(), "') as ", args[1].type()->str(),
                         ", not Tensor (the dense features)");
  } else if (!args[2].type()->isSubtypeOf(*c10::ListType::ofTensors())) {
    wrong = absl::StrCat("takes its second argument ('", args[2].name(), "') as ", args[2].type()->str(),
                         ", not List[Tensor] (the pooled embeddings, one a slot)");
  } else if (schema.returns().size() != 1 || !schema.returns()[0].type()->isSubtypeOf(*c10::TensorType::get())) {
    wrong = "does not return one Tensor";
  }
  if (!wrong.empty()) {
    std::ostringstream has;
    has << schema;
    return absl::InvalidArgumentError(absl::StrCat(what, ": its forward ", wrong, "; hyrec calls ", kSignature,
                                                   ", one logit a sample (it has ", has.str(), ")"));
  }
  const std::string features = absl::StrCat(c.num_dense, " dense feature(s) and ", c.slot_dims.size(),
                                            " slot(s) of dims [", absl::StrJoin(c.slot_dims, ", "), "]");
  const std::string pass = absl::StrCat(what, ": a forward pass on 2 samples of the job's ", features);
  return GuardTorch(pass, [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    model.eval();
    std::vector<torch::Tensor> pooled;
    for (int dim : c.slot_dims) pooled.push_back(torch::zeros({2, dim}));
    const torch::Tensor out = model.forward(torch::zeros({2, c.num_dense}), pooled);
    model.train();
    if (out.dim() != 1 || out.size(0) != 2) {
      return absl::InvalidArgumentError(absl::StrCat(pass, " returned a tensor of shape ", Shape(out),
                                                     "; one logit a sample ([2] or [2, 1]) was expected"));
    }
    if (out.scalar_type() != torch::kFloat) {
      return absl::InvalidArgumentError(
          absl::StrCat(pass, " returned ", c10::toString(out.scalar_type()), " logits; float32 was expected"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::shared_ptr<DenseModelImpl>> Load(std::istream& in, const std::string& what, const ModelContext& c) {
  torch::jit::Module module;
  HYREC_RETURN_IF_ERROR(GuardTorch(
      absl::StrCat(what, " is not a TorchScript file (torch.jit.save) this LibTorch reads"), [&]() -> absl::Status {
        module = torch::jit::load(in, torch::kCPU);
        return absl::OkStatus();
      }));
  auto model = std::make_shared<TorchScriptModelImpl>(std::move(module));
  HYREC_RETURN_IF_ERROR(Check(*model, c, what));
  return model;
}

}  // namespace

absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeTorchScriptModel(const ModelContext& c) {
  const std::string what = absl::StrCat("model.path '", c.spec.path, "'");
  std::ifstream in(c.spec.path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot open it"));
  return Load(in, what, c);
}

absl::StatusOr<std::shared_ptr<DenseModelImpl>> TorchScriptModelFromBytes(const std::string& bytes,
                                                                          const std::string& what,
                                                                          const ModelContext& c) {
  std::istringstream in(bytes);
  return Load(in, what, c);
}

absl::StatusOr<std::string> SerializeTorchScriptModel(DenseModelImpl& model) {
  auto* script = dynamic_cast<TorchScriptModelImpl*>(&model);
  if (script == nullptr) return absl::InvalidArgumentError("not a TorchScript model (model.kind: torchscript)");
  std::ostringstream out;
  HYREC_RETURN_IF_ERROR(GuardTorch("saving the TorchScript module", [&]() -> absl::Status {
    script->module().save(out);
    return absl::OkStatus();
  }));
  return out.str();
}

}  // namespace hyrec::dense_worker
