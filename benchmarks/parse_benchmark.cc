// Criteo TSV parsing beside its floor: splitting the same bytes into lines with memchr.
//
//   build/benchmarks/parse_benchmark [path/to/train.tsv]
//
// Uses the given file, else data/criteo/train.tsv when present (examples/configs/criteo-sample.yaml
// says how to get it), else synthetic Criteo lines; the text is repeated in memory to 128 MiB. Parses on 1 and 2
// threads (the buffer split at line boundaries), then runs the whole loader (parse, batch of 4096, per- table dedup and
// shard partition) on a file in the page cache.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "hyrec/data_loader/loader.h"
#include "hyrec/data_loader/parsers.h"
#include "hyrec/data_loader/synthetic.h"

namespace {

using namespace hyrec::data_loader;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Runs fn(begin, end) on `threads` threads over line-aligned pieces of text; returns seconds.
template <typename Fn>
double RunSplit(const std::string& text, int threads, Fn fn) {
  std::vector<size_t> cuts = {0};
  for (int t = 1; t < threads; ++t) {
    size_t cut = text.size() * t / threads;
    cut = text.find('\n', cut);
    cuts.push_back(cut == std::string::npos ? text.size() : cut + 1);
  }
  cuts.push_back(text.size());
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { fn(text.data() + cuts[t], text.data() + cuts[t + 1]); });
  for (auto& th : pool) th.join();
  return Seconds(start);
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : "";
  if (path.empty()) {
    const std::string sample = std::string(HYREC_SOURCE_DIR) + "/data/criteo/train.tsv";
    if (access(sample.c_str(), R_OK) == 0) path = sample;
  }
  std::string base;
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    base.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::printf("data: %s (%zu bytes)\n", path.c_str(), base.size());
  } else {
    const std::string tmp = "/tmp/hyrec_parse_benchmark.tsv";
    SyntheticConfig c;
    SyntheticSource(c).WriteCriteo(tmp, 20000).IgnoreError();
    std::ifstream in(tmp, std::ios::binary);
    base.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::printf("data: synthetic Criteo lines (%zu bytes); no Criteo sample found\n", base.size());
  }
  if (base.empty() || base.back() != '\n') base.push_back('\n');
  std::string text;
  while (text.size() < (128u << 20)) text += base;
  const double mb = text.size() / 1e6;

  std::printf("\n%-8s %14s %14s %16s %16s %8s\n", "threads", "floor MB/s", "parse MB/s", "floor lines/s",
              "parse samples/s", "ratio");
  for (int threads : {1, 2}) {
    std::atomic<uint64_t> lines{0}, good{0};
    const double floor_s = RunSplit(text, threads, [&](const char* p, const char* end) {
      uint64_t n = 0;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
        if (nl == nullptr) break;
        ++n;
        p = nl + 1;
      }
      lines += n;
    });
    const double parse_s = RunSplit(text, threads, [&](const char* p, const char* end) {
      Sample sample;
      uint64_t n = 0;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
        if (nl == nullptr) break;
        if (ParseCriteoLine(absl::string_view(p, nl - p), CriteoOptions(), &sample).ok()) ++n;
        p = nl + 1;
      }
      good += n;
    });
    const double line_count = static_cast<double>(lines.load()) / threads;
    std::printf("%-8d %14.0f %14.0f %16.0f %16.0f %8.2f\n", threads, mb / floor_s, mb / parse_s,
                line_count * threads / floor_s, good.load() / parse_s, floor_s / parse_s);
  }
  std::printf("targets: parse >= 0.25 x floor per thread; >= 1M samples/s on two threads\n");

  // The synthetic source alone, one core: sample generation with the teacher's labels.
  {
    SyntheticSource source{SyntheticConfig()};
    Sample sample;
    const uint64_t n = 2'000'000;
    const auto start = Clock::now();
    uint64_t positives = 0;
    for (uint64_t i = 0; i < n; ++i) {
      source.Generate(i, &sample);
      positives += sample.label > 0;
    }
    std::printf("synthetic source, 1 thread: %.0f samples/s (26 slots, 13 dense, teacher labels; %.3f positive)\n",
                n / Seconds(start), static_cast<double>(positives) / n);
  }

  // The whole loader on a page-cached file: parse + batches of 4096 + dedup + shard partition.
  const std::string file = "/tmp/hyrec_parse_benchmark_full.tsv";
  {
    std::ofstream out(file, std::ios::binary);
    size_t bytes = std::min<size_t>(text.size(), 64u << 20);
    bytes = text.rfind('\n', bytes - 1) + 1;  // Whole lines only.
    out.write(text.data(), static_cast<std::streamsize>(bytes));
  }
  for (int threads : {1, 2}) {
    LoaderOptions o;
    o.source.format = Format::kCriteo;
    o.source.files = {file};
    o.batch_size = 4096;
    o.threads = threads;
    o.num_shards = 4;
    o.max_bad_fraction = 0.01;
    const auto start = Clock::now();
    auto loader = Loader::Start(o, {});
    if (!loader.ok()) return 1;
    Batch batch;
    uint64_t samples = 0;
    while ((*loader)->stream(0)->Next(&batch, absl::Seconds(60)).ok()) samples += batch.batch_size;
    std::printf("loader, %d parse thread(s): %.0f samples/s (parse, batch 4096, dedup, 4 shards)\n", threads,
                samples / Seconds(start));
  }
  std::remove(file.c_str());
  return 0;
}
