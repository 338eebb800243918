// hyrec-worker (`hyrec worker`): one dense worker of a job (src/cli/train_role.cc).
#include "src/cli/roles.h"

int main(int argc, char** argv) { return hyrec::cli::WorkerMain(argc, argv); }
