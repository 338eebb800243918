// A role that cannot bind its port says which key or flag set that port, so that the user
// knows what to change:
//
//   auto server = StartServer(...);
//   if (!server.ok()) return NamePortSetting(server.status(), "--port");
#ifndef HYREC_SRC_CLI_PORT_SETTING_H_
#define HYREC_SRC_CLI_PORT_SETTING_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hyrec::cli {

// `status` with `setting` (a flag or a job file's key) named when it is a failure to bind or
// listen (RpcServer's "cannot listen on", the metrics endpoint's "cannot bind"); as it is
// otherwise.
inline absl::Status NamePortSetting(const absl::Status& status, absl::string_view setting) {
  if (status.ok() || !(absl::StrContains(status.message(), "cannot listen on") ||
                       absl::StrContains(status.message(), "cannot bind"))) {
    return status;
  }
  return absl::Status(status.code(), absl::StrCat(status.message(), " (the port is set by ", setting,
                                                  "; if another process holds it, stop that or set another port)"));
}

template <typename T>
absl::StatusOr<T> NamePortSetting(absl::StatusOr<T> started, absl::string_view setting) {
  if (started.ok()) return started;
  return NamePortSetting(started.status(), setting);
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_PORT_SETTING_H_
