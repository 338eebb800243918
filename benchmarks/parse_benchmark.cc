// Criteo TSV and csv parsing beside their floor: splitting the same bytes into lines with memchr.
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

  // The csv parser on the same records as comma-separated values (label, 13 dense with log1p, 26
  // categorical columns, by position), beside the memchr floor on those bytes and the Criteo
  // parser on the original lines.
  {
    std::string csv_text = text;
    for (char& c : csv_text) c = c == '\t' ? ',' : c;
    CsvOptions csv;
    csv.header = false;
    for (int k = 0; k < 1 + kCriteoDense + kCriteoSlots; ++k) {
      CsvColumn c;
      c.index = k;
      c.kind = k == 0 ? CsvColumn::Kind::kLabel
                      : (k <= kCriteoDense ? CsvColumn::Kind::kDense : CsvColumn::Kind::kCategorical);
      c.transform = CsvColumn::Transform::kLog1p;
      csv.columns.push_back(c);
    }
    if (!csv.Resolve(nullptr).ok()) return 1;
    auto parse_all = [](const std::string& t, int threads, auto parse_line, std::atomic<uint64_t>* good) {
      return RunSplit(t, threads, [&](const char* p, const char* end) {
        Sample sample;
        uint64_t n = 0;
        while (p < end) {
          const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
          if (nl == nullptr) break;
          if (parse_line(absl::string_view(p, nl - p), &sample)) ++n;
          p = nl + 1;
        }
        *good += n;
      });
    };
    std::printf("\ncsv (the same records, comma-separated, 40 columns by position)\n");
    std::printf("%-8s %14s %14s %16s %14s %14s\n", "threads", "floor MB/s", "csv MB/s", "csv samples/s", "csv/floor",
                "csv/criteo");
    for (int threads : {1, 2}) {
      std::atomic<uint64_t> lines{0}, csv_good{0}, criteo_good{0};
      const double floor_s = parse_all(
          csv_text, threads, [](absl::string_view, Sample*) { return true; }, &lines);
      const double csv_s = parse_all(
          csv_text, threads, [&](absl::string_view l, Sample* s) { return ParseCsvLine(l, csv, s).ok(); }, &csv_good);
      const double criteo_s = parse_all(
          text, threads, [](absl::string_view l, Sample* s) { return ParseCriteoLine(l, CriteoOptions(), s).ok(); },
          &criteo_good);
      if (csv_good.load() < criteo_good.load()) {
        std::printf("csv parsed %llu samples, Criteo %llu: the conversion lost records\n",
                    static_cast<unsigned long long>(csv_good.load()),
                    static_cast<unsigned long long>(criteo_good.load()));
        return 1;
      }
      std::printf("%-8d %14.0f %14.0f %16.0f %14.2f %14.2f\n", threads, mb / floor_s, mb / csv_s,
                  csv_good.load() / csv_s, floor_s / csv_s, criteo_s / csv_s);
    }
    std::printf("target: csv >= 0.5 x the Criteo parser's samples/s on the same records\n");
  }

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
