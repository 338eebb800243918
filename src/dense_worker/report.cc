#include "hyrec/dense_worker/report.h"

#include "hyrec/common/enum_names.h"

namespace hyrec::dense_worker {

namespace {
constexpr EnumName<TrainReport::ExportReason> kExportReasons[] = {
    {TrainReport::ExportReason::kNone, "none"},
    {TrainReport::ExportReason::kBestEvaluation, "best_evaluation"},
    {TrainReport::ExportReason::kNoEvaluation, "no_evaluation"},
    {TrainReport::ExportReason::kBestNotCommitted, "best_not_committed"},
};
}  // namespace

const char* ExportReasonName(TrainReport::ExportReason reason) { return NameOf(kExportReasons, reason); }

bool ParseExportReason(const std::string& name, TrainReport::ExportReason* reason) {
  return FindName(kExportReasons, name, reason);
}

}  // namespace hyrec::dense_worker
