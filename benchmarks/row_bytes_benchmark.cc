// Bytes a PS row costs by precision and optimizer, from the store's own accounting: a store of one
// dim-16 table (by default) filled to a capacity of 1,000,000 rows with hashed ids, its
// StoreStats::bytes / rows (the slot, the index, the slab's slack) for fp32 + adagrad (the floor:
// what a row cost before row precision and the row-wise optimizers) and for the other
// combinations, and each one's ratio to the floor (target for fp16 + adagrad_rowwise: <= 0.35).
//
//   build/benchmarks/row_bytes_benchmark [--dim=16] [--rows=1000000]
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "hyrec/common/hash.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace {

using hyrec::embedding_ps::EmbeddingShardStore;
using hyrec::embedding_ps::OptimizerKind;
using hyrec::embedding_ps::RowPrecision;

// The store's bytes per row once it holds `rows` rows of one table of `dim`.
double BytesPerRow(RowPrecision precision, OptimizerKind kind, int dim, uint64_t rows) {
  hyrec::embedding_ps::TableConfig t;
  t.name = "t";
  t.dim = dim;
  t.precision = precision;
  t.optimizer.kind = kind;
  hyrec::embedding_ps::StoreOptions o;
  o.tables = {t};
  o.capacity_rows = rows;
  auto store = EmbeddingShardStore::Create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return -1;
  }
  std::vector<uint64_t> ids(4096);
  std::vector<float> out(ids.size() * dim);
  for (uint64_t base = 0; base < rows; base += ids.size()) {
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = hyrec::Mix64(base + i + 1);
    if (!(*store)->Lookup(0, ids, absl::MakeSpan(out), nullptr).ok()) return -1;
  }
  const auto stats = (*store)->Stats();
  return static_cast<double>(stats.bytes) / static_cast<double>(stats.rows);
}

}  // namespace

int main(int argc, char** argv) {
  int dim = 16;
  uint64_t rows = 1000000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool ok = false;
    if (absl::StartsWith(arg, "--dim=")) ok = absl::SimpleAtoi(arg.substr(6), &dim) && dim >= 1 && dim <= 4096;
    if (absl::StartsWith(arg, "--rows=")) ok = absl::SimpleAtoi(arg.substr(7), &rows) && rows >= 1000;
    if (!ok) {
      std::fprintf(stderr, "row_bytes_benchmark: bad argument %s (--dim=1..4096, --rows>=1000)\n", arg.c_str());
      return 2;
    }
  }
  const double floor = BytesPerRow(RowPrecision::kFp32, OptimizerKind::kAdagrad, dim, rows);
  if (floor <= 0) return 1;
  std::printf("dim %d, %llu rows; floor fp32 + adagrad: %.1f bytes a row\n", dim, static_cast<unsigned long long>(rows),
              floor);
  const struct {
    RowPrecision precision;
    OptimizerKind kind;
  } cases[] = {{RowPrecision::kFp32, OptimizerKind::kAdagradRowwise},
               {RowPrecision::kFp16, OptimizerKind::kAdagrad},
               {RowPrecision::kFp16, OptimizerKind::kAdagradRowwise},
               {RowPrecision::kFp16, OptimizerKind::kSgd},
               {RowPrecision::kInt8, OptimizerKind::kAdagradRowwise}};
  for (const auto& c : cases) {
    const double bytes = BytesPerRow(c.precision, c.kind, dim, rows);
    if (bytes <= 0) return 1;
    std::printf("%s + %-16s %6.1f bytes a row  %.3f of the floor\n",
                std::string(hyrec::embedding_ps::RowPrecisionName(c.precision)).c_str(),
                std::string(hyrec::embedding_ps::OptimizerName(c.kind)).c_str(), bytes, bytes / floor);
  }
  return 0;
}
