#include <string>
#include <vector>

#include "hyrec/common/program.h"
#include "hyrec/dense_worker/train_main.h"
#include "src/cli/roles.h"

namespace hyrec::dense_worker {

int TrainMain(int argc, char** argv) {
  if (argc >= 1) SetProgramName(argv[0]);
  if (argc >= 2) {
    const std::string role = argv[1];
    int (*role_main)(int, char**) = role == "worker"    ? cli::WorkerMain
                                    : role == "ps"      ? cli::PsMain
                                    : role == "loader"  ? cli::LoaderMain
                                    : role == "predict" ? cli::PredictMain
                                    : role == "eval"    ? cli::EvalMain
                                    : role == "export"  ? cli::ExportMain
                                                        : nullptr;
    if (role_main != nullptr || role == "train") {
      std::vector<char*> args(argv, argv + argc);  // Without the role word.
      args.erase(args.begin() + 1);
      args.push_back(nullptr);
      const int count = argc - 1;
      return role_main != nullptr ? role_main(count, args.data())
                                  : cli::TrainMainWith(count, args.data(), cli::SelfRoleCommands());
    }
  }
  return cli::TrainMainWith(argc, argv, cli::SelfRoleCommands());
}

}  // namespace hyrec::dense_worker
