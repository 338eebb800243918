// Keys, certificates and tokens for a job's services (docs/security.md): what `hyrec certs`
// writes, and what `hyrec train --processes` makes for its children in a throw-away directory.
//
//   CertificateRequest request;
//   request.dir = "certs";
//   request.identities = JobIdentities(/*workers=*/2, /*ps=*/2, /*loaders=*/1);
//   HYREC_RETURN_IF_ERROR(WriteJobCertificates(request));
//   // certs/ca.pem, ca.key, worker-0.pem, worker-0.key, ..., admin.pem, admin.key, token.secret
//
// Keys are ECDSA P-256; certificates carry the identity as their common name and as a DNS name,
// which clients check against the server they meant to reach ("ps-1"). Private keys and the
// token secret are written with mode 0600. Links OpenSSL's libcrypto.
#ifndef HYREC_COMMON_CERTS_H_
#define HYREC_COMMON_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "hyrec/common/security.h"

namespace hyrec {

struct CertificateRequest {
  std::string dir;                   // Created when missing.
  std::vector<Identity> identities;  // A key and certificate each.
  absl::Duration validity = absl::Hours(24 * 365);
  // Reuse dir/ca.pem and dir/ca.key when they exist (adding identities to a job); else a CA
  // that is already there is an error, so that nothing is overwritten by accident.
  bool reuse_ca = false;
  bool token_secret = true;  // Also write dir/token.secret (32 random bytes, hex).
};

// Every identity of a job: worker-0..workers-1, ps-0..ps-1, loader-0.., and admin.
std::vector<Identity> JobIdentities(int workers, int ps, int loaders);

absl::Status WriteJobCertificates(const CertificateRequest& request);

// Writes `text` to `path` with mode 0600, through a synced temporary file renamed over it.
absl::Status WritePrivateTextFile(const std::string& path, const std::string& text);

// A bearer token for `identity`, valid until `expiry`, signed with `secret` (HMAC-SHA256):
// "hyrec1.<identity>.<expiry, unix seconds>.<hex signature>".
std::string IssueToken(absl::string_view secret, const Identity& identity, absl::Time expiry);

// The token's identity when its signature is `secret`'s and it has not expired at `now`;
// UNAUTHENTICATED saying which check failed otherwise.
absl::StatusOr<Identity> VerifyToken(absl::string_view secret, absl::string_view token, absl::Time now);

// VerifyToken on an authorization header's value, "Bearer <token>"; UNAUTHENTICATED for a value
// of another shape.
absl::StatusOr<Identity> VerifyBearerToken(absl::string_view secret, absl::string_view authorization, absl::Time now);

}  // namespace hyrec

#endif  // HYREC_COMMON_CERTS_H_
