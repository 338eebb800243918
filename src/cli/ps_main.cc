// hyrec-ps (`hyrec ps`): one embedding parameter-server shard (src/cli/ps_role.cc).
#include "src/cli/roles.h"

int main(int argc, char** argv) { return hyrec::cli::PsMain(argc, argv); }
