// hyrec-loader (`hyrec loader`): the job's data loader as a process (src/cli/loader_role.cc).
#include "src/cli/roles.h"

int main(int argc, char** argv) { return hyrec::cli::LoaderMain(argc, argv); }
