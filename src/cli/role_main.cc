// hyrec-<tool> binaries whose main is one role entry point (src/cli/roles.h), named at build time
// by HYREC_ROLE_MAIN: hyrec-certs, hyrec-k8s, hyrec-plan, hyrec-checkpoint, hyrec-export, hyrec-predict, hyrec-eval.
#include "src/cli/roles.h"

int main(int argc, char** argv) { return hyrec::cli::HYREC_ROLE_MAIN(argc, argv); }
