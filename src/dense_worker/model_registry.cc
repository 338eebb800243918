#include "hyrec/dense_worker/model_registry.h"

#include <map>
#include <mutex>

#include "absl/strings/str_join.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/dense_worker/torchscript_model.h"
#include "src/dense_worker/torch_status.h"

namespace hyrec::dense_worker {
namespace {

absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeDlrm(const ModelContext& c) {
  DlrmOptions o;
  o.num_dense = c.num_dense;
  o.num_slots = static_cast<int>(c.slot_dims.size());
  o.embedding_dim = c.spec.embedding_dim;
  o.slot_dims = c.slot_dims;
  o.bottom = c.spec.bottom;
  o.top = c.spec.top;
  o.dropout = c.spec.dropout;
  return std::make_shared<DlrmImpl>(o);
}

absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeDcn(const ModelContext& c) {
  DcnOptions o;
  o.num_dense = c.num_dense;
  o.slot_dims = c.slot_dims;
  o.cross_layers = c.spec.cross_layers;
  o.deep = c.spec.top;
  o.dropout = c.spec.dropout;
  return std::make_shared<DcnV2Impl>(o);
}

// wide_deep, deepfm, fm: the plan added the wide slots after the deep ones.
ModelFactory MakeWide(bool fm, bool deep) {
  return [fm, deep](const ModelContext& c) -> absl::StatusOr<std::shared_ptr<DenseModelImpl>> {
    const int slots = static_cast<int>(c.slot_dims.size());
    if (c.wide_slots * 2 != slots) {
      return absl::FailedPreconditionError(
          absl::StrCat("model '", c.spec.kind, "' needs the plan's wide slots (", c.wide_slots, " of ", slots, ")"));
    }
    WideOptions o;
    o.num_dense = c.num_dense;
    o.slot_dims.assign(c.slot_dims.begin(), c.slot_dims.begin() + c.wide_slots);
    o.wide_slots = c.wide_slots;
    o.embedding_dim = c.spec.embedding_dim;
    o.deep = c.spec.top;
    o.dropout = c.spec.dropout;
    o.fm = fm;
    o.deep_part = deep;
    return std::make_shared<WideModelImpl>(o);
  };
}

absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeLogisticRegression(const ModelContext& c) {
  return std::make_shared<LogisticRegressionImpl>(c.num_dense);
}

struct Registry {
  std::mutex mu;
  std::map<std::string, ModelFactory> factories;  // Guarded by mu.
};

Registry& TheRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    r->factories["dlrm"] = MakeDlrm;
    r->factories["dcn"] = MakeDcn;
    r->factories["lr"] = MakeLogisticRegression;
    r->factories["wide_deep"] = MakeWide(/*fm=*/false, /*deep=*/true);
    r->factories["deepfm"] = MakeWide(/*fm=*/true, /*deep=*/true);
    r->factories["fm"] = MakeWide(/*fm=*/true, /*deep=*/false);
    r->factories["torchscript"] = MakeTorchScriptModel;
    return r;
  }();
  return *registry;
}

}  // namespace

absl::Status RegisterModel(const std::string& kind, ModelFactory factory) {
  if (kind.empty()) return absl::InvalidArgumentError("a model kind needs a name");
  if (!factory) return absl::InvalidArgumentError(absl::StrCat("model '", kind, "': no factory"));
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.factories.emplace(kind, std::move(factory)).second) {
    return absl::AlreadyExistsError(absl::StrCat("model kind '", kind, "' is registered already"));
  }
  return absl::OkStatus();
}

std::vector<std::string> RegisteredModels() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> kinds;
  for (const auto& [kind, factory] : r.factories) kinds.push_back(kind);
  return kinds;
}

bool IsRegisteredModel(const std::string& kind) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.count(kind) > 0;
}

ModelContext ContextFor(const job::WorkerPlan& plan) {
  ModelContext c;
  c.num_dense = plan.num_dense;
  c.feature_names = plan.feature_names;
  c.slot_dims = plan.slot_dims;
  c.wide_slots = plan.wide_slots;
  c.spec = plan.model;
  c.options = plan.model.options_yaml.empty() ? YAML::Node(YAML::NodeType::Map) : YAML::Load(plan.model.options_yaml);
  return c;
}

absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeModel(const job::WorkerPlan& plan) {
  ModelFactory factory;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(plan.model.kind);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    return absl::NotFoundError(absl::StrCat("model.kind '", plan.model.kind, "' is not a registered model (",
                                            absl::StrJoin(RegisteredModels(), ", "), ")"));
  }
  std::shared_ptr<DenseModelImpl> model;
  const std::string what = absl::StrCat("building model '", plan.model.kind, "'");
  HYREC_RETURN_IF_ERROR(GuardTorch(what, [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<DenseModelImpl>> made = factory(ContextFor(plan));
    if (!made.ok()) return Annotate(made.status(), what);
    model = std::move(*made);
    return model != nullptr ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat(what, ": no model made"));
  }));
  return model;
}

}  // namespace hyrec::dense_worker
