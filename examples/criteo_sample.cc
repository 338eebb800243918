// Reads a sample of the Criteo challenge data (data/criteo/train.tsv; examples/configs/
// criteo-sample.yaml says how to get it, it is not part of the repository) through the loader and
// prints what a dense worker would receive. Skips cleanly when the sample is absent.
//
//   build/hyrec-criteo-sample [path/to/train.tsv]
#include <unistd.h>

#include <cstdio>
#include <string>

#include "hyrec/data_loader/loader.h"

int main(int argc, char** argv) {
  using namespace hyrec::data_loader;
  std::string path = argc > 1 ? argv[1] : std::string(HYREC_SOURCE_DIR) + "/data/criteo/train.tsv";
  if (access(path.c_str(), R_OK) != 0) {
    std::printf("criteo-sample: %s not found; skipping (the sample is not part of the repository)\n", path.c_str());
    return 0;
  }
  LoaderOptions options;
  options.source.format = Format::kCriteo;
  options.source.files = {path};
  options.batch_size = 1024;
  options.num_workers = 2;
  options.num_shards = 2;
  options.epochs = 1;
  auto loader = Loader::Start(options, {});
  if (!loader.ok()) {
    std::fprintf(stderr, "criteo-sample: %s\n", loader.status().ToString().c_str());
    return 1;
  }
  uint64_t samples = 0, positives = 0, ids = 0, unique = 0;
  bool done[2] = {false, false};
  Batch batch;
  while (!done[0] || !done[1]) {
    for (int w = 0; w < 2; ++w) {
      if (done[w]) continue;
      absl::Status s = (*loader)->stream(w)->Next(&batch, absl::Seconds(60));
      if (!s.ok()) {
        done[w] = true;
        if (!absl::IsOutOfRange(s)) {
          std::fprintf(stderr, "criteo-sample: %s\n", s.ToString().c_str());
          return 1;
        }
        continue;
      }
      samples += batch.batch_size;
      for (float l : batch.labels) positives += l > 0;
      for (const SlotIds& slot : batch.slots) ids += slot.ids.size();
      for (const TableIds& t : batch.tables) unique += t.unique_ids.size();
      if (batch.batch_id < 2) {
        std::printf(
            "worker %d batch %llu: %d samples, slot C1 ids %zu, table C1 unique ids %zu "
            "(shard 0: %u, shard 1: %u)\n",
            w, static_cast<unsigned long long>(batch.batch_id), batch.batch_size, batch.slots[0].ids.size(),
            batch.tables[0].unique_ids.size(), batch.tables[0].shard_offsets[1],
            batch.tables[0].shard_offsets[2] - batch.tables[0].shard_offsets[1]);
      }
    }
  }
  const LoaderStats stats = (*loader)->Stats();
  std::printf(
      "%llu samples (%.1f%% positive) in %llu batches; %llu categorical ids, %.1f%% unique "
      "within their batch and table; %llu of %llu lines bad\n",
      static_cast<unsigned long long>(samples), 100.0 * positives / std::max<uint64_t>(samples, 1),
      static_cast<unsigned long long>(stats.batches), static_cast<unsigned long long>(ids),
      100.0 * unique / std::max<uint64_t>(ids, 1), static_cast<unsigned long long>(stats.bad_lines),
      static_cast<unsigned long long>(stats.lines));
  return 0;
}
