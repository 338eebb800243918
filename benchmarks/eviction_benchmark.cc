// The store's eviction quality: its hit rate beside exact LRU's at the same capacity, on real
// Criteo ids and on Zipf(1.05) ids.
//
//   build/benchmarks/eviction_benchmark [--criteo=PATH] [--stripes=64] [--batch=64]
//
// --criteo: the Criteo Kaggle train file (tab-separated: label, 13 counts, 26 categorical
// columns; https://www.kaggle.com/c/criteo-display-ad-challenge), or any prefix of it; its 26
// categorical values of each sample are the ids of one table. Without it only Zipf is measured.
// Zipf: 5,000,000 draws over 1,000,000 ids. Each stream is cut into batches of `batch` samples
// whose unique ids are looked up in one call, as a worker sends them (64 Criteo samples ask for
// about 1,000 ids, fewer than the smallest capacity holds: a cache smaller than one request's ids
// measures the order of ids within a request more than the eviction). Capacities of 5%, 20% and
// 50% of the stream's distinct ids. Figures: the fraction of looked-up ids that found their row
// (store: 1 - rows created / ids looked up), exact LRU's on the same unique-batch stream (the
// floor), and the difference in points (target: within 1).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "tests/exact_lru.h"

namespace {

using hyrec::embedding_ps::EmbeddingShardStore;

// Batches of unique ids.
using Stream = std::vector<std::vector<uint64_t>>;

// Exact LRU over `capacity` rows: the hits of a stream.
uint64_t ExactLruHits(const Stream& stream, size_t capacity) {
  hyrec::testing::ExactLru lru(capacity);
  uint64_t hits = 0;
  for (const std::vector<uint64_t>& batch : stream) {
    for (uint64_t id : batch) hits += lru.Use(id) ? 1 : 0;
  }
  return hits;
}

// The store's hits on a stream, one table of `capacity` rows (dim 1, SGD: the rows' size does
// not change which are kept).
bool StoreHits(const Stream& stream, uint64_t capacity, int stripes, uint64_t* hits, uint64_t* uses) {
  hyrec::embedding_ps::StoreOptions options;
  hyrec::embedding_ps::TableConfig table;
  table.name = "t";
  table.dim = 1;
  table.capacity_rows = capacity;
  options.tables = {table};
  options.num_stripes = stripes;
  auto store = EmbeddingShardStore::Create(options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return false;
  }
  std::vector<float> out;
  for (const std::vector<uint64_t>& batch : stream) {
    out.resize(batch.size());
    if (!(*store)->Lookup(0, batch, absl::MakeSpan(out), nullptr).ok()) return false;
  }
  const hyrec::embedding_ps::StoreStats stats = (*store)->Stats();
  *uses = stats.tables[0].lookups;
  *hits = *uses - (stats.tables[0].rows + stats.tables[0].evictions);
  return true;
}

Stream Batches(const std::vector<std::vector<uint64_t>>& samples, int batch) {
  Stream stream;
  for (size_t begin = 0; begin < samples.size(); begin += batch) {
    absl::flat_hash_set<uint64_t> seen;
    std::vector<uint64_t> ids;
    for (size_t s = begin; s < std::min(samples.size(), begin + batch); ++s) {
      for (uint64_t id : samples[s]) {
        if (seen.insert(id).second) ids.push_back(id);
      }
    }
    stream.push_back(std::move(ids));
  }
  return stream;
}

// Each sample's categorical values (columns 15-40), as ids distinct per column.
bool ReadCriteo(const std::string& path, std::vector<std::vector<uint64_t>>* samples) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  std::string line;
  while (std::getline(in, line)) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
    std::vector<uint64_t> ids;
    for (size_t c = 14; c < fields.size(); ++c) {
      if (fields[c].empty()) continue;
      uint64_t value = 0;
      for (char ch : fields[c]) value = value * 131 + static_cast<unsigned char>(ch);
      ids.push_back(hyrec::HashCombine(c, value));
    }
    samples->push_back(std::move(ids));
  }
  return !samples->empty();
}

bool Report(const std::string& name, const Stream& stream, int stripes) {
  absl::flat_hash_set<uint64_t> distinct;
  uint64_t total = 0;
  for (const auto& batch : stream) {
    distinct.insert(batch.begin(), batch.end());
    total += batch.size();
  }
  for (const double share : {0.05, 0.2, 0.5}) {
    const uint64_t capacity = static_cast<uint64_t>(share * distinct.size());
    uint64_t hits = 0, uses = 0;
    if (!StoreHits(stream, capacity, stripes, &hits, &uses)) return false;
    const double store = static_cast<double>(hits) / uses;
    const double exact = static_cast<double>(ExactLruHits(stream, capacity)) / total;
    std::printf("%-10s %9zu %9llu %10.4f %10.4f %+9.2f\n", name.c_str(), distinct.size(),
                static_cast<unsigned long long>(capacity), exact, store, 100.0 * (store - exact));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string criteo;
  int stripes = hyrec::embedding_ps::StoreOptions().num_stripes;
  int batch = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--criteo=", 0) == 0) {
      criteo = arg.substr(9);
    } else if (!(arg.rfind("--stripes=", 0) == 0 && absl::SimpleAtoi(arg.substr(10), &stripes) && stripes > 0) &&
               !(arg.rfind("--batch=", 0) == 0 && absl::SimpleAtoi(arg.substr(8), &batch) && batch > 0)) {
      std::fprintf(stderr, "unknown or malformed argument: %s\n", argv[i]);
      return 2;
    }
  }
  std::printf("hit rate at equal capacity, %d stripes, batches of %d samples\n", stripes, batch);
  std::printf("%-10s %9s %9s %10s %10s %9s\n", "ids", "distinct", "capacity", "exact LRU", "store", "points");
  if (!criteo.empty()) {
    std::vector<std::vector<uint64_t>> samples;
    if (!ReadCriteo(criteo, &samples) || !Report("criteo", Batches(samples, batch), stripes)) return 1;
  } else {
    std::printf("criteo: not measured (--criteo=PATH to the Kaggle train file)\n");
  }
  const hyrec::ZipfDistribution zipf(1'000'000, 1.05);
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint64_t>> samples(5'000'000);
  for (auto& s : samples) s = {hyrec::Mix64(zipf(rng))};
  return Report("zipf1.05", Batches(samples, batch), stripes) ? 0 : 1;
}
