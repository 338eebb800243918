// What one lost PS shard costs: a real `hyrec ps` process holding --rows rows (dim 64, Adagrad)
// is checkpointed, takes --replay_calls more Update calls (logged, sync every_group), is killed
// with SIGKILL and restarted with --recover on its port. Reported: kill to serving again (the
// restarted process prints its "listening" line only once its state is back), and its parts as
// the shard logs them (the checkpoint's load, the log's replay). Floors, in this binary on the
// same data: reading the shard's checkpoint file (the bytes a load must read) and applying the
// same updates to a store in this process (what a replay must do, without the log).
//
//   build/benchmarks/recovery_benchmark [--rows=1000000] [--replay_calls=200] [--dir=/tmp]
//
// Target: kill to serving <= 60 s for 10M rows on the reference machine (two cores).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace {

using namespace hyrec;
using namespace hyrec::embedding_ps;

constexpr int kDim = 64;
constexpr size_t kIdsPerCall = 8192;

struct Flags {
  uint64_t rows = 1'000'000;
  int replay_calls = 200;
  std::string dir = "/tmp";
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = true;
    if (absl::StartsWith(a, "--rows=")) {
      ok = absl::SimpleAtoi(a.substr(7), &f->rows) && f->rows >= kIdsPerCall;
    } else if (absl::StartsWith(a, "--replay_calls=")) {
      ok = absl::SimpleAtoi(a.substr(15), &f->replay_calls) && f->replay_calls >= 0;
    } else if (absl::StartsWith(a, "--dir=")) {
      f->dir = a.substr(6);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "recovery_benchmark: bad flag %s\nflags: --rows=N (>= %zu) --replay_calls=N --dir=DIR\n",
                   a.c_str(), kIdsPerCall);
      return false;
    }
  }
  return true;
}

// The calls after the checkpoint: a fixed seed, so the floor applies the same ones.
std::vector<std::vector<uint64_t>> ReplayIds(const Flags& f) {
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint64_t>> calls(f.replay_calls);
  for (auto& ids : calls) {
    ids.resize(kIdsPerCall);
    for (uint64_t& id : ids) id = 1 + rng() % f.rows;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  }
  return calls;
}

std::vector<float> Grads(size_t ids, float value) { return std::vector<float>(ids * kDim, value); }

class Bench {
 public:
  explicit Bench(Flags f) : f_(std::move(f)), root_(JoinPath(f_.dir, "hyrec-recovery-benchmark")) {}
  ~Bench() {
    if (ps_ != nullptr) ps_->Signal(SIGKILL);
    std::filesystem::remove_all(root_);
  }

  absl::Status Run() {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    job_ = JoinPath(root_, "job.yaml");
    std::ofstream(job_) << "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n"
                        << "features: [f]\n"
                        << "tables: [{name: t, features: [f], dim: " << kDim << ", capacity_rows: " << f_.rows * 2
                        << ", optimizer: {kind: adagrad, learning_rate: 0.05}}]\n"
                        << "ps: {shards: 1}\nsecurity: {mode: none}\n"
                        << "checkpoint: {dir: " << JoinPath(root_, "ckpt") << "}\n";
    HYREC_ASSIGN_OR_RETURN(const int port, StartShard(/*port=*/0, /*recover=*/false));
    ClientOptions options;
    options.call_timeout = absl::Seconds(600);
    options.attempt_timeout = absl::Seconds(120);
    HYREC_ASSIGN_OR_RETURN(auto client, ConnectEmbeddingClient({absl::StrCat("127.0.0.1:", port)}, options));
    const absl::Time filled = absl::Now();
    uint64_t sequence = 0;
    std::vector<uint64_t> ids(kIdsPerCall);
    const std::vector<float> grads = Grads(kIdsPerCall, 0.01f);
    for (uint64_t first = 1; first <= f_.rows; first += kIdsPerCall) {
      const size_t n = std::min<uint64_t>(kIdsPerCall, f_.rows - first + 1);
      ids.resize(n);
      for (size_t i = 0; i < n; ++i) ids[i] = first + i;
      HYREC_RETURN_IF_ERROR(
          client->Update("t", ids, absl::MakeConstSpan(grads).subspan(0, n * kDim), UpdateId{0, ++sequence}));
    }
    std::printf("filled %llu rows in %.1f s\n", static_cast<unsigned long long>(f_.rows),
                absl::ToDoubleSeconds(absl::Now() - filled));
    HYREC_RETURN_IF_ERROR(Checkpoint(*client));
    const std::vector<std::vector<uint64_t>> calls = ReplayIds(f_);
    for (const auto& c : calls) {
      HYREC_RETURN_IF_ERROR(client->Update("t", c, Grads(c.size(), 0.02f), UpdateId{0, ++sequence}));
    }
    client.reset();
    ps_->Signal(SIGKILL);
    (void)ps_->Wait(absl::Seconds(30));
    const absl::Time killed = absl::Now();
    HYREC_ASSIGN_OR_RETURN(const int again, StartShard(port, /*recover=*/true));
    const double serving = absl::ToDoubleSeconds(absl::Now() - killed);
    if (again != port) return absl::InternalError("the shard came back on another port");
    ps_->Signal(SIGTERM);
    (void)ps_->Wait(absl::Seconds(30));
    double load = -1, replay = -1;
    HYREC_RETURN_IF_ERROR(ReadParts(&load, &replay));

    const double floor_load = ReadFloor();
    const double floor_replay = ApplyFloor(calls);
    std::printf(
        "\nrecovery of one shard: %llu rows (dim %d, adagrad), %d logged calls of <= %zu ids after its "
        "checkpoint\n",
        static_cast<unsigned long long>(f_.rows), kDim, f_.replay_calls, kIdsPerCall);
    std::printf("%-34s %9s %9s %7s\n", "part", "hyrec s", "floor s", "ratio");
    std::printf("%-34s %9.2f %9.2f %7.2f\n", "checkpoint load / file read", load, floor_load, load / floor_load);
    std::printf("%-34s %9.2f %9.2f %7.2f\n", "log replay / in-process apply", replay, floor_replay,
                floor_replay > 0 ? replay / floor_replay : 0.0);
    std::printf("%-34s %9.2f %9.2f %7.2f\n", "kill to serving / both floors", serving, floor_load + floor_replay,
                serving / (floor_load + floor_replay));
    std::printf("target: kill to serving <= 60 s at 10M rows\n");
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<int> StartShard(int port, bool recover) {
    std::vector<std::string> argv = {HYREC_PS_BINARY, "--config=" + job_, "--shard_index=0",
                                     absl::StrCat("--port=", port), "--log_level=info"};
    if (recover) argv.push_back("--recover");
    SpawnOptions spawn;
    spawn.capture_stderr = true;
    HYREC_ASSIGN_OR_RETURN(ps_, Subprocess::Spawn(argv, spawn));
    HYREC_ASSIGN_OR_RETURN(const int listening, WaitForListeningPort(*ps_, absl::Seconds(600)));
    return listening;
  }

  absl::Status Checkpoint(EmbeddingClient& client) {
    const std::string name = CheckpointDirName(kCheckpointPrefix, 1, 1);
    const absl::Time start = absl::Now();
    HYREC_RETURN_IF_ERROR(client.BeginCut(CutKind::kCheckpoint, name, 1, absl::Seconds(600)));
    HYREC_ASSIGN_OR_RETURN(std::vector<ShardFileInfo> files, client.AwaitCut(1, absl::Seconds(600)));
    CheckpointManifest m;
    m.step = 1;
    m.num_shards = 1;
    m.num_workers = 1;
    for (const ShardFileInfo& file : files) m.files.push_back(file.file);
    m.tables.push_back({"t", kDim, "adagrad", f_.rows});
    checkpoint_ = JoinPath(JoinPath(root_, "ckpt"), name);
    HYREC_RETURN_IF_ERROR(CommitManifest(Env::Default(), checkpoint_, m));
    shard_file_ = JoinPath(checkpoint_, files[0].file.name);
    std::printf("checkpointed in %.1f s (%s, %.2f GB)\n", absl::ToDoubleSeconds(absl::Now() - start),
                files[0].file.name.c_str(), static_cast<double>(files[0].file.length) / 1e9);
    return absl::OkStatus();
  }

  // The restarted shard's own figures: "restored from ... in D" and "... (the replay D)".
  absl::Status ReadParts(double* load, double* replay) {
    for (;;) {
      absl::StatusOr<std::string> line = ps_->ReadErrorLine(absl::Seconds(5));
      if (!line.ok()) break;
      auto seconds_after = [&](const std::string& marker) {
        const size_t at = line->find(marker);
        absl::Duration d;
        if (at == std::string::npos) return -1.0;
        std::string text = line->substr(at + marker.size());
        text = text.substr(0, text.find_first_of(" )"));
        return absl::ParseDuration(text, &d) ? absl::ToDoubleSeconds(d) : -1.0;
      };
      if (absl::StrContains(*line, "restored from")) *load = seconds_after(") in ");
      if (absl::StrContains(*line, "(the replay ")) *replay = seconds_after("(the replay ");
    }
    if (*load < 0 || *replay < 0) return absl::InternalError("the restarted shard did not log its parts");
    return absl::OkStatus();
  }

  double ReadFloor() const {
    std::vector<char> buffer(8 << 20);
    const absl::Time start = absl::Now();
    std::FILE* in = std::fopen(shard_file_.c_str(), "rb");
    if (in == nullptr) return -1;
    uint64_t sum = 0;
    for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), in)) > 0;)
      sum += static_cast<uint8_t>(buffer[n / 2]);
    std::fclose(in);
    benchmark_sink_ = sum;
    return absl::ToDoubleSeconds(absl::Now() - start);
  }

  // The same calls applied to a store that holds their rows, without a log or the network.
  double ApplyFloor(const std::vector<std::vector<uint64_t>>& calls) const {
    TableConfig table;
    table.name = "t";
    table.dim = kDim;
    table.optimizer.kind = OptimizerKind::kAdagrad;
    table.optimizer.learning_rate = 0.05f;
    StoreOptions options;
    options.tables = {table};
    auto store = EmbeddingShardStore::Create(options);
    if (!store.ok()) return -1;
    uint64_t sequence = 0;
    for (const auto& c : calls) (void)(*store)->Update(0, c, Grads(c.size(), 0.01f), UpdateId{1, ++sequence}, nullptr);
    const absl::Time start = absl::Now();
    for (const auto& c : calls) (void)(*store)->Update(0, c, Grads(c.size(), 0.02f), UpdateId{0, ++sequence}, nullptr);
    return absl::ToDoubleSeconds(absl::Now() - start);
  }

  const Flags f_;
  const std::string root_;
  std::string job_, checkpoint_, shard_file_;
  std::unique_ptr<Subprocess> ps_;
  mutable uint64_t benchmark_sink_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  Bench bench(f);
  const absl::Status s = bench.Run();
  if (!s.ok()) {
    std::fprintf(stderr, "recovery_benchmark: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
