// The keepalive of the connections between a job's roles (docs/wire.md, "Connections").
//
// Every gRPC channel and server the process makes after SetKeepalive takes it: a connection whose
// peer has been silent for `timeout` is closed (a ping goes out after timeout/2 without traffic
// and must be answered within timeout/2), so that its calls fail UNAVAILABLE and its channel
// connects again, resolving the peer's name anew, rather than waiting out the kernel's TCP
// retransmissions (minutes). Servers accept such pings from any client at any rate. A role sets
// it once, at its start and before it connects, from its job's plan (cluster.keepalive_seconds).
#ifndef HYREC_COMMON_KEEPALIVE_H_
#define HYREC_COMMON_KEEPALIVE_H_

#include "absl/time/time.h"

namespace hyrec {

inline constexpr absl::Duration kDefaultKeepalive = absl::Seconds(20);

// Zero (or less) turns keepalive off for the connections made from now on.
void SetKeepalive(absl::Duration timeout);
absl::Duration Keepalive();

}  // namespace hyrec

#endif  // HYREC_COMMON_KEEPALIVE_H_
