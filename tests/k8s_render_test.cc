// `hyrec k8s render` (hyrec/deploy/k8s.h): the committed deploy/k8s/ files are a fresh render; what
// no schema checks (durable, disruption-budgeted PS shards, indexed workers with a failure policy,
// resources, pinned images, probes, the order of dependsOn, success on the workers, no private key
// but a pod's own); the pods' job file plans the same job; bad input names its key.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "hyrec/common/certs.h"
#include "hyrec/deploy/k8s.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/planner/capacity.h"
#include "yaml-cpp/yaml.h"

namespace hyrec::deploy {

using job::JobPlan;
using job::JobSpec;
using job::LoadJobSpec;
using job::ParseJobSpecText;
using job::Plan;
using job::PsShardPlan;
using job::WorkerPlan;
namespace {

constexpr char kImage[] =
    "registry.example/hyrec@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string kExample = HYREC_SOURCE_DIR "/examples/configs/cluster.yaml";

JobSpec Example() {
  auto spec = LoadJobSpec(kExample);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

K8sOptions Options(const std::string& overlay = "local", const std::string& api = "jobset") {
  K8sOptions o;
  o.image = kImage;
  o.name = "user-item";
  EXPECT_TRUE(FindName(kK8sOverlayNames, overlay, &o.overlay)) << overlay;
  EXPECT_TRUE(FindName(kK8sApiNames, api, &o.api)) << api;
  return o;
}

std::vector<YAML::Node> Objects(const std::string& yaml) {
  std::vector<YAML::Node> docs;
  for (const YAML::Node& d : YAML::LoadAll(yaml)) {
    if (d.IsMap()) docs.push_back(d);
  }
  return docs;
}

YAML::Node Find(const std::vector<YAML::Node>& docs, const std::string& kind) {
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() == kind) return d;
  }
  ADD_FAILURE() << "no " << kind;
  return YAML::Node();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(K8sRender, CommittedManifestsAreAFreshRender) {
  // tools/k8s-examples writes these; it renders with the same options.
  for (auto [overlay, api, dir] : {std::tuple<const char*, const char*, const char*>{"local", "jobset", "local"},
                                   {"gke", "jobset", "gke"},
                                   {"local", "plain", "plain"}}) {
    auto r = RenderK8s(Example(), Options(overlay, api));
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string path = absl::StrCat(HYREC_SOURCE_DIR, "/deploy/k8s/", dir, "/user-item.yaml");
    EXPECT_EQ(Slurp(path), r->yaml) << path << " differs from a fresh render: run tools/k8s-examples";
  }
}

TEST(K8sRender, RendersAreReproducible) {
  auto a = RenderK8s(Example(), Options("gke"));
  auto b = RenderK8s(Example(), Options("gke"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->yaml, b->yaml);
}

// Every container of every pod template in the render, with the template's pod spec.
std::vector<std::pair<YAML::Node, YAML::Node>> Containers(const std::vector<YAML::Node>& docs) {
  std::vector<YAML::Node> pods;
  for (const YAML::Node& d : docs) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind == "JobSet") {
      for (const YAML::Node& rj : d["spec"]["replicatedJobs"])
        pods.push_back(rj["template"]["spec"]["template"]["spec"]);
    } else if (kind == "Job" || kind == "StatefulSet") {
      pods.push_back(d["spec"]["template"]["spec"]);
    }
  }
  std::vector<std::pair<YAML::Node, YAML::Node>> out;
  for (const YAML::Node& pod : pods) {
    for (const YAML::Node& c : pod["containers"]) out.emplace_back(pod, c);
  }
  return out;
}

void ExpectPodPolicies(const std::vector<YAML::Node>& docs, const std::string& what) {
  const auto containers = Containers(docs);
  ASSERT_EQ(containers.size(), 3u) << what;  // ps, loader, worker
  for (const auto& [pod, c] : containers) {
    const std::string name = what + " " + c["name"].as<std::string>();
    const std::string image = c["image"].as<std::string>();
    EXPECT_TRUE(absl::StrContains(image, "@sha256:")) << name;
    EXPECT_FALSE(absl::StrContains(image, ":latest")) << name;
    for (const char* kind : {"requests", "limits"}) {
      for (const char* resource : {"cpu", "memory"}) {
        EXPECT_TRUE(c["resources"][kind][resource].IsDefined()) << name << " " << kind << "." << resource;
      }
    }
    for (const char* probe : {"startupProbe", "readinessProbe", "livenessProbe"}) {
      EXPECT_EQ(c[probe]["grpc"]["port"].as<int>(), kK8sHealthPort) << name << " " << probe;
    }
    EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>()) << name;
    EXPECT_TRUE(c["securityContext"]["readOnlyRootFilesystem"].as<bool>()) << name;
    EXPECT_FALSE(c["securityContext"]["allowPrivilegeEscalation"].as<bool>()) << name;
    // Longer than a checkpoint may take, so that a stopped role can finish its part of a cut.
    EXPECT_GT(pod["terminationGracePeriodSeconds"].as<int>(), 600) << name;
    bool has_state = false, has_certs = false;
    for (const YAML::Node& m : c["volumeMounts"]) {
      has_state = has_state || m["mountPath"].as<std::string>() == kK8sStateDir;
      if (m["name"].as<std::string>() == "certs") {
        has_certs = true;
        // One identity's directory of the role's Secret, never the whole of it.
        EXPECT_TRUE(m["subPath"].IsDefined() || m["subPathExpr"].IsDefined()) << name;
        EXPECT_TRUE(m["readOnly"].as<bool>()) << name;
      }
    }
    EXPECT_TRUE(has_state && has_certs) << name;
  }
}

TEST(K8sRender, JobSetTopologyAndPolicies) {
  for (const char* overlay : {"local", "gke"}) {
    auto r = RenderK8s(Example(), Options(overlay));
    ASSERT_TRUE(r.ok()) << r.status();
    const auto docs = Objects(r->yaml);
    ExpectPodPolicies(docs, overlay);
    const YAML::Node js = Find(docs, "JobSet");
    const YAML::Node jobs = js["spec"]["replicatedJobs"];
    ASSERT_EQ(jobs.size(), 3u);
    std::map<std::string, YAML::Node> by_name;
    std::vector<std::string> order;
    for (const YAML::Node& rj : jobs) {
      by_name[rj["name"].as<std::string>()] = rj;
      order.push_back(rj["name"].as<std::string>());
    }
    // The PS: one child Job of one pod per shard, so that a failure policy can restart one shard.
    const YAML::Node ps = by_name["ps"];
    EXPECT_EQ(ps["replicas"].as<int>(), 2);
    EXPECT_EQ(ps["template"]["spec"]["parallelism"].as<int>(), 1);
    EXPECT_EQ(ps["template"]["spec"]["completions"].as<int>(), 1);
    // The workers: one Indexed Job of train.workers pods, with a failure policy on exit codes.
    const YAML::Node workers = by_name["workers"]["template"]["spec"];
    EXPECT_EQ(workers["completionMode"].as<std::string>(), "Indexed");
    EXPECT_EQ(workers["completions"].as<int>(), 2);
    EXPECT_EQ(workers["parallelism"].as<int>(), 2);
    // Worker 1 heals in place: a worker killed by a signal is retried in its index; one that
    // failed (1, 3) fails its index and so the Job (the JobSet then restarts every role).
    EXPECT_FALSE(workers["backoffLimit"].IsDefined());
    EXPECT_EQ(workers["backoffLimitPerIndex"].as<int>(), 3);
    EXPECT_EQ(workers["maxFailedIndexes"].as<int>(), 0);
    for (const auto& [name, rj] : by_name) {
      const YAML::Node rules = rj["template"]["spec"]["podFailurePolicy"]["rules"];
      const bool heals = name == "workers";
      ASSERT_EQ(rules.size(), heals ? 3u : 2u) << name;
      EXPECT_EQ(rules[0]["action"].as<std::string>(), "FailJob") << name;
      EXPECT_EQ(rules[0]["onExitCodes"]["values"][0].as<int>(), 2) << name;
      if (heals) {
        EXPECT_EQ(rules[1]["action"].as<std::string>(), "FailIndex");
        ASSERT_EQ(rules[1]["onExitCodes"]["values"].size(), 2u);
        EXPECT_EQ(rules[1]["onExitCodes"]["values"][0].as<int>(), 1);
        EXPECT_EQ(rules[1]["onExitCodes"]["values"][1].as<int>(), 3);
      } else {
        EXPECT_EQ(rj["template"]["spec"]["backoffLimit"].as<int>(-1), 0) << name;
      }
      EXPECT_EQ(rules[heals ? 2 : 1]["onPodConditions"][0]["type"].as<std::string>(), "DisruptionTarget") << name;
      EXPECT_EQ(rj["template"]["spec"]["template"]["spec"]["restartPolicy"].as<std::string>(), "Never") << name;
      // dependsOn names only a replicated job listed before this one.
      for (const YAML::Node& dep : rj["dependsOn"]) {
        const auto self = std::find(order.begin(), order.end(), name);
        const auto other = std::find(order.begin(), order.end(), dep["name"].as<std::string>());
        EXPECT_LT(other, self) << name << " depends on a later replicated job";
      }
    }
    EXPECT_EQ(by_name["workers"]["dependsOn"][0]["name"].as<std::string>(), "ps");
    EXPECT_EQ(by_name["workers"]["dependsOn"][0]["status"].as<std::string>(), "Ready");
    const YAML::Node success = js["spec"]["successPolicy"];
    ASSERT_EQ(success["targetReplicatedJobs"].size(), 1u);
    EXPECT_EQ(success["targetReplicatedJobs"][0].as<std::string>(), "workers");
    EXPECT_EQ(js["spec"]["failurePolicy"]["rules"][0]["action"].as<std::string>(), "FailJobSet");
    EXPECT_EQ(js["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"][0].as<std::string>(), "PodFailurePolicy");
    // A lost loader or PS shard (its update log on the volume) is restarted alone; a failed
    // workers' Job restarts the JobSet (the default action).
    const YAML::Node alone = js["spec"]["failurePolicy"]["rules"][1];
    EXPECT_EQ(alone["action"].as<std::string>(), "RestartJob");
    ASSERT_EQ(alone["targetReplicatedJobs"].size(), 2u);
    EXPECT_EQ(alone["targetReplicatedJobs"][0].as<std::string>(), "loader");
    EXPECT_EQ(alone["targetReplicatedJobs"][1].as<std::string>(), "ps");
    EXPECT_EQ(js["spec"]["failurePolicy"]["rules"].size(), 2u);
    // Durable: checkpoints go to the volume claimed for the whole JobSet.
    EXPECT_EQ(js["spec"]["volumeClaimPolicies"][0]["templates"][0]["metadata"]["name"].as<std::string>(), "state");
    const YAML::Node pdb = Find(docs, "PodDisruptionBudget");
    EXPECT_EQ(pdb["spec"]["maxUnavailable"].as<int>(), 1);
    EXPECT_EQ(pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as<std::string>(), "ps");
    // The default image is CPU-only: no render of it holds GPUs (device auto).
    const YAML::Node worker = workers["template"]["spec"]["containers"][0];
    EXPECT_FALSE(worker["resources"]["limits"]["nvidia.com/gpu"].IsDefined()) << overlay;
    EXPECT_FALSE(absl::StrContains(r->yaml, "ca.key"));
    EXPECT_FALSE(absl::StrContains(r->yaml, "admin"));
  }
}

// Without heal (train.heal_timeout_seconds: 0) a lost worker pod fails the workers' Job at once
// (backoffLimit 0), and the JobSet restarts every role from the latest checkpoint.
TEST(K8sRender, WorkersWithoutHealFailTheirJobOnTheFirstLoss) {
  JobSpec spec = Example();
  spec.train.heal_timeout_seconds = 0;
  auto r = RenderK8s(spec, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  const YAML::Node js = Find(Objects(r->yaml), "JobSet");
  for (const YAML::Node& rj : js["spec"]["replicatedJobs"]) {
    const YAML::Node job = rj["template"]["spec"];
    EXPECT_EQ(job["backoffLimit"].as<int>(-1), 0) << rj["name"];
    EXPECT_FALSE(job["backoffLimitPerIndex"].IsDefined()) << rj["name"];
    EXPECT_EQ(job["podFailurePolicy"]["rules"].size(), 2u) << rj["name"];
    if (rj["name"].as<std::string>() == "workers") {
      EXPECT_EQ(YAML::Dump(job).find("--restart_attempt"), std::string::npos);
    }
  }
}

TEST(K8sRender, PlainFallback) {
  auto r = RenderK8s(Example(), Options("local", "plain"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto docs = Objects(r->yaml);
  ExpectPodPolicies(docs, "plain");
  EXPECT_EQ(Find(docs, "StatefulSet")["spec"]["replicas"].as<int>(), 2);
  EXPECT_EQ(Find(docs, "Service")["spec"]["clusterIP"].as<std::string>(), "None");
  EXPECT_EQ(Find(docs, "PersistentVolumeClaim")["metadata"]["name"].as<std::string>(), "state-user-item");
  int indexed = 0;
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() != "Job") continue;
    EXPECT_EQ(d["spec"]["completionMode"].as<std::string>(), "Indexed");
    EXPECT_TRUE(d["spec"]["podFailurePolicy"].IsDefined());
    ++indexed;
  }
  EXPECT_EQ(indexed, 2);
}

// What each role runs with, apart from where it is (addresses, directories): both `hyrec train
// --processes` and the pods plan it from the job file.
std::string Settings(const JobPlan& p) {
  std::ostringstream s;
  for (const PsShardPlan& shard : p.ps) {
    s << "ps " << shard.shard_index << "/" << shard.num_shards << " cap " << shard.store.capacity_rows << " "
      << shard.store.capacity_bytes << " stripes " << shard.store.num_stripes << " max " << shard.max_ids_per_request
      << " threads " << shard.threads << " deltas " << shard.store.track_changes << "\n";
    for (const auto& t : shard.store.tables) {
      s << "  " << t.name << " dim " << t.dim << " seed " << t.seed << " cap " << t.capacity_rows << " opt "
        << static_cast<int>(t.optimizer.kind) << " " << t.optimizer.learning_rate << " init "
        << static_cast<int>(t.initializer.kind) << " " << t.initializer.stddev << " adm " << t.admission.min_count
        << "\n";
    }
  }
  const auto& l = p.loader.options;
  s << "loader batch " << l.batch_size << " workers " << l.num_workers << " shards " << l.num_shards << " threads "
    << l.threads << " epochs " << l.epochs << " seed " << l.seed << "\n";
  for (const WorkerPlan& w : p.workers) {
    s << "worker " << w.rank << "/" << w.world_size << " " << w.model.kind << " staleness " << w.embedding_staleness
      << " seed " << w.seed << " device " << w.device << " lr " << w.dense_optimizer.learning_rate << " steps "
      << w.planned_steps << " slots " << absl::StrJoin(w.slot_tables, ",") << " ckpt every " << w.checkpoint.every_steps
      << " keep " << w.checkpoint.keep_last << " eval " << w.eval.every_batches << "\n";
  }
  return s.str();
}

TEST(K8sRender, PodsPlanTheSameJobAndOnlyAddPlacementFlags) {
  const JobSpec spec = Example();
  auto original = Plan(spec);
  ASSERT_TRUE(original.ok()) << original.status();
  auto r = RenderK8s(spec, Options("gke"));
  ASSERT_TRUE(r.ok()) << r.status();
  const YAML::Node config_map = Find(Objects(r->yaml), "ConfigMap");
  auto pods = ParseJobSpecText(config_map["data"]["job.yaml"].as<std::string>(), "ConfigMap");
  ASSERT_TRUE(pods.ok()) << pods.status();
  auto planned = Plan(*pods);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(Settings(*planned), Settings(*original));
  EXPECT_EQ(planned->endpoints.ps[1], "user-item-ps-1-0.user-item:7000");
  EXPECT_EQ(planned->endpoints.loader, "user-item-loader-0-0.user-item:7100");
  EXPECT_EQ(planned->endpoints.master_addr, "user-item-workers-0-0.user-item");
  EXPECT_EQ(planned->spec.checkpoint.dir, "/var/lib/hyrec/checkpoints");
  EXPECT_EQ(planned->spec.security.dir, kK8sCertsDir);
  // The flags a pod adds are where it is, how it is watched and where its summary goes, never a
  // setting of the plan (the roles refuse those beside --config, as under --processes).
  const std::set<std::string> placement = {"config",      "shard_index", "resume",       "restart_attempt",
                                           "health_host", "health_port", "metrics_host", "metrics_port",
                                           "progress",    "plot",        "report"};
  for (const auto& [pod, c] : Containers(Objects(r->yaml))) {
    EXPECT_EQ(c["command"][0].as<std::string>(), kK8sBinary);
    for (size_t i = 1; i < c["args"].size(); ++i) {
      const std::string arg = c["args"][i].as<std::string>();
      ASSERT_TRUE(absl::StartsWith(arg, "--")) << arg;
      const std::string name = arg.substr(2, arg.find('=') - 2);
      EXPECT_TRUE(placement.count(name)) << c["name"] << ": " << arg;
    }
  }
}

TEST(K8sRender, PsMemoryComesFromTheCapacities) {
  auto plan = Plan(Example());
  ASSERT_TRUE(plan.ok());
  // users: 1M rows a shard; the rest of the shard's 5M rows go to the widest other table (items),
  // as the store's accounting holds them, with the process, serving and 20% headroom
  // (capacity_test checks planner::PodRequestBytes against the planner).
  const embedding_ps::StoreMemoryPlan store =
      embedding_ps::PlanStoreMemory(plan->ps[0].store, {1'000'000, 4'000'000, 0});
  const uint64_t expected = planner::PodRequestBytes(*plan, 0);
  EXPECT_GT(expected, static_cast<uint64_t>((store.bytes + (256 << 20)) * 1.2));
  EXPECT_LT(expected, static_cast<uint64_t>((store.bytes + (300 << 20)) * 1.2));
  // About the slots (users dim 32 Adagrad: 16 + 4 * 64 bytes; items dim 16 Adam: 16 + 4 * 49) and
  // 8 bytes of index a row, and the 1 MiB admission sketch.
  const double rows = 1e6 * (16 + 4 * 64 + 8) + 4e6 * (16 + 4 * 49 + 8) + (1 << 20);
  EXPECT_NEAR(static_cast<double>(store.bytes), rows, 0.02 * rows);
  auto r = RenderK8s(Example(), Options("gke"));
  ASSERT_TRUE(r.ok());
  const YAML::Node ps = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"][0];
  const YAML::Node resources = ps["template"]["spec"]["template"]["spec"]["containers"][0]["resources"];
  EXPECT_EQ(resources["requests"]["memory"].as<std::string>(),
            absl::StrCat((expected + (1 << 20) - 1) / (1 << 20), "Mi"));
  EXPECT_EQ(resources["limits"]["memory"].as<std::string>(), resources["requests"]["memory"].as<std::string>());
}

// A job with a disk tier: each PS pod's job file points the tier at its own emptyDir, mounted
// there, sized by ps.disk.capacity_bytes and requested as ephemeral storage; other pods have none.
TEST(K8sRender, APsDiskTierIsAnEmptyDirOfItsCapacity) {
  YAML::Node root = YAML::LoadFile(kExample);
  root["ps"]["capacity_rows"] = 1000000;
  root["ps"]["disk"] = YAML::Load("{dir: /ssd, capacity_bytes: 10737418240}");
  YAML::Emitter out;
  out << root;
  auto spec = ParseJobSpecText(out.c_str(), "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto r = RenderK8s(*spec, Options("gke"));
  ASSERT_TRUE(r.ok()) << r.status();
  const YAML::Node config_map = Find(Objects(r->yaml), "ConfigMap");
  auto pods = ParseJobSpecText(config_map["data"]["job.yaml"].as<std::string>(), "ConfigMap");
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ(pods->ps.disk_dir, kK8sDiskDir);
  EXPECT_EQ(pods->ps.disk_capacity_bytes, 10737418240u);
  const YAML::Node jobs = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"];
  for (size_t j = 0; j < jobs.size(); ++j) {
    const YAML::Node pod = jobs[j]["template"]["spec"]["template"]["spec"];
    const bool ps = jobs[j]["name"].as<std::string>() == "ps";
    bool mounted = false, volume = false;
    for (const auto& m : pod["containers"][0]["volumeMounts"]) {
      mounted |= m["name"].as<std::string>() == "disk" && m["mountPath"].as<std::string>() == kK8sDiskDir;
    }
    for (const auto& v : pod["volumes"]) {
      if (v["name"].as<std::string>() != "disk") continue;
      volume = true;
      EXPECT_EQ(v["emptyDir"]["sizeLimit"].as<std::string>(), "10Gi");
    }
    EXPECT_EQ(mounted, ps) << jobs[j]["name"];
    EXPECT_EQ(volume, ps) << jobs[j]["name"];
    if (ps) {
      EXPECT_EQ(pod["containers"][0]["resources"]["requests"]["ephemeral-storage"].as<std::string>(), "11Gi");
    }
  }
}

// The example job with a criteo source reading `files` (a YAML flow sequence) instead of the
// synthetic one, and held-out `eval_files` (none when empty).
std::string SourceWithFiles(const std::string& job, const std::string& files, const std::string& eval_files = "") {
  YAML::Node root = YAML::Load(job);
  root["loader"]["source"] = YAML::Load(absl::StrCat("{format: criteo, files: ", files, "}"));
  root.remove("features");
  root.remove("tables");
  root.remove("eval");
  root["train"]["dense_optimizer"]["schedule"]["decay_steps"] = 1000;  // Files: no step count in advance.
  if (!eval_files.empty()) root["eval"] = YAML::Load(absl::StrCat("{files: ", eval_files, "}"));
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

absl::Status RenderError(const std::string& job_yaml, const K8sOptions& options) {
  auto spec = ParseJobSpecText(job_yaml, "job.yaml");
  if (!spec.ok()) return spec.status();
  return RenderK8s(*spec, options).status();
}

TEST(K8sRender, BadInputNamesTheKey) {
  const std::string job = Slurp(kExample);
  struct Case {
    std::string what;
    std::string job;
    K8sOptions options;
    std::string message;
  };
  std::vector<Case> cases;
  K8sOptions o = Options("gke");
  o.image = "";
  cases.push_back({"no image", job, o, "--image is required"});
  o.image = "registry.example/hyrec:latest";
  cases.push_back({"a tag", job, o, "pin the image by its digest"});
  o.image = "registry.example/hyrec@sha256:1234";
  cases.push_back({"a short digest", job, o, "pin the image by its digest"});
  o = Options("gke");
  o.name = "User_Item";
  cases.push_back({"a bad name", job, o, "DNS label"});
  o = Options("gke");
  o.ps_machine = "m9-imaginary-1";
  cases.push_back({"an unknown machine", job, o, "--ps_machine=m9-imaginary-1"});
  cases.push_back({"zero shards",
                   absl::StrReplaceAll(job, {{"ps: {shards: 2, capacity_rows: 5000000}", "ps: {shards: 0}"}}),
                   Options(), "ps.shards"});
  cases.push_back(
      {"zero workers", absl::StrReplaceAll(job, {{"workers: 2", "workers: 0"}}), Options(), "train.workers"});
  cases.push_back({"no capacity",
                   absl::StrReplaceAll(job, {{"ps: {shards: 2, capacity_rows: 5000000}", "ps: {shards: 2}"}}),
                   Options(), "capacity_rows"});
  cases.push_back({"too much memory on one node",
                   absl::StrReplaceAll(job, {{"capacity_rows: 5000000", "capacity_rows: 9000000000"}}), Options("gke"),
                   "ps.capacity_rows"});
  cases.push_back({"too much memory for local",
                   absl::StrReplaceAll(job, {{"capacity_rows: 5000000", "capacity_rows: 90000000"}}), Options("local"),
                   "more than a local node offers"});
  cases.push_back({"security off", absl::StrCat(job, "security: {mode: none}\n"), Options(), "security.mode"});
  // Values Kubernetes refuses are refused at render time, naming the flag.
  const std::vector<std::pair<std::function<void(K8sOptions*)>, std::string>> refused = {
      {[](K8sOptions* k) { k->namespace_name = "My_Team"; }, "--namespace=My_Team: Kubernetes would refuse it"},
      {[](K8sOptions* k) { k->queue = "team queue"; }, "--queue=team queue: Kubernetes would refuse it"},
      {[](K8sOptions* k) { k->storage_size = "10GB"; }, "--storage_size=10GB: Kubernetes would refuse it"},
      {[](K8sOptions* k) { k->storage_size = "0Gi"; }, "--storage_size=0Gi: the volume needs a size above 0"},
      {[](K8sOptions* k) { k->storage_class = "Fast SSD"; }, "--storage_class=Fast SSD: Kubernetes would refuse it"},
      {[](K8sOptions* k) { k->worker_machine = "a2/highgpu"; }, "--worker_machine=a2/highgpu: Kubernetes would"},
  };
  for (const auto& [set, message] : refused) {
    o = Options("gke");
    set(&o);
    cases.push_back({message, job, o, message});
  }
  for (const Case& c : cases) {
    const absl::Status s = RenderError(c.job, c.options);
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_TRUE(absl::StrContains(s.message(), c.message)) << c.what << ": " << s.message();
  }
}

// `hyrec plan` and the render place the PS alike: the PS pods ask for the CPU and memory the
// plan gives each shard, as many share a node as the plan says, and the runbook's node pools
// (docs/deploy-gke.md) are the ones the gke render names, of the machine types it assumes, with
// as many PS nodes as the plan needs.
TEST(K8sRender, PlanRenderAndRunbookAgree) {
  auto plan = Plan(Example());
  ASSERT_TRUE(plan.ok()) << plan.status();
  planner::CapacityOptions c;
  c.measure_batches = 0;
  c.dedup_ratio = 1;
  auto capacity = planner::PlanCapacity(*plan, c);
  ASSERT_TRUE(capacity.ok()) << capacity.status();
  EXPECT_EQ(capacity->ps_machine.name, "m3-megamem-64");
  EXPECT_EQ(capacity->placement.memory_per_pod, planner::PodRequestBytes(*plan, 0));
  // Two small shards share one node, each with half of its allocatable CPUs.
  EXPECT_EQ(capacity->ps_machines, 1);
  EXPECT_EQ(capacity->placement.pods_per_machine, 2);
  EXPECT_DOUBLE_EQ(capacity->placement.cpus_per_pod, planner::AllocatableCpus(capacity->ps_machine) / 2);
  std::map<std::string, std::string> pools;  // node pool -> machine type, of every gke render.
  for (const ImageVariant variant : {ImageVariant::kCpu, ImageVariant::kCuda}) {
    K8sOptions o = Options("gke");
    o.image_variant = variant;
    auto r = RenderK8s(Example(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    const YAML::Node jobs = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"];
    for (const YAML::Node& rj : jobs) {
      const YAML::Node pod = rj["template"]["spec"]["template"]["spec"];
      const std::string pool = pod["nodeSelector"]["cloud.google.com/gke-nodepool"].as<std::string>();
      const YAML::Node requests = pod["containers"][0]["resources"]["requests"];
      if (rj["name"].as<std::string>() == "ps") {
        pools[pool] = capacity->ps_machine.name;
        EXPECT_EQ(requests["cpu"].as<std::string>(),
                  absl::StrCat(std::llround(capacity->placement.cpus_per_pod * 1000), "m"));
        EXPECT_EQ(requests["memory"].as<std::string>(),
                  absl::StrCat((capacity->placement.memory_per_pod + (1 << 20) - 1) / (1 << 20), "Mi"));
      } else if (rj["name"].as<std::string>() == "loader") {
        pools[pool] = "c3-standard-22";
        EXPECT_EQ(requests["cpu"].as<std::string>(), "2");  // loader.threads 1, and one to serve.
      } else {
        pools[pool] = variant == ImageVariant::kCuda ? "a2-highgpu-8g" : "c3-standard-44";
      }
    }
  }
  ASSERT_EQ(pools.size(), 4u);  // hyrec-ps, hyrec-loader, hyrec-cpu, hyrec-gpu.
  // The runbook creates each pool with the machine type the render assumes.
  const std::string runbook = Slurp(HYREC_SOURCE_DIR "/docs/deploy-gke.md");
  for (const auto& [pool, machine] : pools) {
    const size_t at = runbook.find("node-pools create " + pool + " ");
    ASSERT_NE(at, std::string::npos) << "docs/deploy-gke.md creates no node pool " << pool;
    const std::string command = runbook.substr(at, runbook.find("\n\n", at) - at);
    const std::string line = command.substr(0, command.find("\ngcloud"));
    EXPECT_TRUE(absl::StrContains(line, "--machine-type=" + machine)) << pool << ": " << line;
    if (pool == "hyrec-ps") {
      EXPECT_TRUE(absl::StrContains(line, absl::StrCat("--num-nodes=", capacity->ps_machines))) << line;
    }
  }
}

// GPUs only for a CUDA image: device auto gets one per worker on gke's GPU pool with
// --image_variant=cuda, none with the default cpu image; device cuda on a cpu image is refused.
TEST(K8sRender, GpusOnlyForACudaImage) {
  K8sOptions o = Options("gke");
  o.image_variant = ImageVariant::kCuda;
  auto r = RenderK8s(Example(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  const YAML::Node workers = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"][2];
  const YAML::Node pod = workers["template"]["spec"]["template"]["spec"];
  EXPECT_EQ(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
  EXPECT_EQ(pod["nodeSelector"]["cloud.google.com/gke-nodepool"].as<std::string>(), "hyrec-gpu");
  r = RenderK8s(Example(), Options("gke"));
  ASSERT_TRUE(r.ok()) << r.status();
  const YAML::Node cpu = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"][2];
  EXPECT_EQ(
      cpu["template"]["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"].as<std::string>(),
      "hyrec-cpu");
  const std::string cuda_job = absl::StrReplaceAll(Slurp(kExample), {{"device: auto", "device: cuda"}});
  const absl::Status refused = RenderError(cuda_job, Options("gke"));
  EXPECT_TRUE(absl::StrContains(refused.message(), "train.device: cuda needs the CUDA image")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "--image_variant=cuda")) << refused;
  o = Options("gke");
  o.worker_gpus = 2;
  EXPECT_TRUE(absl::StrContains(RenderK8s(Example(), o).status().message(), "--worker_gpus=2 needs the CUDA image"));
}

// A data file must be reachable from the pods: a relative or host-local path is refused naming
// the key and the ways to reach data; the state volume, a GCS bucket (mounted through Cloud
// Storage FUSE into the loader and the workers) and a derived image's folder are accepted.
TEST(K8sRender, DataPathsMustBeReachableFromThePods) {
  const std::string base = Slurp(kExample);
  struct Case {
    std::string files;
    std::string eval_files;
    std::string key;
  };
  for (const Case& c : std::vector<Case>{{"[train.tsv]", "", "loader.source.files[0] 'train.tsv': a relative path"},
                                         {"[/var/lib/hyrec/data/train.tsv, /home/me/day_1.tsv]", "",
                                          "loader.source.files[1] '/home/me/day_1.tsv': a path on no volume"},
                                         {"[/var/lib/hyrec/../etc/x.tsv]", "", "loader.source.files[0]"},
                                         {"[/mnt/gcs/train.tsv]", "", "--gcs_bucket=BUCKET"},
                                         {"[/var/lib/hyrec/train.tsv]", "[held.tsv]", "eval.files[0] 'held.tsv'"}}) {
    auto spec = ParseJobSpecText(SourceWithFiles(base, c.files, c.eval_files), "job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    const absl::Status s = RenderK8s(*spec, Options("gke")).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.files << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.key)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "/var/lib/hyrec/")) << s;  // The choices are named.
    EXPECT_TRUE(absl::StrContains(s.message(), "--image_data_dir")) << s;
  }
  // The state volume, the bucket, the image's folder.
  auto spec = ParseJobSpecText(SourceWithFiles(base,
                                               "[/var/lib/hyrec/data/train.tsv, /mnt/gcs/day_1.tsv.gz, "
                                               "/opt/data/day_2.tsv]"),
                               "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  K8sOptions o = Options("gke");
  o.gcs_bucket = "my-training-data";
  o.image_data_dir = "/opt/data";
  o.service_account = "hyrec-reader";
  auto r = RenderK8s(*spec, o);
  ASSERT_TRUE(r.ok()) << r.status();
  const YAML::Node jobs = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"];
  for (const YAML::Node& rj : jobs) {
    const YAML::Node pod = rj["template"]["spec"]["template"];
    const bool reads = rj["name"].as<std::string>() != "ps";
    bool mounted = false;
    for (const YAML::Node& m : pod["spec"]["containers"][0]["volumeMounts"]) {
      if (m["name"].as<std::string>() == "gcs") {
        mounted = true;
        EXPECT_EQ(m["mountPath"].as<std::string>(), kK8sGcsDir);
        EXPECT_TRUE(m["readOnly"].as<bool>());
      }
    }
    EXPECT_EQ(mounted, reads) << rj["name"];
    EXPECT_EQ(pod["metadata"]["annotations"]["gke-gcsfuse/volumes"].IsDefined(), reads) << rj["name"];
    EXPECT_EQ(pod["spec"]["serviceAccountName"].as<std::string>(), "hyrec-reader");
    if (!reads) continue;
    bool bucket = false;
    for (const YAML::Node& v : pod["spec"]["volumes"]) {
      if (v["name"].as<std::string>() != "gcs") continue;
      bucket = v["csi"]["driver"].as<std::string>() == "gcsfuse.csi.storage.gke.io" &&
               v["csi"]["volumeAttributes"]["bucketName"].as<std::string>() == "my-training-data";
    }
    EXPECT_TRUE(bucket) << rj["name"];
  }
  // The pods read the paths as the job gives them.
  EXPECT_TRUE(absl::StrContains(r->job_text, "/mnt/gcs/day_1.tsv.gz")) << r->job_text;
  o = Options("local");
  o.gcs_bucket = "my-training-data";
  EXPECT_TRUE(absl::StrContains(RenderK8s(Example(), o).status().message(), "--gcs_bucket needs --overlay=gke"));
  o = Options("gke");
  o.gcs_bucket = "gs://my-training-data";
  EXPECT_TRUE(absl::StrContains(RenderK8s(Example(), o).status().message(), "not a URL"));
}

TEST(K8sRender, SecretsHoldEachRolesIdentitiesAndNoCaKey) {
  const std::string dir = ::testing::TempDir() + "/k8s_render_certs";
  std::filesystem::remove_all(dir);
  CertificateRequest request;
  request.dir = dir;
  request.identities = JobIdentities(2, 2, 1);
  ASSERT_TRUE(WriteJobCertificates(request).ok());
  auto text = K8sSecrets("user-item", "", dir, 2, 2, /*kubectl=*/false);
  ASSERT_TRUE(text.ok()) << text.status();
  std::map<std::string, std::set<std::string>> keys;
  for (const YAML::Node& d : Objects(*text)) {
    EXPECT_EQ(d["kind"].as<std::string>(), "Secret");
    for (const auto& kv : d["data"]) keys[d["metadata"]["name"].as<std::string>()].insert(kv.first.as<std::string>());
  }
  // The servers also hold the token secret (tokens are checked by them, security.tokens).
  EXPECT_EQ(keys["user-item-certs-ps"],
            (std::set<std::string>{"ca.pem", "ps-0.pem", "ps-0.key", "ps-1.pem", "ps-1.key", "token.secret"}));
  EXPECT_EQ(keys["user-item-certs-loader"],
            (std::set<std::string>{"ca.pem", "loader-0.pem", "loader-0.key", "token.secret"}));
  EXPECT_EQ(keys["user-item-certs-workers"],
            (std::set<std::string>{"ca.pem", "worker-0.pem", "worker-0.key", "worker-1.pem", "worker-1.key"}));
  // A pod's volume puts each identity in a directory of its own, which its mount selects.
  auto r = RenderK8s(Example(), Options());
  ASSERT_TRUE(r.ok());
  const YAML::Node workers = Find(Objects(r->yaml), "JobSet")["spec"]["replicatedJobs"][2];
  const YAML::Node pod = workers["template"]["spec"]["template"]["spec"];
  for (const YAML::Node& v : pod["volumes"]) {
    if (v["name"].as<std::string>() != "certs") continue;
    EXPECT_EQ(v["secret"]["secretName"].as<std::string>(), "user-item-certs-workers");
    for (const YAML::Node& item : v["secret"]["items"]) {
      const std::string path = item["path"].as<std::string>();
      const std::string id = path.substr(0, path.find('/'));
      EXPECT_TRUE(item["key"].as<std::string>() == "ca.pem" || absl::StartsWith(item["key"].as<std::string>(), id))
          << path;
    }
  }
  auto commands = K8sSecrets("user-item", "ml", dir, 2, 2, /*kubectl=*/true);
  ASSERT_TRUE(commands.ok());
  EXPECT_TRUE(absl::StrContains(*commands, "kubectl create secret generic user-item-certs-ps --namespace=ml"));
  EXPECT_FALSE(absl::StrContains(*commands, "ca.key"));
  std::filesystem::remove(dir + "/worker-1.key");
  EXPECT_TRUE(absl::IsNotFound(K8sSecrets("user-item", "", dir, 2, 2, false).status()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hyrec::deploy
