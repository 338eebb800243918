// gRPC lookups against a real `hyrec ps` process on loopback, beside the in-process client on
// the same store configuration and ids (the floor: the same client logic without a network).
//
//   build/benchmarks/grpc_benchmark [--benchmark_min_time=1]
//
// One PS shard, one table (dim 16, Adagrad), Zipf(1.05) ids over 1M, warmed so every id has a
// row. Client and server share this machine's two cores.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench_util.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/ps_cluster.h"

namespace {

using namespace hyrec::embedding_ps;

constexpr int kDim = 16;
constexpr uint64_t kVocabulary = 1'000'000;
constexpr char kTables[] = "t:16:adagrad:0.05";

std::vector<uint64_t> g_ids;
std::unique_ptr<EmbeddingClient> g_local, g_grpc32, g_grpc16;

void Lookup(benchmark::State& state, EmbeddingClient* client) {
  const size_t n = state.range(0);
  std::vector<float> out(n * kDim);
  size_t offset = 0;
  for (auto _ : state) {
    if (offset + n > g_ids.size()) offset = 0;
    absl::Status s = client->Lookup("t", absl::MakeConstSpan(g_ids.data() + offset, n), absl::MakeSpan(out));
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    offset += n;
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_InProcess(benchmark::State& state) { Lookup(state, g_local.get()); }
void BM_GrpcFp32(benchmark::State& state) { Lookup(state, g_grpc32.get()); }
void BM_GrpcFp16(benchmark::State& state) { Lookup(state, g_grpc16.get()); }

BENCHMARK(BM_InProcess)->Arg(1024)->Arg(16384)->UseRealTime();
BENCHMARK(BM_GrpcFp32)->Arg(1024)->Arg(16384)->UseRealTime();
BENCHMARK(BM_GrpcFp16)->Arg(1024)->Arg(16384)->UseRealTime();

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "grpc_benchmark: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  PsClusterOptions cluster_options;
  cluster_options.binary = HYREC_PS_BINARY;
  cluster_options.args = {std::string("--tables=") + kTables, "--capacity_rows=2000000", "--log_level=warn"};
  auto cluster = PsCluster::Launch(cluster_options);
  if (!cluster.ok()) return Fail(cluster.status());
  ClientOptions fp32, fp16;
  fp16.precision = Precision::kFp16;
  auto c32 = ConnectEmbeddingClient((*cluster)->addresses(), fp32);
  auto c16 = ConnectEmbeddingClient((*cluster)->addresses(), fp16);
  if (!c32.ok()) return Fail(c32.status());
  if (!c16.ok()) return Fail(c16.status());
  g_grpc32 = std::move(*c32);
  g_grpc16 = std::move(*c16);
  StoreOptions store_options;
  store_options.tables = *ParseTableSpecs(kTables);
  store_options.capacity_rows = 2'000'000;
  std::vector<std::shared_ptr<EmbeddingShardStore>> stores = {*EmbeddingShardStore::Create(store_options)};
  g_local = std::move(*NewInProcessEmbeddingClient(stores));

  // Warm both: every id of the vocabulary gets its row.
  std::vector<uint64_t> all(kVocabulary);
  for (uint64_t i = 0; i < kVocabulary; ++i) all[i] = hyrec::Mix64(i);
  std::vector<float> out(16384 * kDim);
  for (size_t i = 0; i < all.size(); i += 16384) {
    const size_t n = std::min<size_t>(16384, all.size() - i);
    auto span = absl::MakeConstSpan(all.data() + i, n);
    auto o = absl::MakeSpan(out).subspan(0, n * kDim);
    if (auto s = g_grpc32->Lookup("t", span, o); !s.ok()) return Fail(s);
    if (auto s = g_local->Lookup("t", span, o); !s.ok()) return Fail(s);
  }
  const hyrec::ZipfDistribution zipf(kVocabulary, 1.05);
  std::mt19937_64 rng(7);
  g_ids.resize(1 << 22);
  for (auto& id : g_ids) id = hyrec::Mix64(zipf(rng) - 1);

  hyrec::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-8s %14s %20s %20s\n", "ids/req", "in-process", "gRPC fp32 (ratio)", "gRPC fp16 (ratio)");
  for (int n : {1024, 16384}) {
    const std::string arg = "/" + std::to_string(n) + "/real_time";
    const double local = reporter.ItemsPerSecond("BM_InProcess" + arg);
    const double r32 = reporter.ItemsPerSecond("BM_GrpcFp32" + arg);
    const double r16 = reporter.ItemsPerSecond("BM_GrpcFp16" + arg);
    std::printf("%-8d %14s %13s (%.2f) %13s (%.2f)\n", n, hyrec::bench::Millions(local).c_str(),
                hyrec::bench::Millions(r32).c_str(), r32 / local, hyrec::bench::Millions(r16).c_str(), r16 / local);
  }
  std::printf("targets: gRPC >= 0.5 x in-process at 1k ids per request, >= 0.85 at 16k (fp32)\n");
  g_grpc32.reset();
  g_grpc16.reset();
  return (*cluster)->Stop().ok() ? 0 : 1;
}
