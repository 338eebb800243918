// The flags every role shares for its identity: --certs (the job's certificate directory, in
// place of security.dir) and --token_file (a bearer token to send). docs/security.md.
#ifndef HYREC_SRC_CLI_SECURITY_FLAGS_H_
#define HYREC_SRC_CLI_SECURITY_FLAGS_H_

#include <string>

#include "hyrec/common/flags.h"
#include "hyrec/common/security.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::cli {

struct SecurityFlags {
  std::string certs;
  std::string token_file;
};

inline void AddSecurityFlags(FlagSet& flags, SecurityFlags* f) {
  flags.String("certs", &f->certs, "DIR",
               "The job's certificates (hyrec certs) in place of security.dir: ca.pem and this role's "
               "<identity>.pem and .key.");
  flags.String("token_file", &f->token_file, "FILE",
               "A bearer token (hyrec certs --token) this process sends; the server then takes the identity "
               "from it.");
}

// The role's options: the job's security section with the flags applied.
inline SecurityOptions ResolveSecurity(const job::SecuritySpec& spec, const Identity& identity,
                                       const SecurityFlags& f) {
  SecurityOptions options = job::RoleSecurity(spec, identity, f.certs);
  if (options.enabled) options.token_file = f.token_file;
  return options;
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_SECURITY_FLAGS_H_
