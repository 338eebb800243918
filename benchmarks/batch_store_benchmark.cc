// The store as a training batch uses it: the unique ids of every table of one batch in one call,
// with the caches cold, as the dense step leaves them between two batches.
//
//   build/benchmarks/batch_store_benchmark [--tables=26] [--vocabulary=100000] [--batch=2048]
//                                          [--dim=16] [--batches=200] [--flush_mb=64]
//                                          [--stripes=64] [--repeat=1]
//
// Each table holds `vocabulary` rows (scattered over memory in insertion order); each batch draws
// `batch` ids per table from Zipf(1.05) and keeps the unique ones (~1,000 per table for the
// defaults). Before each timed call, `flush_mb` MiB are written (untimed) to evict the caches.
// Figures, ns per row:
//   floor        a gather of the same rows from one flat float array per table (the same
//                scattering, huge pages as the store's), into the same output
//   lookup       EmbeddingShardStore::Lookup, one call per table
//   update       EmbeddingShardStore::Update (Adagrad), one call per table
// `repeat` runs each figure's batches that many times (the figure is their mean), so that a
// profiler sees the timed calls above the setup.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_util.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace {

using hyrec::embedding_ps::EmbeddingShardStore;
using Clock = std::chrono::steady_clock;

struct Options {
  int tables = 26;
  uint64_t vocabulary = 100000;
  int batch = 2048;
  int dim = 16;
  int batches = 200;
  int flush_mb = 64;
  int stripes = hyrec::embedding_ps::StoreOptions().num_stripes;
  int repeat = 1;
};

// One batch: per table, unique row indices (into the flat arrays) and their ids.
struct Batch {
  std::vector<std::vector<uint32_t>> rows;
  std::vector<std::vector<uint64_t>> ids;
  size_t total = 0;
};

uint64_t IdOf(int table, uint32_t row) { return hyrec::Mix64((static_cast<uint64_t>(table) << 32) | row); }

std::vector<Batch> MakeBatches(const Options& o) {
  const hyrec::ZipfDistribution zipf(o.vocabulary, 1.05);
  std::mt19937_64 rng(7);
  std::vector<Batch> out(o.batches);
  for (Batch& b : out) {
    b.rows.resize(o.tables);
    b.ids.resize(o.tables);
    for (int t = 0; t < o.tables; ++t) {
      absl::flat_hash_set<uint32_t> seen;
      for (int i = 0; i < o.batch; ++i) {
        // Rank -> a row scattered over the table, the same for the store and the flat array.
        const uint32_t row = static_cast<uint32_t>(((zipf(rng) - 1) * 2654435761ULL) % o.vocabulary);
        if (seen.insert(row).second) {
          b.rows[t].push_back(row);
          b.ids[t].push_back(IdOf(t, row));
        }
      }
      b.total += b.rows[t].size();
    }
  }
  return out;
}

// Writes `buffer` so that what an operation reads afterwards comes from memory.
void Flush(std::vector<char>& buffer) {
  for (size_t i = 0; i < buffer.size(); i += 64) buffer[i] = static_cast<char>(buffer[i] + 1);
}

// Mean ns per row of op(batch) over all batches, each after prepare(batch) and a flush, both
// untimed.
template <typename Prepare, typename Op>
double NsPerRow(const std::vector<Batch>& batches, int repeat, std::vector<char>& flush, Prepare&& prepare, Op&& op) {
  double ns = 0;
  size_t rows = 0;
  for (int r = 0; r < repeat; ++r) {
    for (const Batch& b : batches) {
      prepare(b);
      Flush(flush);
      const auto start = Clock::now();
      op(b);
      ns += std::chrono::duration<double, std::nano>(Clock::now() - start).count();
      rows += b.total;
    }
  }
  return ns / static_cast<double>(rows);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag, auto* out) {
      const std::string prefix = absl::StrCat("--", flag, "=");
      return arg.rfind(prefix, 0) == 0 && absl::SimpleAtoi(arg.substr(prefix.size()), out);
    };
    if (!(value("tables", &o.tables) || value("vocabulary", &o.vocabulary) || value("batch", &o.batch) ||
          value("dim", &o.dim) || value("batches", &o.batches) || value("flush_mb", &o.flush_mb) ||
          value("stripes", &o.stripes) || value("repeat", &o.repeat)) ||
        o.repeat < 1) {
      std::fprintf(stderr, "unknown or malformed argument: %s\n", argv[i]);
      return 2;
    }
  }
  hyrec::embedding_ps::StoreOptions options;
  options.num_stripes = o.stripes;
  for (int t = 0; t < o.tables; ++t) {
    hyrec::embedding_ps::TableConfig table;
    table.name = absl::StrCat("t", t);
    table.dim = o.dim;
    table.optimizer.kind = hyrec::embedding_ps::OptimizerKind::kAdagrad;
    options.tables.push_back(table);
  }
  auto created = EmbeddingShardStore::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 2;
  }
  auto store = std::move(*created);
  std::vector<std::unique_ptr<hyrec::bench::HugeFloats>> flat(o.tables);
  {
    std::vector<uint64_t> ids;
    std::vector<float> out;
    for (int t = 0; t < o.tables; ++t) {
      flat[t] = std::make_unique<hyrec::bench::HugeFloats>(o.vocabulary * o.dim, 0.01f);
      ids.clear();
      for (uint32_t r = 0; r < o.vocabulary; ++r) ids.push_back(IdOf(t, r));
      out.resize(ids.size() * o.dim);
      (void)store->Lookup(t, ids, absl::MakeSpan(out), nullptr);  // Every row present.
    }
  }
  const std::vector<Batch> batches = MakeBatches(o);
  size_t total = 0;
  for (const Batch& b : batches) total += b.total;
  std::printf(
      "%d tables x %llu rows (dim %d, Adagrad), %d batches of %d ids per table: %.0f unique rows "
      "a batch; %d MiB written between calls\n",
      o.tables, static_cast<unsigned long long>(o.vocabulary), o.dim, o.batches, o.batch,
      static_cast<double>(total) / batches.size(), o.flush_mb);
  std::vector<char> flush(static_cast<size_t>(o.flush_mb) << 20, 1);
  std::vector<std::vector<float>> out(o.tables);
  std::vector<std::vector<float>> grads(o.tables);
  auto size_buffers = [&](const Batch& b) {  // The output and gradients of every table.
    for (int t = 0; t < o.tables; ++t) {
      out[t].resize(b.ids[t].size() * o.dim);
      grads[t].assign(b.ids[t].size() * o.dim, 1e-4f);
    }
  };

  const double floor = NsPerRow(batches, o.repeat, flush, size_buffers, [&](const Batch& b) {
    for (int t = 0; t < o.tables; ++t) {
      float* dst = out[t].data();
      for (uint32_t row : b.rows[t]) {
        std::memcpy(dst, flat[t]->data() + static_cast<size_t>(row) * o.dim, sizeof(float) * o.dim);
        dst += o.dim;
      }
    }
  });
  const double lookup = NsPerRow(batches, o.repeat, flush, size_buffers, [&](const Batch& b) {
    for (int t = 0; t < o.tables; ++t) {
      if (!store->Lookup(t, b.ids[t], absl::MakeSpan(out[t]), nullptr).ok()) std::abort();
    }
  });
  const double update = NsPerRow(batches, o.repeat, flush, size_buffers, [&](const Batch& b) {
    for (int t = 0; t < o.tables; ++t) {
      if (!store->Update(t, b.ids[t], grads[t], {}, nullptr).ok()) std::abort();
    }
  });
  std::printf("\n%-40s %10s %10s\n", "ns per row, caches cold", "ns", "x floor");
  auto line = [&](const char* name, double ns) { std::printf("%-40s %10.1f %10.2f\n", name, ns, ns / floor); };
  line("floor: flat-array gather", floor);
  line("store lookup", lookup);
  line("store Adagrad update", update);
  return 0;
}
