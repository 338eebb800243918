// `hyrec certs`: a job's CA, a key and certificate per role, the token secret, and tokens.
//
//   hyrec certs --dir=certs --config=job.yaml            # every identity of the job's plan
//   hyrec certs --dir=certs --workers=4 --ps=8           # or by count
//   hyrec certs --dir=certs --add --workers=6            # more identities under the same CA
//   hyrec certs --dir=certs --token=admin --token_hours=8 > admin.token
//   hyrec certs --dir=certs --config=job.yaml --k8s=myjob   # + certs/k8s-secrets.yaml, one Secret a role
//
// docs/security.md describes the files and how the roles use them.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/deploy/k8s.h"
#include "hyrec/job/job_plan.h"
#include "src/cli/job_flags.h"
#include "src/cli/roles.h"

namespace hyrec::cli {
namespace {

struct CertsFlags {
  std::string dir;
  std::string config;
  std::vector<std::string> overrides;  // --set
  int workers = -1;
  int ps = -1;
  int loaders = 1;
  bool add = false;
  int days = 365;
  std::string token;
  double token_hours = 24;
  std::string k8s;  // The job's name on Kubernetes: also write its Secrets.
  std::string k8s_namespace;
  std::string k8s_out;
  bool kubectl = false;
};

absl::Status PrintToken(const CertsFlags& f) {
  HYREC_ASSIGN_OR_RETURN(const Identity identity, ParseIdentityName(f.token));
  HYREC_ASSIGN_OR_RETURN(std::string secret,
                         ReadFileToString(Env::Default(), JoinPath(f.dir, "token.secret"), 1 << 20));
  const std::string trimmed(absl::StripAsciiWhitespace(secret));
  if (trimmed.empty()) return absl::InvalidArgumentError(absl::StrCat(f.dir, "/token.secret is empty"));
  std::cout << IssueToken(trimmed, identity, absl::Now() + absl::Seconds(f.token_hours * 3600)) << "\n";
  return absl::OkStatus();
}

// The Kubernetes Secrets of the job's roles (--k8s), into --k8s_out (mode 0600) or, with
// --kubectl, as commands on stdout.
absl::Status WriteSecrets(const CertsFlags& f, int workers, int ps) {
  if (f.loaders != 1) return absl::InvalidArgumentError("--k8s renders one loader (loader-0); drop --loaders");
  HYREC_ASSIGN_OR_RETURN(const std::string text, deploy::K8sSecrets(f.k8s, f.k8s_namespace, f.dir, std::max(workers, 0),
                                                                    std::max(ps, 0), f.kubectl));
  if (f.kubectl) {
    std::cout << text;
    return absl::OkStatus();
  }
  const std::string out = f.k8s_out.empty() ? JoinPath(f.dir, "k8s-secrets.yaml") : f.k8s_out;
  HYREC_RETURN_IF_ERROR(WritePrivateTextFile(out, text));
  std::cout << "wrote the Secrets " << deploy::K8sSecretName(f.k8s, Role::kPs) << ", "
            << deploy::K8sSecretName(f.k8s, Role::kLoader) << " and " << deploy::K8sSecretName(f.k8s, Role::kWorker)
            << " to " << out << " (kubectl apply -f " << out << ")\n";
  return absl::OkStatus();
}

absl::Status Write(const CertsFlags& f) {
  CertificateRequest request;
  request.dir = f.dir;
  request.reuse_ca = f.add;
  request.validity = absl::Hours(24) * f.days;
  int workers = f.workers, ps = f.ps;
  if (!f.config.empty()) {
    if (workers >= 0 || ps >= 0) return absl::InvalidArgumentError("--config gives the counts; drop --workers/--ps");
    HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile(f.config, f.overrides));
    workers = static_cast<int>(plan.workers.size());
    ps = static_cast<int>(plan.ps.size());
  }
  if (workers < 0 && ps < 0) return absl::InvalidArgumentError("give --config=JOB.yaml, or --workers and --ps");
  request.identities = JobIdentities(std::max(workers, 0), std::max(ps, 0), f.loaders);
  const bool existing = Env::Default()->FileExists(JoinPath(f.dir, "ca.pem"));
  if (!f.k8s.empty() && existing && !f.add) {  // From the files already there, when they are the job's.
    for (const Identity& identity : request.identities) {
      const std::string pem = JoinPath(f.dir, IdentityName(identity) + ".pem");
      if (!Env::Default()->FileExists(pem)) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.dir, " holds a CA but no ", pem, ": it was made for a job with fewer roles than this one (",
                         std::max(workers, 0), " workers, ", std::max(ps, 0),
                         " PS). Add the missing ones under the same CA with ", "--add, or give a new --dir"));
      }
    }
    return WriteSecrets(f, workers, ps);
  }
  HYREC_RETURN_IF_ERROR(WriteJobCertificates(request));
  if (!f.k8s.empty()) HYREC_RETURN_IF_ERROR(WriteSecrets(f, workers, ps));
  std::cout << "wrote " << request.identities.size() << " identities (" << std::max(workers, 0) << " workers, "
            << std::max(ps, 0) << " PS, " << f.loaders << " loader(s), admin) under " << f.dir << "\n";
  return absl::OkStatus();
}

}  // namespace

int CertsMain(int argc, char** argv) {
  CertsFlags f;
  FlagSet flags("hyrec certs",
                "A job's CA, a key and certificate per role (ECDSA P-256) and its token secret; or, with --token, "
                "a bearer token.");
  flags.String("dir", &f.dir, "DIR", "Where the files go (required); created with mode 0700.");
  flags.String("config", &f.config, "FILE", "The job: one identity per worker and PS shard of its plan.");
  AddSetFlag(flags, &f.overrides);
  flags.Int("workers", &f.workers, "Without --config: worker identities worker-0 ...", -1, 100000);
  flags.Int("ps", &f.ps, "Without --config: PS identities ps-0 ...", -1, 100000);
  flags.Int("loaders", &f.loaders, "Loader identities loader-0 ...", 0, 1024);
  flags.Bool("add", &f.add, "Sign with the CA already in --dir instead of refusing to replace it.");
  flags.Int("days", &f.days, "How long the certificates are valid.", 1, 36500);
  flags.String("token", &f.token, "IDENTITY",
               "Print a token for IDENTITY (worker-N, ps-N, loader-N, admin) signed with DIR/token.secret.");
  flags.Double("token_hours", &f.token_hours, "How long the token is valid.", 0.001, 24 * 3650);
  flags.String("k8s", &f.k8s, "NAME",
               "Also write the Kubernetes Secrets of job NAME (as `hyrec k8s render --name` names it), one per "
               "role, from the files in --dir (made first when there are none).");
  flags.String("k8s_namespace", &f.k8s_namespace, "NAMESPACE", "With --k8s: the Secrets' namespace.");
  flags.String("k8s_out", &f.k8s_out, "FILE", "With --k8s: where the Secrets go (default DIR/k8s-secrets.yaml).");
  flags.Bool("kubectl", &f.kubectl, "With --k8s: print `kubectl create secret` commands instead of manifests.");
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  absl::Status status = f.dir.empty()      ? absl::InvalidArgumentError("--dir is required")
                        : !f.token.empty() ? PrintToken(f)
                                           : Write(f);
  if (!status.ok()) std::cerr << "hyrec certs: " << status.message() << "\n";
  return ExitCodeFor(status);
}

}  // namespace hyrec::cli
