// Helpers shared by the loader and DataService tests.
#ifndef HYREC_TESTS_STREAM_TEST_UTIL_H_
#define HYREC_TESTS_STREAM_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "hyrec/data_loader/loader.h"

namespace hyrec::data_loader {

// Reads the streams in turn, as concurrent workers would (the loader deals batch b to worker
// b % num_workers, so a worker that stops reading eventually stalls the others), until each
// ends or reaches its limit.
inline std::vector<std::vector<Batch>> DrainAll(const std::vector<BatchStream*>& streams,
                                                std::vector<size_t> limits = {}) {
  if (limits.empty()) limits.assign(streams.size(), SIZE_MAX);
  std::vector<std::vector<Batch>> out(streams.size());
  std::vector<bool> done(streams.size(), false);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t w = 0; w < streams.size(); ++w) {
      if (done[w] || out[w].size() >= limits[w]) continue;
      Batch b;
      absl::Status s = streams[w]->Next(&b, absl::Seconds(30));
      if (!s.ok()) {
        EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
        done[w] = true;
        continue;
      }
      out[w].push_back(std::move(b));
      progress = true;
    }
  }
  return out;
}

inline std::vector<BatchStream*> Streams(Loader& loader, int workers) {
  std::vector<BatchStream*> out;
  for (int w = 0; w < workers; ++w) out.push_back(loader.stream(w));
  return out;
}

}  // namespace hyrec::data_loader

#endif  // HYREC_TESTS_STREAM_TEST_UTIL_H_
