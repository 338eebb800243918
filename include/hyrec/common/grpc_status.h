// Conversion between absl::Status and grpc::Status at the RPC edge. The canonical codes are the
// same numbers in both, so only the representation changes. Include only from code that links
// gRPC (the service and client targets).
#ifndef HYREC_COMMON_GRPC_STATUS_H_
#define HYREC_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace hyrec {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace hyrec

#endif  // HYREC_COMMON_GRPC_STATUS_H_
