// The job spec and plan: what a job file says, what every role is planned to run, and the errors
// a wrong file gets (key, line, what was wrong; never an exception).
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/job/job_spec.h"

namespace hyrec::job {
namespace {

constexpr char kTwoTables[] = R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: 10000, num_slots: 4, num_dense: 3, vocabulary: 100}
  batch_size: 100
features: [user, item, history, context]
tables:
  - name: users
    features: [user]
    dim: 8
    optimizer: {kind: adam, learning_rate: 0.01}
    initializer: {kind: normal, stddev: 0.05}
    admission: {min_count: 2}
    capacity_rows: 1001
  - name: items
    features: [item, {name: history, pooling: mean}]
    dim: 16
  - name: context
    features: [context]
    pooling: sqrtn
    optimizer: sgd
model: {kind: dcn, embedding_dim: 16, top: [32, 16]}
ps: {shards: 2, optimizer: adagrad, learning_rate: 0.07, init_stddev: 0.02, capacity_rows: 500}
train:
  workers: 2
  embedding_staleness: 0
  dense_optimizer: {kind: sgd, learning_rate: 0.1, momentum: 0.5, schedule: {kind: cosine, warmup_steps: 5}}
  seed: 9
)";

absl::StatusOr<JobSpec> Parse(const std::string& text) { return ParseJobSpecText(text, "job.yaml"); }

// The message of a job that must fail, or a marker when it parsed.
std::string Error(const std::string& text) {
  auto spec = Parse(text);
  if (!spec.ok()) return std::string(spec.status().message());
  auto plan = Plan(*spec);
  return plan.ok() ? "<parsed and planned>" : std::string(plan.status().message());
}

TEST(JobSpec, ShorthandGivesEveryFeatureATableNamedAfterIt) {
  auto spec = Parse(R"(loader: {source: {format: criteo, files: [day_0.gz]}}
model: {embedding_dim: 8, pooling: mean}
ps: {optimizer: ftrl, learning_rate: 0.2}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->features.size(), 26u);
  EXPECT_EQ(spec->features[0], "C1");
  EXPECT_EQ(spec->features[25], "C26");
  ASSERT_EQ(spec->tables.size(), 26u);
  for (size_t k = 0; k < spec->tables.size(); ++k) {
    const TableSpec& t = spec->tables[k];
    EXPECT_EQ(t.config.name, spec->features[k]);
    EXPECT_EQ(t.config.dim, 8);
    EXPECT_EQ(t.config.seed, k);
    EXPECT_EQ(t.config.optimizer.kind, embedding_ps::OptimizerKind::kFtrl);
    EXPECT_FLOAT_EQ(t.config.optimizer.learning_rate, 0.2f);
    ASSERT_EQ(t.features.size(), 1u);
    EXPECT_EQ(t.features[0].pooling, Pooling::kMean);
  }
  auto synthetic = Parse("loader: {source: {format: synthetic, synthetic: {num_slots: 3}}}\n");
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  EXPECT_EQ(synthetic->features, (std::vector<std::string>{"f0", "f1", "f2"}));
  EXPECT_EQ(synthetic->tables[2].config.name, "f2");
  EXPECT_EQ(synthetic->train.dense_optimizer.kind, DenseOptimizerKind::kAdam);
  EXPECT_EQ(synthetic->tables[0].config.optimizer.kind, embedding_ps::OptimizerKind::kAdagrad);
  EXPECT_FLOAT_EQ(synthetic->tables[0].config.optimizer.learning_rate, 0.05f);
}

TEST(JobSpec, NamedTablesCarryTheirOwnSettings) {
  auto spec = Parse(kTwoTables);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->tables.size(), 3u);
  const TableSpec& users = spec->tables[0];
  EXPECT_EQ(users.config.dim, 8);
  EXPECT_EQ(users.config.optimizer.kind, embedding_ps::OptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(users.config.optimizer.learning_rate, 0.01f);
  EXPECT_EQ(users.config.initializer.kind, embedding_ps::InitializerKind::kNormal);
  EXPECT_FLOAT_EQ(users.config.initializer.stddev, 0.05f);
  EXPECT_EQ(users.config.admission.min_count, 2u);
  EXPECT_EQ(users.capacity_rows, 1001u);
  const TableSpec& items = spec->tables[1];
  EXPECT_EQ(items.config.dim, 16);
  EXPECT_EQ(items.config.optimizer.kind, embedding_ps::OptimizerKind::kAdagrad);  // ps shorthand
  EXPECT_FLOAT_EQ(items.config.optimizer.learning_rate, 0.07f);
  EXPECT_EQ(items.config.initializer.kind, embedding_ps::InitializerKind::kNormal);  // ps.init_stddev
  EXPECT_FLOAT_EQ(items.config.initializer.stddev, 0.02f);
  ASSERT_EQ(items.features.size(), 2u);
  EXPECT_EQ(items.features[0].pooling, Pooling::kSum);
  EXPECT_EQ(items.features[1].name, "history");
  EXPECT_EQ(items.features[1].pooling, Pooling::kMean);
  const TableSpec& context = spec->tables[2];
  EXPECT_EQ(context.features[0].pooling, Pooling::kSqrtN);
  EXPECT_EQ(context.config.optimizer.kind, embedding_ps::OptimizerKind::kSgd);
  EXPECT_EQ(context.config.seed, 2u);
  const DenseOptimizerSpec& dense = spec->train.dense_optimizer;
  EXPECT_EQ(dense.kind, DenseOptimizerKind::kSgd);
  EXPECT_DOUBLE_EQ(dense.learning_rate, 0.1);
  EXPECT_DOUBLE_EQ(dense.momentum, 0.5);
  EXPECT_EQ(dense.schedule.kind, LrSchedule::Kind::kCosine);
  EXPECT_EQ(dense.schedule.warmup_steps, 5);
}

// ps.precision gives every table its row precision, tables[].precision its own; both reach the
// PS shards' stores, and a precision the PS does not have is refused naming the key and line.
TEST(JobSpec, RowPrecisionIsTheTablesOwnOrThePsDefault) {
  const std::string base =
      "loader: {source: {format: criteo, files: [a.tsv]}}\n"
      "model: {kind: dlrm, embedding_dim: 8, bottom: [8], top: [8]}\n";
  auto spec = Parse(base + "ps: {precision: fp16, optimizer: adagrad_rowwise}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const TableSpec& t : spec->tables) {
    EXPECT_EQ(t.config.precision, embedding_ps::RowPrecision::kFp16) << t.config.name;
    EXPECT_EQ(t.config.optimizer.kind, embedding_ps::OptimizerKind::kAdagradRowwise) << t.config.name;
  }
  auto plan = Plan(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ps[0].store.tables[0].precision, embedding_ps::RowPrecision::kFp16);
  spec = Parse(base);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tables[0].config.precision, embedding_ps::RowPrecision::kFp32) << "the default";
  std::string own = kTwoTables;
  own.replace(own.find("    optimizer: sgd\n"), 19, "    optimizer: sgd\n    precision: fp16\n");
  spec = Parse(own);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tables[0].config.precision, embedding_ps::RowPrecision::kFp32);
  EXPECT_EQ(spec->tables[2].config.precision, embedding_ps::RowPrecision::kFp16) << "the table's own";
  const auto refused = Parse(base + "ps: {precision: fp8}\n");
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("ps.precision (line 3)"), std::string::npos) << refused.status();
}

// ps.disk gives every shard's store a disk tier of its own file; a tier without a DRAM
// capacity, with export deltas, or with a bad key or value is refused naming the key and line.
TEST(JobSpec, PsDiskGivesEachShardItsOwnTier) {
  const std::string base =
      "loader: {source: {format: criteo, files: [a.tsv]}}\n"
      "model: {kind: dlrm, embedding_dim: 8, bottom: [8], top: [8]}\n";
  auto spec = Parse(base + "ps: {shards: 2, capacity_rows: 1000, disk: {dir: /ssd, capacity_bytes: 1073741824}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = Plan(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->ps.size(), 2u);
  EXPECT_EQ(plan->ps[0].store.disk.path, "/ssd/ps-0.tier");
  EXPECT_EQ(plan->ps[1].store.disk.path, "/ssd/ps-1.tier");
  EXPECT_EQ(plan->ps[1].store.disk.capacity_bytes, 1073741824u);
  EXPECT_EQ(plan->ps[1].store.disk.queue_depth, 32);
  spec = Parse(base);
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE((*Plan(*spec)).ps[0].store.disk.path.empty()) << "none by default";
  const std::pair<std::string, std::string> refusals[] = {
      {"ps: {disk: {dir: /ssd, capacity_bytes: 1073741824}}\n", "needs ps.capacity_rows"},
      {"ps: {capacity_rows: 10, disk: {capacity_bytes: 1073741824}}\n", "ps.disk.dir"},
      {"ps: {capacity_rows: 10, disk: {dir: /ssd, capacity_bytes: 1000}}\n", "ps.disk.capacity_bytes (line 3"},
      {"ps: {capacity_rows: 10, disk: {dir: /ssd, capacity_bytes: 1073741824, queue_depth: 0}}\n",
       "ps.disk.queue_depth"},
      {"ps: {capacity_rows: 10, disk: {dir: /ssd, capacity_bytes: 1073741824, size: 3}}\n", "size"},
      {"ps: {capacity_rows: 10, disk: {dir: /ssd, capacity_bytes: 1073741824}}\n"
       "checkpoint: {dir: /c}\nexport: {dir: /e, delta_every_steps: 10}\n",
       "export deltas"},
  };
  for (const auto& [yaml, expected] : refusals) {
    const auto refused = Parse(base + yaml);
    ASSERT_FALSE(refused.ok()) << yaml;
    EXPECT_NE(refused.status().message().find(expected), std::string::npos) << refused.status();
  }
}

TEST(JobPlan, EveryRoleGetsTheTablesOfTheSpec) {
  auto spec = Parse(kTwoTables);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = Plan(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // PS: both shards hold every table with its full configuration; table capacities are shared out.
  ASSERT_EQ(plan->ps.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const PsShardPlan& shard = plan->ps[i];
    EXPECT_EQ(shard.shard_index, i);
    EXPECT_EQ(shard.num_shards, 2);
    EXPECT_EQ(shard.store.capacity_rows, 500u);
    ASSERT_EQ(shard.store.tables.size(), 3u);
    EXPECT_EQ(shard.store.tables[0].name, "users");
    EXPECT_EQ(shard.store.tables[0].capacity_rows, 501u);  // 1001 over 2 shards, rounded up.
    EXPECT_EQ(shard.store.tables[1].capacity_rows, 0u);
    EXPECT_EQ(shard.store.tables[0].admission.min_count, 2u);
    EXPECT_EQ(shard.store.tables[0].optimizer.kind, embedding_ps::OptimizerKind::kAdam);
  }
  // Loader: workers, shards and the slot-to-table map from the spec.
  const data_loader::LoaderOptions& loader = plan->loader.options;
  EXPECT_EQ(loader.num_workers, 2);
  EXPECT_EQ(loader.num_shards, 2);
  EXPECT_EQ(loader.slot_tables, (std::vector<int>{0, 1, 1, 2}));
  EXPECT_EQ(loader.num_tables(), 3);
  // Workers: the same tables, per slot dims and pooling, the dense optimizer with its schedule.
  ASSERT_EQ(plan->workers.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const WorkerPlan& w = plan->workers[r];
    EXPECT_EQ(w.rank, r);
    EXPECT_EQ(w.world_size, 2);
    EXPECT_EQ(w.table_names, (std::vector<std::string>{"users", "items", "context"}));
    EXPECT_EQ(w.table_dims, (std::vector<int>{8, 16, 16}));
    EXPECT_EQ(w.slot_tables, loader.slot_tables);
    EXPECT_EQ(w.slot_dims, (std::vector<int>{8, 16, 16, 16}));
    EXPECT_EQ(w.pooling, (std::vector<Pooling>{Pooling::kSum, Pooling::kSum, Pooling::kMean, Pooling::kSqrtN}));
    EXPECT_EQ(w.feature_names, spec->features);
    EXPECT_EQ(w.num_dense, 3);
    EXPECT_EQ(w.embedding_staleness, 0);
    EXPECT_EQ(w.seed, 9u);
    EXPECT_EQ(w.model.kind, "dcn");
    EXPECT_EQ(w.planned_steps, 50);  // 100 batches over 2 workers.
    EXPECT_EQ(w.planned_samples, 10000u);
    EXPECT_EQ(w.dense_optimizer.schedule.decay_steps, 50);  // 0 in the spec: the planned steps.
    EXPECT_TRUE(w.synthetic);
    EXPECT_TRUE(w.has_eval_data);
    EXPECT_EQ(w.eval_loader.source.synthetic.first_index, 1ULL << 40);
    EXPECT_EQ(w.eval_loader.num_workers, 1);
    EXPECT_FALSE(w.eval_loader.shuffle);
  }
  // Endpoints: defaults on loopback, replaced as a whole by SetEndpoints.
  EXPECT_EQ(plan->endpoints.ps, (std::vector<std::string>{"127.0.0.1:7000", "127.0.0.1:7001"}));
  EXPECT_EQ(plan->endpoints.loader, "127.0.0.1:7100");
  EXPECT_EQ(plan->endpoints.master_port, 29500);
  ASSERT_TRUE(SetEndpoints({"a:1", "b:2"}, "c:3", "d", 4, &*plan).ok());
  EXPECT_EQ(plan->endpoints.ps[1], "b:2");
  EXPECT_EQ(plan->endpoints.loader, "c:3");
  EXPECT_EQ(plan->endpoints.master_addr, "d");
  EXPECT_EQ(plan->endpoints.master_port, 4);
  EXPECT_NE(SetEndpoints({"a:1"}, "", "", 0, &*plan).message().find("1 PS addresses given for the job's 2 shards"),
            std::string::npos);
  EXPECT_FALSE(SetEndpoints({}, "nohost", "", 0, &*plan).ok());
}

TEST(JobPlan, FeaturesOfASharedTableShareTheirIdsHash) {
  auto plan = Plan(*Parse(R"(loader: {source: {format: libffm, num_slots: 3, files: [a.txt]}}
features: [query, title, body]
tables:
  - {name: words, features: [title, body]}
  - {name: queries, features: [query]}
)"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->loader.options.slot_tables, (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(plan->loader.options.source.libsvm.hash_slots, (std::vector<int>{0, 1, 1}));
  // Own tables: every slot hashes with its own seed, as without a plan.
  auto own = Plan(*Parse("loader: {source: {format: libffm, num_slots: 3, files: [a.txt]}}\n"));
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE(own->loader.options.source.libsvm.hash_slots.empty());
  EXPECT_FALSE(own->workers[0].has_eval_data);
}

TEST(JobPlan, AWideModelGetsADimOneTableAndASlotPerFeature) {
  auto plan = Plan(*Parse(R"(loader: {source: {format: libffm, num_slots: 3, files: [a.txt]}}
features: [query, title, body]
tables:
  - {name: words, features: [title, body], dim: 8}
  - {name: queries, features: [query], dim: 4, optimizer: {kind: ftrl}}
model: {kind: deepfm}
)"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const WorkerPlan& w = plan->workers[0];
  EXPECT_EQ(w.table_names, (std::vector<std::string>{"words", "queries", "words_wide", "queries_wide"}));
  EXPECT_EQ(w.table_dims, (std::vector<int>{8, 4, 1, 1}));
  EXPECT_EQ(w.feature_names,
            (std::vector<std::string>{"query", "title", "body", "query_wide", "title_wide", "body_wide"}));
  EXPECT_EQ(w.slot_tables, (std::vector<int>{1, 0, 0, 3, 2, 2}));
  EXPECT_EQ(w.slot_dims, (std::vector<int>{4, 8, 8, 1, 1, 1}));
  EXPECT_EQ(w.wide_slots, 3);
  EXPECT_EQ(plan->loader.options.slot_copies, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan->loader.options.slot_tables, w.slot_tables);
  const auto& store_tables = plan->ps[0].store.tables;
  ASSERT_EQ(store_tables.size(), 4u);
  EXPECT_EQ(store_tables[3].name, "queries_wide");
  EXPECT_EQ(store_tables[3].dim, 1);
  EXPECT_EQ(store_tables[3].initializer.kind, embedding_ps::InitializerKind::kZeros);
  EXPECT_EQ(store_tables[3].optimizer.kind, embedding_ps::OptimizerKind::kFtrl);  // The table's own optimizer.
  // deepfm: a dense linear map, projections of the dim-8 slots to 16, a deep MLP over 4 + 8 + 8.
  EXPECT_EQ(DenseParameterCount(w), 1u + (4 * 16 + 2 * 8 * 16) + (20 * 512 + 512) + (512 * 256 + 256) + (256 + 1));
  // A job table named like a wide one is refused.
  auto clash = Plan(*Parse(R"(loader: {source: {format: libffm, num_slots: 2, files: [a.txt]}}
features: [a, b]
tables: [{name: t, features: [a]}, {name: t_wide, features: [b]}]
model: {kind: wide_deep}
)"));
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("'t_wide' is the name of table 't''s wide part"), std::string::npos);
}

TEST(JobPlan, PlannedStepsCountWhatTheWorkersTrainTogether) {
  auto plan = Plan(*Parse(R"(loader:
  source: {format: synthetic, synthetic: {num_samples: 1050}}
  batch_size: 100
  epochs: 2
train: {workers: 3}
)"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 11 batches an epoch (the last of 50), 22 in all: 7 steps each, 21 batches, one of them partial.
  EXPECT_EQ(plan->workers[0].planned_steps, 7);
  EXPECT_EQ(plan->workers[0].planned_samples, 21u * 100 - 50);
  auto forever = Plan(*Parse("loader: {source: {format: synthetic}, epochs: 0}\n"));
  ASSERT_TRUE(forever.ok());
  EXPECT_EQ(forever->workers[0].planned_steps, 0);
}

TEST(LrSchedule, WarmsUpThenDecaysToTheFinalFraction) {
  LrSchedule s;
  EXPECT_DOUBLE_EQ(s.Factor(0), 1.0);
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(s.Factor(0), 0.25);
  EXPECT_DOUBLE_EQ(s.Factor(3), 1.0);
  EXPECT_DOUBLE_EQ(s.Factor(100), 1.0);
  s.kind = LrSchedule::Kind::kLinear;
  s.decay_steps = 14;
  s.final_fraction = 0.1;
  EXPECT_DOUBLE_EQ(s.Factor(4), 1.0);
  EXPECT_NEAR(s.Factor(9), 0.55, 1e-12);
  EXPECT_NEAR(s.Factor(14), 0.1, 1e-12);
  EXPECT_NEAR(s.Factor(1000), 0.1, 1e-12);
  s.kind = LrSchedule::Kind::kCosine;
  EXPECT_NEAR(s.Factor(9), 0.55, 1e-12);  // Half way: the cosine's midpoint too.
  EXPECT_NEAR(s.Factor(6), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.2)), 1e-12);
  EXPECT_NEAR(s.Factor(14), 0.1, 1e-12);
}

// `--set key.path=value`: as if the file said so, checked as its own keys, and kept in the
// job's text (what checkpoints keep), which parses to the same job.
TEST(JobSpec, OverridesReplaceOrAddKeysAndAreCheckedAsTheFilesOwn) {
  const std::string path = ::testing::TempDir() + "/overrides.yaml";
  std::ofstream(path) << kTwoTables;
  auto spec = LoadJobSpec(path, {"train.workers=3", "ps.shards=4", "train.dense_optimizer.learning_rate=0.25",
                                 "eval.files=[a.csv, b.csv]", "checkpoint.dir=/tmp/x", "train.workers=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train.workers, 1);  // In order: the later one wins.
  EXPECT_EQ(spec->ps.shards, 4);
  EXPECT_DOUBLE_EQ(spec->train.dense_optimizer.learning_rate, 0.25);
  EXPECT_EQ(spec->train.dense_optimizer.momentum, 0.5);  // Its siblings stay.
  EXPECT_EQ(spec->eval.files, (std::vector<std::string>{"a.csv", "b.csv"}));
  EXPECT_EQ(spec->checkpoint.dir, "/tmp/x");
  EXPECT_EQ(spec->overrides.size(), 6u);
  auto again = ParseJobSpecText(spec->text, "the kept text");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << spec->text;
  EXPECT_EQ(again->train.workers, 1);
  EXPECT_EQ(again->ps.shards, 4);
  EXPECT_EQ(again->tables.size(), spec->tables.size());
  EXPECT_EQ(again->checkpoint.dir, "/tmp/x");
  auto plain = LoadJobSpec(path);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->text, kTwoTables);  // Without overrides the file's own text.

  const auto error = [&](const std::string& o) {
    auto s = LoadJobSpec(path, {o});
    return s.ok() ? std::string("<parsed>") : std::string(s.status().message());
  };
  EXPECT_EQ(error("train.wrokers=2"),
            path + " with --set train.wrokers=2: train.wrokers (--set): unknown key; did you mean 'workers'?");
  EXPECT_NE(error("train.workers=two").find("train.workers (--set): cannot read 'two'"), std::string::npos)
      << error("train.workers=two");
  EXPECT_EQ(error("train.workers"), "--set train.workers: expected key.path=value (for example train.workers=2)");
  EXPECT_EQ(error("=2"), "--set =2: expected key.path=value (for example train.workers=2)");
  EXPECT_EQ(error("train..workers=2"), "--set train..workers=2: an empty key in the path");
  EXPECT_EQ(error("features.x=2"), "--set features.x=2: features is not a mapping");
  EXPECT_EQ(error("train.workers.x=2"), "--set train.workers.x=2: train.workers is not a mapping");
  EXPECT_NE(error("eval.files=[a, b").find("YAML syntax error"), std::string::npos) << error("eval.files=[a, b");
}

TEST(JobSpec, ErrorsNameTheKeyAndLine) {
  const std::string base = "loader: {source: {format: synthetic, synthetic: {num_slots: 2}}}\n";
  EXPECT_EQ(Error(base + "modle: {}\n"), "job.yaml: modle (line 2): unknown key; did you mean 'model'?");
  EXPECT_EQ(Error(base + "tables: [{name: a, features: [f0, f1], dimm: 4}]\n"),
            "job.yaml: tables[0].dimm (line 2): unknown key; did you mean 'dim'?");
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0]}]\n").find("no table serves feature(s) f1"),
            std::string::npos);
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0, f1]}, {name: b, features: [f1]}]\n")
                .find("tables[1] 'b': feature 'f1' is already served by another table"),
            std::string::npos);
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0, f1, f9]}]\n").find("feature 'f9' is not one of"),
            std::string::npos);
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0]}, {name: a, features: [f1]}]\n")
                .find("a table of that name is defined before"),
            std::string::npos);
  // Eviction: the policy and its keys, and ttl only where the samples carry times.
  EXPECT_NE(
      Error(base + "tables: [{name: a, features: [f0, f1], eviction: fifo}]\n").find("tables[0].eviction (line 2)"),
      std::string::npos);
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0, f1], eviction: {policy: lfu, ttl: 5}}]\n")
                .find("tables[0].eviction.ttl (line 2): unknown key"),
            std::string::npos);
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0, f1], eviction: {policy: ttl, ttl_seconds: 60}}]\n")
                .find("eviction ttl goes by the samples' times, and this source has none"),
            std::string::npos);
  {
    auto lfu = Parse(base + "tables: [{name: a, features: [f0, f1], eviction: {policy: lfu, lfu_aging_touches: 4}}]\n");
    ASSERT_TRUE(lfu.ok()) << lfu.status();
    EXPECT_EQ(lfu->tables[0].config.eviction.policy, embedding_ps::EvictionPolicy::kLfu);
    EXPECT_EQ(lfu->tables[0].config.eviction.lfu_aging_touches, 4u);
  }
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0, f1], pooling: max}]\n")
                .find("tables[0].pooling (line 2): 'max' is not sum, mean or sqrtn"),
            std::string::npos);
  EXPECT_NE(Error(base + "tables: [{name: a, features: [f0, f1], dim: 0}]\n").find("dim must be in"),
            std::string::npos);
  EXPECT_NE(Error(base + "features: [a]\n").find("features (line 2): 1 names for the source's 2 sparse features"),
            std::string::npos);
  EXPECT_NE(Error(base + "features: [a, a]\n").find("'a' is named twice"), std::string::npos);
  EXPECT_NE(Error(base + "train: {dense_optimizer: rmsprop}\n").find("'rmsprop' is not adam, adamw, adagrad or sgd"),
            std::string::npos);
  EXPECT_NE(Error(base + "train: {dense_optimizer: {kind: adam, learning_rate: 0.1}, dense_learning_rate: 0.2}\n")
                .find("given twice"),
            std::string::npos);
  EXPECT_NE(Error(base + "train: {dense_optimizer: {schedule: {kind: step}}}\n").find("'step' is not constant"),
            std::string::npos);
  EXPECT_NE(Error(base + "ps: {optimizer: {kind: adagrad, learnig_rate: 1}}\n")
                .find("ps.optimizer.learnig_rate (line 2): unknown key; did you mean 'learning_rate'?"),
            std::string::npos);
  EXPECT_NE(Error(base + "cluster: {ps: [a:1]}\n").find("cluster.ps lists 1 addresses for ps.shards 2"),
            std::string::npos);
  EXPECT_NE(Error(base + "cluster: {loader: nowhere}\n").find("cluster.loader: 'nowhere' is not host:port"),
            std::string::npos);
  // Keys the plan sets are refused with what sets them.
  EXPECT_NE(Error("loader: {source: {format: synthetic}, num_workers: 2}\n")
                .find("loader.num_workers (line 1): not a job key: train.workers sets it"),
            std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}, slot_tables: [0]}\n").find("under `tables`"),
            std::string::npos);
  EXPECT_NE(Error("model: {kind: dlrm}\n").find("missing key 'loader'"), std::string::npos);
  // An infinite rate names its key and line and says what it must be.
  EXPECT_NE(Error(base + "train: {dense_learning_rate: .inf}\n")
                .find("train.dense_optimizer.learning_rate (line 2): must be finite and > 0"),
            std::string::npos);
  EXPECT_NE(Error(base + "ps: {optimizer: {kind: sgd, learning_rate: .inf}}\n").find("must be finite and > 0"),
            std::string::npos);
  // The update log's keys.
  EXPECT_NE(Error(base + "ps: {update_log: {sync: sometimes}}\n")
                .find("ps.update_log.sync (line 2): must be every_group, interval or off"),
            std::string::npos);
  EXPECT_NE(Error(base + "ps: {update_log: {syncc: off}}\n").find("did you mean 'sync'?"), std::string::npos);
  EXPECT_NE(Error(base + "ps: {recovery_timeout_seconds: 0}\n").find("ps.recovery_timeout_seconds"), std::string::npos);
  EXPECT_NE(Error(base + "cluster: {startup_timeout_seconds: -1}\n").find("cluster.startup_timeout_seconds"),
            std::string::npos);
  for (const char* keepalive : {"0.5", "-1", "3601", "often"}) {
    EXPECT_NE(Error(base + "cluster: {keepalive_seconds: " + keepalive + "}\n").find("cluster.keepalive_seconds"),
              std::string::npos)
        << keepalive;
  }
}

// ps.wire_precision reaches every worker's plan, with or without update logs; another value is
// refused naming the key.
TEST(JobPlan, WirePrecisionReachesEveryWorker) {
  const std::string base = "loader: {source: {format: synthetic, synthetic: {num_slots: 2}}}\ntrain: {workers: 2}\n";
  for (const std::string checkpoint : {"", "checkpoint: {dir: /c}\n"}) {
    auto plan = Plan(*ParseJobSpecText(base + checkpoint + "ps: {wire_precision: fp16}\n", "job.yaml"));
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const auto& worker : plan->workers) EXPECT_TRUE(worker.ps_wire_fp16) << checkpoint;
  }
  auto plan = Plan(*ParseJobSpecText(base, "job.yaml"));
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->workers[1].ps_wire_fp16);
  const absl::StatusOr<JobSpec> bad = ParseJobSpecText(base + "ps: {wire_precision: int8}\n", "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ps.wire_precision"), std::string::npos) << bad.status();
}

// Each shard's update log is its own directory under the checkpoints; without checkpoints (nothing
// to truncate it at) or with ps.update_log false there is none.
TEST(JobPlan, UpdateLogsGoUnderTheCheckpointsOnePerShard) {
  const std::string base = "loader: {source: {format: synthetic, synthetic: {num_slots: 2}}}\nps: {shards: 2}\n";
  auto plan = Plan(*ParseJobSpecText(base + "checkpoint: {dir: /c}\n", "job.yaml"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ps[1].update_log_dir, "/c/update-log/ps-1");
  EXPECT_EQ(plan->ps[1].update_log_sync, embedding_ps::LogSync::kEveryGroup);
  EXPECT_GT(plan->workers[0].ps_recovery_timeout_seconds, 0);
  plan = Plan(*ParseJobSpecText(base, "job.yaml"));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ps[0].update_log_dir, "");
  EXPECT_EQ(plan->workers[0].ps_recovery_timeout_seconds, 0);
  plan = Plan(*ParseJobSpecText(
      "loader: {source: {format: synthetic}}\nps: {shards: 2, update_log: false}\ncheckpoint: {dir: /c}\n",
      "job.yaml"));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ps[0].update_log_dir, "");
  plan = Plan(*ParseJobSpecText(
      "loader: {source: {format: synthetic}}\nps: {update_log: {dir: /logs, sync: interval}}\ncheckpoint: {dir: /c}\n",
      "job.yaml"));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ps[0].update_log_dir, "/logs/ps-0");
  EXPECT_EQ(plan->ps[0].update_log_sync, embedding_ps::LogSync::kInterval);
}

TEST(JobSpec, CheckpointAndExportKeysAreChecked) {
  const std::string base = "loader: {source: {format: synthetic, synthetic: {num_slots: 2}}}\n";
  EXPECT_EQ(Error(base + "checkpoint: {dir: c, evry_steps: 5}\n"),
            "job.yaml: checkpoint.evry_steps (line 2): unknown key; did you mean 'every_steps'?");
  EXPECT_NE(
      Error(base + "checkpoint: {dir: c, every_steps: -1}\n").find("checkpoint.every_steps (line 2): must be >= 0"),
      std::string::npos);
  EXPECT_NE(Error(base + "checkpoint: {dir: c, keep_last: 0}\n").find("checkpoint.keep_last (line 2): must be in"),
            std::string::npos);
  EXPECT_NE(Error(base + "checkpoint: {dir: c, every_seconds: -3}\n").find("checkpoint.every_seconds"),
            std::string::npos);
  EXPECT_NE(Error(base + "checkpoint: {dir: c, timeout_seconds: 0}\n").find("checkpoint.timeout_seconds"),
            std::string::npos);
  EXPECT_NE(Error(base + "checkpoint: {dir: [c]}\n").find("checkpoint.dir"), std::string::npos);
  EXPECT_NE(Error(base + "export: {dir: m}\n").find("export.dir (line 2): needs checkpoint.dir"), std::string::npos);
  EXPECT_NE(Error(base + "checkpoint: {dir: c}\nexport: {delta_every_steps: 5}\n").find("deltas need export.dir"),
            std::string::npos);
  EXPECT_NE(
      Error(base + "checkpoint: {dir: c}\nexport: {dir: m, delta_every_steps: -5}\n").find("export.delta_every_steps"),
      std::string::npos);
  EXPECT_NE(
      Error(base + "checkpoint: {dir: c}\nexport: {dir: m, base_every_deltas: -1}\n").find("export.base_every_deltas"),
      std::string::npos);
  EXPECT_NE(Error(base + "checkpoint: {dir: c}\nexport: {dir: m, keep_bases: 0}\n").find("export.keep_bases"),
            std::string::npos);
  // A good section reaches every role's plan: the shards' roots and change tracking, the workers'.
  absl::StatusOr<JobSpec> spec = ParseJobSpecText(
      base +
          "checkpoint: {dir: c, every_steps: 7}\nexport: {dir: m, delta_every_seconds: 30, base_every_deltas: 9, "
          "keep_bases: 4}\n",
      "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = Plan(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PsShardPlan& shard : plan->ps) {
    EXPECT_EQ(shard.checkpoint_root, "c");
    EXPECT_EQ(shard.export_root, "m");
    EXPECT_TRUE(shard.store.track_changes);
  }
  EXPECT_EQ(plan->workers[0].checkpoint.every_steps, 7);
  EXPECT_EQ(plan->workers[0].serving.delta_every_seconds, 30);
  EXPECT_EQ(plan->workers[0].serving.base_every_deltas, 9);
  EXPECT_EQ(plan->workers[0].serving.keep_bases, 4);
  EXPECT_NE(plan->spec.text.find("every_steps: 7"), std::string::npos);
}

TEST(JobSpec, SecurityIsOnByDefaultAndItsKeysAreChecked) {
  const std::string base = "loader: {source: {format: synthetic, synthetic: {num_slots: 2}}}\n";
  auto spec = ParseJobSpecText(base, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->security.mtls);
  EXPECT_EQ(spec->security.dir, "certs");
  const SecurityOptions worker = RoleSecurity(spec->security, Identity{Role::kWorker, 3}, "");
  EXPECT_TRUE(worker.enabled);
  EXPECT_EQ(worker.cert_file, "certs/worker-3.pem");
  EXPECT_TRUE(worker.token_secret_file.empty());
  EXPECT_EQ(RoleSecurity(spec->security, Identity{Role::kPs, 1}, "/run/x").key_file, "/run/x/ps-1.key");
  EXPECT_NE(Error(base + "security: {mode: tls}\n").find("security.mode (line 2): must be mtls or none"),
            std::string::npos);
  EXPECT_NE(Error(base + "security: {mode: none, tokens: true}\n").find("security.tokens (line 2): needs mode mtls"),
            std::string::npos);
  EXPECT_EQ(Error(base + "security: {mod: none}\n"),
            "job.yaml: security.mod (line 2): unknown key; did you mean 'mode'?");
  auto plain = ParseJobSpecText(base + "security: {mode: none}\n", "job.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(RoleSecurity(plain->security, Identity{Role::kWorker, 0}, "").enabled);
  auto tokens = ParseJobSpecText(base + "security: {tokens: true}\n", "job.yaml");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(RoleSecurity(tokens->security, Identity{Role::kLoader, 0}, "").token_secret_file, "certs/token.secret");
}

TEST(JobSpec, NoDocumentShapeThrows) {
  // Each of these once aborted `hyrec train` with an uncaught yaml-cpp exception or became a file
  // named "null".
  EXPECT_EQ(Error("loader: {source: {format: criteo, files: [[a]]}}\n"),
            "job.yaml: loader.source.files[0] (line 1): expected a plain value, found a list");
  EXPECT_EQ(Error("loader: {source: {format: criteo, files: [~]}}\n"),
            "job.yaml: loader.source.files[0] (line 1): empty entry (~ or nothing)");
  EXPECT_EQ(Error("loader: {source: {format: criteo, files: [a]}}\neval: {files: [{x: 1}]}\n"),
            "job.yaml: eval.files[0] (line 2): expected a plain value, found a mapping");
  EXPECT_NE(
      Error("loader: {source: {format: criteo, files: a}}\n").find("loader.source.files (line 1): expected a list"),
      std::string::npos);
  EXPECT_NE(Error("? [a, b]\n: 1\nloader: {source: {format: synthetic}}\n").find("a key must be a plain word"),
            std::string::npos);
  EXPECT_NE(Error("loader: [1, 2]\n").find("loader (line 1): expected a mapping"), std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nmodel: {bottom: [a]}\n")
                .find("model.bottom[0] (line 2): 'a' is not an integer"),
            std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nmodel: {bottom: 5}\n")
                .find("model.bottom (line 2): expected a list"),
            std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nmodel: {top: [[1]]}\n").find("found a list"),
            std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nmodel: {kind: [dlrm]}\n")
                .find("model.kind (line 2): expected a scalar value"),
            std::string::npos);
  EXPECT_NE(
      Error("loader: {source: {format: synthetic}}\ntables: {a: 1}\n").find("expected a non-empty list of tables"),
      std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nfeatures: [[x]]\n").find("found a list"), std::string::npos);
  EXPECT_NE(Error("- 1\n- 2\n").find("expected a mapping"), std::string::npos);
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nmodel: {options: [1]}\n").find("model.options (line 2)"),
            std::string::npos);
}

TEST(JobPlan, RefusesWhatCannotRun) {
  // A dense model far too large to allocate is refused before anything is built.
  EXPECT_NE(Error("loader: {source: {format: synthetic}}\nmodel: {bottom: [65536, 65536], top: [65536, 65536]}\n")
                .find("dense parameters, more than"),
            std::string::npos);
  // A decaying schedule needs a step count that a file source cannot give in advance.
  EXPECT_NE(Error("loader: {source: {format: criteo, files: [a]}}\n"
                  "train: {dense_optimizer: {schedule: {kind: linear}}}\n")
                .find("schedule.decay_steps must be set"),
            std::string::npos);
  EXPECT_EQ(Error("loader: {source: {format: criteo, files: [a]}}\n"
                  "train: {dense_optimizer: {schedule: {kind: linear, decay_steps: 10}}}\n"),
            "<parsed and planned>");
  EXPECT_NE(Error("loader: {source: {format: synthetic, synthetic: {num_samples: 1000}}, batch_size: 100}\n"
                  "train: {dense_optimizer: {schedule: {kind: cosine, warmup_steps: 10}}}\n")
                .find("is not below the job's 10 steps"),
            std::string::npos);
}

TEST(JobPlan, DenseParameterCountsMatchTheModelsLayers) {
  WorkerPlan w;
  w.num_dense = 13;
  w.slot_dims.assign(26, 16);
  w.model.kind = "dlrm";
  w.model.embedding_dim = 16;
  w.model.bottom = {512, 256};
  w.model.top = {512, 256};
  // Bottom 13-512-256-16, 27 features (351 pairs), top (16 + 351)-512-256-1.
  const uint64_t bottom = (13 * 512 + 512) + (512 * 256 + 256) + (256 * 16 + 16);
  const uint64_t top = (367 * 512 + 512) + (512 * 256 + 256) + (256 + 1);
  EXPECT_EQ(DenseParameterCount(w), bottom + top);
  w.slot_dims[0] = 8;  // Projected to the interaction dim.
  EXPECT_EQ(DenseParameterCount(w), bottom + top + 8 * 16);
  w.model.kind = "my_model";
  EXPECT_EQ(DenseParameterCount(w), 0u);
}

}  // namespace
}  // namespace hyrec::job
