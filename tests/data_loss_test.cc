// Nothing is lost silently, as a user of `hyrec train` and `hyrec loader` meets it: a data or
// eval file that is missing, empty, a truncated gzip stream, or in the wrong format stops the job
// with the invalid-input exit code and a message naming the file, before or while training, and
// never trains on nothing with exit 0. (The loader's own tests cover files that shrink or vanish
// mid-run, all-bad batches and skip_bad_files.)
#include <zlib.h>

#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/data_loader/data_service.h"
#include "run_command.h"

namespace {

using hyrec::SpawnOptions;
using hyrec::Subprocess;
using hyrec::WaitForListeningPort;
using hyrec::testing::CommandResult;
using hyrec::testing::RunCommand;
namespace data_loader = hyrec::data_loader;

std::string Path(const std::string& name) { return ::testing::TempDir() + "/data_loss_" + name; }

// `lines` Criteo lines (label, 13 integers, 26 hex tokens) with a learnable label.
std::string CriteoText(int lines, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    const uint64_t c1 = rng() % 50;
    absl::StrAppend(&text, c1 % 3 == 0 ? 1 : 0);
    for (int k = 0; k < 13; ++k) absl::StrAppend(&text, "\t", rng() % 20);
    for (int k = 0; k < 26; ++k) absl::StrAppend(&text, "\t", absl::Hex(k == 0 ? c1 : rng() % 100, absl::kZeroPad8));
    text += "\n";
  }
  return text;
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = Path(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string WriteTruncatedGzip(const std::string& name, const std::string& text, size_t keep) {
  const std::string path = Path(name);
  gzFile gz = gzopen(path.c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  std::ifstream in(path, std::ios::binary);
  std::string z((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(z.size(), keep);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(z.data(), static_cast<std::streamsize>(keep));
  return path;
}

std::string Job(const std::string& files, const std::string& eval_files) {
  const std::string path = Path("job.yaml");
  std::ofstream(path) << "loader:\n  source: {format: criteo, files: [" << files << "]}\n"
                      << "  batch_size: 64\n  threads: 1\n  shuffle_window: 512\n"
                      << (eval_files.empty() ? "" : "eval:\n  files: [" + eval_files + "]\n")
                      << "model: {embedding_dim: 4, bottom: [8], top: [8]}\n"
                      << "ps: {shards: 1}\ntrain: {log_every_batches: 1000}\n"
                      << "security: {mode: none}\n";  // A loader started by hand, on loopback.
  return path;
}

CommandResult Train(const std::string& job) { return RunCommand({HYREC_LAUNCHER_BINARY, "train", "--config=" + job}); }

void ExpectInvalidInputNaming(const CommandResult& r, const std::string& file, const std::string& why) {
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, file)) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, why)) << r.all();
  EXPECT_FALSE(absl::StrContains(r.out, "held-out AUC")) << r.all();
}

TEST(DataLoss, AGoodFileTrainsAndEvaluates) {  // The baseline the other cases differ from.
  const std::string train = Write("good.tsv", CriteoText(1000, 1));
  const std::string test = Write("good_test.tsv", CriteoText(300, 2));
  const CommandResult r = Train(Job(train, test));
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(absl::StrContains(r.out, "summary: 1000 samples")) << r.all();
  EXPECT_TRUE(absl::StrContains(r.out, "held-out AUC")) << r.all();
}

TEST(DataLoss, AMissingFileAmongSeveralStopsTheJob) {
  const std::string good = Write("good.tsv", CriteoText(1000, 1));
  ExpectInvalidInputNaming(Train(Job(good + ", " + Path("nope.tsv"), "")), "data_loss_nope.tsv", "cannot open");
}

TEST(DataLoss, AnEmptyFileStopsTheJob) {
  const std::string empty = Write("empty.tsv", "");
  ExpectInvalidInputNaming(Train(Job(empty, "")), "data_loss_empty.tsv", "is empty");
}

TEST(DataLoss, ATruncatedGzipStopsTheJobInsteadOfTrainingOnHalf) {
  const std::string gz = WriteTruncatedGzip("trunc.tsv.gz", CriteoText(20000, 3), 30000);
  const CommandResult r = Train(Job(gz, ""));
  ExpectInvalidInputNaming(r, "data_loss_trunc.tsv.gz", "");
  EXPECT_FALSE(absl::StrContains(r.out, "summary:")) << r.all();
}

TEST(DataLoss, AWrongEvalPathStopsTheJobBeforeTraining) {
  const std::string train = Write("good.tsv", CriteoText(1000, 1));
  const CommandResult r = Train(Job(train, Path("no_test.tsv")));
  ExpectInvalidInputNaming(r, "data_loss_no_test.tsv", "eval.files");
  EXPECT_FALSE(absl::StrContains(r.out, "summary:")) << r.all();
}

TEST(DataLoss, AFileInTheWrongFormatStopsWithTheBadLineErrorNotANan) {
  std::string libsvm;
  for (int i = 0; i < 500; ++i) absl::StrAppend(&libsvm, i % 2, " 1:", i % 7, " 5:1 9:0.5\n");
  const CommandResult r = Train(Job(Write("libsvm.txt", libsvm), ""));
  ExpectInvalidInputNaming(r, "data_loss_libsvm.txt", "the first 100 lines");
  EXPECT_FALSE(absl::StrContains(r.all(), "NaN")) << r.all();
}

TEST(DataLoss, ALoaderWithNoUsableDataExitsAsInvalidInput) {
  const CommandResult r =
      RunCommand({HYREC_LAUNCHER_BINARY, "loader", "--config=" + Job(Path("nope.tsv"), ""), "--port=0"});
  ExpectInvalidInputNaming(r, "data_loss_nope.tsv", "cannot open");
  EXPECT_FALSE(absl::StrContains(r.out, "listening")) << r.all();
}

// The loader reads once its worker opened its stream: the worker's stream then ends with the
// loader's DATA_LOSS naming the file, and the loader exits as invalid input naming it too.
TEST(DataLoss, ALoaderWhoseDataFailsMidRunExitsAsInvalidInput) {
  const std::string gz = WriteTruncatedGzip("trunc_loader.tsv.gz", CriteoText(20000, 4), 30000);
  SpawnOptions spawn;
  spawn.capture_stderr = true;
  auto loader = Subprocess::Spawn({HYREC_LAUNCHER_BINARY, "loader", "--config=" + Job(gz, ""), "--port=0"}, spawn);
  ASSERT_TRUE(loader.ok()) << loader.status();
  auto port = WaitForListeningPort(**loader, absl::Seconds(30));  // It started...
  ASSERT_TRUE(port.ok()) << port.status();
  auto stream = data_loader::ConnectBatchStream(absl::StrCat("127.0.0.1:", *port), 0, {});
  ASSERT_TRUE(stream.ok()) << stream.status();
  data_loader::Batch batch;
  absl::Status s;
  while ((s = (*stream)->Next(&batch, absl::Seconds(30))).ok()) {
  }
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;  // ...then failed, and said so to its worker.
  EXPECT_TRUE(absl::StrContains(s.message(), "data_loss_trunc_loader.tsv.gz")) << s;
  std::string err;
  for (absl::StatusOr<std::string> line; (line = (*loader)->ReadErrorLine(absl::Seconds(30))).ok();) {
    absl::StrAppend(&err, *line, "\n");
  }
  auto code = (*loader)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2) << err;
  EXPECT_TRUE(absl::StrContains(err, "data_loss_trunc_loader.tsv.gz")) << err;
}

}  // namespace
