// Who a peer of a hyrec service is, and how a process proves who it is (docs/security.md).
//
// Every service of a cluster job (PS shards, the loader's DataService) serves over mutual TLS:
// both ends present a certificate signed by the job's CA, and the server learns the client's
// identity ("worker-3", "ps-0", "loader-0", "admin") from its certificate's common name, or from
// a bearer token the client sends beside it (signed with the job's token secret; certs.h issues
// them). Each RPC then checks the identity's role: only workers update rows and stream batches,
// only admin takes cuts, and a worker's update ids and batch stream are its own.
//
//   SecurityOptions security = SecurityInDirectory("certs", Identity{Role::kWorker, 3});
//   // certs/ca.pem, certs/worker-3.pem, certs/worker-3.key
//
// This header is plain data, linked by the job plan; the gRPC side is in src/common/rpc.h and
// key and certificate generation in certs.h.
#ifndef HYREC_COMMON_SECURITY_H_
#define HYREC_COMMON_SECURITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hyrec {

enum class Role { kWorker, kPs, kLoader, kAdmin };

absl::string_view RoleName(Role role);

struct Identity {
  Role role = Role::kAdmin;
  int index = 0;  // The worker's rank, the PS shard, the loader; 0 for admin.

  bool operator==(const Identity& o) const { return role == o.role && index == o.index; }
};

// "worker-3", "ps-0", "loader-0", "admin": the certificate common name and the token subject.
std::string IdentityName(const Identity& identity);
// The inverse of IdentityName; InvalidArgument for anything else.
absl::StatusOr<Identity> ParseIdentityName(absl::string_view name);

struct SecurityOptions {
  // False: plaintext and no authentication. Only where every process that can reach the port is
  // trusted (in-process tests); the cluster config's default is true.
  bool enabled = false;
  std::string ca_file;    // PEM: the job's CA; a peer's certificate must chain to it.
  std::string cert_file;  // PEM: this process's certificate.
  std::string key_file;   // PEM: its private key.
  // Client side, optional: a token (one line) sent as "authorization: Bearer <token>". The
  // server then takes the identity from the token instead of the certificate. A file that cannot
  // be read fails the call; it never falls back to no token.
  std::string token_file;
  // Server side, optional: the HMAC key tokens are checked against; empty: tokens are refused
  // and only certificates identify peers.
  std::string token_secret_file;
  // How often the certificate, token and secret files are checked for changes.
  absl::Duration reload_interval = absl::Seconds(5);
};

// Enabled, with the files of `identity` in a directory laid out by `hyrec certs`: ca.pem,
// <name>.pem and <name>.key.
SecurityOptions SecurityInDirectory(const std::string& dir, const Identity& identity);

}  // namespace hyrec

#endif  // HYREC_COMMON_SECURITY_H_
