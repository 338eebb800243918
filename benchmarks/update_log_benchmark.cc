// What the PS update log costs. (1) A shard: Update calls over gRPC (loopback, plaintext) against
// a shard that logs every update with the default policy (sync every_group), beside the same
// shard without a log (the floor), in the same run, with 1, 4 and 16 clients calling at once
// (each its own worker id and channel). Rounds alternate the two shards so that drift falls on
// both. (2) Training: the default `hyrec train --processes` job (examples/configs/synthetic.yaml
// with a checkpoint directory, so its shards log) beside the same job with ps.update_log false,
// runs alternated.
//
//   build/benchmarks/update_log_benchmark [--rounds=3] [--seconds=2] [--dir=/tmp] [--sync=every_group]
//                                         [--train_rounds=2] [--only=shard|train]
//
// One table of dim 16 (Adagrad), 1024 distinct ids a call out of 1M; the log is written under
// --dir (its disk is what is measured). Targets: logged >= 0.9 x unlogged at 16 clients, and
// for training.
#include <sys/resource.h>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/server.h"
#include "hyrec/embedding_ps/update_log.h"
#include "train_run.h"

namespace {

using namespace hyrec::embedding_ps;

constexpr int kDim = 16;
constexpr size_t kIds = 1024;

struct Shard {
  std::unique_ptr<EmbeddingServer> server;
  std::string address;
};

absl::StatusOr<Shard> StartShard(const std::string& log_dir, LogSync sync) {
  TableConfig table;
  table.name = "t";
  table.dim = kDim;
  table.optimizer.kind = OptimizerKind::kAdagrad;
  StoreOptions store_options;
  store_options.tables = {table};
  HYREC_ASSIGN_OR_RETURN(auto store, EmbeddingShardStore::Create(store_options));
  ServerOptions options;
  options.port = 0;
  if (!log_dir.empty()) {
    std::filesystem::remove_all(log_dir);
    UpdateLogOptions log;
    log.dir = log_dir;
    log.sync = sync;
    HYREC_ASSIGN_OR_RETURN(auto opened, UpdateLog::Open(log));
    HYREC_RETURN_IF_ERROR(opened->Reset(""));
    options.update_log = std::move(opened);
  }
  Shard shard;
  HYREC_ASSIGN_OR_RETURN(shard.server, EmbeddingServer::Start(std::move(store), options));
  shard.address = absl::StrCat("127.0.0.1:", shard.server->port());
  return shard;
}

// This process's CPU seconds and context switches so far.
std::pair<double, double> ProcessUsage() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return {static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
              static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6,
          static_cast<double>(usage.ru_nvcsw + usage.ru_nivcsw)};
}

struct Rate {
  double calls_per_second = 0;
  double cpu_us_per_call = 0;    // This process's CPU time (clients and shard alike) per call.
  double switches_per_call = 0;  // Its context switches per call.
};

// Updates per second of `clients` threads calling `address` for `seconds`.
absl::StatusOr<Rate> Measure(const std::string& address, int clients, double seconds, uint64_t* sequence_base) {
  std::vector<std::unique_ptr<EmbeddingClient>> connections;
  for (int c = 0; c < clients; ++c) {
    HYREC_ASSIGN_OR_RETURN(auto client, ConnectEmbeddingClient({address}, ClientOptions()));
    connections.push_back(std::move(client));
  }
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> failed{false};
  const auto usage_start = ProcessUsage();
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 random(static_cast<uint64_t>(c) * 7919 + *sequence_base);
      std::vector<uint64_t> ids(kIds);
      const std::vector<float> grads(kIds * kDim, 0.001f);
      for (uint64_t s = *sequence_base; absl::Now() < end; ++s) {
        for (size_t i = 0; i < kIds; ++i) ids[i] = (random() % (1'000'000 / kIds)) * kIds + i;  // Distinct.
        if (!connections[c]->Update("t", ids, grads, UpdateId{static_cast<uint32_t>(c), s}).ok()) {
          failed = true;
          return;
        }
        ++calls;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const auto usage_end = ProcessUsage();
  *sequence_base += 1'000'000;
  if (failed) return absl::InternalError("an update failed");
  const double n = static_cast<double>(std::max<uint64_t>(1, calls.load()));
  return Rate{n / seconds, (usage_end.first - usage_start.first) / n * 1e6,
              (usage_end.second - usage_start.second) / n};
}

// (2): the default job with its logs (sync `sync`) against the same job without; returns the exit
// code of main.
int TrainPart(int rounds, const std::string& dir, LogSync sync) {
  if (std::string(HYREC_TRAIN_BINARY).empty()) {
    std::printf("\nhyrec train: not built (HYREC_WITH_TORCH is off)\n");
    return 0;
  }
  std::ifstream in(std::string(HYREC_SOURCE_DIR) + "/examples/configs/synthetic.yaml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string checkpoints = dir + "/hyrec-update-log-benchmark-ckpt";
  const std::string job = "/tmp/hyrec_update_log_benchmark.yaml";
  std::ofstream(job) << text << "checkpoint: {dir: " << checkpoints << ", every_steps: 1000}\n";
  const std::string report = "/tmp/hyrec_update_log_benchmark.report";
  const std::vector<std::string> logged = {std::string("--set=ps.update_log.sync=") + LogSyncName(sync)};
  const std::vector<std::string> unlogged = {"--set=ps.update_log=false"};
  std::printf("\nhyrec train --processes (synthetic.yaml, a checkpoint every 1000 steps under %s), samples/s\n",
              dir.c_str());
  double best_plain = 0, best_logged = 0;
  std::vector<double> ratios;
  const auto run = [&](const std::vector<std::string>& flags) {
    std::filesystem::remove_all(checkpoints);
    auto rate = hyrec::bench::TrainSamplesPerSecond(HYREC_TRAIN_BINARY, job, report, flags);
    std::filesystem::remove_all(checkpoints);
    return rate;
  };
  for (int r = 0; r < rounds; ++r) {  // Alternated, each first in every other round: drift hits both alike.
    absl::StatusOr<double> p, l;
    if (r % 2 == 0) {
      p = run(unlogged);
      l = run(logged);
    } else {
      l = run(logged);
      p = run(unlogged);
    }
    if (!p.ok() || !l.ok()) {
      std::fprintf(stderr, "%s\n", std::string((p.ok() ? l.status() : p.status()).message()).c_str());
      return 1;
    }
    std::printf("round %d: no log %.0f, log %.0f (%.2f)\n", r + 1, *p, *l, *l / *p);
    best_plain = std::max(best_plain, *p);
    best_logged = std::max(best_logged, *l);
    ratios.push_back(*l / *p);
  }
  std::printf("best of %d: no log %.0f, log (sync %s) %.0f samples/s (%.2f)\ntarget: log >= 0.9 x no log\n", rounds,
              best_plain, LogSyncName(sync), best_logged, best_logged / best_plain);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  int train_rounds = 2;
  std::string only;
  double seconds = 2;
  std::string dir = "/tmp";
  LogSync sync = LogSync::kEveryGroup;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool ok = true;
    if (arg.rfind("--rounds=", 0) == 0) {
      ok = absl::SimpleAtoi(arg.substr(9), &rounds) && rounds > 0;
    } else if (arg.rfind("--seconds=", 0) == 0) {
      ok = absl::SimpleAtod(arg.substr(10), &seconds) && seconds > 0;
    } else if (arg.rfind("--train_rounds=", 0) == 0) {
      ok = absl::SimpleAtoi(arg.substr(15), &train_rounds) && train_rounds >= 0;
    } else if (arg.rfind("--only=", 0) == 0) {
      only = arg.substr(7);
      ok = only == "shard" || only == "train";
    } else if (arg.rfind("--dir=", 0) == 0) {
      dir = arg.substr(6);
    } else if (arg.rfind("--sync=", 0) == 0) {
      ok = hyrec::FindName(kLogSyncNames, arg.substr(7), &sync);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: update_log_benchmark [--rounds=N] [--seconds=S] [--dir=DIR] "
                   "[--sync=every_group|interval|off] [--train_rounds=N] [--only=shard|train]; bad '%s'\n",
                   arg.c_str());
      return 2;
    }
  }
  if (only == "train") return TrainPart(train_rounds, dir, sync);
  const std::string log_dir = dir + "/hyrec-update-log-benchmark";
  auto plain = StartShard("", sync);
  auto logged = StartShard(log_dir, sync);
  if (!plain.ok() || !logged.ok()) {
    std::fprintf(stderr, "cannot start the shards: %s\n",
                 std::string((plain.ok() ? logged.status() : plain.status()).message()).c_str());
    return 1;
  }
  std::printf("Update calls of %zu ids (dim %d, Adagrad) per second, log (sync %s, under %s) vs none\n", kIds, kDim,
              LogSyncName(sync), dir.c_str());
  std::printf("%-8s %10s %10s %7s %12s %9s %10s %9s   %s\n", "clients", "no log", "log", "ratio", "cpu us/call",
              "(no log)", "csw/call", "(no log)", "ratios of the rounds");
  uint64_t sequence = 1;
  for (int clients : {1, 4, 16}) {
    Rate best_plain, best_logged;
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) {
      auto p = Measure(plain->address, clients, seconds, &sequence);
      auto l = Measure(logged->address, clients, seconds, &sequence);
      if (!p.ok() || !l.ok()) {
        std::fprintf(stderr, "%s\n", std::string((p.ok() ? l.status() : p.status()).message()).c_str());
        return 1;
      }
      if (p->calls_per_second > best_plain.calls_per_second) best_plain = *p;
      if (l->calls_per_second > best_logged.calls_per_second) best_logged = *l;
      ratios.push_back(l->calls_per_second / p->calls_per_second);
    }
    std::string each;
    for (double r : ratios) absl::StrAppend(&each, absl::StrFormat("%.2f ", r));
    std::printf("%-8d %10.0f %10.0f %7.2f %12.0f %9.0f %10.1f %9.1f   %s\n", clients, best_plain.calls_per_second,
                best_logged.calls_per_second, best_logged.calls_per_second / best_plain.calls_per_second,
                best_logged.cpu_us_per_call, best_plain.cpu_us_per_call, best_logged.switches_per_call,
                best_plain.switches_per_call, each.c_str());
  }
  std::filesystem::remove_all(log_dir);
  return only == "shard" || train_rounds == 0 ? 0 : TrainPart(train_rounds, dir, sync);
}
