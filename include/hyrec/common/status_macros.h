// Small helpers for absl::Status propagation.
//
// Debian's Abseil (20220623) ships no RETURN_IF_ERROR / ASSIGN_OR_RETURN, so hyrec defines its
// own, prefixed to avoid clashes:
//
//   auto make_port = [](int p) -> absl::StatusOr<int> {
//     if (p < 0) return absl::InvalidArgumentError("negative port");
//     return p;
//   };
//   HYREC_ASSIGN_OR_RETURN(int port, make_port(7000));
//   HYREC_RETURN_IF_ERROR(Annotate(port > 1024 ? absl::OkStatus() : absl::PermissionDeniedError("low"), "--port"));
#ifndef HYREC_COMMON_STATUS_MACROS_H_
#define HYREC_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define HYREC_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status hyrec_status_ = (expr);         \
    if (!hyrec_status_.ok()) return hyrec_status_; \
  } while (0)

#define HYREC_STATUS_CONCAT_INNER_(a, b) a##b
#define HYREC_STATUS_CONCAT_(a, b) HYREC_STATUS_CONCAT_INNER_(a, b)

#define HYREC_ASSIGN_OR_RETURN(lhs, expr) \
  HYREC_ASSIGN_OR_RETURN_IMPL_(HYREC_STATUS_CONCAT_(hyrec_statusor_, __LINE__), lhs, expr)

#define HYREC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace hyrec {

// Returns `status` with `context` prepended to its message ("context: message"); OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace hyrec

#endif  // HYREC_COMMON_STATUS_MACROS_H_
