// The exit codes of every hyrec binary, as supervisors (Kubernetes pod failure policies, CI)
// key on them. docs/configuration.md lists them.
//
//   int main(int argc, char** argv) {
//     absl::Status status = absl::UnavailableError("PS shard 1 did not answer");
//     if (!status.ok()) std::cerr << "hyrec ps: " << status.message() << "\n";
//     return hyrec::ExitCodeFor(status);  // kExitTransient
//   }
#ifndef HYREC_COMMON_EXIT_CODES_H_
#define HYREC_COMMON_EXIT_CODES_H_

#include "absl/status/status.h"

namespace hyrec {

enum ExitCode : int {
  kExitOk = 0,
  // A failure hyrec did not expect (a bug, an unknown error): look at the message.
  kExitFailure = 1,
  // Invalid configuration, flags or input data: running it again as it is fails the same way.
  kExitInvalidInput = 2,
  // A transient failure (a peer lost or not answering, a deadline passed, memory or quota
  // exhausted): running it again may succeed.
  kExitTransient = 3,
  // Stopped by SIGINT or SIGTERM before the job's end, after finishing its current batch (the
  // summary says what was trained), or at once on a second signal.
  kExitInterrupted = 130,
};

// The exit code for a run that ended with `status`: OK is kExitOk; InvalidArgument, NotFound,
// AlreadyExists, FailedPrecondition, OutOfRange, DataLoss, Unimplemented, PermissionDenied and
// Unauthenticated are kExitInvalidInput; Unavailable, DeadlineExceeded, Aborted and
// ResourceExhausted are kExitTransient; Cancelled is kExitInterrupted; the rest kExitFailure.
inline int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return kExitInvalidInput;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
      return kExitTransient;
    case absl::StatusCode::kCancelled:
      return kExitInterrupted;
    default:
      return kExitFailure;
  }
}

}  // namespace hyrec

#endif  // HYREC_COMMON_EXIT_CODES_H_
