#include "hyrec/data_loader/loader.h"

#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/hash.h"
#include "stream_test_util.h"

namespace hyrec::data_loader {
namespace {

SyntheticConfig SmallSynthetic(uint64_t samples = 5000) {
  SyntheticConfig c;
  c.num_samples = samples;
  c.vocabulary = 2000;
  c.seed = 11;
  return c;
}

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

int ExitCodeOf(const absl::Status& s) { return ExitCodeFor(s); }

// A fingerprint of one sample of a batch: label, dense and ids.
uint64_t Fingerprint(const Batch& b, int i) {
  uint64_t h = static_cast<uint64_t>(b.labels[i]);
  for (int k = 0; k < b.num_dense; ++k) {
    uint32_t bits;
    std::memcpy(&bits, &b.dense[i * b.num_dense + k], 4);
    h = HashCombine(h, bits);
  }
  for (const SlotIds& s : b.slots) {
    for (uint32_t j = s.offsets[i]; j < s.offsets[i + 1]; ++j) h = HashCombine(h, s.ids[j]);
    h = HashCombine(h, 0xff);
  }
  return h;
}

std::vector<Batch> Drain(BatchStream* stream, size_t limit = SIZE_MAX) {
  std::vector<Batch> out;
  Batch b;
  while (out.size() < limit) {
    absl::Status s = stream->Next(&b, absl::Seconds(30));
    if (absl::IsOutOfRange(s)) break;
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    out.push_back(b);
  }
  return out;
}

std::vector<std::vector<Batch>> DrainAll(Loader& loader, int workers, std::vector<size_t> limits = {}) {
  return hyrec::data_loader::DrainAll(Streams(loader, workers), std::move(limits));
}

bool SameBatch(const Batch& a, const Batch& b) {
  if (a.batch_id != b.batch_id || a.labels != b.labels || a.dense != b.dense || a.slots.size() != b.slots.size() ||
      a.tables.size() != b.tables.size()) {
    return false;
  }
  for (size_t s = 0; s < a.slots.size(); ++s) {
    if (a.slots[s].offsets != b.slots[s].offsets || a.slots[s].ids != b.slots[s].ids) return false;
  }
  for (size_t t = 0; t < a.tables.size(); ++t) {
    if (a.tables[t].unique_ids != b.tables[t].unique_ids || a.tables[t].shard_offsets != b.tables[t].shard_offsets ||
        a.tables[t].inverse != b.tables[t].inverse) {
      return false;
    }
  }
  return true;
}

TEST(Synthetic, SamplesArePureFunctionsOfSeedAndIndex) {
  SyntheticSource a(SmallSynthetic()), b(SmallSynthetic());
  Sample x, y;
  a.Generate(123, &x);
  b.Generate(123, &y);
  EXPECT_EQ(x.ids, y.ids);
  EXPECT_EQ(x.dense, y.dense);
  EXPECT_EQ(x.label, y.label);
  b.Generate(124, &y);
  EXPECT_NE(x.ids, y.ids);
  EXPECT_EQ(x.ids.size(), 26u);
  EXPECT_EQ(x.dense.size(), 13u);
}

TEST(Synthetic, TeacherAucIsKnownAndLabelsFollowTheTeacher) {
  SyntheticSource source(SmallSynthetic());
  const double auc = source.TeacherAuc(50000);
  std::printf("teacher AUC %.4f\n", auc);
  EXPECT_GT(auc, 0.7);
  EXPECT_LT(auc, 0.95);
  double positives = 0, mean_p = 0;
  Sample s;
  for (uint64_t i = 0; i < 20000; ++i) {
    source.Generate(i, &s);
    positives += s.label;
    mean_p += source.TeacherProbability(i);
  }
  EXPECT_NEAR(positives / 20000, mean_p / 20000, 0.015);  // Labels are Bernoulli(p).
}

TEST(Synthetic, IdsFollowZipf) {
  SyntheticConfig c = SmallSynthetic();
  c.num_slots = 1;
  c.vocabulary = 100000;
  SyntheticSource source(c);
  std::map<uint64_t, int> counts;
  Sample s;
  for (uint64_t i = 0; i < 200000; ++i) {
    source.Generate(i, &s);
    ++counts[s.ids[0]];
  }
  std::vector<int> sorted;
  for (const auto& [id, n] : counts) sorted.push_back(n);
  std::sort(sorted.rbegin(), sorted.rend());
  // Frequency of rank 1 over rank 2 is 2^1.05.
  EXPECT_NEAR(static_cast<double>(sorted[0]) / sorted[1], std::pow(2.0, 1.05), 0.15);
  EXPECT_GT(counts.size(), 20000u);  // The tail is drawn too.
}

TEST(Synthetic, CriteoFileReadsBackToTheSameSamples) {
  SyntheticSource source(SmallSynthetic());
  const std::string path = TempPath("synthetic.tsv");
  ASSERT_TRUE(source.WriteCriteo(path, 300).ok());
  std::ifstream in(path);
  std::string line;
  Sample parsed, generated;
  for (uint64_t i = 0; i < 300; ++i) {
    ASSERT_TRUE(std::getline(in, line));
    ASSERT_TRUE(ParseCriteoLine(line, {}, &parsed).ok()) << line;
    source.Generate(i, &generated);
    ASSERT_EQ(parsed.ids, generated.ids) << i;
    ASSERT_EQ(parsed.dense, generated.dense) << i;
    ASSERT_EQ(parsed.label, generated.label) << i;
  }
  SyntheticConfig multi = SmallSynthetic();
  multi.ids_per_sample = 3;
  EXPECT_EQ(SyntheticSource(multi).WriteCriteo(path, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BuildBatch, CsrDedupAndShardPartition) {
  std::vector<Sample> samples(3);
  // 2 slots, both mapped to table 0; ids repeat within and across slots.
  const std::vector<std::vector<std::vector<uint64_t>>> ids = {{{5, 6}, {5}}, {{7}, {}}, {{5}, {8, 6}}};
  for (int i = 0; i < 3; ++i) {
    samples[i].Clear(2);
    samples[i].label = i % 2;
    for (int s = 0; s < 2; ++s) {
      for (uint64_t id : ids[i][s]) samples[i].ids.push_back(id);
      samples[i].slot_offsets[s + 1] = samples[i].ids.size();
    }
  }
  Batch b;
  BuildBatch(samples, 3, 0, 2, {0, 0}, 1, 3, &b);
  EXPECT_EQ(b.slots[0].offsets, (std::vector<uint32_t>{0, 2, 3, 4}));
  EXPECT_EQ(b.slots[0].ids, (std::vector<uint64_t>{5, 6, 7, 5}));
  EXPECT_EQ(b.slots[1].offsets, (std::vector<uint32_t>{0, 1, 1, 3}));
  const TableIds& t = b.tables[0];
  EXPECT_EQ(t.unique_ids.size(), 4u);  // 5, 6, 7, 8
  ASSERT_EQ(t.shard_offsets.size(), 4u);
  for (int shard = 0; shard < 3; ++shard) {
    for (uint32_t u = t.shard_offsets[shard]; u < t.shard_offsets[shard + 1]; ++u) {
      EXPECT_EQ(ShardForId(t.unique_ids[u], 3), shard);
    }
  }
  for (int s = 0; s < 2; ++s) {
    for (size_t j = 0; j < b.slots[s].ids.size(); ++j) {
      EXPECT_EQ(t.unique_ids[t.inverse[s][j]], b.slots[s].ids[j]);
    }
  }
}

LoaderOptions SyntheticOptions(int threads, int workers) {
  LoaderOptions o;
  o.source.format = Format::kSynthetic;
  o.source.synthetic = SmallSynthetic(5000);
  o.batch_size = 128;
  o.shuffle_window = 1000;
  o.threads = threads;
  o.num_workers = workers;
  o.num_shards = 2;
  o.epochs = 2;
  return o;
}

TEST(Loader, BatchesAreIdenticalForAnyThreadCount) {
  std::vector<std::vector<Batch>> runs;
  for (int threads : {1, 3}) {
    auto loader = Loader::Start(SyntheticOptions(threads, 2), {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    auto per_worker = DrainAll(**loader, 2);
    std::vector<Batch> all = std::move(per_worker[0]);
    all.insert(all.end(), per_worker[1].begin(), per_worker[1].end());
    runs.push_back(std::move(all));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(SameBatch(runs[0][i], runs[1][i])) << i;
}

TEST(Loader, EverySampleGoesToExactlyOneWorkerPerEpoch) {
  auto loader = Loader::Start(SyntheticOptions(2, 2), {});
  ASSERT_TRUE(loader.ok());
  std::map<uint64_t, std::multiset<uint64_t>> by_epoch;
  auto per_worker = DrainAll(**loader, 2);
  for (int w = 0; w < 2; ++w) {
    for (const Batch& b : per_worker[w]) {
      EXPECT_EQ(b.batch_id % 2, static_cast<uint64_t>(w));
      for (int i = 0; i < b.batch_size; ++i) by_epoch[b.epoch].insert(Fingerprint(b, i));
    }
  }
  SyntheticSource source(SmallSynthetic(5000));
  std::multiset<uint64_t> expected;
  Sample s;
  std::vector<Sample> one(1);
  for (uint64_t i = 0; i < 5000; ++i) {
    source.Generate(i, &one[0]);
    Batch b;
    BuildBatch(one, 1, 13, 26, {}, 26, 1, &b);
    expected.insert(Fingerprint(b, 0));
  }
  ASSERT_EQ(by_epoch.size(), 2u);
  EXPECT_EQ(by_epoch[0], expected);
  EXPECT_EQ(by_epoch[1], expected);
}

TEST(Loader, ShufflesDifferentlyEachEpoch) {
  auto loader = Loader::Start(SyntheticOptions(2, 1), {});
  ASSERT_TRUE(loader.ok());
  std::vector<Batch> batches = Drain((*loader)->stream(0));
  const size_t per_epoch = (5000 + 127) / 128;
  ASSERT_EQ(batches.size(), 2 * per_epoch);
  EXPECT_FALSE(SameBatch(batches[0], batches[per_epoch]));
}

// Reads `first` batches per worker, saves the positions, stops; resumes from them and reads the
// rest. The concatenation must equal an uninterrupted read: nothing skipped, nothing repeated.
void ExpectExactResume(const LoaderOptions& options, size_t first) {
  std::vector<std::vector<Batch>> uninterrupted(options.num_workers);
  {
    auto loader = Loader::Start(options, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    uninterrupted = DrainAll(**loader, options.num_workers);
  }
  std::vector<std::vector<Batch>> resumed(options.num_workers);
  std::vector<ReaderPosition> positions;
  {
    auto loader = Loader::Start(options, {});
    ASSERT_TRUE(loader.ok());
    std::vector<size_t> limits;
    for (int w = 0; w < options.num_workers; ++w) limits.push_back(first + w);  // Uneven stops.
    resumed = DrainAll(**loader, options.num_workers, limits);
    for (int w = 0; w < options.num_workers; ++w) positions.push_back((*loader)->stream(w)->Position());
  }
  auto loader = Loader::Start(options, positions);
  ASSERT_TRUE(loader.ok()) << loader.status();
  for (int w = 0; w < options.num_workers; ++w) {
    EXPECT_EQ((*loader)->stream(w)->Position(), positions[w]);
  }
  auto rest = DrainAll(**loader, options.num_workers);
  for (int w = 0; w < options.num_workers; ++w) {
    for (Batch& b : rest[w]) resumed[w].push_back(std::move(b));
    ASSERT_EQ(resumed[w].size(), uninterrupted[w].size()) << "worker " << w;
    for (size_t i = 0; i < resumed[w].size(); ++i) {
      EXPECT_TRUE(SameBatch(resumed[w][i], uninterrupted[w][i])) << "worker " << w << " batch " << i;
    }
  }
}

TEST(Loader, ResumesSyntheticStreamsExactly) {
  ExpectExactResume(SyntheticOptions(2, 2), 9);   // Mid-window, mid-epoch.
  ExpectExactResume(SyntheticOptions(2, 2), 22);  // Into the second epoch.
}

std::vector<std::string> WriteCriteoFiles(int files, uint64_t lines_each) {
  SyntheticConfig c = SmallSynthetic(lines_each * files);
  SyntheticSource source(c);
  const std::string all = TempPath("all.tsv");
  EXPECT_TRUE(source.WriteCriteo(all, lines_each * files).ok());
  std::ifstream in(all);
  std::vector<std::string> paths;
  std::string line;
  for (int f = 0; f < files; ++f) {
    paths.push_back(TempPath(absl::StrCat("part", f, ".tsv")));
    std::ofstream out(paths.back());
    for (uint64_t i = 0; i < lines_each && std::getline(in, line); ++i) out << line << "\n";
  }
  return paths;
}

LoaderOptions FileOptions(std::vector<std::string> files, int threads, int workers) {
  LoaderOptions o;
  o.source.format = Format::kCriteo;
  o.source.files = std::move(files);
  o.batch_size = 64;
  o.shuffle_window = 300;
  o.threads = threads;
  o.num_workers = workers;
  o.epochs = 2;
  return o;
}

TEST(Loader, ResumesFileStreamsExactly) {
  const auto files = WriteCriteoFiles(3, 700);
  ExpectExactResume(FileOptions(files, 2, 2), 5);
  ExpectExactResume(FileOptions(files, 3, 2), 40);
}

TEST(Loader, FileBatchesMatchTheSyntheticSamplesTheyWereWrittenFrom) {
  const auto files = WriteCriteoFiles(2, 500);
  LoaderOptions o = FileOptions(files, 2, 1);
  o.epochs = 1;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok());
  std::multiset<uint64_t> got;
  for (const Batch& b : Drain((*loader)->stream(0))) {
    for (int i = 0; i < b.batch_size; ++i) got.insert(Fingerprint(b, i));
  }
  SyntheticSource source(SmallSynthetic(1000));
  std::multiset<uint64_t> expected;
  std::vector<Sample> one(1);
  for (uint64_t i = 0; i < 1000; ++i) {
    source.Generate(i, &one[0]);
    Batch b;
    BuildBatch(one, 1, 13, 26, {}, 26, 1, &b);
    expected.insert(Fingerprint(b, 0));
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ((*loader)->Stats().lines, 1000u);
  EXPECT_EQ((*loader)->Stats().bad_lines, 0u);
}

std::string GzipFile(const std::string& plain, const std::string& name, size_t truncate_to = 0) {
  std::ifstream in(plain, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = TempPath(name);
  gzFile gz = gzopen(path.c_str(), "wb");
  gzwrite(gz, data.data(), data.size());
  gzclose(gz);
  if (truncate_to > 0) {
    std::ifstream zin(path, std::ios::binary);
    std::string z((std::istreambuf_iterator<char>(zin)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(z.data(), std::min(z.size(), truncate_to));
  }
  return path;
}

TEST(Loader, GzipFilesReadLikePlainOnesAndResume) {
  const auto files = WriteCriteoFiles(2, 600);
  std::vector<std::string> gz = {GzipFile(files[0], "p0.tsv.gz"), GzipFile(files[1], "p1.tsv.gz")};
  std::vector<std::vector<Batch>> runs;
  for (const auto& f : {files, gz}) {
    LoaderOptions o = FileOptions(f, 2, 1);
    o.epochs = 1;
    auto loader = Loader::Start(o, {});
    ASSERT_TRUE(loader.ok());
    runs.push_back(Drain((*loader)->stream(0)));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(SameBatch(runs[0][i], runs[1][i]));
  ExpectExactResume(FileOptions(gz, 2, 2), 7);
}

TEST(Loader, SkipsAndCountsBadLinesWithinTheAllowedFraction) {
  const auto files = WriteCriteoFiles(1, 400);
  std::ifstream in(files[0]);
  const std::string path = TempPath("with_bad.tsv");
  std::ofstream out(path);
  std::string line;
  for (int i = 0; std::getline(in, line); ++i) {
    if (i == 10) out << "1\tnot\ta\tcriteo\tline\n";
    if (i == 200) out << std::string("\x01\x02\xfe binary", 10) << "\n";
    out << line << (i % 50 == 0 ? "\r\n" : "\n");
  }
  out << "0";  // Truncated last line without a newline: a bad line too.
  out.close();
  LoaderOptions o = FileOptions({path}, 2, 1);
  o.epochs = 1;
  o.max_bad_fraction = 0.01;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok());
  size_t samples = 0;
  for (const Batch& b : Drain((*loader)->stream(0))) samples += b.batch_size;
  EXPECT_EQ(samples, 400u);
  const LoaderStats stats = (*loader)->Stats();
  EXPECT_EQ(stats.bad_lines, 3u);
  EXPECT_EQ(stats.lines, 403u);
  ASSERT_FALSE(stats.first_bad.empty());
  EXPECT_NE(stats.first_bad[0].find("with_bad.tsv:11: "), std::string::npos) << stats.first_bad[0];
}

TEST(Loader, ReadsAValidLastLineWithoutANewline) {
  const auto files = WriteCriteoFiles(1, 50);
  std::ifstream in(files[0]);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(text.back(), '\n');
  text.pop_back();
  const std::string path = TempPath("no_final_newline.tsv");
  std::ofstream(path) << text;
  LoaderOptions o = FileOptions({path}, 1, 1);
  o.epochs = 1;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok());
  size_t samples = 0;
  for (const Batch& b : Drain((*loader)->stream(0))) samples += b.batch_size;
  EXPECT_EQ(samples, 50u);
  EXPECT_EQ((*loader)->Stats().bad_lines, 0u);
}

TEST(Loader, StopsWithAClearErrorAboveTheAllowedFraction) {
  const std::string path = TempPath("mostly_bad.tsv");
  {
    std::ofstream out(path);
    for (int i = 0; i < 100; ++i)
      out << (i % 10 == 3 ? "garbage line\n"
                          : "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\ta\tb\tc\td\te\tf\t0\t1\t2\t3\t4\t5\t6\t7\t8"
                            "\t9\taa\tbb\tcc\tdd\tee\tff\t00\t11\t22\t33\n");
  }
  LoaderOptions o = FileOptions({path}, 2, 1);
  o.epochs = 1;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok());
  Batch b;
  absl::Status s;
  do {
    s = (*loader)->stream(0)->Next(&b, absl::Seconds(30));
  } while (s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("too many bad lines: 10 of 100"), std::string::npos) << s;
  EXPECT_NE(s.message().find("mostly_bad.tsv:4: "), std::string::npos) << s;
}

// Drains worker 0's stream and returns how it ended (OUT_OF_RANGE at the end of the data), and
// the samples it delivered.
absl::Status DrainToEnd(Loader& loader, size_t* samples = nullptr) {
  Batch b;
  absl::Status s;
  size_t n = 0;
  while ((s = loader.stream(0)->Next(&b, absl::Seconds(30))).ok()) {
    EXPECT_GT(b.batch_size, 0);
    n += static_cast<size_t>(b.batch_size);
  }
  if (samples != nullptr) *samples = n;
  return s;
}

void ExpectNamedError(const absl::Status& s, absl::StatusCode code, const std::string& file, const std::string& why) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(file), std::string::npos) << s;
  EXPECT_NE(s.message().find(why), std::string::npos) << s;
}

TEST(Loader, AMissingFileAmongSeveralFailsAtStartNamingIt) {
  const auto files = WriteCriteoFiles(2, 100);
  LoaderOptions o = FileOptions({files[0], TempPath("does_not_exist.tsv"), files[1]}, 2, 1);
  auto loader = Loader::Start(o, {});
  ASSERT_FALSE(loader.ok());
  ExpectNamedError(loader.status(), absl::StatusCode::kNotFound, "does_not_exist.tsv", "cannot open");
  EXPECT_EQ(ExitCodeOf(loader.status()), 2);
}

TEST(Loader, AnEmptyFileFailsAtStartNamingIt) {
  const auto files = WriteCriteoFiles(1, 100);
  std::ofstream(TempPath("empty.tsv")).close();
  auto loader = Loader::Start(FileOptions({files[0], TempPath("empty.tsv")}, 1, 1), {});
  ASSERT_FALSE(loader.ok());
  ExpectNamedError(loader.status(), absl::StatusCode::kDataLoss, "empty.tsv", "is empty");
  // An empty gzip stream too.
  const std::string empty_gz = GzipFile(TempPath("empty.tsv"), "empty.tsv.gz");
  loader = Loader::Start(FileOptions({empty_gz}, 1, 1), {});
  ASSERT_FALSE(loader.ok());
  ExpectNamedError(loader.status(), absl::StatusCode::kDataLoss, "empty.tsv.gz", "is empty");
}

TEST(Loader, ATruncatedGzipStreamStopsTheLoaderNamingTheFile) {
  const auto files = WriteCriteoFiles(1, 3000);
  const std::string truncated = GzipFile(files[0], "trunc.tsv.gz", 20000);
  LoaderOptions o = FileOptions({files[0], truncated}, 2, 1);
  o.epochs = 1;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  size_t samples = 0;
  const absl::Status s = DrainToEnd(**loader, &samples);
  ExpectNamedError(s, absl::StatusCode::kDataLoss, "trunc.tsv.gz", "");
  EXPECT_LT(samples, 6000u);
  EXPECT_EQ((*loader)->status(), s);
}

TEST(Loader, SkipBadFilesCountsThemWithinTheFractionAndTrainsTheRest) {
  const auto files = WriteCriteoFiles(1, 3000);
  const std::string truncated = GzipFile(files[0], "trunc2.tsv.gz", 20000);
  std::ofstream(TempPath("empty2.tsv")).close();
  LoaderOptions o = FileOptions({files[0], truncated, TempPath("missing2.tsv"), TempPath("empty2.tsv")}, 2, 1);
  o.source.skip_bad_files = true;
  o.epochs = 1;
  o.max_bad_fraction = 0.01;
  o.min_lines_for_bad_check = 1 << 30;  // Judge at the end of the epoch only.
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  size_t samples = 0;
  EXPECT_TRUE(absl::IsOutOfRange(DrainToEnd(**loader, &samples)));
  EXPECT_GE(samples, 3000u);
  const LoaderStats stats = (*loader)->Stats();
  EXPECT_GE(stats.bad_lines, 1u);  // The truncated stream, met while reading.
  std::string all;
  for (const auto& m : stats.first_bad) all += m + "\n";
  EXPECT_NE(all.find("trunc2.tsv.gz"), std::string::npos) << all;
  // With no usable file at all, Start fails.
  o.source.files = {TempPath("missing2.tsv"), TempPath("empty2.tsv")};
  auto none = Loader::Start(o, {});
  ASSERT_FALSE(none.ok());
  ExpectNamedError(none.status(), absl::StatusCode::kDataLoss, "missing2.tsv", "no usable data file");
}

// A file that shrinks or disappears while the loader reads it is an error naming it. The loader
// reads ahead by at most a few windows and buffers, so a large file is still being read when the
// first batch arrives.
TEST(Loader, AFileTruncatedOrRemovedMidRunStopsTheLoader) {
  for (const bool remove : {false, true}) {
    const auto files = WriteCriteoFiles(1, 40000);
    LoaderOptions o = FileOptions(files, 1, 1);
    o.epochs = 1;
    o.shuffle_window = 64;
    o.prefetch_batches = 1;
    auto loader = Loader::Start(o, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    Batch b;
    ASSERT_TRUE((*loader)->stream(0)->Next(&b, absl::Seconds(30)).ok());
    ASSERT_LT(b.bytes_read, b.bytes_total);
    if (remove) {
      ASSERT_EQ(std::remove(files[0].c_str()), 0);
    } else {
      ASSERT_EQ(truncate(files[0].c_str(), 100000), 0);
    }
    const absl::Status s = DrainToEnd(**loader);
    ExpectNamedError(s, absl::StatusCode::kDataLoss, files[0], remove ? "removed while it was read" : "shrank");
  }
}

TEST(Loader, AFileWhoseFirstLinesAreAllBadStopsAtOnce) {
  const auto files = WriteCriteoFiles(1, 5000);
  const std::string path = TempPath("bad_head.tsv");
  {
    std::ofstream out(path);
    for (int i = 0; i < 150; ++i) out << "1 2 3 a b c\n";  // Not tab-separated: libsvm-like.
    std::ifstream in(files[0]);
    out << in.rdbuf();
  }
  // Shuffled or not: the head is judged in file order as it is read, before any batch is cut, so
  // the loader stops without parsing the window or warning about its batches.
  for (const bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "in order");
    LoaderOptions o = FileOptions({path}, 2, 1);
    o.epochs = 1;
    o.shuffle = shuffle;
    o.shuffle_window = 4096;
    o.max_bad_fraction = 0.1;  // 150 of 5150 is within it: the head rule stops it.
    auto loader = Loader::Start(o, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    size_t samples = 0;
    const absl::Status s = DrainToEnd(**loader, &samples);
    ExpectNamedError(s, absl::StatusCode::kDataLoss, "bad_head.tsv", "the first 100 lines");
    EXPECT_NE(s.message().find("criteo"), std::string::npos) << s;
    EXPECT_NE(s.message().find("first: " + path + ":1: "), std::string::npos) << s;  // In file order.
    EXPECT_EQ(samples, 0u);
    EXPECT_EQ((*loader)->Stats().skipped_batches, 0u);
  }
}

TEST(Loader, ABatchOfOnlyBadLinesIsNeverDelivered) {
  const auto files = WriteCriteoFiles(1, 640);
  std::ifstream in(files[0]);
  const std::string path = TempPath("bad_batch.tsv");
  std::ofstream out(path);
  std::string line;
  for (int i = 0; std::getline(in, line); ++i) out << (i >= 128 && i < 192 ? "garbage" : line) << "\n";
  out.close();
  LoaderOptions o = FileOptions({path}, 2, 1);
  o.epochs = 1;
  o.shuffle = false;
  o.max_bad_fraction = 0.5;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  size_t samples = 0;
  EXPECT_TRUE(absl::IsOutOfRange(DrainToEnd(**loader, &samples)));  // DrainToEnd expects no empty batch.
  EXPECT_EQ(samples, 576u);
  const LoaderStats stats = (*loader)->Stats();
  EXPECT_EQ(stats.skipped_batches, 1u);
  EXPECT_EQ(stats.batches, 9u);
  EXPECT_EQ(stats.bad_lines, 64u);
}

TEST(Loader, FileBatchesCarryTheBytesReadOfTheirEpoch) {
  const auto files = WriteCriteoFiles(2, 2000);
  const uint64_t total = std::filesystem::file_size(files[0]) + std::filesystem::file_size(files[1]);
  LoaderOptions o = FileOptions(files, 2, 1);
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<Batch> batches = Drain((*loader)->stream(0));
  ASSERT_FALSE(batches.empty());
  uint64_t last = 0;
  uint64_t epoch = 0;
  for (const Batch& b : batches) {
    EXPECT_EQ(b.bytes_total, total);
    if (b.epoch != epoch) last = 0;
    epoch = b.epoch;
    EXPECT_GE(b.bytes_read, last);
    EXPECT_LE(b.bytes_read, total);
    last = b.bytes_read;
  }
  EXPECT_EQ(batches.back().bytes_read, total);
  EXPECT_EQ(batches.back().epoch, 1u);
  EXPECT_EQ(CheckSourceFiles(o.source).value_or(0), total);
}

LoaderOptions CsvLoaderOptions(std::vector<std::string> files) {
  LoaderOptions o;
  o.source.format = Format::kCsv;
  o.source.files = std::move(files);
  CsvColumn label;
  label.name = "click";
  label.kind = CsvColumn::Kind::kLabel;
  CsvColumn price;
  price.name = "price";
  price.kind = CsvColumn::Kind::kDense;
  CsvColumn site;
  site.name = "site";
  site.kind = CsvColumn::Kind::kCategorical;
  o.source.csv.columns = {label, price, site};
  o.batch_size = 10;
  o.epochs = 1;
  o.shuffle = false;
  return o;
}

TEST(Loader, CsvFilesSkipTheirHeaderPlaceColumnsByNameAndMustAgree) {
  const std::string a = TempPath("a.csv");
  const std::string b = TempPath("b.csv");
  {
    std::ofstream out(a);
    out << "site,price,click\n";
    for (int i = 0; i < 25; ++i) out << "s" << i % 3 << "," << i << "," << i % 2 << "\n";
    std::ofstream out_b(b);
    out_b << "site,price,click\n";
    for (int i = 0; i < 5; ++i) out_b << "t,\"" << i << "\",1\n";
  }
  auto loader = Loader::Start(CsvLoaderOptions({a, b}), {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<Batch> batches = Drain((*loader)->stream(0));
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].num_dense, 1);
  EXPECT_EQ(batches[0].dense[3], 3.0f);
  EXPECT_EQ(batches[0].labels[3], 1.0f);
  EXPECT_EQ(batches[0].slots[0].ids[3], HashToken(0, "s0"));
  EXPECT_EQ(batches[2].labels.back(), 1.0f);
  EXPECT_EQ((*loader)->Stats().lines, 30u);  // The headers are not data.
  EXPECT_EQ((*loader)->Stats().bad_lines, 0u);
  // A file with another header, a header without rows, and a declared column the header lacks.
  const std::string other = TempPath("other.csv");
  std::ofstream(other) << "price,site,click\n1,x,0\n";
  auto mismatch = Loader::Start(CsvLoaderOptions({a, other}), {});
  ASSERT_FALSE(mismatch.ok());
  ExpectNamedError(mismatch.status(), absl::StatusCode::kInvalidArgument, "other.csv:1", "differs from the first");
  const std::string only_header = TempPath("only_header.csv");
  std::ofstream(only_header) << "site,price,click\n";
  auto empty = Loader::Start(CsvLoaderOptions({only_header}), {});
  ASSERT_FALSE(empty.ok());
  ExpectNamedError(empty.status(), absl::StatusCode::kDataLoss, "only_header.csv", "no line after its header");
  const std::string lacking = TempPath("lacking.csv");
  std::ofstream(lacking) << "site,click\nx,1\n";
  auto missing = Loader::Start(CsvLoaderOptions({lacking}), {});
  ASSERT_FALSE(missing.ok());
  ExpectNamedError(missing.status(), absl::StatusCode::kInvalidArgument, "lacking.csv:1 (header)",
                   "csv column 'price' is not in the header (site, click)");
}

// With header: false, a file's header is a bad line; its message says it may be one.
TEST(Loader, AHeaderReadAsDataIsSaidToBeOne) {
  const std::string path = TempPath("headed.csv");
  {
    std::ofstream out(path);
    out << "click,price,site\n";
    for (int i = 0; i < 25; ++i) out << i % 2 << "," << i << ",s" << i % 3 << "\n";
  }
  LoaderOptions o = CsvLoaderOptions({path});
  o.source.csv.header = false;
  for (int i = 0; i < 3; ++i) {
    o.source.csv.columns[i].name.clear();
    o.source.csv.columns[i].index = i;
  }
  o.max_bad_fraction = 0.5;
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(Drain((*loader)->stream(0)).size(), 3u);
  const LoaderStats stats = (*loader)->Stats();
  EXPECT_EQ(stats.bad_lines, 1u);
  ASSERT_FALSE(stats.first_bad.empty());
  EXPECT_NE(stats.first_bad[0].find("headed.csv:1: the column at index 0: 'click'"), std::string::npos)
      << stats.first_bad[0];
  EXPECT_NE(stats.first_bad[0].find("(a header line? then set csv.header: true)"), std::string::npos)
      << stats.first_bad[0];
}

// Kept columns travel in each batch beside its samples, in order (scoring's --keep): csv by the
// header's names, criteo by its column names, also for lines without their label; other formats
// refuse them.
TEST(Loader, KeptColumnsTravelWithTheirSamples) {
  const std::string csv = TempPath("kept.csv");
  {
    std::ofstream out(csv);
    out << "site,price\n";  // No label column: data to score.
    for (int i = 0; i < 15; ++i) out << "s" << i << "," << i << "\n";
  }
  LoaderOptions o = CsvLoaderOptions({csv});
  o.source.csv.label_optional = true;
  o.source.keep = {"price", "site"};
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<Batch> batches = Drain((*loader)->stream(0));
  ASSERT_EQ(batches.size(), 2u);
  ASSERT_EQ(batches[0].kept.size(), 20u);
  ASSERT_EQ(batches[1].kept.size(), 10u);
  EXPECT_EQ(batches[0].kept[0], "0");
  EXPECT_EQ(batches[0].kept[1], "s0");
  EXPECT_EQ(batches[1].kept[8], "14");
  EXPECT_EQ(batches[1].kept[9], "s14");
  EXPECT_TRUE(std::isnan(batches[0].labels[0]));

  const std::string criteo = TempPath("kept.criteo");
  {
    std::ofstream out(criteo);
    for (int i = 0; i < 4; ++i) {
      std::string line = i % 2 == 0 ? "1" : "";  // Odd lines have no label field at all.
      for (int k = 1; k <= 13; ++k) absl::StrAppend(&line, line.empty() && i % 2 == 1 && k == 1 ? "" : "\t", k + i);
      for (int k = 1; k <= 26; ++k) absl::StrAppend(&line, "\t", absl::Hex(k * 16 + i));
      out << line << "\n";
    }
  }
  LoaderOptions c;
  c.source.format = Format::kCriteo;
  c.source.files = {criteo};
  c.source.criteo.label_optional = true;
  c.source.keep = {"label", "I2", "C26"};
  c.batch_size = 4;
  c.shuffle = false;
  c.epochs = 1;
  loader = Loader::Start(c, {});
  ASSERT_TRUE(loader.ok()) << loader.status();
  batches = Drain((*loader)->stream(0));
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].kept,
            (std::vector<std::string>{"1", "2", "1a0", "", "3", "1a1", "1", "4", "1a2", "", "5", "1a3"}));
  c.source.keep = {"I14"};
  EXPECT_NE(Loader::Start(c, {}).status().message().find("kept column 'I14' is not a Criteo column"),
            std::string::npos);
  c.source.format = Format::kLibsvm;
  c.source.keep = {"label"};
  EXPECT_NE(Loader::Start(c, {}).status().message().find("kept columns are for csv and criteo sources, not libsvm"),
            std::string::npos);
}

// A file without a header among files with one: its first line parses as data, so it is data,
// read with the header's columns (for held-out files the plan names the training data's first
// file as csv.header_file). A held-out file with a header of its own is placed by it; a first line
// that is neither the header nor data is refused.
TEST(Loader, AFileWithoutAHeaderIsReadWithTheHeadersColumns) {
  const auto write = [](const std::string& name, const std::string& header) {
    const std::string path = TempPath(name);
    std::ofstream out(path);
    out << header;
    for (int i = 0; i < 20; ++i) out << "s" << i % 3 << "," << (i == 0 ? 1 : i % 2) << "," << i + 5 << "\n";
    return path;
  };
  const auto samples = [](const LoaderOptions& o, std::vector<Batch>* batches) -> absl::Status {
    auto loader = Loader::Start(o, {});
    if (!loader.ok()) return loader.status();
    *batches = Drain((*loader)->stream(0));
    return absl::OkStatus();
  };
  const std::string train = write("train_headed.csv", "site,click,price\n");
  const std::string bare = write("heldout_bare.csv", "");
  std::vector<Batch> batches;
  LoaderOptions o = CsvLoaderOptions({train, bare});
  ASSERT_TRUE(samples(o, &batches).ok());
  EXPECT_EQ(batches.size(), 4u);  // Both files' 20 lines: the bare file's first line too.
  o = CsvLoaderOptions({bare});
  o.source.csv.header_file = train;
  ASSERT_TRUE(samples(o, &batches).ok());
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].labels[0], 1.0f);  // Its first line, placed by the training header.
  EXPECT_EQ(batches[0].dense[0], 5.0f);
  const std::string reordered = TempPath("heldout_reordered.csv");
  {
    std::ofstream out(reordered);
    out << "price,site,click\n";
    for (int i = 0; i < 20; ++i) out << i + 7 << ",s" << i % 3 << "," << i % 2 << "\n";
  }
  o = CsvLoaderOptions({reordered});
  o.source.csv.header_file = train;  // Its own header places its columns.
  {
    const absl::Status s = samples(o, &batches);
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].dense[0], 7.0f);
  o = CsvLoaderOptions({train, write("heldout_other.csv", "a,b,c\n")});
  const absl::Status refused = samples(o, &batches);
  EXPECT_NE(refused.message().find("heldout_other.csv:1: its header differs from the first file's"), std::string::npos)
      << refused;
}

TEST(Loader, SlowWorkerStallsTheLoaderWithBoundedMemory) {
  LoaderOptions o = SyntheticOptions(2, 2);
  o.prefetch_batches = 2;
  o.epochs = 0;  // Forever.
  auto loader = Loader::Start(o, {});
  ASSERT_TRUE(loader.ok());
  // Worker 1 never reads. Worker 0 gets batches until worker 1's queue is full, then none.
  Batch b;
  int got = 0;
  while ((*loader)->stream(0)->Next(&b, absl::Milliseconds(500)).ok()) ++got;
  EXPECT_GE(got, 2);
  EXPECT_LE(got, 2 + 1 + 2);  // Its own queue, the batch in the dispatcher's hands, a margin.
  const uint64_t delivered = (*loader)->Stats().batches;
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ((*loader)->Stats().batches, delivered);  // Stalled: nothing produced, nothing dropped.
  // Once worker 1 reads, both streams flow again, in order.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE((*loader)->stream(1)->Next(&b, absl::Seconds(30)).ok());
    EXPECT_EQ(b.batch_id, static_cast<uint64_t>(2 * i + 1));
    ASSERT_TRUE((*loader)->stream(0)->Next(&b, absl::Seconds(30)).ok());
  }
  (*loader)->Stop();
  absl::Status s;
  while ((s = (*loader)->stream(1)->Next(&b, absl::Seconds(1))).ok()) {
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

TEST(Loader, RejectsBadOptionsAndPositions) {
  LoaderOptions o = SyntheticOptions(1, 2);
  o.batch_size = 0;
  EXPECT_EQ(Loader::Start(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = SyntheticOptions(1, 2);
  EXPECT_EQ(Loader::Start(o, {ReaderPosition()}).status().code(), absl::StatusCode::kInvalidArgument);
  ReaderPosition p0, p1;
  p1.next_batch = 2;  // Belongs to worker 0, not 1.
  EXPECT_NE(Loader::Start(o, {p0, p1}).status().message().find("does not belong to worker 1"), std::string::npos);
  o.source.format = Format::kCriteo;
  EXPECT_NE(Loader::Start(o, {}).status().message().find("needs at least one file"), std::string::npos);
}

}  // namespace
}  // namespace hyrec::data_loader
