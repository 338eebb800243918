#include "src/dense_worker/healer.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::dense_worker {

std::string EncodeHealState(const HealState& h) {
  Encoder e;
  e.Bytes(h.dense.model);
  e.Bytes(h.dense.optimizer);
  e.U64(h.sequence_origin);
  e.U32(h.run_tag);
  e.U64(h.base_step);
  e.U64(h.base_samples);
  e.U64(h.run_samples);
  e.U64(static_cast<uint64_t>(h.last_batch_id));
  e.U64(h.last_cut_step);
  e.U64(h.delta_sequence);
  e.U64(h.cuts);
  e.Bytes(h.best_checkpoint);
  return std::move(e.str());
}

absl::StatusOr<HealState> DecodeHealState(const std::string& bytes) {
  Decoder d(bytes);
  HealState h;
  h.dense.model = d.Bytes();
  h.dense.optimizer = d.Bytes();
  h.sequence_origin = d.U64();
  h.run_tag = d.U32();
  h.base_step = d.U64();
  h.base_samples = d.U64();
  h.run_samples = d.U64();
  h.last_batch_id = static_cast<int64_t>(d.U64());
  h.last_cut_step = d.U64();
  h.delta_sequence = d.U64();
  h.cuts = d.U64();
  h.best_checkpoint = d.Bytes();
  if (!d.done()) return absl::DataLossError("the healed group's dense state arrived malformed");
  return h;
}

bool Healer::CanHeal() const {
  return sync_ != nullptr && o_.timeout > absl::ZeroDuration() && (o_.stop == nullptr || !o_.stop->load());
}

absl::Status Healer::Regroup(const absl::Status& cause) {
  if (sync_ == nullptr) return cause;
  std::cerr << "hyrec worker " << o_.rank << ": a peer was lost (" << cause.message() << "); waiting up to "
            << absl::FormatDuration(o_.timeout) << " for its replacement (generation " << sync_->generation() + 1 << ")"
            << std::endl;
  const absl::Time deadline = absl::Now() + o_.timeout;
  absl::Status regrouped;
  for (;;) {
    regrouped = sync_->Regroup(std::min(o_.slice, std::max(deadline - absl::Now(), absl::Milliseconds(1))));
    if (!absl::IsDeadlineExceeded(regrouped) || absl::Now() >= deadline) break;
    if (o_.stop != nullptr && o_.stop->load()) {
      regrouped = absl::CancelledError("stopped while waiting for the replacement");
      break;
    }
  }
  if (regrouped.ok()) return regrouped;
  return absl::Status(regrouped.code(),
                      absl::StrCat(cause.message(), "; healing the group failed: ", regrouped.message()));
}

absl::StatusOr<Healer::Agreement> Healer::Agree(int64_t completed,
                                                const std::function<absl::StatusOr<HealState>()>& capture) {
  if (sync_ == nullptr) return absl::FailedPreconditionError("a worker alone has no group to agree with");
  HYREC_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, sync_->AllGather(completed));
  Agreement a;
  a.newest = *std::max_element(steps.begin(), steps.end());
  if (a.newest < 0) return absl::FailedPreconditionError("no rank of the healed group has trained state");
  a.source = static_cast<int>(std::find(steps.begin(), steps.end(), a.newest) - steps.begin());
  std::string bytes;
  if (o_.rank == a.source) {
    HYREC_ASSIGN_OR_RETURN(const HealState mine, capture());
    bytes = EncodeHealState(mine);
  }
  HYREC_RETURN_IF_ERROR(sync_->BroadcastBytes(&bytes, a.source));
  HYREC_ASSIGN_OR_RETURN(a.state, DecodeHealState(bytes));
  return a;
}

}  // namespace hyrec::dense_worker
