// `hyrec <role> [flags]`: the launcher. Each role is its own binary, `hyrec-<role>`, installed
// beside this one; the launcher replaces itself with it, so a PS process links only the PS tier.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/yaml_config.h"

namespace {

constexpr const char* kRoles[][2] = {
    {"train", "train a job on one machine: every role in one process, or each its own (--processes)"},
    {"ps", "one embedding parameter-server shard (gRPC)"},
    {"loader", "stream a job's training batches to its dense workers (gRPC DataService)"},
    {"worker", "one dense worker of a job (remote PS and loader, c10d sync)"},
    {"certs", "make a job's CA, role certificates and token secret, or a token (docs/security.md)"},
    {"k8s", "render a job's Kubernetes manifests from its plan (hyrec k8s render --help)"},
    {"plan", "size a job: rows, memory per PS shard and machine, bytes per step (docs/capacity.md)"},
    {"checkpoint", "inspect or verify a checkpoint, export or delta directory"},
    {"export", "write the serving artifact (model.pt and rows) of a job's checkpoint"},
    {"predict", "score data files with an exported model, one probability per line"},
    {"eval", "AUC and log loss of an exported model on labelled data"},
    {"ps-demo", "start PS shards and drive lookups and updates through the client"},
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: hyrec <role> [flags]     (hyrec <role> --help lists the role's flags)\n"
               "       hyrec --version\n\nroles:\n");
  for (const auto& role : kRoles) std::fprintf(out, "  %-9s %s\n", role[0], role[1]);
  std::fprintf(out,
               "\nexit codes: 0 success; 1 unexpected failure; 2 invalid configuration, flags or input (do not "
               "retry);\n3 transient failure (a peer lost, a deadline passed: retry); 130 interrupted.\n"
               "docs/configuration.md documents the job file and every flag.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return hyrec::kExitInvalidInput;
  }
  const std::string role = argv[1];
  if (role == "--help" || role == "-h" || role == "help") {
    Usage(stdout);
    return hyrec::kExitOk;
  }
  if (role == "--version" || role == "version") {
    std::printf("hyrec %s\n", hyrec::VersionString().c_str());
    return hyrec::kExitOk;
  }
  std::vector<std::string> names;
  for (const auto& r : kRoles) names.push_back(r[0]);
  bool known = false;
  for (const std::string& name : names) known = known || role == name;
  if (!known) {
    const std::string close = hyrec::ClosestWord(role, names);
    std::fprintf(stderr, "hyrec: unknown role '%s'%s\n\n", role.c_str(),
                 close.empty() ? "" : ("; did you mean '" + close + "'?").c_str());
    Usage(stderr);
    return hyrec::kExitInvalidInput;
  }
  const std::string binary = hyrec::ExecutableDirectory() + "/hyrec-" + role;
  std::vector<char*> args;
  std::string arg0 = "hyrec-" + role;
  args.push_back(arg0.data());
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(binary.c_str(), args.data());
  std::fprintf(stderr, "hyrec: cannot run %s: %s\n", binary.c_str(), std::strerror(errno));
  return hyrec::kExitFailure;
}
