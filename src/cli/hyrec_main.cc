// `hyrec <role> [flags]`: the launcher. Each role is its own binary, `hyrec-<role>`, installed
// beside this one; the launcher replaces itself with it, so a PS process links only the PS tier.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr const char* kRoles[][2] = {
    {"ps", "run one embedding parameter-server shard (gRPC)"},
    {"train", "train on one machine: PS, loader and dense workers in one process"},
    {"worker", "one dense worker of a cluster (remote PS and loader, c10d sync)"},
    {"loader", "stream training batches to dense workers (gRPC DataService)"},
    {"ps-demo", "start PS shards and drive lookups and updates through the client"},
};

void Usage(FILE* out) {
  std::fprintf(out, "usage: hyrec <role> [flags]   (hyrec <role> --help for the role's flags)\n\nroles:\n");
  for (const auto& role : kRoles) std::fprintf(out, "  %-10s %s\n", role[0], role[1]);
}

std::string SelfDirectory() {
  std::vector<char> buffer(4096);
  const ssize_t n = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (n <= 0) return ".";
  std::string path(buffer.data(), static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string role = argv[1];
  bool known = false;
  for (const auto& r : kRoles) known = known || role == r[0];
  if (!known) {
    std::fprintf(stderr, "hyrec: unknown role '%s'\n\n", role.c_str());
    Usage(stderr);
    return 2;
  }
  const std::string binary = SelfDirectory() + "/hyrec-" + role;
  std::vector<char*> args;
  std::string arg0 = "hyrec-" + role;
  args.push_back(arg0.data());
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(binary.c_str(), args.data());
  std::fprintf(stderr, "hyrec: cannot run %s: %s\n", binary.c_str(), std::strerror(errno));
  return 127;
}
