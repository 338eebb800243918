// What mutual TLS costs: gRPC lookups and updates against a real `hyrec ps` serving mTLS, beside
// the same against a plaintext `hyrec ps` (the floor) in the same run, on the same ids; then the
// default `hyrec train --processes` job (examples/configs/synthetic.yaml) with its default
// security (mTLS, a throw-away CA) against the same job with security.mode none.
//
//   build/benchmarks/tls_benchmark [--rounds=2] [--no_train]
//
// PS part: one shard per mode, tables of dim 16 and 64 (Adagrad), 16k Zipf(1.05) ids over 1M
// per request, rows warmed first; 25 x rounds rounds of 4 calls to each shard in turn (paired,
// so drift on the machine falls on both), first one call at a time, then 4 in flight. Client and
// servers share this machine's cores. Targets: TLS >= 0.8 x plaintext for every operation;
// training >= 0.9 x.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_util.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/ps_cluster.h"
#include "train_run.h"

namespace {

using namespace hyrec::embedding_ps;

constexpr uint64_t kVocabulary = 1'000'000;
constexpr size_t kIds = 16384;
constexpr int kInFlight = 4;  // Two workers, each with a lookup and an update outstanding.
constexpr char kTables[] = "d16:16:adagrad:0.05,d64:64:adagrad:0.05";

std::vector<uint64_t> g_ids;
std::unique_ptr<EmbeddingClient> g_plain, g_tls;

struct Op {
  const char* name;
  const char* table;
  int dim;
  bool update;
};

// One call of `op` on `client` at the ids from `*offset`.
absl::Status Call(EmbeddingClient& client, const Op& op, size_t* offset, std::atomic<uint64_t>* sequence) {
  thread_local std::vector<float> rows, grads;
  rows.resize(kIds * op.dim);
  grads.assign(kIds * op.dim, 0.001f);
  if (*offset + kIds > g_ids.size()) *offset = 0;
  const auto ids = absl::MakeConstSpan(g_ids.data() + *offset, kIds);
  *offset += kIds;
  return op.update ? client.Update(op.table, ids, grads, UpdateId{0, sequence->fetch_add(1) + 1})
                   : client.Lookup(op.table, ids, absl::MakeSpan(rows));
}

// `in_flight` threads each make `calls` calls of `op` on `client`; the wall time they took.
absl::StatusOr<absl::Duration> Burst(EmbeddingClient& client, const Op& op, int in_flight, int calls,
                                     std::vector<size_t>* offsets, std::atomic<uint64_t>* sequence) {
  std::vector<absl::Status> results(in_flight);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < in_flight; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < calls && results[t].ok(); ++k) results[t] = Call(client, op, &(*offsets)[t], sequence);
    });
  }
  for (auto& thread : threads) thread.join();
  const absl::Duration took = absl::Now() - start;
  for (const absl::Status& s : results) HYREC_RETURN_IF_ERROR(s);
  return took;
}

// Paired measurement: rounds of a few calls on the plaintext shard then the same on the mTLS
// one, so that whatever else the machine does falls on both alike. Ids per second of each, with
// `in_flight` calls at a time (1: each call's latency; more: what the server sustains, as
// workers that prefetch lookups and send updates asynchronously load it).
absl::StatusOr<std::pair<double, double>> Measure(const Op& op, int rounds, int in_flight) {
  constexpr int kCallsPerRound = 4;
  std::vector<size_t> plain_offsets(in_flight), tls_offsets(in_flight);
  for (int t = 0; t < in_flight; ++t) plain_offsets[t] = tls_offsets[t] = t * (g_ids.size() / in_flight);
  std::atomic<uint64_t> plain_sequence{0}, tls_sequence{0};
  absl::Duration plain_time, tls_time;
  for (int r = -1; r < rounds; ++r) {  // Round -1 warms both.
    HYREC_ASSIGN_OR_RETURN(const absl::Duration plain,
                           Burst(*g_plain, op, in_flight, kCallsPerRound, &plain_offsets, &plain_sequence));
    HYREC_ASSIGN_OR_RETURN(const absl::Duration tls,
                           Burst(*g_tls, op, in_flight, kCallsPerRound, &tls_offsets, &tls_sequence));
    if (r < 0) continue;
    plain_time += plain;
    tls_time += tls;
  }
  const double ids = static_cast<double>(rounds) * kCallsPerRound * in_flight * kIds;
  return std::make_pair(ids / absl::ToDoubleSeconds(plain_time), ids / absl::ToDoubleSeconds(tls_time));
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tls_benchmark: %s\n", s.ToString().c_str());
  return 1;
}

absl::Status Warm(EmbeddingClient& client) {
  std::vector<uint64_t> all(kVocabulary);
  for (uint64_t i = 0; i < kVocabulary; ++i) all[i] = hyrec::Mix64(i);
  for (const auto& [table, dim] : {std::pair<const char*, int>{"d16", 16}, {"d64", 64}}) {
    std::vector<float> out(kIds * dim);
    for (size_t i = 0; i < all.size(); i += kIds) {
      const size_t n = std::min(kIds, all.size() - i);
      absl::Status s =
          client.Lookup(table, absl::MakeConstSpan(all.data() + i, n), absl::MakeSpan(out).subspan(0, n * dim));
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// samples_per_second of one `hyrec train --processes` run of `job`.
absl::StatusOr<double> TrainSamplesPerSecond(const std::string& job, const std::string& report) {
  return hyrec::bench::TrainSamplesPerSecond(HYREC_TRAIN_BINARY, job, report);
}

int TrainPart(int rounds) {
  const std::string base = std::string(HYREC_SOURCE_DIR) + "/examples/configs/synthetic.yaml";
  std::ifstream in(base);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string plain = "/tmp/hyrec_tls_benchmark_plain.yaml";
  std::ofstream(plain) << text << "security: {mode: none}\n";
  double best_plain = 0, best_tls = 0;
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {  // Interleaved, so drift on the machine hits both alike.
    auto p = TrainSamplesPerSecond(plain, "/tmp/hyrec_tls_benchmark_plain.report");
    if (!p.ok()) return Fail(p.status());
    auto t = TrainSamplesPerSecond(base, "/tmp/hyrec_tls_benchmark_tls.report");
    if (!t.ok()) return Fail(t.status());
    std::printf("round %d: plaintext %.0f samples/s, mTLS %.0f samples/s (%.2f)\n", r + 1, *p, *t, *t / *p);
    best_plain = std::max(best_plain, *p);
    best_tls = std::max(best_tls, *t);
    ratios.push_back(*t / *p);
  }
  std::sort(ratios.begin(), ratios.end());
  const double median = rounds % 2 == 1 ? ratios[rounds / 2] : (ratios[rounds / 2 - 1] + ratios[rounds / 2]) / 2;
  std::printf(
      "\nhyrec train --processes (synthetic.yaml), best of %d: plaintext %.0f, mTLS %.0f samples/s (%.2f); "
      "median of the rounds' ratios %.2f\n",
      rounds, best_plain, best_tls, best_tls / best_plain, median);
  std::printf("target: mTLS >= 0.9 x plaintext\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 2;
  bool train = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no_train") {
      train = false;
    } else if (arg.rfind("--rounds=", 0) == 0 && absl::SimpleAtoi(arg.substr(9), &rounds) && rounds >= 1) {
    } else {
      std::fprintf(stderr, "tls_benchmark: unknown argument '%s' (--rounds=N, --no_train)\n", arg.c_str());
      return 2;
    }
  }
  char certs[] = "/tmp/hyrec-tls-benchmark-XXXXXX";
  if (mkdtemp(certs) == nullptr) return Fail(absl::UnavailableError("mkdtemp"));
  hyrec::CertificateRequest request;
  request.dir = certs;
  request.identities = hyrec::JobIdentities(1, 1, 0);
  if (auto s = hyrec::WriteJobCertificates(request); !s.ok()) return Fail(s);

  PsClusterOptions plain_options;
  plain_options.binary = HYREC_PS_BINARY;
  plain_options.args = {std::string("--tables=") + kTables, "--capacity_rows=4000000", "--log_level=warn"};
  PsClusterOptions tls_options = plain_options;
  tls_options.certs = certs;
  auto plain = PsCluster::Launch(plain_options);
  if (!plain.ok()) return Fail(plain.status());
  auto tls = PsCluster::Launch(tls_options);
  if (!tls.ok()) return Fail(tls.status());
  ClientOptions plain_client, tls_client;
  tls_client.security = hyrec::SecurityInDirectory(certs, {hyrec::Role::kWorker, 0});
  auto p = ConnectEmbeddingClient((*plain)->addresses(), plain_client);
  if (!p.ok()) return Fail(p.status());
  auto t = ConnectEmbeddingClient((*tls)->addresses(), tls_client);
  if (!t.ok()) return Fail(t.status());
  g_plain = std::move(*p);
  g_tls = std::move(*t);
  if (auto s = Warm(*g_plain); !s.ok()) return Fail(s);
  if (auto s = Warm(*g_tls); !s.ok()) return Fail(s);
  const hyrec::ZipfDistribution zipf(kVocabulary, 1.05);
  std::mt19937_64 rng(7);
  g_ids.resize(1 << 22);
  for (auto& id : g_ids) id = hyrec::Mix64(zipf(rng) - 1);

  for (const int in_flight : {1, kInFlight}) {
    std::printf("%-10s %16s %16s %8s   (%d call%s in flight)\n", "16k ids", "plaintext", "mTLS", "ratio", in_flight,
                in_flight == 1 ? "" : "s");
    for (const Op& op : {Op{"Lookup16", "d16", 16, false}, Op{"Update16", "d16", 16, true},
                         Op{"Lookup64", "d64", 64, false}, Op{"Update64", "d64", 64, true}}) {
      auto rates = Measure(op, rounds * 25 / in_flight, in_flight);
      if (!rates.ok()) return Fail(rates.status());
      std::printf("%-10s %16s %16s %8.2f\n", op.name, hyrec::bench::Millions(rates->first).c_str(),
                  hyrec::bench::Millions(rates->second).c_str(), rates->second / rates->first);
    }
  }
  std::printf("targets: mTLS >= 0.85 x plaintext with 1 call in flight, >= 0.8 with 4\n");
  g_plain.reset();
  g_tls.reset();
  const int code = train ? TrainPart(rounds) : 0;
  (void)(*plain)->Stop();
  (void)(*tls)->Stop();
  return code;
}
