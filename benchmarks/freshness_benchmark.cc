// Freshness of online training: the time from a record's append to a Kafka topic to the moment a
// follower (dense_worker/follower.h, what `hyrec predict --follow` serves with) holds a model that
// has trained on it. librdkafka's mock cluster runs in this process (the real protocol on
// loopback); `hyrec train`, embedded (the one-command way), reads the topic as a child process;
// a Follower polls the job's export.dir here.
//
//   build/benchmarks/freshness_benchmark [--seconds=60] [--rate=2048] [--delta_every_seconds=5]
//                                        [--poll_ms=1000]
//
// The job is examples/configs/stream.yaml's (batch 1024, 2 workers, 2 PS shards, linger 100 ms)
// with deltas every --delta_every_seconds and a checkpoint a minute. Records are appended at
// --rate a second for --seconds; those of the middle (after 10 s, and before the last 2 delta
// periods + 5 s) are measured. Record i is trained once the job has trained more than i samples
// (windows go in arrival order, up to records appended in the same millisecond), and served
// once the follower's model holds more than i.
//
// The job's progress lines (log_every_batches: 1) say when each step was trained.
//
// Parts (medians): batch fill (until the last record of the record's step was appended),
// loader + train step (from then until worker 0 reported the step), the wait for the next delta
// cut, the delta's write (cut to committed manifest), and poll + apply (committed to held; apply
// alone is the follower's Poll). The floor is the delta schedule alone: the next delta cut after
// the append, as if training, writing and applying took no time.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/dense_worker/follower.h"
#include "kafka_mock.h"

namespace {

using hyrec::dense_worker::Follower;

struct Flags {
  double seconds = 60;
  double rate = 2048;
  double delta_every_seconds = 5;
  int poll_ms = 1000;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::vector<std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    bool ok = kv.size() == 2;
    if (ok && kv[0] == "--seconds")
      ok = absl::SimpleAtod(kv[1], &f->seconds) && f->seconds >= 30;
    else if (ok && kv[0] == "--rate")
      ok = absl::SimpleAtod(kv[1], &f->rate) && f->rate >= 100 && f->rate <= 1e6;
    else if (ok && kv[0] == "--delta_every_seconds") {
      ok = absl::SimpleAtod(kv[1], &f->delta_every_seconds) && f->delta_every_seconds > 0;
    } else if (ok && kv[0] == "--poll_ms") {
      ok = absl::SimpleAtoi(kv[1], &f->poll_ms) && f->poll_ms > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "freshness_benchmark: bad argument '%s' (--seconds>=30, --rate in [100, 1e6], "
                   "--delta_every_seconds>0, --poll_ms>0)\n",
                   argv[i]);
      return false;
    }
  }
  return true;
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

int64_t MtimeMs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return int64_t{st.st_mtim.tv_sec} * 1000 + st.st_mtim.tv_nsec / 1000000;
}

// A model the follower took: when, what it holds, and its newest cut's times.
struct Taken {
  int64_t at_ms;
  uint64_t samples;
  int64_t cut_ms;
  int64_t commit_ms;
  double poll_ms;  // The Poll that took it.
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

std::string WriteJob(const std::string& dir, const std::string& brokers, const Flags& f) {
  const std::string path = dir + "/job.yaml";
  std::ofstream(path) << absl::StrCat(
      "loader:\n  source:\n    format: criteo\n    kafka: {brokers: '", brokers,
      "', topic: clicks, group: freshness, linger_ms: 100}\n  batch_size: 1024\n  threads: 2\n",
      "  shuffle_window: 8192\nmodel: {kind: dlrm, embedding_dim: 16, bottom: [64], top: [128, 64]}\n",
      "ps: {shards: 2}\ntrain: {workers: 2, log_every_batches: 1}\n", "checkpoint: {dir: ", dir,
      "/ckpt, every_seconds: 60}\n", "export: {dir: ", dir, "/model, delta_every_seconds: ", f.delta_every_seconds,
      "}\n");
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  const std::string dir = std::filesystem::temp_directory_path().string() + "/hyrec_freshness_benchmark";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  hyrec::testing::MockKafka kafka;
  if (!kafka.CreateTopic("clicks", 3)) return 1;
  const std::string job = WriteJob(dir, kafka.brokers(), f);
  hyrec::SpawnOptions spawn;
  spawn.capture_stderr = true;
  absl::StatusOr<std::unique_ptr<hyrec::Subprocess>> train = hyrec::Subprocess::Spawn(
      {HYREC_TRAIN_BINARY, "--config=" + job, "--progress=lines", "--plot=", "--report=" + dir + "/report.yaml"},
      spawn);
  if (!train.ok()) {
    std::fprintf(stderr, "freshness_benchmark: %s\n", std::string(train.status().message()).c_str());
    return 1;
  }

  // The job's progress lines ("samples N  ..."), one a step, on either stream.
  std::mutex mu;
  std::vector<std::pair<int64_t, uint64_t>> trained;  // (when, samples) of each progress line.
  std::string job_said;
  auto read_progress = [&](bool errors) {
    for (;;) {
      absl::StatusOr<std::string> line =
          errors ? (*train)->ReadErrorLine(absl::Minutes(10)) : (*train)->ReadLine(absl::Minutes(10));
      if (!line.ok()) return;
      const int64_t now = NowMs();
      absl::string_view rest = absl::StripLeadingAsciiWhitespace(*line);
      uint64_t samples = 0;
      std::lock_guard<std::mutex> lock(mu);
      if (absl::ConsumePrefix(&rest, "samples ") &&
          absl::SimpleAtoi(rest.substr(0, rest.find_first_of(" /")), &samples)) {
        trained.emplace_back(now, samples);
      } else {
        absl::StrAppend(&job_said, *line, "\n");
      }
    }
  };
  std::thread progress([&] { read_progress(false); });
  std::thread progress_errors([&] { read_progress(true); });

  std::atomic<bool> stop_follower{false};
  std::vector<Taken> taken;
  std::set<std::string> deltas_seen;
  std::vector<int64_t> cuts;  // Every delta cut seen, when it was taken.
  std::thread following([&] {
    std::unique_ptr<Follower> follower;
    for (bool last = false; !last;) {
      last = stop_follower.load();
      const absl::Time start = absl::Now();
      bool changed = false;
      if (follower == nullptr) {
        absl::StatusOr<std::unique_ptr<Follower>> s = Follower::Start(dir + "/model");
        if (s.ok()) {
          follower = std::move(*s);
          changed = true;
        } else if (!absl::IsNotFound(s.status())) {
          std::fprintf(stderr, "follower: %s\n", std::string(s.status().message()).c_str());
        }
      } else {
        absl::StatusOr<bool> c = follower->Poll();
        if (!c.ok()) std::fprintf(stderr, "follower: %s\n", std::string(c.status().message()).c_str());
        changed = c.ok() && *c;
      }
      const double poll_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (changed) {
        const std::shared_ptr<const Follower::Model> m = follower->model();
        taken.push_back({NowMs(), m->samples, static_cast<int64_t>(m->created_unix_ms),
                         MtimeMs(hyrec::JoinPath(m->newest, hyrec::kManifestName)), poll_ms});
      }
      for (const std::string& name : hyrec::ListCheckpointDirs(hyrec::Env::Default(), dir + "/model", "delta")) {
        const std::string d = hyrec::JoinPath(dir + "/model", name);
        if (deltas_seen.count(name) > 0 || !std::filesystem::exists(hyrec::JoinPath(d, hyrec::kManifestName))) continue;
        absl::StatusOr<hyrec::CheckpointManifest> m = hyrec::ReadManifest(hyrec::Env::Default(), d);
        if (!m.ok()) continue;
        deltas_seen.insert(name);
        cuts.push_back(static_cast<int64_t>(m->created_unix_ms));
      }
      if (!last) std::this_thread::sleep_for(std::chrono::milliseconds(f.poll_ms));
    }
  });

  // The records: appended at a steady rate, each timestamped with its append.
  const uint64_t total = static_cast<uint64_t>(f.seconds * f.rate);
  std::vector<int64_t> appended(total);
  const int64_t begin_ms = NowMs();
  int64_t last_ts = 0;
  for (uint64_t i = 0; i < total; ++i) {
    const int64_t due = begin_ms + static_cast<int64_t>(1000.0 * i / f.rate);
    while (NowMs() < due) std::this_thread::sleep_for(std::chrono::microseconds(200));
    // Never decreasing: windows go in (timestamp, partition, offset) order, which is append order
    // up to records of the same millisecond.
    last_ts = std::max(last_ts, NowMs());
    appended[i] = last_ts;
    if (!kafka.Produce("clicks", static_cast<int>(i % 3), hyrec::testing::CriteoRecord(static_cast<int>(i)), last_ts)) {
      std::fprintf(stderr, "freshness_benchmark: produce %llu failed\n", static_cast<unsigned long long>(i));
      return 1;
    }
  }
  kafka.Flush();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(2000 * f.delta_every_seconds) + 3000));
  (*train)->Signal(SIGTERM);
  absl::StatusOr<int> code = (*train)->Wait(absl::Minutes(3));
  stop_follower = true;
  following.join();
  progress.join();
  progress_errors.join();
  if (!code.ok() || *code != 0) {
    std::fprintf(stderr, "freshness_benchmark: the job ended with %s:\n%s\n",
                 code.ok() ? absl::StrCat("exit ", *code).c_str() : std::string(code.status().message()).c_str(),
                 job_said.c_str());
    return 1;
  }

  // Record i: trained at the first report of more than i samples, served at the first model
  // holding more than i.
  const int64_t from_ms = begin_ms + 10000;
  const int64_t to_ms =
      begin_ms + static_cast<int64_t>(1000 * f.seconds) - static_cast<int64_t>(2000 * f.delta_every_seconds) - 5000;
  std::sort(cuts.begin(), cuts.end());
  std::vector<double> fresh, fill, loader_train, wait_cut, write, apply, floor;
  const uint64_t step_records = 2 * 1024;
  size_t t = 0, m = 0;
  for (uint64_t i = 0; i < total; ++i) {
    if (appended[i] < from_ms || appended[i] > to_ms) continue;
    while (t < trained.size() && trained[t].second <= i) ++t;
    while (m < taken.size() && taken[m].samples <= i) ++m;
    if (t == trained.size() || m == taken.size()) break;
    const Taken& k = taken[m];
    const uint64_t step_last = std::min(total - 1, (i / step_records + 1) * step_records - 1);
    fresh.push_back((k.at_ms - appended[i]) / 1000.0);
    fill.push_back((appended[step_last] - appended[i]) / 1000.0);
    loader_train.push_back((trained[t].first - appended[step_last]) / 1000.0);
    wait_cut.push_back((k.cut_ms - trained[t].first) / 1000.0);
    // The manifest's mtime is the file system's coarse clock (a few ms): never before the cut.
    write.push_back(std::max<int64_t>(0, k.commit_ms - k.cut_ms) / 1000.0);
    apply.push_back((k.at_ms - std::max(k.commit_ms, k.cut_ms)) / 1000.0);
    auto next_cut = std::lower_bound(cuts.begin(), cuts.end(), appended[i]);
    if (next_cut != cuts.end()) floor.push_back((*next_cut - appended[i]) / 1000.0);
  }
  std::vector<double> poll_ms;
  for (const Taken& k : taken) poll_ms.push_back(k.poll_ms);
  if (fresh.empty()) {
    std::fprintf(stderr, "freshness_benchmark: no record was measured (%zu reports, %zu models)\n", trained.size(),
                 taken.size());
    return 1;
  }
  std::printf(
      "freshness over %zu records appended at %.0f/s (deltas every %g s, follower polls every %d ms; %zu models "
      "taken)\n",
      fresh.size(), f.rate, f.delta_every_seconds, f.poll_ms, taken.size());
  std::printf(
      "  append -> follower holds a model trained on it: median %.2f s, p90 %.2f s, p99 %.2f s, max %.2f s "
      "(target <= 10 s)\n",
      Quantile(fresh, 0.5), Quantile(fresh, 0.9), Quantile(fresh, 0.99), Quantile(fresh, 1));
  std::printf(
      "  parts (medians): batch fill %.2f s, loader + train step %.2f s, wait for the delta cut %.2f s, "
      "delta write %.3f s, poll + apply %.2f s (apply alone %.1f ms)\n",
      Quantile(fill, 0.5), Quantile(loader_train, 0.5), Quantile(wait_cut, 0.5), Quantile(write, 0.5),
      Quantile(apply, 0.5), Quantile(poll_ms, 0.5));
  std::printf("  floor (the delta schedule alone: the next delta cut after the append): median %.2f s, max %.2f s\n",
              Quantile(floor, 0.5), Quantile(floor, 1));
  std::printf("  ratio (median freshness / median floor): %.2f\n", Quantile(fresh, 0.5) / Quantile(floor, 0.5));
  return 0;
}
