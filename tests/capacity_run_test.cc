// hyrec plan's memory against real PS processes: for stores of one and several tables, one to four
// shards, filled past their capacities through the gRPC client, each process's resident memory
// (VmRSS) is within 5% of the memory the plan gives its shard, with the process's own memory as
// `hyrec plan --calibrate` measures it.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/planner/capacity.h"

namespace hyrec::planner {

using job::JobPlan;
using job::PlanJobFile;
using job::WorkerPlan;
namespace {

struct Shape {
  std::string name;
  int shards;
  std::string tables;  // The job's tables: a YAML list over features a, b and c.
  int batches;         // Batches of 4,096 read and looked up: past every capacity.
};

class CapacityRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/capacity_run_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(CapacityRunTest, PlannedPsMemoryIsWithinFivePercentOfTheProcesses) {
  absl::StatusOr<Calibration> calibration = Calibrate(HYREC_PS_BINARY, dir_);
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  std::printf("a PS process with an empty store: %.1f MiB; serving: %.1f MiB + %.2f x its responses\n",
              calibration->process_bytes / 1048576.0, calibration->serving_fixed_bytes / 1048576.0,
              calibration->serving_per_byte);
  const std::vector<Shape> shapes = {
      {"one table, one shard", 1, "[{name: t, features: [a, b, c], dim: 64, capacity_rows: 600000}]", 60},
      {"three tables, two shards", 2,
       "[{name: u, features: [a], dim: 8, optimizer: {kind: adagrad}, capacity_rows: 400000},\n"
       " {name: v, features: [b], dim: 32, optimizer: {kind: adam}, capacity_rows: 300000},\n"
       " {name: w, features: [c], dim: 64, capacity_rows: 300000}]",
       120},
      {"one table, four shards", 4,
       "[{name: t, features: [a, b, c], dim: 32, optimizer: {kind: adagrad}, capacity_rows: 1600000}]", 160},
  };
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.name);
    const std::string job = absl::StrCat(dir_, "/job.yaml");
    std::ofstream(job) << "loader:\n  source: {format: synthetic, synthetic: {num_slots: 3, vocabulary: 100000000, "
                       << "zipf: 0.5, num_samples: 10000000}}\n  batch_size: 4096\n"
                       << "features: [a, b, c]\ntables: " << shape.tables << "\n"
                       << "ps: {shards: " << shape.shards << "}\nsecurity: {mode: none}\n";
    absl::StatusOr<JobPlan> plan = PlanJobFile(job);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<std::unique_ptr<Subprocess>> shards;
    std::vector<std::string> addresses;
    for (int s = 0; s < shape.shards; ++s) {
      auto p = Subprocess::Spawn({HYREC_PS_BINARY, "--config=" + job, absl::StrCat("--shard_index=", s), "--port=0"});
      ASSERT_TRUE(p.ok()) << p.status();
      absl::StatusOr<int> port = WaitForListeningPort(**p, absl::Seconds(60));
      ASSERT_TRUE(port.ok()) << port.status();
      addresses.push_back(absl::StrCat("127.0.0.1:", *port));
      shards.push_back(std::move(*p));
    }
    auto client = embedding_ps::ConnectEmbeddingClient(addresses, embedding_ps::ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status();
    // The job's own batches, looked up as a dense worker looks them up (every table's shards at once).
    auto loader = data_loader::Loader::Start(plan->loader.options, {});
    ASSERT_TRUE(loader.ok()) << loader.status();
    const WorkerPlan& w = plan->workers[0];
    for (int b = 0; b < shape.batches; ++b) {
      data_loader::Batch batch;
      ASSERT_TRUE((*loader)->stream(0)->Next(&batch, absl::Seconds(60)).ok());
      std::vector<std::vector<float>> rows(batch.tables.size());
      std::vector<embedding_ps::EmbeddingClient::ShardedLookup> lookups;
      for (size_t t = 0; t < batch.tables.size(); ++t) {
        rows[t].resize(batch.tables[t].unique_ids.size() * w.table_dims[t]);
        lookups.push_back(
            {w.table_names[t], batch.tables[t].unique_ids, batch.tables[t].shard_offsets, absl::MakeSpan(rows[t])});
      }
      ASSERT_TRUE((*client)->LookupShardedTables(lookups).ok());
    }
    CapacityOptions options;
    options.rows_per_table = 100'000'000;  // The vocabulary: past every capacity.
    options.process_bytes = calibration->process_bytes;
    options.serving_fixed_bytes = calibration->serving_fixed_bytes;
    options.serving_per_byte = calibration->serving_per_byte;
    absl::StatusOr<CapacityPlan> planned = PlanCapacity(*plan, options);
    ASSERT_TRUE(planned.ok()) << planned.status();
    for (int s = 0; s < shape.shards; ++s) {
      absl::StatusOr<uint64_t> rss = ResidentBytes(shards[s]->pid());
      ASSERT_TRUE(rss.ok()) << rss.status();
      const double want = static_cast<double>(planned->shards[s].memory_bytes);
      std::printf("%s, shard %d: planned %.1f MiB, resident %.1f MiB (%+.1f%%)\n", shape.name.c_str(), s,
                  want / 1048576, *rss / 1048576.0, 100.0 * (want - static_cast<double>(*rss)) / *rss);
      EXPECT_NEAR(want, static_cast<double>(*rss), 0.05 * static_cast<double>(*rss)) << "shard " << s;
    }
    client->reset();
    for (auto& p : shards) {
      p->Signal(SIGKILL);
      (void)p->Wait(absl::Seconds(10));
    }
  }
}

}  // namespace
}  // namespace hyrec::planner
