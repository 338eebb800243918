// The rendered manifests run: every pod of `hyrec k8s render`'s JobSet is started as a local
// process with its container's command, arguments and environment (downward API fields and
// $(VAR) references resolved as the kubelet does), its volumes (the job's ConfigMap, its role's
// certificate Secret from `hyrec certs --k8s` with the items and subPathExpr the pod names, the
// JobSet's shared claim, an emptyDir for /tmp) mounted at their paths in a mount namespace of its
// own, its own host name, and each pod's DNS name mapped to a loopback address of its own in that
// namespace's /etc/hosts. A small JobSet controller reads the rest from the objects: dependsOn
// with readiness from the pods' grpc readinessProbe, each Job's podFailurePolicy, the JobSet's
// failurePolicy and successPolicy.
//
// The job trains to the same result as `hyrec train --processes` on the same job file. Worker
// 0's "pod" killed mid-run restarts the whole JobSet, which resumes from the latest checkpoint;
// another worker's "pod" is recreated alone by its Job (backoffLimitPerIndex) and heals from its
// peer; a PS "pod" and a loader "pod" killed mid-run are restarted alone (RestartJob). Those
// three finish in their first attempt.
//
// Needs root (or user namespaces) for `unshare --mount --uts`; as root, their absence fails.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/health.h"
#include "hyrec/common/subprocess.h"
#include "run_command.h"
#include "yaml-cpp/yaml.h"

namespace hyrec {
namespace {

namespace fs = std::filesystem;

constexpr char kImage[] =
    "registry.example/hyrec@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// Deterministic with one worker (staleness 0, fixed seeds), checkpoints every 10 steps.
std::string JobText(int workers, const std::string& checkpoints, int samples = 25600) {
  return absl::StrCat(R"(loader:
  source:
    format: synthetic
    synthetic: {num_samples: )",
                      samples, R"(, num_slots: 4, num_dense: 4, vocabulary: 400, ids_per_sample: 2, seed: 5}
  batch_size: 256
  threads: 1
  shuffle_window: 2048
features: [user, item, history, context]
tables:
  - {name: users, features: [user], dim: 8, capacity_rows: 100000}
  - {name: items, features: [item, {name: history, pooling: mean}], dim: 8}
  - {name: context, features: [context], dim: 8, optimizer: {kind: ftrl, learning_rate: 0.1}}
eval: {samples: 2000}
model: {kind: dlrm, embedding_dim: 8, bottom: [16], top: [16]}
ps: {shards: 2, capacity_rows: 200000}
train: {workers: )",
                      workers, R"(, embedding_staleness: 0, seed: 3, log_every_batches: 20}
checkpoint: {dir: )",
                      checkpoints, R"(, every_steps: 10, keep_last: 2}
)");
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Quote(const std::string& s) { return "'" + absl::StrReplaceAll(s, {{"'", "'\\''"}}) + "'"; }

// $(NAME) replaced by NAME's value when defined, $$ by $, as Kubernetes expands command, args
// and subPathExpr.
std::string Expand(const std::string& text, const std::map<std::string, std::string>& env) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "$$") == 0) {
      out += '$';
      ++i;
      continue;
    }
    if (text.compare(i, 2, "$(") == 0) {
      const size_t close = text.find(')', i);
      if (close != std::string::npos) {
        auto it = env.find(text.substr(i + 2, close - i - 2));
        if (it != env.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out += text[i];
  }
  return out;
}

struct Pod {
  std::string name;  // <jobset>-<replicated job>-<job index>-<completion index>
  std::string fqdn;  // name.<subdomain>
  std::string ip;
  std::string rjob;
  int job_index = 0;
  int completion_index = 0;
  std::string root;  // Its volumes, overlays, hosts file and log.
  std::unique_ptr<Subprocess> process;
  bool ready = false;
  std::optional<int> exit_code;
};

struct ClusterResult {
  bool succeeded = false;
  int restarts = 0;      // Of the whole JobSet (RestartJobSet).
  int job_restarts = 0;  // Of one child Job alone (RestartJob).
  int pod_restarts = 0;  // Of one pod by its Job (backoffLimitPerIndex).
  std::string why;       // When it failed.
};

class LocalCluster {
 public:
  LocalCluster(std::vector<YAML::Node> objects, std::vector<YAML::Node> secrets, std::string dir)
      : objects_(std::move(objects)), secrets_(std::move(secrets)), dir_(std::move(dir)) {
    for (const YAML::Node& o : objects_) {
      if (o["kind"].as<std::string>() == "JobSet") jobset_ = o;
      if (o["kind"].as<std::string>() == "ConfigMap") config_maps_[o["metadata"]["name"].as<std::string>()] = o;
    }
    name_ = jobset_["metadata"]["name"].as<std::string>();
    // A range of loopback addresses of this process's own, so concurrent tests do not meet.
    const int pid = getpid();
    net_ = absl::StrCat("127.", 100 + pid % 100, ".", (pid / 100) % 250, ".");
    state_ = dir_ + "/claims/state";
    fs::create_directories(state_);
  }

  const std::string& state() const { return state_; }

  // Runs the JobSet until its success policy holds, it fails, or `timeout`. `during` is called
  // every poll with the cluster, for a test's faults.
  ClusterResult Run(absl::Duration timeout, const std::function<void(LocalCluster&)>& during) {
    ClusterResult result;
    const absl::Time deadline = absl::Now() + timeout;
    CreateJobs();
    while (absl::Now() < deadline) {
      if (during) during(*this);
      Poll();
      result.pod_restarts += RetryFailedIndexes();
      if (std::optional<std::string> failed = FailedJob()) {
        const std::string action = FailureAction(*failed);
        const int max = jobset_["spec"]["failurePolicy"]["maxRestarts"].as<int>(0);
        if (action == "FailJobSet" || result.restarts + result.job_restarts >= max) {
          result.why = absl::StrCat("job ", *failed, " failed: ", action);
          StopAll();
          return result;
        }
        if (action == "RestartJob") {  // That child Job alone is recreated; the others run on.
          ++result.job_restarts;
          RestartJob(failed_rjob_, failed_index_);
          continue;
        }
        EXPECT_EQ(action, "RestartJobSet");
        ++result.restarts;  // Every Job is recreated, in the JobSet's next restart attempt.
        restart_attempt_ = result.restarts;
        StopAll();
        for (Pod& p : pods_) retired_.push_back(std::move(p));
        pods_.clear();
        index_failures_.clear();
        CreateJobs();
        continue;
      }
      if (Succeeded()) {
        StopAll();
        result.succeeded = true;
        return result;
      }
      CreateDependents();
      absl::SleepFor(absl::Milliseconds(100));
    }
    result.why = "timed out";
    StopAll();
    return result;
  }

  Pod* Find(const std::string& pod) {
    for (Pod& p : pods_) {
      if (p.name == pod) return &p;
    }
    return nullptr;
  }

  std::string Logs() const {
    std::string out;
    for (const std::vector<Pod>* pods : {&retired_, &pods_}) {
      for (const Pod& p : *pods) absl::StrAppend(&out, "---- ", p.name, "\n", Slurp(p.root + "/log"));
    }
    return out;
  }

 private:
  YAML::Node ReplicatedJob(const std::string& name) const {
    for (const YAML::Node& rj : jobset_["spec"]["replicatedJobs"]) {
      if (rj["name"].as<std::string>() == name) return rj;
    }
    return YAML::Node();
  }

  bool Created(const std::string& rjob) const {
    for (const Pod& p : pods_) {
      if (p.rjob == rjob) return true;
    }
    return false;
  }

  // The replicated jobs without dependsOn; the others once theirs are Ready.
  void CreateJobs() {
    for (const YAML::Node& rj : jobset_["spec"]["replicatedJobs"]) {
      if (!rj["dependsOn"]) Create(rj);
    }
  }

  void CreateDependents() {
    for (const YAML::Node& rj : jobset_["spec"]["replicatedJobs"]) {
      if (!rj["dependsOn"] || Created(rj["name"].as<std::string>())) continue;
      bool ready = true;
      for (const YAML::Node& dep : rj["dependsOn"]) {
        EXPECT_EQ(dep["status"].as<std::string>(), "Ready");
        const std::string other = dep["name"].as<std::string>();
        ready = ready && Created(other);
        for (const Pod& p : pods_) ready = ready && (p.rjob != other || p.ready);
      }
      if (ready) Create(rj);
    }
  }

  // Deletes child Job `index` of `rjob` (its pods get SIGTERM, then SIGKILL) and creates it again.
  void RestartJob(const std::string& rjob, int index) {
    std::vector<Pod> kept;
    for (Pod& p : pods_) {
      if (p.rjob != rjob || p.job_index != index) {
        kept.push_back(std::move(p));
        continue;
      }
      if (p.process != nullptr && !p.exit_code.has_value()) {
        p.process->Signal(SIGTERM);
        if (!p.process->Wait(absl::Seconds(20)).ok()) p.process->Signal(SIGKILL);
      }
      index_failures_.erase(p.name);
      retired_.push_back(std::move(p));  // Its log stays readable.
    }
    pods_ = std::move(kept);
    Create(ReplicatedJob(rjob), index);
  }

  // The replicated job's child Jobs (only `only` if >= 0; of it only the pod of completion
  // index `only_pod` if >= 0).
  void Create(const YAML::Node& rj, int only = -1, int only_pod = -1) {
    const std::string rjob = rj["name"].as<std::string>();
    const YAML::Node job = rj["template"]["spec"];
    for (int j = 0; j < rj["replicas"].as<int>(1); ++j) {
      if (only >= 0 && j != only) continue;
      for (int k = 0; k < job["completions"].as<int>(1); ++k) {
        if (only_pod >= 0 && k != only_pod) continue;
        Pod pod;
        pod.rjob = rjob;
        pod.job_index = j;
        pod.completion_index = k;
        pod.name = absl::StrCat(name_, "-", rjob, "-", j, "-", k);
        pod.fqdn = absl::StrCat(pod.name, ".", name_);
        // A recreated pod keeps its name, and here its address too: the other pods' hosts files
        // (their DNS) stay right, as a Service's records follow a pod in a cluster.
        const auto known = hosts_.find(pod.fqdn);
        pod.ip = known != hosts_.end() ? known->second : absl::StrCat(net_, ++addresses_);
        hosts_[pod.fqdn] = pod.ip;
        hosts_[pod.name] = pod.ip;
        pods_.push_back(std::move(pod));
        pending_.push_back(pods_.size() - 1);
      }
    }
    // Every pod of the set resolves every other's name (the headless Service's records), so the
    // hosts files are written once all of this batch are known.
    for (size_t index : pending_) Start(pods_[index], job["template"]["spec"]);
    pending_.clear();
  }

  // The value of a downward API field for `pod`.
  std::string Field(const Pod& pod, const std::string& path) const {
    if (path == "status.podIP") return pod.ip;
    if (path == "metadata.name") return pod.name;
    if (path == "metadata.labels['jobset.sigs.k8s.io/job-index']") return std::to_string(pod.job_index);
    if (path == "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']") return std::to_string(restart_attempt_);
    if (path == "metadata.annotations['batch.kubernetes.io/job-completion-index']") {
      return std::to_string(pod.completion_index);
    }
    ADD_FAILURE() << "a field this cluster does not set: " << path;
    return "";
  }

  // Materializes a volume of the pod spec under the pod's root; returns its directory.
  std::string Volume(const Pod& pod, const YAML::Node& volume) {
    const std::string name = volume["name"].as<std::string>();
    const std::string dir = pod.root + "/volumes/" + name;
    fs::create_directories(dir);
    if (volume["configMap"]) {
      const YAML::Node cm = config_maps_[volume["configMap"]["name"].as<std::string>()];
      EXPECT_TRUE(cm.IsDefined()) << name;
      for (const auto& kv : cm["data"])
        std::ofstream(dir + "/" + kv.first.as<std::string>()) << kv.second.as<std::string>();
    } else if (volume["secret"]) {
      const std::string secret_name = volume["secret"]["secretName"].as<std::string>();
      YAML::Node data;
      for (const YAML::Node& s : secrets_) {
        if (s["metadata"]["name"].as<std::string>() == secret_name) data = s["data"];
      }
      EXPECT_TRUE(data.IsDefined()) << "no Secret " << secret_name;
      for (const YAML::Node& item : volume["secret"]["items"]) {
        std::string bytes;
        EXPECT_TRUE(absl::Base64Unescape(data[item["key"].as<std::string>()].as<std::string>(""), &bytes))
            << item["key"];
        const fs::path path = fs::path(dir) / item["path"].as<std::string>();
        fs::create_directories(path.parent_path());
        std::ofstream(path) << bytes;
      }
    } else if (!volume["emptyDir"]) {
      ADD_FAILURE() << "a volume kind this cluster does not mount: " << name;
    }
    return dir;
  }

  // The shell commands that build the container's file system in its mount namespace: each
  // mount path under an overlay of its nearest existing ancestor (so nothing outside the
  // namespace changes), then /etc/hosts, then /tmp last (the pod's root lives under /tmp).
  std::string Mounts(Pod& pod, const YAML::Node& spec, const YAML::Node& container,
                     const std::map<std::string, std::string>& env) {
    std::map<std::string, std::string> volumes;
    for (const YAML::Node& v : spec["volumes"]) volumes[v["name"].as<std::string>()] = Volume(pod, v);
    // The JobSet's volume claims: one directory for the whole set.
    for (const YAML::Node& policy : jobset_["spec"]["volumeClaimPolicies"]) {
      for (const YAML::Node& t : policy["templates"]) volumes[t["metadata"]["name"].as<std::string>()] = state_;
    }
    std::vector<std::pair<std::string, std::string>> binds = {{"/opt/hyrec/bin", HYREC_BUILD_DIR}};
    std::string tmp;
    for (const YAML::Node& m : container["volumeMounts"]) {
      std::string source = volumes[m["name"].as<std::string>()];
      EXPECT_FALSE(source.empty()) << m["name"];
      if (m["subPath"]) source += "/" + m["subPath"].as<std::string>();
      if (m["subPathExpr"]) source += "/" + Expand(m["subPathExpr"].as<std::string>(), env);
      const std::string path = m["mountPath"].as<std::string>();
      if (path == "/tmp") {
        tmp = source;
      } else {
        binds.emplace_back(path, source);
      }
    }
    std::string script;
    std::set<std::string> overlaid;
    int overlays = 0;
    for (const auto& [path, source] : binds) {
      fs::path ancestor = fs::path(path).parent_path();
      while (!fs::exists(ancestor)) ancestor = ancestor.parent_path();
      if (!fs::exists(path) && !overlaid.count(ancestor.string())) {
        const std::string ov = absl::StrCat(pod.root, "/overlay", overlays++);
        fs::create_directories(ov + "/upper");
        fs::create_directories(ov + "/work");
        absl::StrAppend(&script, "mount -t overlay overlay -o lowerdir=", ancestor.string(), ",upperdir=", ov,
                        "/upper,workdir=", ov, "/work ", ancestor.string(), "\n");
        overlaid.insert(ancestor.string());
      }
      absl::StrAppend(&script, "mkdir -p ", Quote(path), " && mount --bind ", Quote(source), " ", Quote(path), "\n");
    }
    std::string hosts = "127.0.0.1 localhost\n";
    for (const auto& [host, ip] : hosts_) absl::StrAppend(&hosts, ip, " ", host, "\n");
    std::ofstream(pod.root + "/hosts") << hosts;
    absl::StrAppend(&script, "mount --bind ", Quote(pod.root + "/hosts"), " /etc/hosts\n");
    if (!tmp.empty()) absl::StrAppend(&script, "mount --bind ", Quote(tmp), " /tmp\n");
    return script;
  }

  void Start(Pod& pod, const YAML::Node& spec) {
    pod.root = absl::StrCat(dir_, "/pods/", pod.name, "-", ++generation_);
    fs::create_directories(pod.root);
    ASSERT_EQ(spec["containers"].size(), 1u);
    const YAML::Node container = spec["containers"][0];
    // The image's environment (the Dockerfile's PATH), the kubelet's HOSTNAME, then the
    // container's own; OpenBLAS's core type passes through, as this machine needs it.
    std::map<std::string, std::string> env = {
        {"PATH", "/opt/hyrec/bin:/usr/local/bin:/usr/bin:/bin"}, {"HOSTNAME", pod.name}, {"HOME", "/"}};
    for (const char* name : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}) {
      if (const char* value = std::getenv(name)) env[name] = value;
    }
    std::vector<std::string> env_order = {"PATH", "HOSTNAME", "HOME"};
    for (const YAML::Node& e : container["env"]) {
      const std::string name = e["name"].as<std::string>();
      env[name] = e["valueFrom"] ? Field(pod, e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>())
                                 : Expand(e["value"].as<std::string>(), env);
    }
    // The log is opened before /tmp (where the pod's root is) is mounted over.
    std::string script = absl::StrCat("set -e\nexec >", Quote(pod.root + "/log"), " 2>&1\n");
    absl::StrAppend(&script, Mounts(pod, spec, container, env), "hostname ", pod.name, "\ncd /\nexec env -i");
    for (const auto& [k, v] : env) absl::StrAppend(&script, " ", Quote(k + "=" + v));
    for (const YAML::Node& a : container["command"])
      absl::StrAppend(&script, " ", Quote(Expand(a.as<std::string>(), env)));
    for (const YAML::Node& a : container["args"])
      absl::StrAppend(&script, " ", Quote(Expand(a.as<std::string>(), env)));
    std::ofstream(pod.root + "/start.sh") << script << "\n";
    std::vector<std::string> argv = {"/usr/bin/unshare", "--mount", "--uts"};
    if (geteuid() != 0) argv.insert(argv.begin() + 1, "--map-root-user");
    argv.insert(argv.end(), {"/bin/bash", pod.root + "/start.sh"});
    SpawnOptions options;
    options.new_process_group = true;
    auto process = Subprocess::Spawn(argv, options);
    ASSERT_TRUE(process.ok()) << process.status();
    pod.process = std::move(*process);
    probes_[pod.name] = container["readinessProbe"]["grpc"]["port"].as<int>(0);
  }

  void Poll() {
    for (Pod& p : pods_) {
      if (p.exit_code.has_value() || p.process == nullptr) continue;
      absl::StatusOr<int> code = p.process->Wait(absl::ZeroDuration());
      if (code.ok()) {
        p.exit_code = *code;
        p.ready = false;
        continue;
      }
      const int port = probes_[p.name];
      if (!p.ready && port > 0) p.ready = CheckHealth(absl::StrCat(p.ip, ":", port), 1).ok();
    }
  }

  // The action of the first podFailurePolicy rule that matches a failed pod's exit code; "Count"
  // when none does (disruption conditions: nothing here is disrupted).
  static std::string PodFailureAction(const YAML::Node& job, int exit_code) {
    for (const YAML::Node& rule : job["podFailurePolicy"]["rules"]) {
      if (!rule["onExitCodes"]) continue;
      bool in = false;
      for (const YAML::Node& v : rule["onExitCodes"]["values"]) in = in || v.as<int>() == exit_code;
      if (in == (rule["onExitCodes"]["operator"].as<std::string>() == "In")) return rule["action"].as<std::string>();
    }
    return "Count";
  }

  // What a Job with backoffLimitPerIndex does with a failed pod that its policy counts: a new pod
  // for the index, until the index has failed more than the limit. Returns the pods recreated.
  int RetryFailedIndexes() {
    std::vector<Pod> retry;
    std::vector<Pod> kept;
    for (Pod& p : pods_) {
      const YAML::Node job = ReplicatedJob(p.rjob)["template"]["spec"];
      if (p.exit_code.has_value() && *p.exit_code != 0 && job["backoffLimitPerIndex"] &&
          PodFailureAction(job, *p.exit_code) == "Count" &&
          ++index_failures_[p.name] <= job["backoffLimitPerIndex"].as<int>()) {
        retry.push_back(std::move(p));
      } else {
        kept.push_back(std::move(p));
      }
    }
    pods_ = std::move(kept);
    for (Pod& p : retry) {
      Create(ReplicatedJob(p.rjob), p.job_index, p.completion_index);
      retired_.push_back(std::move(p));
    }
    return static_cast<int>(retry.size());
  }

  // A Job whose pod failed, by its podFailurePolicy: "rjob/index:reason", or none.
  std::optional<std::string> FailedJob() {
    for (const Pod& p : pods_) {
      if (!p.exit_code.has_value() || *p.exit_code == 0) continue;
      const YAML::Node job = ReplicatedJob(p.rjob)["template"]["spec"];
      const std::string action = PodFailureAction(job, *p.exit_code);
      std::string reason;
      if (action == "FailJob") {
        reason = "PodFailurePolicy";
      } else if (job["backoffLimitPerIndex"]) {
        // FailIndex, or an index past its retries: maxFailedIndexes 0, so the Job fails.
        EXPECT_EQ(job["maxFailedIndexes"].as<int>(-1), 0) << p.rjob;
        reason = "MaxFailedIndexesExceeded";
      } else {
        reason = "BackoffLimitExceeded";  // backoffLimit 0: the first failure fails the Job.
        EXPECT_EQ(job["backoffLimit"].as<int>(-1), 0) << p.rjob;
      }
      failure_reason_ = reason;
      failed_rjob_ = p.rjob;
      failed_index_ = p.job_index;
      return absl::StrCat(p.rjob, "-", p.job_index, " (pod ", p.name, " exit ", *p.exit_code, ", ", reason, ")");
    }
    return std::nullopt;
  }

  // The JobSet's failurePolicy: the first rule whose reasons and replicated jobs match;
  // RestartJobSet by default.
  std::string FailureAction(const std::string& job) const {
    for (const YAML::Node& rule : jobset_["spec"]["failurePolicy"]["rules"]) {
      bool match = !rule["onJobFailureReasons"] || rule["onJobFailureReasons"].size() == 0;
      for (const YAML::Node& r : rule["onJobFailureReasons"]) match = match || r.as<std::string>() == failure_reason_;
      bool target = !rule["targetReplicatedJobs"] || rule["targetReplicatedJobs"].size() == 0;
      for (const YAML::Node& r : rule["targetReplicatedJobs"]) target = target || r.as<std::string>() == failed_rjob_;
      if (match && target) return rule["action"].as<std::string>();
    }
    return "RestartJobSet";
  }

  bool Succeeded() const {
    const YAML::Node policy = jobset_["spec"]["successPolicy"];
    EXPECT_EQ(policy["operator"].as<std::string>(), "All");
    for (const YAML::Node& target : policy["targetReplicatedJobs"]) {
      const std::string rjob = target.as<std::string>();
      if (!Created(rjob)) return false;
      for (const Pod& p : pods_) {
        if (p.rjob == rjob && p.exit_code != 0) return false;
      }
    }
    return true;
  }

  // What deleting the Jobs does: SIGTERM, then SIGKILL after a grace (shortened here).
  void StopAll() {
    for (Pod& p : pods_) {
      if (p.process != nullptr && !p.exit_code.has_value()) p.process->Signal(SIGTERM);
    }
    for (Pod& p : pods_) {
      if (p.process == nullptr || p.exit_code.has_value()) continue;
      if (!p.process->Wait(absl::Seconds(20)).ok()) {
        p.process->Signal(SIGKILL);
        (void)p.process->Wait(absl::Seconds(5));
      }
    }
  }

  std::vector<YAML::Node> objects_;
  std::vector<YAML::Node> secrets_;
  std::string dir_;
  YAML::Node jobset_;
  std::map<std::string, YAML::Node> config_maps_;
  std::string name_, net_, state_;
  std::vector<Pod> pods_;
  std::vector<size_t> pending_;
  std::map<std::string, std::string> hosts_;
  std::map<std::string, int> probes_;
  std::vector<Pod> retired_;                   // Pods of restarted child Jobs.
  std::map<std::string, int> index_failures_;  // Counted failures, by pod name (its index).
  std::string failure_reason_;
  std::string failed_rjob_;
  int failed_index_ = 0;
  int restart_attempt_ = 0;
  int addresses_ = 0;
  int generation_ = 0;
};

std::vector<YAML::Node> LoadAll(const std::string& text) {
  std::vector<YAML::Node> docs;
  for (const YAML::Node& d : YAML::LoadAll(text)) {
    if (d.IsMap()) docs.push_back(d);
  }
  return docs;
}

// Defined with the tests below.
bool Committed(const std::string& checkpoints);

class K8sRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> argv = {"/usr/bin/unshare", "--mount", "--uts", "/bin/true"};
    if (geteuid() != 0) argv.insert(argv.begin() + 1, "--map-root-user");
    const testing::CommandResult probe = testing::RunCommand(argv);
    if (probe.code != 0) {
      if (geteuid() == 0) FAIL() << "unshare --mount --uts does not work here: " << probe.all();
      GTEST_SKIP() << "mount namespaces need root or user namespaces: " << probe.all();
    }
    dir_ = ::testing::TempDir() + "/k8s_run_" + std::to_string(getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Renders the job and its Secrets as a user would, and returns the cluster to run them.
  std::unique_ptr<LocalCluster> Render(const std::string& job, const std::string& name) {
    const testing::CommandResult render =
        testing::RunCommand({HYREC_BUILD_DIR "/hyrec-k8s", "render", "--config=" + job, "--name=" + name,
                             std::string("--image=") + kImage, "--overlay=local"});
    EXPECT_EQ(render.code, 0) << render.all();
    const std::string secrets = dir_ + "/" + name + "-secrets.yaml";
    const testing::CommandResult certs =
        testing::RunCommand({HYREC_BUILD_DIR "/hyrec-certs", "--dir=" + dir_ + "/" + name + "-certs", "--config=" + job,
                             "--k8s=" + name, "--k8s_out=" + secrets});
    EXPECT_EQ(certs.code, 0) << certs.all();
    return std::make_unique<LocalCluster>(LoadAll(render.out), LoadAll(Slurp(secrets)), dir_ + "/" + name);
  }

  // Runs a two-worker job as `name` and SIGKILLs worker `rank`'s pod (a lost pod: no grace, no
  // disruption condition) once the first checkpoint is committed; *cluster keeps its logs.
  ClusterResult RunKillingWorker(const std::string& name, int rank, std::unique_ptr<LocalCluster>* cluster) {
    const std::string job = dir_ + "/job.yaml";
    std::ofstream(job) << JobText(2, "unused-on-the-cluster");
    *cluster = Render(job, name);
    const std::string checkpoints = (*cluster)->state() + "/checkpoints";
    bool killed = false;
    const ClusterResult result = (*cluster)->Run(absl::Minutes(4), [&](LocalCluster& c) {
      if (killed || !Committed(checkpoints)) return;
      Pod* worker = c.Find(absl::StrCat(name, "-workers-0-", rank));
      ASSERT_NE(worker, nullptr);
      worker->process->Signal(SIGKILL);
      killed = true;
    });
    EXPECT_TRUE(killed) << "no checkpoint committed before the end\n" << (*cluster)->Logs();
    return result;
  }

  std::string dir_;
};

TEST_F(K8sRunTest, TheManifestsTrainAsTrainProcessesDoes) {
  const std::string job = dir_ + "/job.yaml";
  std::ofstream(job) << JobText(1, dir_ + "/processes-checkpoints");
  const std::string report = dir_ + "/processes-report.yaml";
  const testing::CommandResult processes =
      testing::RunCommand({HYREC_BUILD_DIR "/hyrec-train", "--processes", "--config=" + job, "--report=" + report,
                           "--plot=", "--progress=lines"});
  ASSERT_EQ(processes.code, 0) << processes.all();
  std::unique_ptr<LocalCluster> cluster = Render(job, "parity");
  const ClusterResult result = cluster->Run(absl::Minutes(3), nullptr);
  ASSERT_TRUE(result.succeeded) << result.why << "\n" << cluster->Logs();
  EXPECT_EQ(result.restarts, 0);
  const YAML::Node expected = YAML::LoadFile(report);
  const YAML::Node got = YAML::LoadFile(cluster->state() + "/report.yaml");
  EXPECT_EQ(got["samples"].as<uint64_t>(), expected["samples"].as<uint64_t>());
  EXPECT_EQ(got["first_loss"].as<double>(), expected["first_loss"].as<double>());
  EXPECT_EQ(got["auc"].as<double>(), expected["auc"].as<double>());
  EXPECT_EQ(got["dense_fingerprint"].as<std::string>(), expected["dense_fingerprint"].as<std::string>());
  // The pods' checkpoints went to the claim, under the job's rendered checkpoint.dir.
  EXPECT_FALSE(ListCheckpointDirs(Env::Default(), cluster->state() + "/checkpoints", kCheckpointPrefix).empty());
}

// Whether `checkpoints` holds a committed checkpoint.
bool Committed(const std::string& checkpoints) {
  for (const std::string& d : ListCheckpointDirs(Env::Default(), checkpoints, kCheckpointPrefix)) {
    if (Env::Default()->FileExists(JoinPath(JoinPath(checkpoints, d), kManifestName))) return true;
  }
  return false;
}

// Worker 0's pod lost: it hosts the workers' group, so its peers cannot heal. Its Job starts it
// again in the same attempt; the new worker 0 sees that and fails (transient), the workers' Job
// fails, the JobSet restarts every role, each resumes from the latest checkpoint, and the job
// finishes.
TEST_F(K8sRunTest, AKilledWorkerZeroPodRestartsTheJobSetWhichResumesAndFinishes) {
  std::unique_ptr<LocalCluster> cluster;
  const ClusterResult result = RunKillingWorker("chaos", 0, &cluster);
  ASSERT_TRUE(result.succeeded) << result.why << "\n" << cluster->Logs();
  EXPECT_EQ(result.restarts, 1);
  EXPECT_EQ(result.pod_restarts, 1);
  EXPECT_TRUE(absl::StrContains(cluster->Logs(), "worker 0 was lost in restart attempt 0")) << cluster->Logs();
  const YAML::Node report = YAML::LoadFile(cluster->state() + "/report.yaml");
  EXPECT_GT(report["resumed_step"].as<int>(), 0) << "the restarted job did not resume from a checkpoint";
  // The restarted shards loaded their rows from it too (--resume=auto), not fresh ones, and not
  // from their update logs (those belong to the earlier attempt).
  EXPECT_TRUE(absl::StrContains(cluster->Logs(), "--resume=auto: resuming from the newest checkpoint"))
      << cluster->Logs();
  EXPECT_TRUE(absl::StrContains(cluster->Logs(), "restored from /var/lib/hyrec/checkpoints/")) << cluster->Logs();
  // Every sample of the epoch is trained once across the two runs (steps of two batches).
  EXPECT_EQ(report["samples"].as<uint64_t>(), 25600u);
  EXPECT_GT(report["auc"].as<double>(), 0.6);
}

// Worker 1's pod lost: the workers' Job starts it again in place (backoffLimitPerIndex), it joins
// worker 0's group in its next generation and takes the dense state from it, and the job finishes
// in its first attempt without a rollback, every sample trained once.
TEST_F(K8sRunTest, AKilledWorkerPodIsReplacedAloneAndHealsFromItsPeer) {
  std::unique_ptr<LocalCluster> cluster;
  const ClusterResult result = RunKillingWorker("heal", 1, &cluster);
  ASSERT_TRUE(result.succeeded) << result.why << "\n" << cluster->Logs();
  EXPECT_EQ(result.restarts, 0) << "the whole JobSet was restarted";
  EXPECT_EQ(result.job_restarts, 0);
  EXPECT_EQ(result.pod_restarts, 1);
  EXPECT_TRUE(absl::StrContains(cluster->Logs(), "in place of a lost worker")) << cluster->Logs();
  const YAML::Node report = YAML::LoadFile(cluster->state() + "/report.yaml");
  EXPECT_EQ(report["resumed_step"].as<int>(-1), 0) << "the workers were restarted from a checkpoint";
  EXPECT_EQ(report["heals"].as<int>(), 1);
  EXPECT_EQ(report["samples"].as<uint64_t>(), 25600u);
  EXPECT_GT(report["auc"].as<double>(), 0.6);
}

// A lost PS pod, then a lost loader pod: each child Job is restarted alone (the shard recovers
// from its update log, the loader resumes each worker where its stream stands), the workers wait
// for them and go on, and the job finishes in its first attempt, every sample trained once.
TEST_F(K8sRunTest, KilledPsAndLoaderPodsAreRestartedAloneAndTheJobFinishes) {
  const std::string job = dir_ + "/job.yaml";
  std::ofstream(job) << JobText(2, "unused-on-the-cluster", 4 * 25600);
  std::unique_ptr<LocalCluster> cluster = Render(job, "heal");
  const std::string checkpoints = cluster->state() + "/checkpoints";
  int killed = 0;
  absl::Time next = absl::InfiniteFuture();
  const ClusterResult result = cluster->Run(absl::Minutes(4), [&](LocalCluster& c) {
    if (killed == 0 && Committed(checkpoints)) {
      Pod* ps = c.Find("heal-ps-1-0");
      ASSERT_NE(ps, nullptr);
      ps->process->Signal(SIGKILL);
      killed = 1;
    } else if (killed == 1 && next == absl::InfiniteFuture()) {
      Pod* ps = c.Find("heal-ps-1-0");  // Its new pod, once it serves again.
      if (ps != nullptr && ps->ready) next = absl::Now() + absl::Seconds(1);
    } else if (killed == 1 && absl::Now() > next) {
      Pod* loader = c.Find("heal-loader-0-0");
      ASSERT_NE(loader, nullptr);
      loader->process->Signal(SIGKILL);
      killed = 2;
    }
  });
  ASSERT_TRUE(result.succeeded) << result.why << "\n" << cluster->Logs();
  EXPECT_EQ(killed, 2) << "the job ended before both faults\n" << cluster->Logs();
  EXPECT_EQ(result.restarts, 0) << "the whole JobSet was restarted";
  EXPECT_EQ(result.job_restarts, killed);
  const YAML::Node report = YAML::LoadFile(cluster->state() + "/report.yaml");
  EXPECT_EQ(report["resumed_step"].as<int>(0), 0) << "the workers were restarted";
  EXPECT_TRUE(absl::StrContains(cluster->Logs(), "this shard was lost alone; recovering from its update log"))
      << cluster->Logs();
  EXPECT_EQ(report["samples"].as<uint64_t>(), 4u * 25600);
  EXPECT_GT(report["auc"].as<double>(), 0.6);
}

}  // namespace
}  // namespace hyrec
