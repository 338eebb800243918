// The name a user runs hyrec by: "hyrec", or the program of one's own that registered its models
// and calls hyrec's entry point (dense_worker/train_main.h). Help texts, error messages and the
// training summary name it, so that a model only that program knows is scored with that program.
#ifndef HYREC_COMMON_PROGRAM_H_
#define HYREC_COMMON_PROGRAM_H_

#include <string>

#include "absl/strings/string_view.h"

namespace hyrec {

// "hyrec" until SetProgramName. Thread-safe.
std::string ProgramName();
// The last path component of `argv0` ("./build/my_trainer" names "my_trainer"); an empty one
// keeps the name.
void SetProgramName(absl::string_view argv0);

}  // namespace hyrec

#endif  // HYREC_COMMON_PROGRAM_H_
