// `hyrec predict --follow`: a scorer that serves the newest complete model of a training job's
// export.dir (dense_worker/follower.h) while the job trains.
#ifndef HYREC_CLI_FOLLOW_H_
#define HYREC_CLI_FOLLOW_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hyrec::cli {

struct FollowOptions {
  std::string export_root;                 // export.dir: base exports and deltas.
  std::string output;                      // Where scores go; empty: standard output.
  absl::Duration poll = absl::Seconds(1);  // How often the root is looked at for a newer model.
};

// Scores standard input: one sample a line in the job's source format (a csv job with a header
// gives the header as its first line), one probability a line out, flushed as each group of
// lines that arrived together is scored, with the newest complete model at that moment. Each
// model taken is announced on standard error ("model step S delta K ..."). Before the job's first
// base export it waits for one. Returns at the end of
// standard input, or with the follower's error (a gap in the deltas, a delta that does not
// verify: DATA_LOSS naming it).
absl::Status Follow(const FollowOptions& options);

}  // namespace hyrec::cli

#endif  // HYREC_CLI_FOLLOW_H_
