#include "hyrec/dense_worker/follower.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::dense_worker {

absl::StatusOr<std::unique_ptr<Follower>> Follower::Start(const std::string& export_root, Env* env) {
  std::unique_ptr<Follower> f(new Follower(export_root, env != nullptr ? env : Env::Default()));
  HYREC_ASSIGN_OR_RETURN(const bool loaded, f->Poll());
  if (!loaded) return absl::NotFoundError(absl::StrCat(export_root, " holds no export yet"));
  return f;
}

std::shared_ptr<const Follower::Model> Follower::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::StatusOr<std::string> Follower::NewerBase() const {
  const std::vector<std::string> names = ListCheckpointDirs(env_, root_, kExportPrefix);
  // Names sort by step: the newest committed one is the only candidate.
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    const std::string dir = JoinPath(root_, *it);
    if (!env_->FileExists(JoinPath(dir, kManifestName))) continue;  // Being written.
    HYREC_ASSIGN_OR_RETURN(const CheckpointManifest m, ReadManifest(env_, dir));
    if (m.kind != "export") return absl::DataLossError(absl::StrCat(dir, " is a ", m.kind, ", not an export"));
    return !loaded_ || m.step > rows_.step ? dir : std::string();
  }
  return std::string();
}

absl::StatusOr<bool> Follower::Poll() {
  HYREC_ASSIGN_OR_RETURN(const std::string base, NewerBase());
  std::optional<ServingRows> fresh;
  if (!base.empty()) {
    HYREC_ASSIGN_OR_RETURN(fresh, ReadExport(env_, base));
  } else if (!loaded_) {
    // No base yet: the job's first delta holds every row its first run changed.
    HYREC_ASSIGN_OR_RETURN(const std::vector<std::string> first, DeltasAfter(env_, root_, 0));
    if (first.empty()) return false;
    HYREC_ASSIGN_OR_RETURN(const CheckpointManifest m, ReadManifest(env_, first.front()));
    fresh.emplace();
    fresh->job_yaml = m.job_yaml;
  }
  const uint64_t after = fresh.has_value() ? fresh->delta_sequence : rows_.delta_sequence;
  HYREC_ASSIGN_OR_RETURN(const std::vector<std::string> deltas, DeltasAfter(env_, root_, after));
  if (!fresh.has_value() && deltas.empty()) return false;
  // Built aside and swapped in whole: the model handed out stays as it is.
  ServingRows next = fresh.has_value() ? std::move(*fresh) : rows_;
  for (const std::string& dir : deltas) HYREC_RETURN_IF_ERROR(ApplyDelta(env_, dir, &next));
  auto model = std::make_shared<Model>();
  // Deltas cut at the model's step (the last one of a job, after its final checkpoint's base)
  // hold nothing newer: the predictor stays, the deltas are counted.
  const bool newer = !loaded_ || next.step > rows_.step;
  if (newer) {
    HYREC_ASSIGN_OR_RETURN(model->predictor, Predictor::FromRows(next, next.job_yaml));
  } else {
    model->predictor = this->model()->predictor;
  }
  model->base = base.empty() ? base_ : base;
  model->newest = deltas.empty() ? model->base : deltas.back();
  model->step = next.step;
  model->samples = next.samples;
  model->created_unix_ms = next.created_unix_ms;
  model->delta_sequence = next.delta_sequence;
  model->deltas = (base.empty() ? deltas_ : 0) + static_cast<int>(deltas.size());
  rows_ = std::move(next);
  base_ = model->base;
  deltas_ = model->deltas;
  loaded_ = true;
  absl::MutexLock lock(&mu_);
  model_ = std::move(model);
  return newer;
}

}  // namespace hyrec::dense_worker
