// hyrec plan's capacity model: sizes, machine fit, bytes per step, and its errors.
#include "hyrec/planner/capacity.h"

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/deploy/k8s.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::planner {

using job::JobPlan;
using job::JobSpec;
using job::LoadJobSpec;
using job::ParseJobSpecText;
using job::Plan;
namespace {

const std::string kCluster = HYREC_SOURCE_DIR "/examples/configs/cluster.yaml";

JobPlan PlanOf(const std::string& text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecText(text, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = Plan(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

constexpr char kSynthetic[] = R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 100000, num_slots: 3, num_dense: 4, vocabulary: 1000, zipf: 1.05, seed: 2}
  batch_size: 1024
features: [a, b, c]
tables:
  - {name: ab, features: [a, b], dim: 16, optimizer: {kind: adagrad}, capacity_rows: 400000}
  - {name: c, features: [c], dim: 8, capacity_rows: 100000}
ps: {shards: 2}
train: {workers: 2}
)";

TEST(ParseCount, ReadsSuffixesAndRefusesTheRest) {
  EXPECT_EQ(*ParseCount("100T", "--parameters"), 1e14);
  EXPECT_EQ(*ParseCount("5G", "--parameters"), 5e9);
  EXPECT_EQ(*ParseCount("12.5m", "--parameters"), 12.5e6);
  EXPECT_EQ(*ParseCount("1e9", "--parameters"), 1e9);
  EXPECT_EQ(*ParseCount("3", "--parameters"), 3);
  for (const char* bad : {"", "T", "-4", "0", "12X", "1.5.5G", "nan"}) {
    absl::StatusOr<double> r = ParseCount(bad, "--parameters");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "--parameters")) << r.status();
  }
  // Past its bound (a row count past 2^62, any count past 1e21) is an error, never "not given".
  const absl::Status rows = ParseCount("1e30", "--rows_per_table", 0x1p62).status();
  EXPECT_TRUE(absl::StrContains(rows.message(), "--rows_per_table=1e30: more than")) << rows;
  EXPECT_FALSE(ParseCount("20000000000000000000", "--rows_per_table", 0x1p62).ok());
  EXPECT_FALSE(ParseCount("1e22", "--parameters").ok());
  EXPECT_TRUE(ParseCount("4e18", "--rows_per_table", 0x1p62).ok());
}

// Rows, memory and machines of a sized job: resident rows are the capacities; each shard's
// memory is the store's accounting with its rows plus the process; the pod request covers it.
TEST(PlanCapacity, SizesTablesShardsAndMachines) {
  const JobPlan plan = PlanOf(kSynthetic);
  CapacityOptions o;
  o.parameters = 100e12;
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tables.size(), 2u);
  EXPECT_NEAR(c->logical_parameters, 100e12, 100e12 * 1e-9);
  EXPECT_EQ(c->tables[0].resident_rows, 400000u);
  EXPECT_EQ(c->tables[1].resident_rows, 100000u);
  EXPECT_EQ(c->resident_parameters, 400000.0 * 16 + 100000.0 * 8);
  // Adagrad at dim 16: the 8-byte id, 16 weights and 16 accumulators.
  EXPECT_EQ(c->tables[0].value_bytes, 64u);
  EXPECT_EQ(c->tables[0].state_bytes, 64u);
  EXPECT_GT(c->tables[0].index_bytes, 5.0);
  EXPECT_LT(c->tables[0].index_bytes, 12.0);
  EXPECT_GT(c->tables[0].bytes_per_row, 136 + 5.0);
  ASSERT_EQ(c->shards.size(), 2u);
  for (const CapacityPlan::Shard& s : c->shards) {
    EXPECT_EQ(s.resident_rows, 250000u);
    EXPECT_EQ(s.memory_bytes, s.store_bytes + o.process_bytes + s.serving_bytes);
    // Serving: a batch of 1,024 on each of 2 workers, 3 ids a sample (dims 16, 16, 8), measured
    // deduplication, half of it on each shard.
    EXPECT_GT(s.response_bytes, 0u);
    EXPECT_LE(s.response_bytes, 2 * 1024 * (16 + 16 + 8) * 4 / 2);
    EXPECT_EQ(s.serving_bytes, o.serving_fixed_bytes +
                                   static_cast<uint64_t>(o.serving_per_byte * static_cast<double>(s.response_bytes)));
    EXPECT_GE(s.request_bytes, s.memory_bytes);
    const embedding_ps::StoreMemoryPlan m = embedding_ps::PlanStoreMemory(plan.ps[s.index].store, {200000, 50000});
    EXPECT_EQ(s.store_bytes, m.bytes);
  }
  EXPECT_EQ(c->ps_machine.name, "m3-megamem-64");
  EXPECT_EQ(c->ps_machines, 1);
  EXPECT_GE(c->shards_per_machine, 2);
  // The same figures as JSON.
  const std::string json = CapacityPlanJson(*c);
  EXPECT_TRUE(absl::StrContains(json, "\"resident_rows\":400000")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"ps_machines\":1")) << json;
  EXPECT_TRUE(absl::StrContains(FormatCapacityPlan(*c), "PS machines: 1 x m3-megamem-64")) << FormatCapacityPlan(*c);
}

// With a disk tier: each shard's DRAM holds ps.capacity_rows and the rest of its share is on
// disk, in a file and a DRAM index as PlanDiskTier counts them (the index in the shard's memory);
// the machine's local SSD bounds the shards a machine takes; a machine without local SSD, or a
// tier too small for its rows, is refused naming the key.
TEST(PlanCapacity, ADiskTierHoldsTheRowsBeyondDram) {
  std::string text = kSynthetic;
  text.replace(text.find("ps: {shards: 2}"), 15,
               "ps: {shards: 2, capacity_rows: 50000, disk: {dir: /ssd, capacity_bytes: 107374182400}}");
  const JobPlan plan = PlanOf(text);
  CapacityOptions o;
  o.parameters = 100e12;  // Past the tables' capacities: each shard holds its 250,000 rows.
  o.ps_machine = "z3-highmem-88";
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tables[0].resident_rows + c->tables[1].resident_rows, 500000u) << "DRAM and disk";
  for (const CapacityPlan::Shard& s : c->shards) {
    EXPECT_EQ(s.resident_rows, 250000u);
    EXPECT_NEAR(static_cast<double>(s.disk_rows), 200000, 2) << "the rest of its 250,000";
    // Records of 144 and 80 bytes (adagrad at dims 16 and 8), 28 and 50 a page, pages 90% full.
    EXPECT_GT(s.disk_bytes, 200000u * 4096 / 50);
    EXPECT_LT(s.disk_bytes, 200000u * 4096 / 28 * 10 / 9 + 16 * 4096);
    EXPECT_GT(s.disk_index_bytes, 200000u * 17);
    EXPECT_EQ(s.memory_bytes, s.store_bytes + o.process_bytes + s.serving_bytes + s.disk_index_bytes);
  }
  EXPECT_TRUE(absl::StrContains(FormatCapacityPlan(*c), "disk tier (ps.disk)")) << FormatCapacityPlan(*c);
  EXPECT_TRUE(absl::StrContains(CapacityPlanJson(*c), "\"disk_rows\":2000")) << CapacityPlanJson(*c);
  // 100 GiB a shard: 36,000 GiB of local SSD would take 360, and the job has 2.
  EXPECT_EQ(c->ps_machines, 1);
  EXPECT_EQ(PlacePsShards(c->ps_machine, 1000, 1, 0.001, uint64_t{100} << 30).shards_per_machine, 360);
  o.ps_machine = "m3-megamem-64";
  absl::Status refused = PlanCapacity(plan, o).status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "ps.disk.capacity_bytes")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "local SSD")) << refused;
  std::string small = text;
  small.replace(small.find("107374182400"), 12, "1048576");
  o.ps_machine = "z3-highmem-88";
  refused = PlanCapacity(PlanOf(small), o).status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "ps.disk.capacity_bytes: PS shard 0 would hold 2000")) << refused;
}

// Ids per sample and deduplication come from the job's own batches; bytes per step follow.
TEST(PlanCapacity, MeasuresIdsOnTheJobsDataAndCountsBytesPerStep) {
  const JobPlan plan = PlanOf(kSynthetic);
  CapacityOptions o;
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(absl::StrContains(c->ids_source, "measured on 20 batches")) << c->ids_source;
  EXPECT_DOUBLE_EQ(c->tables[0].ids_per_sample, 2);  // Features a and b, one id each.
  EXPECT_DOUBLE_EQ(c->tables[1].ids_per_sample, 1);
  for (const CapacityPlan::Table& t : c->tables) {
    EXPECT_GT(t.dedup_ratio, 0.05) << t.name;  // Zipf ids over 1,000: a batch of 1,024 repeats many.
    EXPECT_LT(t.dedup_ratio, 0.9) << t.name;
  }
  o.dedup_ratio = 0.5;
  c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  const double unique = 2 * 1024 * 3 * 0.5;  // Workers x batch x ids a sample x unique share.
  EXPECT_DOUBLE_EQ(c->id_bytes_per_step, unique * 8);
  EXPECT_DOUBLE_EQ(c->row_bytes_per_step_fp32, 2 * 1024 * 0.5 * (2 * 16 + 8) * 4);
  // A batch: labels and 4 dense features, 3 slots' offsets, 3 ids a sample (8 bytes as the slot's,
  // 4 as its index among the table's unique ids), the unique ids, 2 tables' shard offsets.
  EXPECT_DOUBLE_EQ(c->loader_bytes_per_step,
                   2 * (1024 * 4.0 * 5 + 3 * 1025 * 4 + 1024 * 3 * 12.0 + 1024 * 3 * 0.5 * 8 + 2 * 3 * 4));
  // A larger batch and more workers re-plan the job.
  o.workers = 4;
  o.batch_size = 4096;
  c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->workers, 4);
  EXPECT_EQ(c->batch_size, 4096);
  EXPECT_DOUBLE_EQ(c->id_bytes_per_step, 4 * 4096 * 3 * 0.5 * 8);
}

TEST(PlanCapacity, BadInputNamesTheKey) {
  const JobPlan plan = PlanOf(kSynthetic);
  CapacityOptions o;
  o.ps_machine = "m3-megamem-46";
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "--ps_machine=m3-megamem-46")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "did you mean m3-megamem-64")) << c.status();
  // A table without a size: a synthetic source's vocabulary sizes it (1,000 ids a feature) ...
  std::string unsized = kSynthetic;
  unsized.replace(unsized.find(", capacity_rows: 100000"), 23, "");
  c = PlanCapacity(PlanOf(unsized), CapacityOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tables[1].logical_rows, 1000u);
  // ... a store bound holds as many as it can ...
  std::string files = unsized;
  files.replace(files.find("format: synthetic"), 17,
                "format: libffm\n    num_slots: 3\n    files: [/nonexistent/a.txt]");
  std::string bounded = files;
  bounded.replace(bounded.find("ps: {shards: 2}"), 15, "ps: {shards: 2, capacity_rows: 300000}");
  c = PlanCapacity(PlanOf(bounded), CapacityOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tables[1].logical_rows, 0u);  // Unknown.
  EXPECT_GT(c->tables[1].resident_rows, 0u);
  EXPECT_EQ(c->shards[0].resident_rows, 300000u);
  EXPECT_TRUE(absl::StrContains(c->ids_source, "not read")) << c->ids_source;
  // ... and without either it is an error naming the key.
  c = PlanCapacity(PlanOf(files), CapacityOptions());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "tables[c].capacity_rows")) << c.status();
  // A capacity no machine of the type can hold.
  o = CapacityOptions();
  o.ps_machine = "e2-standard-8";
  o.rows_per_table = 1;
  std::string huge = kSynthetic;
  huge.replace(huge.find("capacity_rows: 400000"), 21, "capacity_rows: 400000000");
  c = PlanCapacity(PlanOf(huge), o);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "ps.shards: PS shard")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "e2-standard-8")) << c.status();
  // Machine types from a file: errors name the entry and its line.
  const std::string path = ::testing::TempDir() + "/machines.yaml";
  std::ofstream(path) << "- {name: big, cpus: 64, memory_gib: 2048, network_gbps: 100, price_per_hour: 9.5}\n"
                         "- {name: small, cpus: 0, memory_gib: 8}\n";
  absl::StatusOr<std::vector<MachineType>> types = LoadMachineTypes(path);
  ASSERT_FALSE(types.ok());
  EXPECT_TRUE(absl::StrContains(types.status().message(), "[1] (line 2)")) << types.status();
  std::ofstream(path) << "- {name: big, cpus: 64, memory_gib: 2048, network_gbps: 100, price_per_hour: 9.5}\n"
                         "- {name: small, cpus: 4, memroy_gib: 8}\n";
  types = LoadMachineTypes(path);
  ASSERT_FALSE(types.ok());
  EXPECT_TRUE(absl::StrContains(types.status().message(), "memroy_gib")) << types.status();
  std::ofstream(path) << "- {name: big, cpus: 64, memory_gib: 2048, network_gbps: 100, price_per_hour: 9.5}\n";
  types = LoadMachineTypes(path);
  ASSERT_TRUE(types.ok()) << types.status();
  o = CapacityOptions();
  o.machines = *types;
  o.ps_machine = "big";
  c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps_machine.price_per_hour, 9.5);
}

// The Kubernetes renderer asks for the PS pods' memory the planner gives.
TEST(PlanCapacity, TheRendererRequestsThePlannedMemory) {
  absl::StatusOr<JobSpec> spec = LoadJobSpec(kCluster);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = Plan(*spec);
  ASSERT_TRUE(plan.ok());
  CapacityOptions o;
  o.rows_per_table = 100'000'000;  // Beyond every capacity: the shards hold their capacities.
  o.dedup_ratio = 1;
  o.measure_batches = 0;  // As the renderer plans: without reading the data.
  absl::StatusOr<CapacityPlan> c = PlanCapacity(*plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  deploy::K8sOptions k8s;
  k8s.name = "user-item";
  k8s.image = "registry.example/hyrec@sha256:" + std::string(64, 'a');
  absl::StatusOr<deploy::K8sRender> r = deploy::RenderK8s(*spec, k8s);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const CapacityPlan::Shard& s : c->shards) {
    EXPECT_EQ(PodRequestBytes(*plan, s.index), s.request_bytes);
    const std::string quantity = absl::StrCat("memory: \"", (s.request_bytes + (1 << 20) - 1) >> 20, "Mi\"");
    EXPECT_TRUE(absl::StrContains(r->yaml, quantity)) << quantity;
  }
}

}  // namespace
}  // namespace hyrec::planner

namespace hyrec::planner {
namespace {

StepCosts Measured() {
  StepCosts s;
  s.batch_size = 512;
  s.shards = 2;
  s.train_ms = 8;
  s.lookup_client_ms = 2;
  s.update_client_ms = 3;
  s.lookup_server_ms = 3;
  s.update_server_ms = 4;
  s.loader_ms = 1.5;
  s.rpc_client_ms = 0.25;
  s.rpc_server_ms = 0.5;
  s.id_bytes = 40000;
  s.row_bytes = 320000;
  s.batch_bytes = 100000;
  s.dense_bytes = 120000;
  return s;
}

// A calibration file keeps the job's step costs; a hand-edited one gets errors naming the key.
TEST(Calibration, KeepsTheStepCostsAndNamesWhatIsWrong) {
  Calibration c;
  c.machine = "here";
  c.cpus = 2;
  c.process_bytes = 22 << 20;
  c.rpc_dim = 64;
  c.rpc_client_us = 120;
  c.job = "job.yaml";
  c.step = Measured();
  const std::string path = ::testing::TempDir() + "/calibration.yaml";
  ASSERT_TRUE(WriteCalibration(c, path).ok());
  absl::StatusOr<Calibration> read = ReadCalibration(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job, "job.yaml");
  EXPECT_EQ(read->rpc_client_us, 120);
  EXPECT_EQ(read->step.batch_size, 512);
  EXPECT_EQ(read->step.shards, 2);
  EXPECT_EQ(read->step.train_ms, 8);
  EXPECT_EQ(read->step.update_server_ms, 4);
  EXPECT_EQ(read->step.dense_bytes, 120000);
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto read_with = [&](const std::string& from, const std::string& to) {
    std::string edited = text;
    edited.replace(edited.find(from), from.size(), to);
    std::ofstream(path) << edited;
    return ReadCalibration(path);
  };
  read = read_with("  train_ms:", "  trian_ms:");
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "step")) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "trian_ms")) << read.status();
  read = read_with("\ncpus:", "\ncpsu:");  // The machine's fields are checked as the step's.
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "cpsu")) << read.status();
  read = read_with("job: job.yaml\n", "");
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "needs the job")) << read.status();
  read = read_with("  batch_size: 512", "  batch_size: 0");
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "batch_size")) << read.status();
}

// At another batch size, what a call costs stays and the rest follows the batch or its rows.
TEST(ThroughputPlan, ScalesTheMeasuredCostsToThePlannedBatch) {
  const StepCosts c = Measured();
  const StepCosts s = ScaleStepCosts(c, 2048, 0, 0);
  EXPECT_DOUBLE_EQ(s.train_ms, 32);
  EXPECT_DOUBLE_EQ(s.loader_ms, 6);
  EXPECT_DOUBLE_EQ(s.lookup_server_ms, 2 * 0.5 + (3 - 2 * 0.5) * 4);
  EXPECT_DOUBLE_EQ(s.update_client_ms, 2 * 0.25 + (3 - 2 * 0.25) * 4);
  EXPECT_DOUBLE_EQ(s.row_bytes, 4 * 320000);
  // Rows counted by the plan (heavier deduplication at the larger batch): the PS work follows them.
  const StepCosts d = ScaleStepCosts(c, 2048, 2 * 40000, 2 * 320000);
  EXPECT_DOUBLE_EQ(d.train_ms, 32);
  EXPECT_DOUBLE_EQ(d.lookup_server_ms, 2 * 0.5 + (3 - 2 * 0.5) * 2);
  EXPECT_DOUBLE_EQ(d.row_bytes, 2 * 320000);
}

TEST(ThroughputPlan, PredictsThePlannedJobAndItsScaling) {
  const JobPlan plan = PlanOf(kSynthetic);
  CapacityOptions o;
  o.workers = 4;
  o.measure_batches = 0;
  absl::StatusOr<CapacityPlan> c = PlanCapacity(plan, o);
  ASSERT_TRUE(c.ok()) << c.status();
  ThroughputOptions t;
  t.costs = Measured();
  absl::StatusOr<ThroughputPlan> p = PlanThroughput(plan, *c, t);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cluster_options.workers, 4);
  EXPECT_EQ(p->cluster_options.shards, 2);
  EXPECT_EQ(p->cluster_options.ps_cores, c->ps_machine.cpus);
  EXPECT_EQ(p->costs.batch_size, 1024);
  // The dense step (16 ms at batch 1,024) bounds four workers with idle PS machines.
  EXPECT_EQ(p->cluster.bottleneck, Resource::kDenseStep);
  EXPECT_NEAR(p->cluster.samples_per_second, 4 * 1024 / 0.016, 4 * 1024 / 0.016 * 0.03);
  const std::string json = CapacityPlanJson(*c, &*p);
  EXPECT_TRUE(absl::StrContains(json, "\"throughput\":{\"samples_per_second\":")) << json;
  EXPECT_TRUE(absl::StrContains(CapacityPlanJson(*c), "\"throughput\":null"));
  // Weak scaling holds the batch a worker; strong scaling splits the global batch (4 x 1,024).
  const std::vector<ScalingPoint> weak = ScalingCurve(plan, *c, t, true, {1, 2, 4});
  const std::vector<ScalingPoint> strong = ScalingCurve(plan, *c, t, false, {1, 2, 4});
  ASSERT_EQ(weak.size(), 3u);
  ASSERT_EQ(strong.size(), 3u);
  EXPECT_EQ(weak[2].batch_size, 1024);
  EXPECT_EQ(strong[0].batch_size, 4096);
  EXPECT_EQ(strong[2].batch_size, 1024);
  EXPECT_NEAR(weak[2].efficiency, 1, 0.05);
  // An unknown machine type names its flag.
  t.worker_machine = "a2-highgpu-9g";
  p = PlanThroughput(plan, *c, t);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--worker_machine=a2-highgpu-9g")) << p.status();
}

}  // namespace
}  // namespace hyrec::planner
