// The PS demo (`hyrec ps-demo`, run by tools/demo): starts PS shards as real processes, drives
// Zipf-distributed lookups and Adagrad updates through the gRPC client from several threads, and
// prints throughput and latency beside the same workload on the in-process client.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/ps_cluster.h"

ABSL_FLAG(std::string, ps_binary, "", "Path of hyrec-ps (default: beside this binary).");
ABSL_FLAG(int, shards, 2, "PS processes to start.");
ABSL_FLAG(int, dim, 16, "Embedding dimension.");
ABSL_FLAG(int, batch, 4096, "Ids per lookup/update call.");
ABSL_FLAG(int, threads, 2, "Client threads.");
ABSL_FLAG(double, seconds, 3.0, "Seconds per phase.");
ABSL_FLAG(uint64_t, vocabulary, 10'000'000, "Distinct ids (Zipf ranks).");
ABSL_FLAG(double, zipf, 1.05, "Zipf exponent of the ids.");
ABSL_FLAG(bool, fp16, false, "fp16 transport of rows and gradients.");
ABSL_FLAG(uint64_t, capacity_rows, 300'000, "Rows each PS shard holds before evicting.");

namespace {

using namespace hyrec::embedding_ps;

struct PhaseResult {
  double rows_per_second = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

// Each thread repeats: look up a Zipf batch, then push a gradient for it.
absl::StatusOr<PhaseResult> Drive(EmbeddingClient& client, int worker_base) {
  const int dim = absl::GetFlag(FLAGS_dim);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int threads = absl::GetFlag(FLAGS_threads);
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const hyrec::ZipfDistribution zipf(absl::GetFlag(FLAGS_vocabulary), absl::GetFlag(FLAGS_zipf));
  std::atomic<uint64_t> rows{0};
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<double> latencies_ms;
  const absl::Time start = absl::Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<uint64_t> ids(batch);
      std::vector<float> values(static_cast<size_t>(batch) * dim);
      std::vector<float> grads(values.size(), 0.001f);
      std::vector<double> local;
      for (uint64_t seq = 1; absl::Now() - start < duration; ++seq) {
        for (uint64_t& id : ids) id = hyrec::Mix64(zipf(rng));
        const absl::Time t0 = absl::Now();
        absl::Status s = client.Lookup("demo", ids, absl::MakeSpan(values));
        if (s.ok()) s = client.Update("demo", ids, grads, UpdateId{static_cast<uint32_t>(worker_base + t), seq});
        local.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
        if (!s.ok()) {
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = s;
          return;
        }
        rows += static_cast<uint64_t>(batch);
      }
      absl::MutexLock lock(&mu);
      latencies_ms.insert(latencies_ms.end(), local.begin(), local.end());
    });
  }
  for (auto& th : pool) th.join();
  if (!first_error.ok()) return first_error;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::sort(latencies_ms.begin(), latencies_ms.end());
  PhaseResult r;
  r.rows_per_second = static_cast<double>(rows.load()) / seconds;
  if (!latencies_ms.empty()) {
    r.p50_ms = latencies_ms[latencies_ms.size() / 2];
    r.p99_ms = latencies_ms[std::min(latencies_ms.size() - 1, latencies_ms.size() * 99 / 100)];
  }
  return r;
}

std::string SelfDirectory() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  std::string path(buffer, n > 0 ? static_cast<size_t>(n) : 0);
  return path.substr(0, path.rfind('/'));
}

absl::Status Run() {
  const int shards = absl::GetFlag(FLAGS_shards);
  const int dim = absl::GetFlag(FLAGS_dim);
  const std::string tables = absl::StrCat("demo:", dim, ":adagrad:0.05");
  PsClusterOptions cluster_options;
  cluster_options.binary = absl::GetFlag(FLAGS_ps_binary);
  if (cluster_options.binary.empty()) cluster_options.binary = SelfDirectory() + "/hyrec-ps";
  cluster_options.num_shards = shards;
  // Capacity below the ids the workload touches, so the LRU evicts as a real PS would.
  cluster_options.args = {"--tables=" + tables,
                          absl::StrCat("--capacity_rows=", absl::GetFlag(FLAGS_capacity_rows)),
                          "--log_level=warn"};
  std::printf("starting %d PS shard process(es): %s\n", shards, cluster_options.binary.c_str());
  auto cluster = PsCluster::Launch(cluster_options);
  if (!cluster.ok()) return cluster.status();
  ClientOptions client_options;
  client_options.precision = absl::GetFlag(FLAGS_fp16) ? Precision::kFp16 : Precision::kFp32;
  auto remote = ConnectEmbeddingClient((*cluster)->addresses(), client_options);
  if (!remote.ok()) return remote.status();
  for (const std::string& a : (*cluster)->addresses()) std::printf("  PS at %s\n", a.c_str());

  std::printf("workload: %d thread(s), lookup+update of %d Zipf(%.2f) ids over %llu, dim %d, Adagrad\n",
              absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_zipf),
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_vocabulary)), dim);
  auto grpc_result = Drive(**remote, 0);
  if (!grpc_result.ok()) return grpc_result.status();

  StoreOptions store_options;
  auto specs = ParseTableSpecs(tables);
  if (!specs.ok()) return specs.status();
  store_options.tables = *specs;
  store_options.capacity_rows = absl::GetFlag(FLAGS_capacity_rows);
  std::vector<std::shared_ptr<EmbeddingShardStore>> stores;
  for (int s = 0; s < shards; ++s) {
    auto store = EmbeddingShardStore::Create(store_options);
    if (!store.ok()) return store.status();
    stores.push_back(std::move(*store));
  }
  auto local = NewInProcessEmbeddingClient(stores);
  if (!local.ok()) return local.status();
  auto local_result = Drive(**local, 100);
  if (!local_result.ok()) return local_result.status();

  std::printf("\n%-28s %14s %10s %10s\n", "client", "rows/s", "p50 ms", "p99 ms");
  std::printf("%-28s %14.0f %10.2f %10.2f\n",
              absl::StrCat("gRPC, ", shards, " PS processes").c_str(),
              grpc_result->rows_per_second, grpc_result->p50_ms, grpc_result->p99_ms);
  std::printf("%-28s %14.0f %10.2f %10.2f\n", "in-process", local_result->rows_per_second,
              local_result->p50_ms, local_result->p99_ms);
  std::printf("ratio gRPC / in-process: %.2f  (rows/s counts each id once per lookup+update)\n",
              grpc_result->rows_per_second / local_result->rows_per_second);

  auto stats = (*remote)->Stats();
  if (!stats.ok()) return stats.status();
  for (const ShardStats& s : *stats) {
    const TableStats& t = s.store.tables[0];
    std::printf("shard %d: %llu of %llu rows, %.1f MiB, %.1f bytes/row beyond the floats, %llu lookups, "
                "%llu updates, %llu evictions\n",
                s.shard_index, static_cast<unsigned long long>(t.rows),
                static_cast<unsigned long long>(s.store.capacity_rows),
                static_cast<double>(s.store.bytes) / (1 << 20), s.store.OverheadBytesPerRow(),
                static_cast<unsigned long long>(t.lookups), static_cast<unsigned long long>(t.updates),
                static_cast<unsigned long long>(t.evictions));
  }
  return (*cluster)->Stop();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = Run();
  if (!status.ok()) {
    std::fprintf(stderr, "ps-demo: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
