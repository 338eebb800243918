// `hyrec k8s render`: the Kubernetes manifests of a job, from its plan (include/hyrec/deploy/k8s.h,
// docs/deploy-gke.md).
//
//   hyrec k8s render --config=job.yaml --name=myjob --image=REPO@sha256:... [--overlay=gke] [--out=DIR]
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/deploy/k8s.h"
#include "hyrec/job/job_spec.h"
#include "src/cli/job_flags.h"
#include "src/cli/roles.h"

namespace hyrec::cli {
namespace {

struct K8sFlags {
  std::string config;
  std::vector<std::string> overrides;  // --set
  std::string out;
  deploy::K8sOptions options;
};

absl::Status Render(const K8sFlags& f) {
  if (f.config.empty()) return absl::InvalidArgumentError("--config=JOB.yaml is required");
  HYREC_ASSIGN_OR_RETURN(const job::JobSpec spec, job::LoadJobSpec(f.config, f.overrides));
  HYREC_ASSIGN_OR_RETURN(const deploy::K8sRender rendered, deploy::RenderK8s(spec, f.options));
  for (const std::string& w : rendered.warnings) std::cerr << "hyrec k8s render: warning: " << w << "\n";
  if (f.out.empty()) {
    std::cout << rendered.yaml;
    return absl::OkStatus();
  }
  std::error_code error;
  std::filesystem::create_directories(f.out, error);
  const std::string path = absl::StrCat(f.out, "/", f.options.name, ".yaml");
  // Whole or not at all: a full disk leaves the previous file as it was, never half of this one.
  HYREC_RETURN_IF_ERROR(Annotate(WriteFileAtomically(Env::Default(), path, rendered.yaml), "--out"));
  std::cout << "wrote " << path << "\n";
  return absl::OkStatus();
}

}  // namespace

int K8sMain(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "render") {
    const bool help = argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
    (help ? std::cout : std::cerr) << "usage: hyrec k8s render --config=JOB.yaml --name=NAME --image=REPO@sha256:... "
                                      "[flags]   (hyrec k8s render --help)\n";
    return help ? kExitOk : kExitInvalidInput;
  }
  K8sFlags f;
  deploy::K8sOptions& o = f.options;
  FlagSet flags("hyrec k8s render",
                "The Kubernetes manifests of a job (JobSet, or plain StatefulSet and Jobs), rendered from its plan.");
  flags.String("config", &f.config, "FILE", "The job's YAML file (required).");
  AddSetFlag(flags, &f.overrides);
  flags.String("name", &o.name, "NAME", "The job's name on the cluster: a DNS label (required).");
  flags.String("image", &o.image, "REPO@sha256:DIGEST", "The hyrec image, pinned by digest (required).");
  flags.Enum("overlay", &o.overlay, deploy::kK8sOverlayNames, "local (kind, minikube) or gke (node pools, Filestore).");
  flags.Enum("api", &o.api, deploy::kK8sApiNames, "jobset (JobSet v1alpha2), or plain StatefulSet and Jobs.");
  flags.String("namespace", &o.namespace_name, "NAMESPACE", "The objects' namespace (default: kubectl's).");
  flags.String("queue", &o.queue, "QUEUE", "A Kueue LocalQueue (the kueue.x-k8s.io/queue-name label).");
  flags.Int("max_restarts", &o.max_restarts, "Restarts of the whole job after transient failures.", 0, 1000);
  flags.String("storage_size", &o.storage_size, "QUANTITY", "The state volume's size (default 1Ti gke, 10Gi local).");
  flags.String("storage_class", &o.storage_class, "CLASS",
               "The state volume's storage class (default standard-rwx on gke, the cluster's default on local).");
  flags.String("ps_machine", &o.ps_machine, "TYPE", "gke: the PS pool's machine type (default m3-megamem-64).");
  flags.String("loader_machine", &o.loader_machine, "TYPE", "gke: the loader pool's (default c3-standard-22).");
  flags.String("worker_machine", &o.worker_machine, "TYPE",
               "gke: the workers' (default a2-highgpu-8g with GPUs, c3-standard-44 without).");
  flags.Enum("image_variant", &o.image_variant, deploy::kImageVariantNames,
             "The image's LibTorch: cpu (the Dockerfile's default) or cuda (docs/deploy-gke.md, \"GPU image\"); only a "
             "cuda image gets GPUs.");
  int worker_gpus = -1;
  flags.Int("worker_gpus", &worker_gpus,
            "GPUs per worker pod; -1: 1 with a cuda image when train.device is cuda (or auto, on gke), else 0.", -1,
            16);
  flags.String("gcs_bucket", &o.gcs_bucket, "BUCKET",
               "gke: mount this GCS bucket read-only at /mnt/gcs in the loader and workers (Cloud Storage FUSE); "
               "data paths may then be under /mnt/gcs/.");
  flags.String("image_data_dir", &o.image_data_dir, "DIR",
               "Data baked into an image derived from hyrec's: data paths may be under DIR.");
  flags.String("service_account", &o.service_account, "NAME",
               "The pods' Kubernetes service account (with --gcs_bucket: one that may read the bucket).");
  flags.String("out", &f.out, "DIR", "Write DIR/NAME.yaml instead of printing the manifests.");
  if (std::optional<int> code = flags.ParseOrExit(argc - 1, argv + 1)) return *code;
  if (worker_gpus >= 0) o.worker_gpus = worker_gpus;
  const absl::Status status = Render(f);
  if (!status.ok()) std::cerr << "hyrec k8s render: " << status.message() << "\n";
  return ExitCodeFor(status);
}

}  // namespace hyrec::cli
