#include <algorithm>
#include <cmath>
#include <optional>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "hyrec/common/env.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/deploy/k8s.h"
#include "hyrec/embedding_ps/table_config.h"

#include "hyrec/planner/capacity.h"
#include "src/deploy/k8s_value.h"
#include "yaml-cpp/yaml.h"

namespace hyrec::deploy {

using job::JobPlan;
using job::JobSpec;
using job::ParseJobSpecText;
using job::Plan;
using job::PsShardPlan;
using planner::AllocatableCpus;
using planner::AllocatableGiB;
using planner::FindMachineType;
using planner::GkeMachineTypes;
using planner::MachineType;
using planner::PlacePsShards;
using planner::PodRequestBytes;
using planner::PsMinCpus;
using planner::PsPlacement;
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int kPsPort = 7000;
constexpr int kLoaderPort = 7100;
constexpr int kMasterPort = 29500;
constexpr char kPoolLabel[] = "cloud.google.com/gke-nodepool";
constexpr char kInstanceLabel[] = "app.kubernetes.io/instance";
constexpr char kComponentLabel[] = "app.kubernetes.io/component";

using Machine = MachineType;

// The local overlay's one node (kind or minikube on a workstation).
const Machine kLocalNode = {"local", 4, 16, 0, 0, 0, ""};

absl::StatusOr<Machine> FindMachine(const std::string& name, const char* flag) {
  return FindMachineType(GkeMachineTypes(), name, absl::StrCat("--", flag));
}

std::string Quantity(uint64_t bytes) {
  if (bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, "Gi");
  return absl::StrCat((bytes + kMiB - 1) / kMiB, "Mi");
}

// Whole cores as "8", fractions in millicores ("500m").
std::string Millicores(double cpus) {
  const int64_t milli = std::lround(cpus * 1000);
  return milli % 1000 == 0 ? std::to_string(milli / 1000) : absl::StrCat(milli, "m");
}

// One role's pods: where they run and what they get.
struct Pool {
  Machine machine = kLocalNode;
  std::string node_pool;  // gke: the node pool's name; empty: any node.
  std::string taint;      // The pool's taint key=value (NoSchedule); empty: none.
  double cpu_request = 0.5;
  double cpu_limit = 2;
  uint64_t memory_request = kGiB;
  uint64_t memory_limit = 2 * kGiB;
  int gpus = 0;
};

enum class K8sRole { kPs, kLoader, kWorker };

// Per role: its replicated job (and Job) name, its container's name and its identities' role.
struct RoleNames {
  const char* job;
  const char* container;
  Role identity;
};
constexpr RoleNames kRoleNames[] = {
    {"ps", "ps", Role::kPs}, {"loader", "loader", Role::kLoader}, {"workers", "worker", Role::kWorker}};

const char* RoleJobName(K8sRole role) { return kRoleNames[static_cast<int>(role)].job; }
const char* ContainerName(K8sRole role) { return kRoleNames[static_cast<int>(role)].container; }
Role IdentityRole(K8sRole role) { return kRoleNames[static_cast<int>(role)].identity; }

// Everything one render needs, worked out once.
class Renderer {
 public:
  Renderer(const JobSpec& spec, const JobPlan& plan, const K8sOptions& options)
      : spec_(spec), plan_(plan), options_(options), jobset_(options.api == K8sApi::kJobSet) {}

  absl::Status Prepare();
  K8sRender Render();

 private:
  // The stable DNS name of a role's pod `index` (shard, rank; 0 for the loader).
  std::string PodHost(K8sRole role, int index) const;
  std::string JobText() const;

  KValue Metadata(const std::string& name, const std::string& component) const;
  KValue SelectorLabels(const std::string& component) const;
  KValue Env(K8sRole role) const;
  KValue Args(K8sRole role) const;
  KValue Probes(K8sRole role, KValue* container) const;
  KValue Container(K8sRole role) const;
  KValue CertsVolume(K8sRole role) const;
  KValue PodSpec(K8sRole role) const;
  KValue PodTemplate(K8sRole role) const;
  KValue PodFailurePolicy(K8sRole role) const;
  KValue JobSpecOf(K8sRole role) const;
  KValue StateClaimSpec() const;

  KValue ConfigMap(const std::string& job_text) const;
  KValue JobSet() const;
  KValue PsDisruptionBudget() const;
  std::vector<KValue> PlainObjects() const;

  int Count(K8sRole role) const;
  // Whether a lost PS shard's child Job is restarted alone: a JobSet whose shards keep update
  // logs (on the state volume), from which one recovers.
  bool ShardsRestartAlone() const { return jobset_ && spec_.ps.update_log; }
  // Whether a lost worker pod other than worker 0's is replaced alone (its index retried by the
  // workers' Job) and heals from its live peers: a JobSet of several workers with heal on.
  bool WorkersHeal() const {
    return jobset_ && Count(K8sRole::kWorker) > 1 && plan_.workers[0].heal_timeout_seconds > 0;
  }
  const Pool& PoolOf(K8sRole role) const;
  // Whether `role`'s pods mount the data bucket (--gcs_bucket): the loader and the workers, who
  // read the sources, the held-out files and the module.
  bool ReadsData(K8sRole role) const { return !options_.gcs_bucket.empty() && role != K8sRole::kPs; }
  // A PS pod of a job with a disk tier (ps.disk) mounts an emptyDir for it.
  bool HasDisk(K8sRole role) const { return role == K8sRole::kPs && !spec_.ps.disk_dir.empty(); }
  absl::Status PreparePools();

  const JobSpec& spec_;
  const JobPlan& plan_;
  const K8sOptions& options_;
  const bool jobset_;
  Pool ps_pool_, loader_pool_, worker_pool_;
  std::string storage_size_, storage_class_;
  int startup_failures_ps_ = 60;  // startupProbe failureThreshold at a 10 s period.
  std::vector<std::string> warnings_;
};

int Renderer::Count(K8sRole role) const {
  switch (role) {
    case K8sRole::kPs:
      return static_cast<int>(plan_.ps.size());
    case K8sRole::kLoader:
      return 1;
    case K8sRole::kWorker:
      return static_cast<int>(plan_.workers.size());
  }
  return 0;
}

const Pool& Renderer::PoolOf(K8sRole role) const {
  return role == K8sRole::kPs ? ps_pool_ : role == K8sRole::kLoader ? loader_pool_ : worker_pool_;
}

std::string Renderer::PodHost(K8sRole role, int index) const {
  const std::string& n = options_.name;
  if (jobset_) {
    // <jobset>-<replicated job>-<job index>-<pod index>.<subdomain = the JobSet's name>
    if (role == K8sRole::kPs) return absl::StrCat(n, "-ps-", index, "-0.", n);
    if (role == K8sRole::kLoader) return absl::StrCat(n, "-loader-0-0.", n);
    return absl::StrCat(n, "-workers-0-", index, ".", n);
  }
  // A StatefulSet's pods are <set>-<ordinal>; an Indexed Job's pods <job>-<index>; all under
  // the headless Service named after the job.
  if (role == K8sRole::kPs) return absl::StrCat(n, "-ps-", index, ".", n);
  if (role == K8sRole::kLoader) return absl::StrCat(n, "-loader-0.", n);
  return absl::StrCat(n, "-workers-", index, ".", n);
}

absl::Status Renderer::PreparePools() {
  const bool gke = options_.overlay == K8sOverlay::kGke;
  const std::string device = absl::AsciiStrToLower(spec_.train.device);
  const bool cuda_image = options_.image_variant == ImageVariant::kCuda;
  if (!cuda_image && (device == "cuda" || options_.worker_gpus.value_or(0) > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        device == "cuda" ? "train.device: cuda" : absl::StrCat("--worker_gpus=", *options_.worker_gpus),
        " needs the CUDA image (built against a CUDA LibTorch: docs/deploy-gke.md, \"GPU image\") "
        "rendered with --image_variant=cuda (the default image is CPU-only and would hold GPUs it cannot use)"));
  }
  // A worker per GPU, and only on a CUDA image: cuda asks for one; auto for one where the overlay
  // has GPU pools (gke).
  const int default_gpus = cuda_image && (device == "cuda" || (device == "auto" && gke)) ? 1 : 0;
  worker_pool_.gpus = options_.worker_gpus.value_or(default_gpus);
  if (gke) {
    HYREC_ASSIGN_OR_RETURN(
        ps_pool_.machine,
        FindMachine(options_.ps_machine.empty() ? "m3-megamem-64" : options_.ps_machine, "ps_machine"));
    HYREC_ASSIGN_OR_RETURN(
        loader_pool_.machine,
        FindMachine(options_.loader_machine.empty() ? "c3-standard-22" : options_.loader_machine, "loader_machine"));
    const std::string worker_default = worker_pool_.gpus > 0 ? "a2-highgpu-8g" : "c3-standard-44";
    HYREC_ASSIGN_OR_RETURN(
        worker_pool_.machine,
        FindMachine(options_.worker_machine.empty() ? worker_default : options_.worker_machine, "worker_machine"));
    ps_pool_.node_pool = "hyrec-ps";
    ps_pool_.taint = "hyrec.io/pool=ps";
    loader_pool_.node_pool = "hyrec-loader";
    loader_pool_.taint = "hyrec.io/pool=loader";
    worker_pool_.node_pool = worker_pool_.gpus > 0 ? "hyrec-gpu" : "hyrec-cpu";
    if (worker_pool_.gpus > 0) worker_pool_.taint = "nvidia.com/gpu=present";
  } else if (!options_.ps_machine.empty() || !options_.loader_machine.empty() || !options_.worker_machine.empty()) {
    return absl::InvalidArgumentError("--ps_machine, --loader_machine and --worker_machine need --overlay=gke");
  }
  if (worker_pool_.gpus > worker_pool_.machine.gpus && gke) {
    return absl::InvalidArgumentError(absl::StrCat("--worker_gpus=", worker_pool_.gpus, ": the worker machine ",
                                                   worker_pool_.machine.name, " has ", worker_pool_.machine.gpus,
                                                   " GPUs (train.device is ", spec_.train.device, ")"));
  }
  // Requests: a share of a node for the loader and the workers (a worker per GPU), the PS sized
  // from its capacity; limits equal requests for memory, so a pod is never killed for memory
  // another pod took.
  if (gke) {
    const Machine& w = worker_pool_.machine;
    const int per_node = std::max(1, worker_pool_.gpus > 0 ? w.gpus / worker_pool_.gpus : 1);
    worker_pool_.cpu_request = std::max(1.0, std::floor(w.cpus * 0.9 / per_node));
    worker_pool_.memory_request = static_cast<uint64_t>(AllocatableGiB(w) / per_node) * kGiB;
    // The loader: a core per parsing thread and one for serving the streams, within a node.
    loader_pool_.cpu_request =
        std::min(AllocatableCpus(loader_pool_.machine), static_cast<double>(plan_.loader.options.threads + 1));
    loader_pool_.memory_request =
        std::min<uint64_t>(static_cast<uint64_t>(AllocatableGiB(loader_pool_.machine)), 4) * kGiB;
  } else {
    worker_pool_.cpu_request = 1;
    worker_pool_.memory_request = 2 * kGiB;
  }
  for (Pool* p : {&worker_pool_, &loader_pool_, &ps_pool_}) {
    p->cpu_limit = gke ? p->cpu_request : std::max(p->cpu_request, 2.0);
    p->memory_limit = p->memory_request;
  }
  return absl::OkStatus();
}

absl::Status Renderer::Prepare() {
  if (!spec_.security.mtls) {
    return absl::InvalidArgumentError(
        "security.mode: none cannot run on a cluster (any pod that reaches a port could read and write rows); use "
        "mtls, the default, with `hyrec certs --k8s`");
  }
  HYREC_RETURN_IF_ERROR(PreparePools());
  // The PS: memory from the tables' capacities, checked against a node of its pool.
  uint64_t largest = 0;
  int largest_shard = 0;
  for (const PsShardPlan& shard : plan_.ps) {
    const uint64_t bytes = PodRequestBytes(plan_, shard.shard_index);
    if (bytes == 0) {
      return absl::InvalidArgumentError(
          "tables[].capacity_rows, ps.capacity_rows or ps.capacity_bytes: a PS shard on a cluster needs a bound to "
          "size its pod's memory (an unbounded shard grows until the node runs out)");
    }
    if (bytes > largest) {
      largest = bytes;
      largest_shard = shard.shard_index;
    }
  }
  const double allocatable = AllocatableGiB(ps_pool_.machine);
  if (static_cast<double>(largest) / kGiB > allocatable) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ps.capacity_rows / tables[].capacity_rows: PS shard %d needs %.1f GiB (rows at capacity times the store's "
        "bytes per row, plus headroom), more than a %s node offers (%.0f GiB); raise ps.shards or lower the "
        "capacities%s",
        largest_shard, static_cast<double>(largest) / kGiB, ps_pool_.machine.name, allocatable,
        options_.overlay == K8sOverlay::kGke ? ", or choose a larger --ps_machine" : ""));
  }
  ps_pool_.memory_request = ps_pool_.memory_limit = (largest + kMiB - 1) / kMiB * kMiB;
  if (options_.overlay == K8sOverlay::kGke) {  // As `hyrec plan` places them: several shards may share a node.
    const PsPlacement placement =
        PlacePsShards(ps_pool_.machine, static_cast<int>(plan_.ps.size()), largest, PsMinCpus(plan_),
                      spec_.ps.disk_dir.empty() ? 0 : spec_.ps.disk_capacity_bytes);
    ps_pool_.cpu_request = ps_pool_.cpu_limit = placement.cpus_per_pod;
  }
  // A restore reads the shard's rows and their optimizer state; the startup probe allows for it
  // at 50 MB/s, and never less than 10 minutes.
  const double restore_seconds = static_cast<double>(largest) / 50e6;
  startup_failures_ps_ = static_cast<int>(std::ceil(std::max(600.0, 3 * restore_seconds) / 10));
  const bool gke = options_.overlay == K8sOverlay::kGke;
  storage_size_ = !options_.storage_size.empty() ? options_.storage_size : gke ? "1Ti" : "10Gi";
  storage_class_ = !options_.storage_class.empty() ? options_.storage_class : gke ? "standard-rwx" : "";
  if (spec_.checkpoint.every_steps == 0 && spec_.checkpoint.every_seconds == 0) {
    warnings_.push_back(
        "checkpoint.every_steps and checkpoint.every_seconds are 0: after a failure the job restarts from its "
        "start; set one of them");
  }
  return absl::OkStatus();
}

// The job file as the pods read it: the user's, with the cluster's addresses, the volume's
// checkpoint and export directories and the mounted certificates.
std::string Renderer::JobText() const {
  YAML::Node root = YAML::Load(spec_.text);
  YAML::Node cluster = root["cluster"];
  YAML::Node ps(YAML::NodeType::Sequence);
  for (int i = 0; i < Count(K8sRole::kPs); ++i) ps.push_back(absl::StrCat(PodHost(K8sRole::kPs, i), ":", kPsPort));
  cluster["ps"] = ps;
  cluster["loader"] = absl::StrCat(PodHost(K8sRole::kLoader, 0), ":", kLoaderPort);
  cluster["master"] = absl::StrCat(PodHost(K8sRole::kWorker, 0), ":", kMasterPort);
  root["checkpoint"]["dir"] = absl::StrCat(kK8sStateDir, "/checkpoints");
  const YAML::Node ps_section = static_cast<const YAML::Node&>(root)["ps"];
  const YAML::Node log = ps_section && ps_section.IsMap() ? ps_section["update_log"] : YAML::Node();
  if (log && log.IsMap() && log["dir"]) {
    root["ps"]["update_log"]["dir"] = absl::StrCat(kK8sStateDir, "/update-log");  // Durable, beside the checkpoints.
  }
  if (!spec_.serving.dir.empty()) root["export"]["dir"] = absl::StrCat(kK8sStateDir, "/exports");
  if (!spec_.ps.disk_dir.empty()) root["ps"]["disk"]["dir"] = kK8sDiskDir;  // The PS pods' own emptyDir.
  root["security"]["dir"] = kK8sCertsDir;
  YAML::Emitter out;
  out << root;
  return absl::StrCat("# Rendered by `hyrec k8s render` from the job file; edit that, not this.\n", out.c_str(), "\n");
}

KValue Renderer::SelectorLabels(const std::string& component) const {
  KValue labels = KValue::Map({{kInstanceLabel, options_.name}});
  if (!component.empty()) labels.Set(kComponentLabel, component);
  return labels;
}

KValue Renderer::Metadata(const std::string& name, const std::string& component) const {
  KValue m = KValue::Map({{"name", name}});
  if (!options_.namespace_name.empty()) m.Set("namespace", options_.namespace_name);
  KValue labels = KValue::Map({{"app.kubernetes.io/name", "hyrec"}});
  labels.Set(kInstanceLabel, options_.name);
  if (!component.empty()) labels.Set(kComponentLabel, component);
  m.Set("labels", labels);
  return m;
}

KValue FieldEnv(const std::string& name, const std::string& path) {
  return KValue::Map({{"name", name}, {"valueFrom", KValue::Map({{"fieldRef", KValue::Map({{"fieldPath", path}})}})}});
}

KValue Renderer::Env(K8sRole role) const {
  KValue env = KValue::List();
  env.Append(FieldEnv("POD_IP", "status.podIP"));
  // getaddrinfo, so that names resolve as the pod's resolver says (search domains, /etc/hosts).
  env.Append(KValue::Map({{"name", "GRPC_DNS_RESOLVER"}, {"value", "native"}}));
  if (role == K8sRole::kPs) {
    env.Append(FieldEnv("SHARD_INDEX", jobset_ ? "metadata.labels['jobset.sigs.k8s.io/job-index']"
                                               : "metadata.labels['apps.kubernetes.io/pod-index']"));
  }
  if ((role == K8sRole::kPs && ShardsRestartAlone()) || (role == K8sRole::kWorker && WorkersHeal())) {
    env.Append(FieldEnv("RESTART_ATTEMPT", "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"));
  }
  if (role == K8sRole::kWorker) {
    env.Append(FieldEnv("RANK", "metadata.annotations['batch.kubernetes.io/job-completion-index']"));
    env.Append(KValue::Map({{"name", "WORLD_SIZE"}, {"value", std::to_string(Count(K8sRole::kWorker))}}));
    if (worker_pool_.gpus > 0) {
      env.Append(KValue::Map({{"name", "NCCL_SOCKET_IFNAME"}, {"value", "eth0"}}));
      env.Append(KValue::Map({{"name", "NCCL_DEBUG"}, {"value", "WARN"}}));
      env.Append(KValue::Map({{"name", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}, {"value", "1"}}));
      env.Append(KValue::Map({{"name", "NCCL_ASYNC_ERROR_HANDLING"}, {"value", "1"}}));
    }
  }
  return env;
}

KValue Renderer::Args(K8sRole role) const {
  const std::string config = absl::StrCat("--config=", kK8sJobDir, "/job.yaml");
  KValue args = KValue::List();
  switch (role) {
    case K8sRole::kPs:
      args = KValue::List({"ps", config, "--shard_index=$(SHARD_INDEX)"});
      if (ShardsRestartAlone()) args.Append("--restart_attempt=$(RESTART_ATTEMPT)");
      break;
    case K8sRole::kLoader:
      args = KValue::List({"loader", config});
      break;
    case K8sRole::kWorker:
      // Worker 0 writes the run's summary as YAML beside the checkpoints (the others none).
      args = KValue::List(
          {"worker", config, "--progress=lines", "--plot=", absl::StrCat("--report=", kK8sStateDir, "/report.yaml")});
      if (WorkersHeal()) args.Append("--restart_attempt=$(RESTART_ATTEMPT)");
      break;
  }
  for (const char* flag : {"--resume=auto", "--health_host=$(POD_IP)"}) args.Append(flag);
  args.Append(absl::StrCat("--health_port=", kK8sHealthPort));
  args.Append("--metrics_host=$(POD_IP)");
  args.Append(absl::StrCat("--metrics_port=", kK8sMetricsPort));
  return args;
}

KValue GrpcProbe(int period, int failures, int timeout) {
  return KValue::Map({{"grpc", KValue::Map({{"port", kK8sHealthPort}})},
                      {"periodSeconds", period},
                      {"timeoutSeconds", timeout},
                      {"failureThreshold", failures}});
}

// startupProbe (until the role first reports SERVING: a PS after its restore, a worker once its
// peers answer), then readiness and liveness.
KValue Renderer::Probes(K8sRole role, KValue* c) const {
  const int startup_failures = role == K8sRole::kPs
                                   ? startup_failures_ps_
                                   : static_cast<int>(std::ceil(plan_.endpoints.startup_timeout_seconds / 10)) + 6;
  c->Set("startupProbe", GrpcProbe(10, startup_failures, 5));
  c->Set("readinessProbe", GrpcProbe(5, 2, 5));
  c->Set("livenessProbe", GrpcProbe(10, 6, 5));
  return *c;
}

KValue Renderer::Container(K8sRole role) const {
  const Pool& pool = PoolOf(role);
  KValue c = KValue::Map({{"name", ContainerName(role)}, {"image", options_.image}});
  c.Set("command", KValue::List({kK8sBinary}));
  c.Set("args", Args(role));
  c.Set("env", Env(role));
  KValue ports = KValue::List();
  const int service_port = role == K8sRole::kPs ? kPsPort : role == K8sRole::kLoader ? kLoaderPort : kMasterPort;
  ports.Append(
      KValue::Map({{"name", role == K8sRole::kWorker ? "rendezvous" : "grpc"}, {"containerPort", service_port}}));
  ports.Append(KValue::Map({{"name", "health"}, {"containerPort", kK8sHealthPort}}));
  ports.Append(KValue::Map({{"name", "metrics"}, {"containerPort", kK8sMetricsPort}}));
  c.Set("ports", ports);
  KValue requests = KValue::Map({{"cpu", Millicores(pool.cpu_request)}, {"memory", Quantity(pool.memory_request)}});
  KValue limits = KValue::Map({{"cpu", Millicores(pool.cpu_limit)}, {"memory", Quantity(pool.memory_limit)}});
  if (HasDisk(role)) {  // The tier's file and /tmp, on the node's ephemeral storage.
    const uint64_t ephemeral = spec_.ps.disk_capacity_bytes + (uint64_t{1} << 30);
    requests.Set("ephemeral-storage", Quantity(ephemeral));
    limits.Set("ephemeral-storage", Quantity(ephemeral));
  }
  if (role == K8sRole::kWorker && pool.gpus > 0) {
    limits.Set("nvidia.com/gpu", pool.gpus);
    requests.Set("nvidia.com/gpu", pool.gpus);
  }
  c.Set("resources", KValue::Map({{"requests", requests}, {"limits", limits}}));
  Probes(role, &c);
  c.Set("securityContext", KValue::Map({{"allowPrivilegeEscalation", false},
                                        {"readOnlyRootFilesystem", true},
                                        {"capabilities", KValue::Map({{"drop", KValue::List({"ALL"})}})}}));
  KValue mounts = KValue::List();
  mounts.Append(KValue::Map({{"name", "job"}, {"mountPath", kK8sJobDir}, {"readOnly", true}}));
  KValue certs = KValue::Map({{"name", "certs"}, {"mountPath", kK8sCertsDir}, {"readOnly", true}});
  // The Secret holds every identity of the role, each in a directory of its own; the container
  // sees only its own.
  if (role == K8sRole::kPs) certs.Set("subPathExpr", "ps-$(SHARD_INDEX)");
  if (role == K8sRole::kWorker) certs.Set("subPathExpr", "worker-$(RANK)");
  if (role == K8sRole::kLoader) certs.Set("subPath", "loader-0");
  mounts.Append(certs);
  mounts.Append(KValue::Map({{"name", "state"}, {"mountPath", kK8sStateDir}}));
  mounts.Append(KValue::Map({{"name", "tmp"}, {"mountPath", "/tmp"}}));
  if (HasDisk(role)) mounts.Append(KValue::Map({{"name", "disk"}, {"mountPath", kK8sDiskDir}}));
  if (ReadsData(role)) mounts.Append(KValue::Map({{"name", "gcs"}, {"mountPath", kK8sGcsDir}, {"readOnly", true}}));
  c.Set("volumeMounts", mounts);
  return c;
}

KValue Renderer::CertsVolume(K8sRole role) const {
  KValue items = KValue::List();
  const bool serves = role != K8sRole::kWorker;
  for (int i = 0; i < Count(role); ++i) {
    const std::string id = IdentityName(Identity{IdentityRole(role), i});
    items.Append(KValue::Map({{"key", "ca.pem"}, {"path", absl::StrCat(id, "/ca.pem")}}));
    items.Append(KValue::Map({{"key", id + ".pem"}, {"path", absl::StrCat(id, "/", id, ".pem")}}));
    items.Append(KValue::Map({{"key", id + ".key"}, {"path", absl::StrCat(id, "/", id, ".key")}}));
    if (serves && spec_.security.tokens) {
      items.Append(KValue::Map({{"key", "token.secret"}, {"path", absl::StrCat(id, "/token.secret")}}));
    }
  }
  // 0440 (octal) and the pod's fsGroup: the non-root user reads its key, nobody else.
  return KValue::Map({{"name", "certs"},
                      {"secret", KValue::Map({{"secretName", K8sSecretName(options_.name, IdentityRole(role))},
                                              {"defaultMode", 288},
                                              {"items", items}})}});
}

KValue Renderer::PodSpec(K8sRole role) const {
  const Pool& pool = PoolOf(role);
  KValue spec = KValue::Map();
  if (!jobset_) {
    spec.Set("subdomain", options_.name);
    if (role == K8sRole::kPs) spec = KValue::Map();  // A StatefulSet names its pods itself.
  }
  spec.Set("restartPolicy", role == K8sRole::kPs && !jobset_ ? "Always" : "Never");
  const int grace = static_cast<int>(std::ceil(spec_.checkpoint.timeout_seconds)) + 60;
  spec.Set("terminationGracePeriodSeconds", grace);
  spec.Set("enableServiceLinks", false);
  if (!options_.service_account.empty()) spec.Set("serviceAccountName", options_.service_account);
  spec.Set("automountServiceAccountToken", false);
  spec.Set("securityContext", KValue::Map({{"runAsNonRoot", true},
                                           {"runAsUser", 10001},
                                           {"runAsGroup", 10001},
                                           {"fsGroup", 10001},
                                           {"seccompProfile", KValue::Map({{"type", "RuntimeDefault"}})}}));
  if (!pool.node_pool.empty()) {
    KValue selector = KValue::Map({{kPoolLabel, pool.node_pool}});
    if (pool.gpus > 0 && role == K8sRole::kWorker) {
      selector.Set("cloud.google.com/gke-accelerator", pool.machine.accelerator);
    }
    spec.Set("nodeSelector", selector);
  }
  if (!pool.taint.empty()) {
    const size_t eq = pool.taint.find('=');
    spec.Set("tolerations", KValue::List({KValue::Map({{"key", pool.taint.substr(0, eq)},
                                                       {"operator", "Equal"},
                                                       {"value", pool.taint.substr(eq + 1)},
                                                       {"effect", "NoSchedule"}})}));
  }
  spec.Set("containers", KValue::List({Container(role)}));
  KValue volumes = KValue::List();
  volumes.Append(KValue::Map({{"name", "job"}, {"configMap", KValue::Map({{"name", options_.name + "-job"}})}}));
  volumes.Append(CertsVolume(role));
  if (!jobset_) {  // JobSet adds the claim of its volumeClaimPolicies itself.
    volumes.Append(KValue::Map(
        {{"name", "state"}, {"persistentVolumeClaim", KValue::Map({{"claimName", "state-" + options_.name}})}}));
  }
  volumes.Append(KValue::Map({{"name", "tmp"}, {"emptyDir", KValue::Map({{"sizeLimit", "1Gi"}})}}));
  if (HasDisk(role)) {
    volumes.Append(KValue::Map(
        {{"name", "disk"}, {"emptyDir", KValue::Map({{"sizeLimit", Quantity(spec_.ps.disk_capacity_bytes)}})}}));
  }
  if (ReadsData(role)) {
    volumes.Append(
        KValue::Map({{"name", "gcs"},
                     {"csi", KValue::Map({{"driver", "gcsfuse.csi.storage.gke.io"},
                                          {"readOnly", true},
                                          {"volumeAttributes", KValue::Map({{"bucketName", options_.gcs_bucket},
                                                                            {"mountOptions", "implicit-dirs"}})}})}}));
  }
  spec.Set("volumes", volumes);
  return spec;
}

KValue Renderer::PodTemplate(K8sRole role) const {
  KValue labels = KValue::Map({{"app.kubernetes.io/name", "hyrec"}});
  labels.Set(kInstanceLabel, options_.name);
  labels.Set(kComponentLabel, RoleJobName(role));
  KValue annotations = KValue::Map({{"prometheus.io/scrape", "true"},
                                    {"prometheus.io/port", std::to_string(kK8sMetricsPort)},
                                    {"prometheus.io/path", "/metrics"}});
  // GKE injects the Cloud Storage FUSE sidecar into pods that ask for it.
  if (ReadsData(role)) annotations.Set("gke-gcsfuse/volumes", "true");
  return KValue::Map(
      {{"metadata", KValue::Map({{"labels", labels}, {"annotations", annotations}})}, {"spec", PodSpec(role)}});
}

// hyrec's exit codes, read by the Job controller: 2 (invalid input; a retry fails the same way)
// fails the Job at once, and the JobSet with it; a pod lost to a disruption (preemption,
// eviction, a node drain) is not counted; any other failure (3, transient; a lost pod) fails the
// Job, which the JobSet restarts.
KValue Renderer::PodFailurePolicy(K8sRole role) const {
  const auto on_exit = [&](const char* action, KValue codes) {
    return KValue::Map(
        {{"action", action},
         {"onExitCodes",
          KValue::Map({{"containerName", ContainerName(role)}, {"operator", "In"}, {"values", std::move(codes)}})}});
  };
  KValue rules = KValue::List();
  rules.Append(on_exit("FailJob", KValue::List({2})));  // Invalid input: no restart can help.
  // Healing workers: a worker that failed (1, 3: a lost PS past its wait, a heal that timed
  // out, worker 0 started twice in one attempt) fails its index, and so the Job, and the JobSet
  // restarts every role; one killed by a signal is retried in place (backoffLimitPerIndex) and
  // heals from its peers.
  if (role == K8sRole::kWorker && WorkersHeal()) rules.Append(on_exit("FailIndex", KValue::List({1, 3})));
  rules.Append(KValue::Map(
      {{"action", "Ignore"}, {"onPodConditions", KValue::List({KValue::Map({{"type", "DisruptionTarget"}})})}}));
  return KValue::Map({{"rules", rules}});
}

KValue Renderer::JobSpecOf(K8sRole role) const {
  const int pods = role == K8sRole::kWorker ? Count(role) : 1;
  KValue spec = KValue::Map();
  spec.Set("completionMode", "Indexed");
  spec.Set("completions", pods);
  spec.Set("parallelism", pods);
  if (role == K8sRole::kWorker && WorkersHeal()) {
    spec.Set("backoffLimitPerIndex", options_.max_restarts);
    spec.Set("maxFailedIndexes", 0);
  } else {
    spec.Set("backoffLimit", jobset_ ? 0 : options_.max_restarts);
  }
  spec.Set("podFailurePolicy", PodFailurePolicy(role));
  spec.Set("template", PodTemplate(role));
  return spec;
}

KValue Renderer::StateClaimSpec() const {
  KValue spec = KValue::Map();
  // Every role reads and writes one checkpoint directory (a cut is one directory with one
  // manifest): many nodes need the volume at once, except on a one-node local cluster.
  spec.Set("accessModes", KValue::List({options_.overlay == K8sOverlay::kGke ? "ReadWriteMany" : "ReadWriteOnce"}));
  if (!storage_class_.empty()) spec.Set("storageClassName", storage_class_);
  spec.Set("resources", KValue::Map({{"requests", KValue::Map({{"storage", storage_size_}})}}));
  return spec;
}

KValue Renderer::ConfigMap(const std::string& job_text) const {
  KValue m = KValue::Map({{"apiVersion", "v1"}, {"kind", "ConfigMap"}});
  m.Set("metadata", Metadata(options_.name + "-job", ""));
  m.Set("data", KValue::Map({{"job.yaml", job_text}}));
  return m;
}

KValue Renderer::JobSet() const {
  KValue js = KValue::Map({{"apiVersion", "jobset.x-k8s.io/v1alpha2"}, {"kind", "JobSet"}});
  KValue metadata = Metadata(options_.name, "");
  if (!options_.queue.empty()) metadata["labels"].Set("kueue.x-k8s.io/queue-name", options_.queue);
  js.Set("metadata", metadata);
  KValue spec = KValue::Map();
  spec.Set("network", KValue::Map({{"enableDNSHostnames", true}, {"publishNotReadyAddresses", true}}));
  KValue rules = KValue::List({KValue::Map({{"name", "InvalidInput"},
                                            {"action", "FailJobSet"},
                                            {"onJobFailureReasons", KValue::List({"PodFailurePolicy"})}})});
  // A lost loader, or a lost PS shard that keeps an update log, is restarted alone (its child
  // Job): the loader resumes each worker where its stream stands, the shard recovers from its
  // log, and the rest of the job waits for it and goes on. A lost worker pod other than worker
  // 0's is retried inside the workers' Job (WorkersHeal) and never fails it. Any other child
  // Job's failure (the workers') restarts the whole JobSet (the default action); every role then
  // resumes from the latest checkpoint. Both count towards maxRestarts.
  KValue alone = KValue::List({RoleJobName(K8sRole::kLoader)});
  if (ShardsRestartAlone()) alone.Append(RoleJobName(K8sRole::kPs));
  rules.Append(KValue::Map({{"name", "ServerLost"}, {"action", "RestartJob"}, {"targetReplicatedJobs", alone}}));
  spec.Set("failurePolicy", KValue::Map({{"maxRestarts", options_.max_restarts}, {"rules", rules}}));
  spec.Set("successPolicy", KValue::Map({{"operator", "All"}, {"targetReplicatedJobs", KValue::List({"workers"})}}));
  KValue claim = KValue::Map({{"metadata", KValue::Map({{"name", "state"}})}, {"spec", StateClaimSpec()}});
  spec.Set("volumeClaimPolicies",
           KValue::List({KValue::Map({{"templates", KValue::List({claim})},
                                      {"retentionPolicy", KValue::Map({{"whenDeleted", "Retain"}})}})}));
  KValue jobs = KValue::List();
  for (K8sRole role : {K8sRole::kPs, K8sRole::kLoader, K8sRole::kWorker}) {
    KValue rj = KValue::Map({{"name", RoleJobName(role)}});
    rj.Set("replicas", role == K8sRole::kPs ? Count(role) : 1);
    if (role == K8sRole::kWorker) {
      rj.Set("dependsOn", KValue::List({KValue::Map({{"name", "ps"}, {"status", "Ready"}})}));
    }
    rj.Set("template", KValue::Map({{"spec", JobSpecOf(role)}}));
    jobs.Append(rj);
  }
  spec.Set("replicatedJobs", jobs);
  js.Set("spec", spec);
  return js;
}

KValue Renderer::PsDisruptionBudget() const {
  KValue pdb = KValue::Map({{"apiVersion", "policy/v1"}, {"kind", "PodDisruptionBudget"}});
  pdb.Set("metadata", Metadata(options_.name + "-ps", "ps"));
  pdb.Set("spec",
          KValue::Map({{"maxUnavailable", 1}, {"selector", KValue::Map({{"matchLabels", SelectorLabels("ps")}})}}));
  return pdb;
}

std::vector<KValue> Renderer::PlainObjects() const {
  std::vector<KValue> out;
  KValue service = KValue::Map({{"apiVersion", "v1"}, {"kind", "Service"}});
  service.Set("metadata", Metadata(options_.name, ""));
  service.Set("spec", KValue::Map({{"clusterIP", "None"},
                                   {"publishNotReadyAddresses", true},
                                   {"selector", SelectorLabels("")},
                                   {"ports", KValue::List({KValue::Map({{"name", "grpc"}, {"port", kPsPort}})})}}));
  out.push_back(service);
  KValue claim = KValue::Map({{"apiVersion", "v1"}, {"kind", "PersistentVolumeClaim"}});
  claim.Set("metadata", Metadata("state-" + options_.name, ""));
  claim.Set("spec", StateClaimSpec());
  out.push_back(claim);
  KValue set = KValue::Map({{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"}});
  set.Set("metadata", Metadata(options_.name + "-ps", "ps"));
  KValue set_spec = KValue::Map({{"serviceName", options_.name}, {"replicas", Count(K8sRole::kPs)}});
  set_spec.Set("podManagementPolicy", "Parallel");
  set_spec.Set("selector", KValue::Map({{"matchLabels", SelectorLabels("ps")}}));
  set_spec.Set("template", PodTemplate(K8sRole::kPs));
  set.Set("spec", set_spec);
  out.push_back(set);
  for (K8sRole role : {K8sRole::kLoader, K8sRole::kWorker}) {
    KValue job = KValue::Map({{"apiVersion", "batch/v1"}, {"kind", "Job"}});
    job.Set("metadata", Metadata(absl::StrCat(options_.name, "-", RoleJobName(role)), RoleJobName(role)));
    job.Set("spec", JobSpecOf(role));
    out.push_back(job);
  }
  return out;
}

K8sRender Renderer::Render() {
  K8sRender r;
  r.job_text = JobText();
  std::vector<KValue> objects = {ConfigMap(r.job_text)};
  if (jobset_) {
    objects.push_back(JobSet());
  } else {
    for (KValue& o : PlainObjects()) objects.push_back(std::move(o));
  }
  objects.push_back(PsDisruptionBudget());
  r.yaml = absl::StrCat("# hyrec job '", options_.name, "' (", NameOf(kK8sApiNames, options_.api), ", overlay ",
                        NameOf(kK8sOverlayNames, options_.overlay),
                        "), rendered by `hyrec k8s render` from its job file: edit that and render again.\n");
  for (const KValue& o : objects) absl::StrAppend(&r.yaml, "---\n", o.Yaml());
  r.warnings = warnings_;
  return r;
}

absl::Status CheckOptions(const K8sOptions& o) {
  static const std::regex kDigest("^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$");
  if (o.image.empty()) return absl::InvalidArgumentError("--image is required (REPO@sha256:<digest>)");
  if (!std::regex_match(o.image, kDigest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--image=", o.image,
                     ": pin the image by its digest (REPO@sha256:<64 hex digits>), never by a tag such as "
                     ":latest, so that every pod and every restart runs the same build"));
  }
  static const std::regex kLabel("^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$");
  if (!std::regex_match(o.name, kLabel)) {
    return absl::InvalidArgumentError(absl::StrCat("--name='", o.name,
                                                   "': the job's name must be a DNS label of at most 40 characters "
                                                   "(lower-case letters, digits and '-', starting with a letter)"));
  }
  if (o.max_restarts < 0 || o.max_restarts > 1000) {
    return absl::InvalidArgumentError("--max_restarts must be in [0, 1000]");
  }
  if (!o.gcs_bucket.empty()) {
    static const std::regex kBucket("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$");
    if (o.overlay != K8sOverlay::kGke) {
      return absl::InvalidArgumentError(
          "--gcs_bucket needs --overlay=gke (the bucket is mounted by GKE's Cloud Storage FUSE CSI driver)");
    }
    if (!std::regex_match(o.gcs_bucket, kBucket)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gcs_bucket=", o.gcs_bucket,
                       ": a bucket's name (lower-case letters, digits, '.', '_' and '-'), not a URL"));
    }
  }
  if (!o.image_data_dir.empty() && (o.image_data_dir[0] != '/' || o.image_data_dir == "/")) {
    return absl::InvalidArgumentError(absl::StrCat("--image_data_dir=", o.image_data_dir,
                                                   ": the absolute folder the derived image holds the data in, not /"));
  }
  // The values Kubernetes would reject, refused here with the flag that gave them.
  static const std::regex kDnsLabel("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$");
  static const std::regex kLabelValue("^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$");
  static const std::regex kQuantity("^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$");
  static const std::regex kSubdomain("^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$");
  const struct {
    const char* flag;
    const std::string& value;
    const std::regex& pattern;
    const char* what;
  } values[] = {
      {"namespace", o.namespace_name, kDnsLabel,
       "a namespace is a DNS label (lower-case letters, digits, '-'; 63 at most)"},
      {"queue", o.queue, kLabelValue, "a label value (letters, digits, '.', '_', '-'; 63 at most)"},
      {"storage_size", o.storage_size, kQuantity, "a quantity such as 10Gi or 1Ti"},
      {"storage_class", o.storage_class, kSubdomain, "a Kubernetes name (lower-case letters, digits, '.', '-')"},
      {"ps_machine", o.ps_machine, kLabelValue, "a machine type (a node label value)"},
      {"loader_machine", o.loader_machine, kLabelValue, "a machine type (a node label value)"},
      {"worker_machine", o.worker_machine, kLabelValue, "a machine type (a node label value)"},
  };
  for (const auto& v : values) {
    if (!v.value.empty() && !std::regex_match(v.value, v.pattern)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", v.flag, "=", v.value, ": Kubernetes would refuse it; ", v.what));
    }
  }
  if (!o.storage_size.empty() && std::regex_match(o.storage_size, std::regex("^[0.]+[A-Za-z]*$"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--storage_size=", o.storage_size, ": the volume needs a size above 0"));
  }
  static const std::regex kAccount("^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$");
  if (!o.service_account.empty() && !std::regex_match(o.service_account, kAccount)) {
    return absl::InvalidArgumentError(absl::StrCat("--service_account=", o.service_account,
                                                   ": a Kubernetes name (lower-case letters, digits, '.', '-')"));
  }
  return absl::OkStatus();
}

// Whether `path` is `dir` or below it, as strings ("/a/b" is below "/a", "/ab" is not).
bool Below(const std::string& path, const std::string& dir) {
  if (dir.empty() || path.size() <= dir.size() || path.compare(0, dir.size(), dir) != 0) return false;
  return dir.back() == '/' || path[dir.size()] == '/';
}

// A data file of the job must be reachable from a pod: an absolute path on the state volume, in
// the mounted bucket or in the derived image's data folder; `key` names where the job says it.
absl::Status CheckPodPath(const std::string& key, const std::string& path, const K8sOptions& o) {
  const bool normal =
      !path.empty() && path[0] == '/' && path.find("/../") == std::string::npos && !absl::EndsWith(path, "/..");
  if (normal && (Below(path, kK8sStateDir) || (!o.gcs_bucket.empty() && Below(path, kK8sGcsDir)) ||
                 (!o.image_data_dir.empty() && Below(path, o.image_data_dir)))) {
    return absl::OkStatus();
  }
  std::string where = path.empty() || path[0] != '/' ? "a relative path, which a pod would look for under its working "
                                                       "directory in the image"
                                                     : "a path on no volume the pods mount";
  std::vector<std::string> choices = {absl::StrCat("copy it onto the state volume and name it under ", kK8sStateDir,
                                                   "/ (docs/deploy-gke.md, \"Your own data\")")};
  if (o.gcs_bucket.empty()) {
    choices.push_back(absl::StrCat("put it in a GCS bucket and render with --gcs_bucket=BUCKET (gke), naming it under ",
                                   kK8sGcsDir, "/"));
  } else {
    choices.push_back(absl::StrCat("name it under ", kK8sGcsDir, "/ (the bucket ", o.gcs_bucket, ")"));
  }
  choices.push_back(o.image_data_dir.empty()
                        ? std::string("bake it into an image derived from hyrec's and render with --image_data_dir=DIR")
                        : absl::StrCat("name it under ", o.image_data_dir, "/ (--image_data_dir)"));
  return absl::InvalidArgumentError(absl::StrCat(key, " '", path, "': ", where, ". On a cluster a data file must be ",
                                                 "reachable from the pods: ", absl::StrJoin(choices, "; or ")));
}

// Every file the job reads besides its own state: the sources' and the torchscript module.
absl::Status CheckPodPaths(const JobSpec& spec, const K8sOptions& o) {
  const std::vector<std::pair<std::string, const std::vector<std::string>*>> lists = {
      {"loader.source.files", &spec.loader.source.files},
      {"eval.files", &spec.eval.files},
      {"eval.test_files", &spec.eval.test_files}};
  for (const auto& [key, files] : lists) {
    for (size_t i = 0; i < files->size(); ++i) {
      HYREC_RETURN_IF_ERROR(CheckPodPath(absl::StrCat(key, "[", i, "]"), (*files)[i], o));
    }
  }
  if (!spec.model.path.empty()) HYREC_RETURN_IF_ERROR(CheckPodPath("model.path", spec.model.path, o));
  return absl::OkStatus();
}

}  // namespace

std::string K8sSecretName(const std::string& name, Role role) {
  return absl::StrCat(name, "-certs-", role == Role::kWorker ? std::string("workers") : std::string(RoleName(role)));
}

absl::StatusOr<std::string> K8sSecrets(const std::string& name, const std::string& namespace_name,
                                       const std::string& certs_dir, int workers, int ps, bool kubectl) {
  Env* env = Env::Default();
  std::string out =
      kubectl ? "" : "# The job's certificates, one Secret per role (`hyrec certs --k8s`): keep this file private.\n";
  for (auto [role, count] : {std::pair<Role, int>{Role::kPs, ps}, {Role::kLoader, 1}, {Role::kWorker, workers}}) {
    std::vector<std::string> files = {"ca.pem"};
    for (int i = 0; i < count; ++i) {
      const std::string id = IdentityName(Identity{role, i});
      files.push_back(id + ".pem");
      files.push_back(id + ".key");
    }
    if (role != Role::kWorker && env->FileExists(JoinPath(certs_dir, "token.secret"))) files.push_back("token.secret");
    const std::string secret = K8sSecretName(name, role);
    if (kubectl) {
      absl::StrAppend(&out, "kubectl create secret generic ", secret,
                      namespace_name.empty() ? "" : " --namespace=" + namespace_name);
      for (const std::string& f : files) {
        if (!env->FileExists(JoinPath(certs_dir, f)))
          return absl::NotFoundError(JoinPath(certs_dir, f) + " is missing");
        absl::StrAppend(&out, " \\\n  --from-file=", f, "=", JoinPath(certs_dir, f));
      }
      out += "\n";
      continue;
    }
    KValue data = KValue::Map();
    for (const std::string& f : files) {
      absl::StatusOr<std::string> bytes = ReadFileToString(env, JoinPath(certs_dir, f), 1 << 20);
      if (!bytes.ok()) return absl::NotFoundError(absl::StrCat(JoinPath(certs_dir, f), ": ", bytes.status().message()));
      data.Set(f, absl::Base64Escape(*bytes));
    }
    KValue metadata = KValue::Map({{"name", secret}});
    if (!namespace_name.empty()) metadata.Set("namespace", namespace_name);
    metadata.Set("labels", KValue::Map({{"app.kubernetes.io/name", "hyrec"}, {kInstanceLabel, name}}));
    KValue object = KValue::Map({{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", metadata}});
    object.Set("type", "Opaque");
    object.Set("data", data);
    absl::StrAppend(&out, "---\n", object.Yaml());
  }
  return out;
}

absl::StatusOr<K8sRender> RenderK8s(const JobSpec& spec, const K8sOptions& options) {
  HYREC_RETURN_IF_ERROR(CheckOptions(options));
  HYREC_RETURN_IF_ERROR(CheckPodPaths(spec, options));
  HYREC_ASSIGN_OR_RETURN(const JobPlan plan, Plan(spec));
  Renderer renderer(spec, plan, options);
  HYREC_RETURN_IF_ERROR(renderer.Prepare());
  K8sRender r = renderer.Render();
  // The pods' job file must plan the same job: parse and plan it as a pod will.
  absl::StatusOr<JobSpec> pods = ParseJobSpecText(r.job_text, "the rendered job.yaml");
  if (!pods.ok())
    return absl::InternalError(absl::StrCat("the rendered job file does not parse: ", pods.status().message()));
  absl::StatusOr<JobPlan> planned = Plan(*pods);
  if (!planned.ok()) {
    return absl::InternalError(absl::StrCat("the rendered job file does not plan: ", planned.status().message()));
  }
  return r;
}

}  // namespace hyrec::deploy
