// Kubernetes manifests rendered from a job's plan (`hyrec k8s render`, docs/deploy-gke.md).
//
// Every object comes from the plan, so the cluster cannot drift from the job file: the PS shards,
// the loader and the workers with the job file (a ConfigMap, its `cluster` addresses the pods'
// stable DNS names, its paths the pods' mounts), their certificates (Secrets that `hyrec certs
// --k8s` writes), resources sized from the tables' capacities, probes, the failure policy keyed on
// hyrec's exit codes, and the volume the checkpoints go to.
//
//   HYREC_ASSIGN_OR_RETURN(job::JobSpec spec, job::LoadJobSpec("examples/configs/user-item.yaml"));
//   K8sOptions options;
//   options.image = "us-docker.pkg.dev/p/hyrec/hyrec@sha256:...";  // pinned by digest
//   options.overlay = "gke";
//   HYREC_ASSIGN_OR_RETURN(K8sRender r, RenderK8s(spec, options));
//   std::cout << r.yaml;  // kubectl apply -f -
//
// Topology (api "jobset", JobSet v1alpha2): replicated jobs `ps` (one child Job per shard, so a
// failure policy can restart one shard), `loader`, and `workers` (one Indexed Job: RANK from the
// completion index, started once every shard is Ready). api "plain", for clusters without JobSet:
// a StatefulSet for the PS shards, Indexed Jobs for the loader and the workers, a headless
// Service and a claim for the state volume.
#ifndef HYREC_DEPLOY_K8S_H_
#define HYREC_DEPLOY_K8S_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/enum_names.h"
#include "hyrec/common/security.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/job/job_spec.h"

namespace hyrec::deploy {

// Where the image puts hyrec (`cmake --install build --prefix /opt/hyrec`, the Dockerfile) and
// where pods mount what they read and write.
inline constexpr char kK8sBinary[] = "/opt/hyrec/bin/hyrec";
inline constexpr char kK8sJobDir[] = "/etc/hyrec/job";      // The ConfigMap: job.yaml.
inline constexpr char kK8sCertsDir[] = "/etc/hyrec/certs";  // This pod's identity and ca.pem.
inline constexpr char kK8sStateDir[] = "/var/lib/hyrec";    // The shared volume: checkpoints, exports.
// A PS pod's disk tier (ps.disk): an emptyDir of ps.disk.capacity_bytes, on the node's local SSD
// where its pool's nodes keep ephemeral storage there (GKE's local-SSD machine shapes).
inline constexpr char kK8sDiskDir[] = "/var/lib/hyrec-disk";
// Where the loader and the workers see K8sOptions::gcs_bucket (read-only, GKE's Cloud Storage FUSE).
inline constexpr char kK8sGcsDir[] = "/mnt/gcs";
inline constexpr int kK8sHealthPort = 8081;
inline constexpr int kK8sMetricsPort = 9090;

enum class K8sOverlay { kLocal, kGke };  // local: kind, minikube.
inline constexpr EnumName<K8sOverlay> kK8sOverlayNames[] = {{K8sOverlay::kLocal, "local"}, {K8sOverlay::kGke, "gke"}};
enum class K8sApi { kJobSet, kPlain };  // plain: no JobSet controller in the cluster.
inline constexpr EnumName<K8sApi> kK8sApiNames[] = {{K8sApi::kJobSet, "jobset"}, {K8sApi::kPlain, "plain"}};
// The image's LibTorch: kCpu (the Dockerfile's default: Debian's CPU LibTorch) or kCuda (built
// against a CUDA LibTorch, docs/deploy-gke.md "GPU image").
enum class ImageVariant { kCpu, kCuda };
inline constexpr EnumName<ImageVariant> kImageVariantNames[] = {{ImageVariant::kCpu, "cpu"},
                                                                {ImageVariant::kCuda, "cuda"}};

struct K8sOptions {
  // The container image, pinned by digest: "REPO@sha256:<64 hex digits>" (required).
  std::string image;
  K8sOverlay overlay = K8sOverlay::kLocal;
  K8sApi api = K8sApi::kJobSet;
  // The job's name: a DNS label (lower-case letters, digits, '-'), at most 40 characters, since
  // pod names add to it. Required.
  std::string name;
  std::string namespace_name;  // Empty: kubectl's current namespace.
  std::string queue;           // A Kueue LocalQueue: the kueue.x-k8s.io/queue-name label; empty: none.
  int max_restarts = 3;        // JobSet restarts after transient failures before the job fails.
  // The state volume (checkpoints, exports): its size and storage class (empty: the overlay's).
  std::string storage_size;
  std::string storage_class;
  // Machine types of the node pools (gke; empty: the overlay's defaults): PS, loader, workers.
  std::string ps_machine;
  std::string loader_machine;
  std::string worker_machine;
  // Only a cuda image is given GPUs: train.device cuda with a cpu image is refused.
  ImageVariant image_variant = ImageVariant::kCpu;
  // GPUs per worker pod; unset: 1 when the image is cuda and train.device is cuda (or auto, on
  // gke), else 0.
  std::optional<int> worker_gpus;
  // Where the pods find the job's data files (loader.source.files, eval.files, eval.test_files,
  // model.path). Each must be an absolute path under one of: kK8sStateDir (files copied onto the
  // state volume), kK8sGcsDir when gcs_bucket names a bucket (mounted read-only into the loader
  // and the workers through GKE's Cloud Storage FUSE CSI driver; gke only), or image_data_dir
  // (files baked into an image derived from hyrec's). Anything else, a relative path above all,
  // is refused naming the key, since a pod does not see the machine the render ran on.
  std::string gcs_bucket;
  std::string image_data_dir;
  // The Kubernetes service account the pods run as (empty: the namespace's default). With
  // gcs_bucket, one bound to a Google service account that may read the bucket (Workload
  // Identity).
  std::string service_account;
};

struct K8sRender {
  std::string yaml;  // Every object, as one multi-document YAML stream.
  // The job file as the pods read it (the ConfigMap's job.yaml).
  std::string job_text;
  // What the user should know (a job without periodic checkpoints restarts from the start).
  std::vector<std::string> warnings;
};

// InvalidArgument naming the option or the job's key when the job cannot run on a cluster as
// asked: an image not pinned by digest, security.mode none, a PS whose capacity needs more
// memory than a node of its pool has (or that has no capacity to size it by), an unknown overlay
// or machine type, a name that is not a DNS label, a data path the pods cannot reach, GPUs for
// a cpu image.
absl::StatusOr<K8sRender> RenderK8s(const job::JobSpec& spec, const K8sOptions& options);

// The Secret holding `role`'s certificates for job `name` ("<name>-certs-ps", ...-loader,
// ...-workers): ca.pem and every identity of the role, keys named as `hyrec certs` names the
// files. A pod mounts only its own identity's files of it.
std::string K8sSecretName(const std::string& name, Role role);

// The Secrets of job `name` from the files `hyrec certs` wrote in `certs_dir` for `workers`
// workers and `ps` shards (and loader-0): one Secret per role, as manifests (`kubectl apply -f`)
// or, with `kubectl`, as `kubectl create secret generic` commands. The CA's key and the admin
// identity are never in them. NotFound naming the file when one is missing.
absl::StatusOr<std::string> K8sSecrets(const std::string& name, const std::string& namespace_name,
                                       const std::string& certs_dir, int workers, int ps, bool kubectl);

}  // namespace hyrec::deploy

#endif  // HYREC_DEPLOY_K8S_H_
