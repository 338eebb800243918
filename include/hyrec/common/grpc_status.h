// Conversion between absl::Status and grpc::Status at the RPC edge. The canonical codes are the
// same numbers in both, so only the representation changes. Include only from code that links
// gRPC (the service and client targets).
#ifndef HYREC_COMMON_GRPC_STATUS_H_
#define HYREC_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace hyrec {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// Whether `message` (a gRPC status's or log line's) says a TLS handshake failed on a
// certificate that the verifying side's CA did not sign: OpenSSL's and BoringSSL's words for
// "certificate verify failed" and for the alerts a refusing peer sends.
inline bool SaysCertificateNotSignedByCa(absl::string_view message) {
  for (absl::string_view words : {"certificate verify failed", "CERTIFICATE_VERIFY_FAILED", "unknown ca", "UNKNOWN_CA",
                                  "alert bad certificate", "ALERT_BAD_CERTIFICATE"}) {
    if (absl::StrContains(message, words)) return true;
  }
  return false;
}

// What a client says when its TLS handshake with `peer` failed on a certificate: the two sides'
// certificates are not of one CA (another job's, or this job's made again), which a retry cannot
// mend. InvalidArgument; OK when `status` is not such a failure.
inline absl::Status CertificateRefusal(const grpc::Status& status, absl::string_view peer) {
  if (status.ok() || !SaysCertificateNotSignedByCa(status.error_message())) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      peer, ": certificate not signed by this job's CA (the TLS handshake failed: ", status.error_message(),
      "); this process and its peer hold certificates of different CAs (another job's, or made again with hyrec "
      "certs): give both the same job's security.dir"));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace hyrec

#endif  // HYREC_COMMON_GRPC_STATUS_H_
