// The entry points of hyrec's roles, as libraries: each `hyrec-<role>` binary is a main() that
// calls one, and a program built on the C++ API (dense_worker/train_main.h) calls them to be every
// role itself.
#ifndef HYREC_SRC_CLI_ROLES_H_
#define HYREC_SRC_CLI_ROLES_H_

#include <string>
#include <vector>

namespace hyrec::cli {

// `hyrec ps`: one embedding PS shard of a job (--config, --shard_index) or a standalone one
// (--tables). Links the PS tier only.
int PsMain(int argc, char** argv);

// `hyrec loader`: the job's data loader as a gRPC DataService. Links the loader tier only.
int LoaderMain(int argc, char** argv);

// How `--processes` starts each role: the command (and leading arguments) of each.
struct RoleCommands {
  std::vector<std::string> ps;
  std::vector<std::string> loader;
  std::vector<std::string> worker;
};
// hyrec-ps, hyrec-loader and hyrec-worker beside the running executable.
RoleCommands SiblingRoleCommands();
// The running executable itself with the role as its first argument (TrainMain dispatches it).
RoleCommands SelfRoleCommands();

// `hyrec train`: the job on one machine, embedded or with --processes.
int TrainMainWith(int argc, char** argv, const RoleCommands& roles);

// `hyrec worker`: one dense worker of a job, against remote PS shards and a remote loader.
int WorkerMain(int argc, char** argv);

// `hyrec checkpoint inspect|verify DIR` (no LibTorch), `hyrec export`, `hyrec predict`, `hyrec eval`.
int CheckpointMain(int argc, char** argv);
// `hyrec certs`: a job's CA, role certificates, token secret and tokens (no LibTorch, no gRPC).
int CertsMain(int argc, char** argv);
// `hyrec k8s render`: the job's Kubernetes manifests (src/cli/k8s_tool.cc).
int K8sMain(int argc, char** argv);
// `hyrec plan`: a job's rows, memory per PS shard and machine, bytes per step (src/cli/plan_tool.cc).
int PlanMain(int argc, char** argv);
int ExportMain(int argc, char** argv);
int PredictMain(int argc, char** argv);
int EvalMain(int argc, char** argv);

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_ROLES_H_
