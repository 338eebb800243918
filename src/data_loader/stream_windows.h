// StreamWindows: a stream source's shuffle windows, as the loader reads them from a KafkaReader.
// A window's records are named by a range of offsets per partition (PartitionRange), which the
// workers' positions carry; a window named so is read again exactly (a resumed or replaced
// loader), whatever else has arrived since. A window read live takes the records that arrive, in
// arrival order, up to `window_records` and in whole batches; once it holds one batch it waits at
// most KafkaOptions::linger for more, so that a slow stream still trains. Either way its records
// come ordered by (timestamp, partition, offset), which the same ranges always give again.
// Not thread-safe: the loader's producer thread reads.
#ifndef HYREC_SRC_DATA_LOADER_STREAM_WINDOWS_H_
#define HYREC_SRC_DATA_LOADER_STREAM_WINDOWS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/data_loader/kafka_options.h"
#include "hyrec/data_loader/sample.h"
#include "src/data_loader/kafka_reader.h"

namespace hyrec::data_loader {

struct StreamWindow {
  std::vector<KafkaRecord> records;    // In the window's order.
  std::vector<PartitionRange> ranges;  // Every partition's, [start, end); ascending partitions.
  bool last = false;                   // The last window of a stream with an end (may end in a partial batch).
  // The records of the topic after this window, for this reader's partitions (asked of the
  // brokers at most once a second); -1: not asked this time, or they did not say.
  int64_t lag = -1;
};

class StreamWindows {
 public:
  // `window_records`: a multiple of `batch_size`. `options`: the linger and the stream's end
  // (KafkaOptions::ends).
  StreamWindows(std::unique_ptr<KafkaReader> reader, uint64_t batch_size, uint64_t window_records,
                const KafkaOptions& options);

  // Reads from `first`: a window read before (some end > start), read again exactly; or the
  // starts of the next window (every end == start; empty: every partition from its earliest
  // record). DATA_LOSS when a start is no longer in its partition; INVALID_ARGUMENT when
  // end_offsets names no end for one of the topic's partitions.
  absl::Status Start(const std::vector<PartitionRange>& first);

  // The next window. `stopping` is asked between waits; once true the read ends with CANCELLED.
  absl::StatusOr<StreamWindow> Next(const std::function<bool()>& stopping);

 private:
  absl::Status Poll(absl::Duration timeout);
  // A record polled for the live windows: noted in polled_, and pending unless past its
  // partition's end.
  void Arrived(KafkaRecord r);
  absl::StatusOr<StreamWindow> Replay(const std::function<bool()>& stopping);
  StreamWindow Take(size_t n);
  // An end_time stream past end_time: ends each partition with no end yet whose every record was
  // polled where it was polled to (asks the brokers at most once a second).
  absl::Status EndQuietPartitions();
  // A stream with an end: whether every partition has its end and its records up to it were
  // polled.
  bool AllPolled() const;

  const std::unique_ptr<KafkaReader> reader_;
  const uint64_t batch_size_;
  const uint64_t window_records_;
  const KafkaOptions options_;
  // Each partition's end offset, once known (at Start, or for end_time when its first record
  // stamped at or after end_time is polled, or EndQuietPartitions).
  std::map<int32_t, int64_t> bound_;
  std::deque<KafkaRecord> pending_;    // Polled, in arrival order, not yet in a window.
  std::map<int32_t, int64_t> next_;    // Per partition: the offset after the last window's records.
  std::map<int32_t, int64_t> replay_;  // The ends of the window to read again first; empty: none.
  // Per partition: the offset after the last record polled (kept or past a bounded end).
  std::map<int32_t, int64_t> polled_;
  absl::Time refreshed_ = absl::InfinitePast();
  absl::Time lag_asked_ = absl::InfinitePast();
  absl::Time quiet_asked_ = absl::InfinitePast();
};

}  // namespace hyrec::data_loader

#endif  // HYREC_SRC_DATA_LOADER_STREAM_WINDOWS_H_
