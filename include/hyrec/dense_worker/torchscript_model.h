// model.kind: torchscript: a dense model written in Python. The user writes an ordinary PyTorch
// nn.Module with
//
//   def forward(self, dense: Tensor, pooled: List[Tensor]) -> Tensor   # [B, num_dense], per slot
//                                                                       # [B, dim] -> [B] logits
//
// scripts or traces it with the PyTorch that matches this LibTorch (Debian's python3-torch for
// libtorch-dev) and saves it (torch.jit.save); `model.path` names the file. hyrec trains the
// module's parameters exactly as a built-in model's: they are the wrapper's parameters (the same
// tensors), so the dense optimizer, the allreduce, checkpoints and resume see them; train() and
// eval() reach the module's own training flag (dropout, batch norm). The module is checked against
// the job's features before training: its forward's signature, and a forward pass on two samples
// of zeros that must return one logit a sample ([B] or [B, 1]).
//
// An export of such a job holds the module again as TorchScript (kTorchScriptFileName) with the
// trained parameters, which torch.jit.load or torch::jit::load reads beside the export's rows.
// CPU only: the module runs where LibTorch loaded it.
#ifndef HYREC_DENSE_WORKER_TORCHSCRIPT_MODEL_H_
#define HYREC_DENSE_WORKER_TORCHSCRIPT_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/model_registry.h"

namespace hyrec::dense_worker {

// The trained module in an export directory.
inline constexpr char kTorchScriptFileName[] = "module.pt";

// The module of c.spec.path, checked against c. InvalidArgument naming model.path and what is
// wrong (no such file, not TorchScript, the signature, a failing or misshapen forward pass).
absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeTorchScriptModel(const ModelContext& c);

// The same from a TorchScript file's bytes; `what` names them in errors.
absl::StatusOr<std::shared_ptr<DenseModelImpl>> TorchScriptModelFromBytes(const std::string& bytes,
                                                                          const std::string& what,
                                                                          const ModelContext& c);

// The module of a model MakeTorchScriptModel made, with its parameters as they are now, as a
// TorchScript file's bytes. InvalidArgument for any other model.
absl::StatusOr<std::string> SerializeTorchScriptModel(DenseModelImpl& model);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_TORCHSCRIPT_MODEL_H_
