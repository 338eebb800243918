// Data time: when a sample happened, in whole seconds since the Unix epoch (a csv `time` column).
// A batch carries its newest sample's, and a table's rows age by the newest it has seen (ttl
// eviction), so one wrong time far ahead would expire every row: the loader takes such a sample
// for a bad line and a shard refuses such a lookup (docs/configuration.md, `tables[].eviction`).
#ifndef HYREC_COMMON_DATA_TIME_H_
#define HYREC_COMMON_DATA_TIME_H_

#include <cstdint>

#include "absl/time/clock.h"

namespace hyrec {

// How far after the reading machine's clock a data time may be.
inline constexpr uint64_t kMaxDataTimeAheadSeconds = 86400;

// This machine's clock in Unix seconds.
inline uint64_t UnixSecondsNow() { return static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now())); }

// Whether `data_time` is more than kMaxDataTimeAheadSeconds after `now`.
inline bool DataTimeTooFarAhead(uint64_t data_time, uint64_t now) { return data_time > now + kMaxDataTimeAheadSeconds; }

}  // namespace hyrec

#endif  // HYREC_COMMON_DATA_TIME_H_
