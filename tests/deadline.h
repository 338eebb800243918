// Checks that a call with a deadline ends in bounded time, without depending on the machine's
// speed or load: a call is expected to end within its deadline plus kLoadSlack, what a loaded
// machine may add to any wall-clock wait (scheduling, a process's start). The bound stays far
// below what a call that ignored its deadline would take (a hang until the ctest TIMEOUT, or a
// sleep of its peer that is longer still), so such a call still fails the check.
#ifndef HYREC_TESTS_DEADLINE_H_
#define HYREC_TESTS_DEADLINE_H_

#include "absl/time/time.h"

namespace hyrec::testing {

inline constexpr absl::Duration kLoadSlack = absl::Seconds(10);

// The most a call with `deadline` may take on a loaded machine.
inline absl::Duration Bounded(absl::Duration deadline) { return deadline + kLoadSlack; }

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_DEADLINE_H_
