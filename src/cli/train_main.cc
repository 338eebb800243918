// hyrec-train (`hyrec train`): a job on one machine (src/cli/train_role.cc). With --processes its
// roles run as the hyrec-ps, hyrec-loader and hyrec-worker binaries beside it, so that a PS
// process never loads LibTorch.
#include "src/cli/roles.h"

int main(int argc, char** argv) { return hyrec::cli::TrainMainWith(argc, argv, hyrec::cli::SiblingRoleCommands()); }
