// The lease of what a role holds through an OwnershipEpoch (a PS shard's update log, the job's
// loader). While it serves, the role checks its holding every half lease on a PeriodicTask, so
// that a process replaced while it was frozen or cut off (on another host that shares the
// volume) stops, through the epoch's on_lost, once it can read the volume again, even when no
// call reaches it.
#ifndef HYREC_SRC_CLI_LEASE_WATCH_H_
#define HYREC_SRC_CLI_LEASE_WATCH_H_

#include "absl/time/time.h"

namespace hyrec::cli {

inline constexpr absl::Duration kOwnershipLease = absl::Seconds(1);               // OwnershipOptions::lease
inline constexpr absl::Duration kOwnershipCheckPeriod = absl::Milliseconds(500);  // Half the lease.

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_LEASE_WATCH_H_
