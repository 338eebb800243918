// Store lookup and Adagrad update throughput beside the floor: a plain gather of the same rows
// from a flat float array (on huge pages, as the store's rows are), on the same Zipf(1.05) ids
// over 10M rows, in the same binary.
//
//   build/benchmarks/store_benchmark [--rows=10000000] [--dims=16,64,128] [--unbounded] [--eviction=lru|lfu|ttl]
//                                    [--benchmark_min_time=1]
//
// The store's capacity is `rows` (bounded: every access keeps LRU order), or none with
// --unbounded (the embedded default's store: no LRU upkeep).
//
// Ids: Zipf rank r -> row index (r * 2654435761) mod rows (a fixed scattering, so hot rows are
// spread over memory in both the array and the store) -> feature id Mix64(index).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench_util.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace {

using hyrec::embedding_ps::EmbeddingShardStore;

constexpr int kBatch = 4096;
constexpr size_t kIdPool = 1 << 22;

struct Data {
  int dim = 0;
  uint64_t rows = 0;
  std::unique_ptr<hyrec::bench::HugeFloats> flat;  // rows * dim, on huge pages as the store's rows

  std::vector<uint32_t> indices;  // Zipf-drawn row indices (kIdPool)
  std::vector<uint64_t> ids;      // Mix64(index)
  std::unique_ptr<EmbeddingShardStore> store;
};

Data* g_data = nullptr;
bool g_unbounded = false;
// The table's eviction policy; ttl with a data time that stays put (the upkeep, no expiry).
hyrec::embedding_ps::EvictionPolicy g_eviction = hyrec::embedding_ps::EvictionPolicy::kLru;
uint64_t g_store_rss_bytes = 0;

// Resident set size of this process.
uint64_t ResidentBytes() { return hyrec::ProcessStatusBytes(getpid(), "VmRSS").value_or(0); }

void BuildData(Data& d, int dim, uint64_t rows) {
  d.dim = dim;
  d.rows = rows;
  d.flat = std::make_unique<hyrec::bench::HugeFloats>(rows * dim);
  for (size_t k = 0; k < d.flat->size(); ++k) d.flat->data()[k] = static_cast<float>(k % 97) * 1e-3f;
  const hyrec::ZipfDistribution zipf(rows, 1.05);
  std::mt19937_64 rng(2024);
  d.indices.resize(kIdPool);
  d.ids.resize(kIdPool);
  for (size_t i = 0; i < kIdPool; ++i) {
    const uint64_t rank = zipf(rng) - 1;
    d.indices[i] = static_cast<uint32_t>((rank * 2654435761ULL) % rows);
    d.ids[i] = hyrec::Mix64(d.indices[i]);
  }
  const uint64_t rss_before = ResidentBytes();
  hyrec::embedding_ps::StoreOptions options;
  hyrec::embedding_ps::TableConfig table;
  table.name = "t";
  table.dim = dim;
  table.optimizer.kind = hyrec::embedding_ps::OptimizerKind::kAdagrad;
  table.eviction.policy = g_eviction;
  if (g_eviction == hyrec::embedding_ps::EvictionPolicy::kTtl) table.eviction.ttl_seconds = 86400;
  options.tables = {table};
  options.capacity_rows = g_unbounded ? 0 : rows;
  d.store = std::move(*EmbeddingShardStore::Create(options));
  d.store->AdvanceDataTime(0, 1'700'000'000);
  // Every row present, inserted in a scattered order.
  std::vector<uint64_t> batch;
  std::vector<float> out(static_cast<size_t>(kBatch) * dim);
  for (uint64_t r = 0; r < rows; ++r) {
    batch.push_back(hyrec::Mix64((r * 2654435761ULL) % rows));
    if (batch.size() == kBatch || r + 1 == rows) {
      (void)d.store->Lookup(0, batch, absl::MakeSpan(out).subspan(0, batch.size() * dim), nullptr);
      batch.clear();
    }
  }
  g_store_rss_bytes = ResidentBytes() - rss_before;
}

size_t Offset(benchmark::State& state, size_t iteration) {
  return ((iteration * state.threads() + state.thread_index()) * kBatch) % (kIdPool - kBatch);
}

void BM_FlatGather(benchmark::State& state) {
  const Data& d = *g_data;
  std::vector<float> out(static_cast<size_t>(kBatch) * d.dim);
  size_t iteration = 0;
  for (auto _ : state) {
    const uint32_t* idx = d.indices.data() + Offset(state, iteration++);
    for (int i = 0; i < kBatch; ++i) {
      std::memcpy(out.data() + static_cast<size_t>(i) * d.dim, d.flat->data() + static_cast<size_t>(idx[i]) * d.dim,
                  sizeof(float) * d.dim);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_StoreLookup(benchmark::State& state) {
  Data& d = *g_data;
  std::vector<float> out(static_cast<size_t>(kBatch) * d.dim);
  size_t iteration = 0;
  for (auto _ : state) {
    absl::Span<const uint64_t> ids(d.ids.data() + Offset(state, iteration++), kBatch);
    if (!d.store->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok()) state.SkipWithError("lookup");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_StoreAdagradUpdate(benchmark::State& state) {
  Data& d = *g_data;
  std::vector<float> grads(static_cast<size_t>(kBatch) * d.dim, 1e-4f);
  size_t iteration = 0;
  for (auto _ : state) {
    absl::Span<const uint64_t> ids(d.ids.data() + Offset(state, iteration++), kBatch);
    if (!d.store->Update(0, ids, grads, {}, nullptr).ok()) state.SkipWithError("update");
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t rows = 10'000'000;
  std::vector<int> dims = {16, 64, 128};
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--rows=", 0) == 0) {
      (void)absl::SimpleAtoi(arg.substr(7), &rows);
    } else if (arg == "--unbounded") {
      g_unbounded = true;
    } else if (arg.rfind("--eviction=", 0) == 0) {
      auto policy = hyrec::embedding_ps::ParseEvictionPolicy(arg.substr(11));
      if (!policy.ok()) {
        std::fprintf(stderr, "store_benchmark: %s\n", policy.status().ToString().c_str());
        return 2;
      }
      g_eviction = *policy;
    } else if (arg.rfind("--dims=", 0) == 0) {
      dims.clear();
      for (absl::string_view s : absl::StrSplit(arg.substr(7), ',')) {
        int dim = 0;
        if (absl::SimpleAtoi(s, &dim)) dims.push_back(dim);
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  hyrec::bench::RecordingReporter reporter;
  struct Line {
    int dim;
    int threads;
    double floor, lookup, update;
  };
  std::vector<Line> lines;
  for (int dim : dims) {
    auto data = std::make_unique<Data>();
    std::printf("building dim %d: %llu rows in the store and in a flat array...\n", dim,
                static_cast<unsigned long long>(rows));
    std::fflush(stdout);
    BuildData(*data, dim, rows);
    const auto stats = data->store->Stats();
    std::printf(
        "store: %llu rows, %.1f MiB accounted, %.2f bytes/row beyond the floats; "
        "resident growth %.1f MiB, %.2f bytes/row beyond the floats\n",
        static_cast<unsigned long long>(stats.rows), stats.bytes / 1048576.0, stats.OverheadBytesPerRow(),
        g_store_rss_bytes / 1048576.0, (static_cast<double>(g_store_rss_bytes) - stats.payload_bytes) / stats.rows);
    g_data = data.get();
    for (int threads : {1, 2}) {
      const std::string suffix = "/dim:" + std::to_string(dim);
      benchmark::RegisterBenchmark(("FlatGather" + suffix).c_str(), BM_FlatGather)->Threads(threads)->UseRealTime();
      benchmark::RegisterBenchmark(("StoreLookup" + suffix).c_str(), BM_StoreLookup)->Threads(threads)->UseRealTime();
      benchmark::RegisterBenchmark(("StoreAdagradUpdate" + suffix).c_str(), BM_StoreAdagradUpdate)
          ->Threads(threads)
          ->UseRealTime();
    }
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::ClearRegisteredBenchmarks();
    for (int threads : {1, 2}) {
      const std::string suffix = "/dim:" + std::to_string(dim) + "/real_time/threads:" + std::to_string(threads);
      lines.push_back({dim, threads, reporter.ItemsPerSecond("FlatGather" + suffix),
                       reporter.ItemsPerSecond("StoreLookup" + suffix),
                       reporter.ItemsPerSecond("StoreAdagradUpdate" + suffix)});
    }
    g_data = nullptr;
  }
  std::printf("\n%-5s %-7s %14s %14s %8s %14s %8s\n", "dim", "threads", "floor rows/s", "lookup rows/s", "ratio",
              "update rows/s", "ratio");
  for (const Line& l : lines) {
    std::printf("%-5d %-7d %14s %14s %8.2f %14s %8.2f\n", l.dim, l.threads, hyrec::bench::Millions(l.floor).c_str(),
                hyrec::bench::Millions(l.lookup).c_str(), l.floor > 0 ? l.lookup / l.floor : 0.0,
                hyrec::bench::Millions(l.update).c_str(), l.floor > 0 ? l.update / l.floor : 0.0);
  }
  std::printf("targets: lookup >= 0.5 x floor, update >= 0.3 x floor\n");
  return 0;
}
