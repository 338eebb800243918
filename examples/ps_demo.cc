// The PS demo (`hyrec ps-demo`, run by tools/demo): starts PS shards as real processes, drives
// Zipf-distributed lookups and Adagrad updates through the gRPC client from several threads, and
// prints throughput and latency beside the same workload on the in-process client.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/ps_cluster.h"

namespace {

using namespace hyrec::embedding_ps;

struct DemoFlags {
  std::string ps_binary;
  int shards = 2;
  int dim = 16;
  int batch = 4096;
  int threads = 2;
  double seconds = 3.0;
  uint64_t vocabulary = 10'000'000;
  double zipf = 1.05;
  bool fp16 = false;
  uint64_t capacity_rows = 300'000;
  hyrec::CommonFlags common;
};
DemoFlags g_flags;

struct PhaseResult {
  double rows_per_second = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

// Each thread repeats: look up a Zipf batch, then push a gradient for it. Thread t is worker
// worker_base + t, through clients[t] (or the one client when there is one).
absl::StatusOr<PhaseResult> Drive(const std::vector<EmbeddingClient*>& clients, int worker_base) {
  const int dim = g_flags.dim;
  const int batch = g_flags.batch;
  const int threads = g_flags.threads;
  const absl::Duration duration = absl::Seconds(g_flags.seconds);
  const hyrec::ZipfDistribution zipf(g_flags.vocabulary, g_flags.zipf);
  std::atomic<uint64_t> rows{0};
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<double> latencies_ms;
  const absl::Time start = absl::Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      EmbeddingClient& client = *clients[clients.size() == 1 ? 0 : t];
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

absl::Status Run() {
  const int shards = g_flags.shards;
  const int dim = g_flags.dim;
  const std::string tables = absl::StrCat("demo:", dim, ":adagrad:0.05");
  PsClusterOptions cluster_options;
  cluster_options.binary = g_flags.ps_binary;
  if (cluster_options.binary.empty()) cluster_options.binary = hyrec::ExecutableDirectory() + "/hyrec-ps";
  cluster_options.num_shards = shards;
  // Capacity below the ids the workload touches, so the LRU evicts as a real PS would.
  cluster_options.args = {
      "--tables=" + tables, absl::StrCat("--capacity_rows=", g_flags.capacity_rows),
      "--log_level=" + std::string(g_flags.common.log_level == "info" ? "warn" : g_flags.common.log_level)};
  // mTLS as in a cluster: a throw-away CA and certificates for the shards and this client.
  char certs[] = "/tmp/hyrec-ps-demo-certs-XXXXXX";
  if (mkdtemp(certs) == nullptr) return absl::UnavailableError("cannot create a directory for certificates");
  hyrec::CertificateRequest request;
  request.dir = certs;
  request.identities = hyrec::JobIdentities(/*workers=*/g_flags.threads, shards, /*loaders=*/0);
  request.token_secret = false;
  absl::Status written = hyrec::WriteJobCertificates(request);
  if (!written.ok()) return written;
  cluster_options.certs = certs;
  std::printf("starting %d PS shard process(es) with mTLS: %s\n", shards, cluster_options.binary.c_str());
  auto cluster = PsCluster::Launch(cluster_options);
  if (!cluster.ok()) return cluster.status();
  // Each thread is a worker of its own, with its own certificate and connection.
  std::vector<std::unique_ptr<EmbeddingClient>> remotes;
  std::vector<EmbeddingClient*> remote_clients;
  for (int t = 0; t < g_flags.threads; ++t) {
    ClientOptions client_options;
    client_options.security = hyrec::SecurityInDirectory(certs, {hyrec::Role::kWorker, t});
    client_options.precision = g_flags.fp16 ? Precision::kFp16 : Precision::kFp32;
    auto remote = ConnectEmbeddingClient((*cluster)->addresses(), client_options);
    if (!remote.ok()) return remote.status();
    remote_clients.push_back(remote->get());
    remotes.push_back(std::move(*remote));
  }
  for (const std::string& a : (*cluster)->addresses()) std::printf("  PS at %s\n", a.c_str());
  // --metrics_port: the shards' figures, read from them at each scrape.
  hyrec::MetricsRegistry metrics;
  std::unique_ptr<hyrec::MetricsHttpServer> metrics_server;
  if (g_flags.common.metrics_port >= 0) {
    EmbeddingClient* client = remote_clients[0];
    metrics.AddCollector([client](hyrec::MetricsRegistry* m) {
      auto stats = client->Stats();
      if (!stats.ok()) return;
      for (const ShardStats& s : *stats) PublishStoreMetrics(s.store, {{"shard", std::to_string(s.shard_index)}}, m);
    });
    auto server = hyrec::MetricsHttpServer::Start(g_flags.common.metrics_host, g_flags.common.metrics_port, &metrics);
    if (!server.ok()) return server.status();
    metrics_server = std::move(*server);
    std::printf("metrics: http://%s:%d/metrics\n", g_flags.common.metrics_host.c_str(), metrics_server->port());
  }

  std::printf("workload: %d thread(s), lookup+update of %d Zipf(%.2f) ids over %llu, dim %d, Adagrad\n",
              g_flags.threads, g_flags.batch, g_flags.zipf, static_cast<unsigned long long>(g_flags.vocabulary), dim);
  auto grpc_result = Drive(remote_clients, 0);
  if (!grpc_result.ok()) return grpc_result.status();

  StoreOptions store_options;
  auto specs = ParseTableSpecs(tables);
  if (!specs.ok()) return specs.status();
  store_options.tables = *specs;
  store_options.capacity_rows = g_flags.capacity_rows;
  std::vector<std::shared_ptr<EmbeddingShardStore>> stores;
  for (int s = 0; s < shards; ++s) {
    auto store = EmbeddingShardStore::Create(store_options);
    if (!store.ok()) return store.status();
    stores.push_back(std::move(*store));
  }
  auto local = NewInProcessEmbeddingClient(stores);
  if (!local.ok()) return local.status();
  auto local_result = Drive({local->get()}, 100);
  if (!local_result.ok()) return local_result.status();

  std::printf("\n%-28s %14s %10s %10s\n", "client", "rows/s", "p50 ms", "p99 ms");
  std::printf("%-28s %14.0f %10.2f %10.2f\n", absl::StrCat("gRPC, ", shards, " PS processes").c_str(),
              grpc_result->rows_per_second, grpc_result->p50_ms, grpc_result->p99_ms);
  std::printf("%-28s %14.0f %10.2f %10.2f\n", "in-process", local_result->rows_per_second, local_result->p50_ms,
              local_result->p99_ms);
  std::printf("ratio gRPC / in-process: %.2f  (rows/s counts each id once per lookup+update)\n",
              grpc_result->rows_per_second / local_result->rows_per_second);

  auto stats = remote_clients[0]->Stats();
  if (!stats.ok()) return stats.status();
  for (const ShardStats& s : *stats) {
    const TableStats& t = s.store.tables[0];
    std::printf(
        "shard %d: %llu of %llu rows, %.1f MiB, %.1f bytes/row beyond the floats, %llu lookups, "
        "%llu updates, %llu evictions\n",
        s.shard_index, static_cast<unsigned long long>(t.rows), static_cast<unsigned long long>(s.store.capacity_rows),
        static_cast<double>(s.store.bytes) / (1 << 20), s.store.OverheadBytesPerRow(),
        static_cast<unsigned long long>(t.lookups), static_cast<unsigned long long>(t.updates),
        static_cast<unsigned long long>(t.evictions));
  }
  remotes.clear();
  const absl::Status stopped = (*cluster)->Stop();
  (void)hyrec::DeleteDirAndFiles(hyrec::Env::Default(), certs);
  return stopped;
}

}  // namespace

int main(int argc, char** argv) {
  DemoFlags& f = g_flags;
  hyrec::FlagSet flags("hyrec ps-demo",
                       "Start PS shards as processes, drive Zipf lookups and Adagrad updates through "
                       "the gRPC client, then the same on the in-process client.");
  flags.String("ps_binary", &f.ps_binary, "PATH", "Path of hyrec-ps (default: beside this binary).");
  flags.Int("shards", &f.shards, "PS processes to start.", 1, 64);
  flags.Int("dim", &f.dim, "Embedding dimension.", 1, 4096);
  flags.Int("batch", &f.batch, "Ids per lookup/update call.", 1, 1 << 22);
  flags.Int("threads", &f.threads, "Client threads.", 1, 256);
  flags.Double("seconds", &f.seconds, "Seconds per phase.", 0.01, 3600);
  flags.Uint64("vocabulary", &f.vocabulary, "Distinct ids (Zipf ranks).");
  flags.Double("zipf", &f.zipf, "Zipf exponent of the ids.", 0.0, 10.0);
  flags.Bool("fp16", &f.fp16, "fp16 transport of rows and gradients.");
  flags.Uint64("capacity_rows", &f.capacity_rows, "Rows each PS shard holds before evicting.");
  flags.AddCommon(&f.common);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  if (f.vocabulary == 0) {
    std::fprintf(stderr, "hyrec ps-demo: --vocabulary must be at least 1\n");
    return hyrec::kExitInvalidInput;
  }
  absl::Status status = Run();
  if (!status.ok()) std::fprintf(stderr, "hyrec ps-demo: %s\n", status.ToString().c_str());
  return hyrec::ExitCodeFor(status);
}
