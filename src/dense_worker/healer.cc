#include "src/dense_worker/healer.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::dense_worker {

namespace {

// The heal state's fields in their order on the wire: one list for the writer and the reader.
template <typename H, typename Visit>
void HealFields(H& h, Visit&& visit) {
  visit(h.dense.model);
  visit(h.dense.optimizer);
  visit(h.sequence_origin);
  visit(h.run_tag);
  visit(h.base_step);
  visit(h.base_samples);
  visit(h.run_samples);
  visit(h.last_batch_id);
  visit(h.last_cut_step);
  visit(h.delta_sequence);
  visit(h.cuts);
  visit(h.best_checkpoint);
}

struct Write {
  Encoder& e;
  void operator()(const std::string& v) const { e.Bytes(v); }
  void operator()(uint64_t v) const { e.U64(v); }
  void operator()(int64_t v) const { e.U64(static_cast<uint64_t>(v)); }
  void operator()(uint32_t v) const { e.U32(v); }
};

struct Read {
  Decoder& d;
  void operator()(std::string& v) const { v = d.Bytes(); }
  void operator()(uint64_t& v) const { v = d.U64(); }
  void operator()(int64_t& v) const { v = static_cast<int64_t>(d.U64()); }
  void operator()(uint32_t& v) const { v = d.U32(); }
};

}  // namespace

std::string EncodeHealState(const HealState& h) {
  Encoder e;
  HealFields(h, Write{e});
  return std::move(e.str());
}

absl::StatusOr<HealState> DecodeHealState(const std::string& bytes) {
  Decoder d(bytes);
  HealState h;
  HealFields(h, Read{d});
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
