// One rank of the multi-process nn_sync tests: nn_sync_worker RANK WORLD PORT STEPS TIMEOUT_MS
// Prints "step N" after each step, then "params <sum> <sum of squares>" or "error <message>".
#include <cstdio>
#include <cstdlib>

#include "nn_sync_test_model.h"

int main(int argc, char** argv) {
  using namespace hyrec::nn_sync;
  if (argc != 6) {
    std::fprintf(stderr, "usage: nn_sync_worker RANK WORLD PORT STEPS TIMEOUT_MS\n");
    return 2;
  }
  SyncOptions options;
  options.rank = std::atoi(argv[1]);
  options.world_size = std::atoi(argv[2]);
  options.master_port = std::atoi(argv[3]);
  options.timeout = absl::Milliseconds(std::atoi(argv[5]));
  options.bucket_bytes = 1024;
  auto sync = DenseSync::Create(options);
  if (!sync.ok()) {
    std::printf("error %s\n", sync.status().ToString().c_str());
    return 1;
  }
  torch::manual_seed(77 + options.rank);  // Different on purpose: the broadcast must fix it.
  TinyMlp model;
  absl::Status s = TrainSynced(**sync, model, std::atoi(argv[4]), [](int step) {
    std::printf("step %d\n", step);
    std::fflush(stdout);
  });
  if (!s.ok()) {
    std::printf("error %s\n", s.ToString().c_str());
    std::fflush(stdout);
    return 1;
  }
  torch::Tensor flat = Flat(model);
  std::printf("params %.9e %.9e\n", flat.sum().item<double>(), flat.pow(2).sum().item<double>());
  std::fflush(stdout);
  return 0;
}
