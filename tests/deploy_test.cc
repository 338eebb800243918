// deploy/k8s/ps.yaml serves the tables a worker of its job asks for: its ConfigMap's job plans
// the same tables (names, dims, optimizers, initializers, admission, per-shard capacities) as
// examples/configs/user-item.yaml, its StatefulSet runs one `hyrec ps --config` per planned shard
// on the job's PS port, with the job file mounted where the command reads it.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/job/job_plan.h"
#include "yaml-cpp/yaml.h"

namespace hyrec::job {
namespace {

// The document of `kind` named `name` in a multi-document manifest.
YAML::Node Find(const std::vector<YAML::Node>& docs, const std::string& kind, const std::string& name) {
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() == kind && d["metadata"]["name"].as<std::string>() == name) return d;
  }
  ADD_FAILURE() << "no " << kind << " " << name;
  return YAML::Node();
}

void ExpectSameTable(const embedding_ps::TableConfig& a, const embedding_ps::TableConfig& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dim, b.dim) << a.name;
  EXPECT_EQ(a.seed, b.seed) << a.name;
  EXPECT_EQ(a.capacity_rows, b.capacity_rows) << a.name;
  EXPECT_EQ(a.optimizer.kind, b.optimizer.kind) << a.name;
  EXPECT_EQ(a.optimizer.learning_rate, b.optimizer.learning_rate) << a.name;
  EXPECT_EQ(a.optimizer.ftrl_l1, b.optimizer.ftrl_l1) << a.name;
  EXPECT_EQ(a.initializer.kind, b.initializer.kind) << a.name;
  EXPECT_EQ(a.initializer.stddev, b.initializer.stddev) << a.name;
  EXPECT_EQ(a.admission.min_count, b.admission.min_count) << a.name;
  EXPECT_EQ(a.admission.probability, b.admission.probability) << a.name;
}

TEST(Deploy, PsManifestServesTheExampleJobsTables) {
  const std::vector<YAML::Node> docs = YAML::LoadAllFromFile(HYREC_SOURCE_DIR "/deploy/k8s/ps.yaml");
  const YAML::Node config_map = Find(docs, "ConfigMap", "hyrec-job");
  auto k8s = ParseJobSpecText(config_map["data"]["job.yaml"].as<std::string>(), "ps.yaml ConfigMap");
  ASSERT_TRUE(k8s.ok()) << k8s.status();
  auto example = PlanJobFile(HYREC_SOURCE_DIR "/examples/configs/user-item.yaml");
  ASSERT_TRUE(example.ok()) << example.status();
  auto planned = Plan(*k8s);
  ASSERT_TRUE(planned.ok()) << planned.status();
  // Every shard holds exactly the tables the example's workers look up, configured the same.
  ASSERT_EQ(planned->ps.size(), example->ps.size());
  for (size_t i = 0; i < planned->ps.size(); ++i) {
    const auto& served = planned->ps[i].store;
    const auto& wanted = example->ps[i].store;
    EXPECT_EQ(served.capacity_rows, wanted.capacity_rows);
    ASSERT_EQ(served.tables.size(), wanted.tables.size());
    for (size_t t = 0; t < served.tables.size(); ++t) ExpectSameTable(served.tables[t], wanted.tables[t]);
  }
  const WorkerPlan& worker = example->workers[0];
  for (size_t t = 0; t < worker.table_names.size(); ++t) {
    EXPECT_EQ(planned->ps[0].store.tables[t].name, worker.table_names[t]);
    EXPECT_EQ(planned->ps[0].store.tables[t].dim, worker.table_dims[t]);
  }
  // One pod per shard, each `hyrec ps --config` on the mounted job with its ordinal as the shard
  // index, on the port the job's workers dial.
  const YAML::Node set = Find(docs, "StatefulSet", "hyrec-ps");
  EXPECT_EQ(set["spec"]["replicas"].as<size_t>(), planned->ps.size());
  const YAML::Node container = set["spec"]["template"]["spec"]["containers"][0];
  const std::string command = container["args"][0].as<std::string>();
  EXPECT_TRUE(absl::StrContains(command, "hyrec ps --config=/etc/hyrec/job.yaml --shard_index=${HOSTNAME##*-}"))
      << command;
  EXPECT_EQ(container["volumeMounts"][0]["mountPath"].as<std::string>(), "/etc/hyrec");
  EXPECT_EQ(set["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"].as<std::string>(), "hyrec-job");
  for (size_t i = 0; i < planned->endpoints.ps.size(); ++i) {
    EXPECT_EQ(planned->endpoints.ps[i], absl::StrCat("hyrec-ps-", i, ".hyrec-ps:7000"));
  }
  EXPECT_TRUE(absl::StrContains(command, "--port=7000")) << command;
  EXPECT_EQ(container["ports"][0]["containerPort"].as<int>(), 7000);
}

}  // namespace
}  // namespace hyrec::job
