// The `--set key.path=value` flag of every role that reads a job file (job::LoadJobSpec): each
// override replaces or adds one key, as if the file said so, and is checked as the file's own
// keys. The launcher passes the same overrides to every role it starts.
#ifndef HYREC_SRC_CLI_JOB_FLAGS_H_
#define HYREC_SRC_CLI_JOB_FLAGS_H_

#include <string>
#include <vector>

#include "hyrec/common/flags.h"

namespace hyrec::cli {

inline void AddSetFlag(FlagSet& flags, std::vector<std::string>* overrides) {
  flags.StringList("set", overrides, "KEY=VALUE",
                   "Overrides a key of the job file (train.workers=2, loader.source.files=[a.csv,b.csv]); "
                   "repeatable, applied in order, checked as the file's own keys.");
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_JOB_FLAGS_H_
