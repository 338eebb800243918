#include "hyrec/dense_worker/report.h"

namespace hyrec::dense_worker {

namespace {
constexpr std::pair<TrainReport::ExportReason, const char*> kExportReasons[] = {
    {TrainReport::ExportReason::kNone, "none"},
    {TrainReport::ExportReason::kBestEvaluation, "best_evaluation"},
    {TrainReport::ExportReason::kNoEvaluation, "no_evaluation"},
    {TrainReport::ExportReason::kBestNotCommitted, "best_not_committed"},
};
}  // namespace

const char* ExportReasonName(TrainReport::ExportReason reason) {
  for (const auto& [r, name] : kExportReasons) {
    if (r == reason) return name;
  }
  return "none";
}

bool ParseExportReason(const std::string& name, TrainReport::ExportReason* reason) {
  for (const auto& [r, n] : kExportReasons) {
    if (n == name) {
      *reason = r;
      return true;
    }
  }
  return false;
}

}  // namespace hyrec::dense_worker
