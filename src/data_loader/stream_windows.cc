#include "src/data_loader/stream_windows.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::data_loader {
namespace {

// How often a stream looks for partitions added to its topic.
constexpr absl::Duration kRefreshEvery = absl::Seconds(10);
// The longest single wait for records, so that a stop is seen.
constexpr absl::Duration kPollSlice = absl::Milliseconds(100);

void Order(std::vector<KafkaRecord>* records) {
  std::sort(records->begin(), records->end(), [](const KafkaRecord& a, const KafkaRecord& b) {
    return std::tie(a.timestamp_ms, a.partition, a.offset) < std::tie(b.timestamp_ms, b.partition, b.offset);
  });
}

}  // namespace

StreamWindows::StreamWindows(std::unique_ptr<KafkaReader> reader, uint64_t batch_size, uint64_t window_records,
                             const KafkaOptions& options)
    : reader_(std::move(reader)),
      batch_size_(std::max<uint64_t>(1, batch_size)),
      window_records_(std::max(batch_size_, window_records - window_records % batch_size_)),
      options_(options) {}

absl::Status StreamWindows::Start(const std::vector<PartitionRange>& first) {
  PartitionOffsets start;
  for (const PartitionRange& r : first) {
    start[r.partition] = r.start;
    if (r.end > r.start) replay_[r.partition] = r.end;
  }
  HYREC_RETURN_IF_ERROR(reader_->Seek(start));
  for (const auto& [p, offset] : reader_->positions()) next_[p] = polled_[p] = offset;
  refreshed_ = absl::Now();
  if (options_.bounded) {
    HYREC_ASSIGN_OR_RETURN(bound_, reader_->EndOffsets());
  }
  if (!options_.end_offsets.empty()) {
    for (int32_t p : reader_->partitions()) {
      auto end = options_.end_offsets.find(p);
      if (end == options_.end_offsets.end()) {
        return absl::InvalidArgumentError(absl::StrCat("loader.source.kafka.end_offsets names no end for partition ", p,
                                                       " of topic '", options_.topic, "'"));
      }
      bound_[p] = end->second;
    }
  }
  return absl::OkStatus();
}

absl::Status StreamWindows::Poll(absl::Duration timeout) {
  // A stream whose ends are offsets reads the partitions it started with; one without end, or
  // one that ends at a time, takes up partitions added to the topic.
  const bool fixed_partitions = options_.bounded || !options_.end_offsets.empty();
  if (!fixed_partitions && absl::Now() - refreshed_ >= kRefreshEvery) {
    refreshed_ = absl::Now();
    HYREC_RETURN_IF_ERROR(reader_->RefreshPartitions().status());
    for (const auto& [p, offset] : reader_->positions()) {
      next_.emplace(p, offset);
      polled_.emplace(p, offset);
    }
  }
  std::vector<KafkaRecord> got;
  HYREC_RETURN_IF_ERROR(reader_->Poll(&got, window_records_, timeout));
  for (KafkaRecord& r : got) Arrived(std::move(r));
  return absl::OkStatus();
}

void StreamWindows::Arrived(KafkaRecord r) {
  polled_[r.partition] = r.offset + 1;
  if (options_.ends()) {
    auto bound = bound_.find(r.partition);
    if (bound == bound_.end() && options_.end_time.has_value() && r.timestamp_ms >= 0 &&
        absl::FromUnixMillis(r.timestamp_ms) >= *options_.end_time) {
      bound = bound_.emplace(r.partition, r.offset).first;  // The partition's first record at its end.
    }
    if (bound != bound_.end() && r.offset >= bound->second) return;       // After the partition's end.
    if (bound == bound_.end() && !options_.end_time.has_value()) return;  // A partition not read.
  }
  pending_.push_back(std::move(r));
}

absl::Status StreamWindows::EndQuietPartitions() {
  if (!options_.end_time.has_value() || absl::Now() < *options_.end_time) return absl::OkStatus();
  if (absl::Now() - quiet_asked_ < absl::Seconds(1)) return absl::OkStatus();
  bool open = false;
  for (const auto& [p, polled] : polled_) open = open || bound_.find(p) == bound_.end();
  if (!open) return absl::OkStatus();
  quiet_asked_ = absl::Now();
  HYREC_ASSIGN_OR_RETURN(const PartitionOffsets ends, reader_->EndOffsets());
  for (const auto& [p, end] : ends) {
    auto polled = polled_.find(p);
    if (polled != polled_.end() && polled->second >= end) bound_.emplace(p, polled->second);
  }
  return absl::OkStatus();
}

bool StreamWindows::AllPolled() const {
  for (const auto& [p, polled] : polled_) {
    auto bound = bound_.find(p);
    if (bound == bound_.end() || polled < bound->second) return false;
  }
  return true;
}

absl::StatusOr<StreamWindow> StreamWindows::Next(const std::function<bool()>& stopping) {
  if (!replay_.empty()) return Replay(stopping);
  absl::Time batch_at = absl::InfiniteFuture();  // When the window first held a whole batch.
  while (pending_.size() < window_records_) {
    if (stopping()) return absl::CancelledError("the loader was stopped");
    if (options_.ends()) HYREC_RETURN_IF_ERROR(EndQuietPartitions());
    if (options_.ends() && AllPolled()) {  // The end: what is left, a window at a time.
      StreamWindow w = Take(std::min<size_t>(pending_.size(), window_records_));
      w.last = pending_.empty();
      return w;
    }
    const absl::Time now = absl::Now();
    if (pending_.size() >= batch_size_) {
      if (batch_at == absl::InfiniteFuture()) batch_at = now;
      if (now - batch_at >= options_.linger) break;
    }
    HYREC_RETURN_IF_ERROR(
        Poll(pending_.size() >= batch_size_ ? std::min(kPollSlice, batch_at + options_.linger - now) : kPollSlice));
  }
  const size_t n = std::min<size_t>(pending_.size(), window_records_);
  StreamWindow w = Take(n - n % batch_size_);
  if (absl::Now() - lag_asked_ >= absl::Seconds(1)) {
    lag_asked_ = absl::Now();
    absl::StatusOr<int64_t> lag = reader_->Lag();  // What is not polled yet, and the rest polled.
    if (lag.ok()) w.lag = *lag + static_cast<int64_t>(pending_.size());
  }
  return w;
}

// The window `replay_` names: every partition read to its end; what arrives past an end (or from
// a partition it does not name) waits for the windows after it.
absl::StatusOr<StreamWindow> StreamWindows::Replay(const std::function<bool()>& stopping) {
  StreamWindow w;
  for (;;) {
    bool whole = true;
    for (const auto& [p, end] : replay_) whole = whole && polled_[p] >= end;
    if (whole) break;
    if (stopping()) return absl::CancelledError("the loader was stopped");
    std::vector<KafkaRecord> got;
    HYREC_RETURN_IF_ERROR(reader_->Poll(&got, window_records_, kPollSlice));
    for (KafkaRecord& r : got) {
      auto end = replay_.find(r.partition);
      if (end != replay_.end() && r.offset < end->second) {
        polled_[r.partition] = r.offset + 1;
        w.records.push_back(std::move(r));
      } else {
        Arrived(std::move(r));
      }
    }
  }
  for (const auto& [p, start] : next_) {
    auto end = replay_.find(p);
    w.ranges.push_back({p, start, end != replay_.end() ? end->second : start});
  }
  for (const auto& [p, end] : replay_) next_[p] = end;
  replay_.clear();
  Order(&w.records);
  return w;
}

// The first `n` pending records (per partition, a prefix of what arrived) as a window.
StreamWindow StreamWindows::Take(size_t n) {
  StreamWindow w;
  std::map<int32_t, int64_t> end = next_;
  for (size_t i = 0; i < n; ++i) {
    end[pending_.front().partition] = pending_.front().offset + 1;
    w.records.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  for (const auto& [p, start] : next_) w.ranges.push_back({p, start, end[p]});
  next_ = std::move(end);
  Order(&w.records);
  return w;
}

}  // namespace hyrec::data_loader
