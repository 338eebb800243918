// The machine types a plan places roles on: GKE's list, a file of one's own, what a node leaves its pods.
#include "hyrec/planner/capacity.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"

namespace hyrec::planner {

double AllocatableGiB(const MachineType& machine) { return machine.memory_gib * 0.9 - 1; }

const std::vector<MachineType>& GkeMachineTypes() {
  // Published vCPUs, memory and default egress bandwidth (without Tier_1 networking).
  static const auto* types = new std::vector<MachineType>{
      {"m3-megamem-64", 64, 976, 32, 0, 0, "", 0},
      {"m3-megamem-128", 128, 1952, 32, 0, 0, "", 0},
      {"m3-ultramem-32", 32, 976, 32, 0, 0, "", 0},
      {"m3-ultramem-64", 64, 1952, 32, 0, 0, "", 0},
      {"m3-ultramem-128", 128, 3904, 32, 0, 0, "", 0},
      {"m2-megamem-416", 416, 5888, 32, 0, 0, "", 0},
      {"m2-ultramem-208", 208, 5888, 32, 0, 0, "", 0},
      {"m2-ultramem-416", 416, 11776, 32, 0, 0, "", 0},
      {"n2-highmem-32", 32, 256, 32, 0, 0, "", 0},
      // Storage-optimized, with Titanium local SSD: a PS with a disk tier (ps.disk).
      {"z3-highmem-88", 88, 704, 62, 0, 0, "", 36000},
      {"z3-highmem-176", 176, 1408, 100, 0, 0, "", 36000},
      {"c3-standard-22", 22, 88, 23, 0, 0, "", 0},
      {"c3-standard-44", 44, 176, 32, 0, 0, "", 0},
      {"c3-standard-88", 88, 352, 62, 0, 0, "", 0},
      {"c2-standard-30", 30, 120, 32, 0, 0, "", 0},
      {"c2-standard-60", 60, 240, 32, 0, 0, "", 0},
      {"e2-standard-8", 8, 32, 16, 0, 0, "", 0},
      {"a2-highgpu-1g", 12, 85, 24, 0, 1, "nvidia-tesla-a100", 0},
      {"a2-highgpu-8g", 96, 680, 100, 0, 8, "nvidia-tesla-a100", 0},
      {"a2-ultragpu-8g", 96, 1360, 100, 0, 8, "nvidia-a100-80gb", 0},
      {"a3-highgpu-8g", 208, 1872, 200, 0, 8, "nvidia-h100-80gb", 0},
      {"a3-megagpu-8g", 208, 1872, 200, 0, 8, "nvidia-h100-mega-80gb", 0},
  };
  return *types;
}

absl::StatusOr<MachineType> FindMachineType(const std::vector<MachineType>& types, const std::string& name,
                                            absl::string_view key) {
  std::vector<std::string> known;
  for (const MachineType& m : types) {
    if (m.name == name) return m;
    known.push_back(m.name);
  }
  const std::string close = ClosestWord(name, known);
  return absl::InvalidArgumentError(absl::StrCat(key, "=", name, ": not a machine type hyrec knows",
                                                 close.empty() ? "" : absl::StrCat(" (did you mean ", close, "?)"),
                                                 "; known: ", absl::StrJoin(known, ", ")));
}

absl::StatusOr<std::vector<MachineType>> LoadMachineTypes(const std::string& path) {
  HYREC_ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlFile(path));
  std::vector<MachineType> types;
  HYREC_RETURN_IF_ERROR(CatchYamlErrors(path, [&]() -> absl::Status {
    if (!root.IsSequence() || root.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": expected a list of machine types"));
    }
    for (size_t i = 0; i < root.size(); ++i) {
      const YAML::Node& node = root[i];
      const std::string at = absl::StrCat(path, ": [", i, "]");
      HYREC_RETURN_IF_ERROR(CheckKeys(
          node, at,
          {"name", "cpus", "memory_gib", "network_gbps", "price_per_hour", "gpus", "accelerator", "local_ssd_gib"}));
      MachineType m;
      for (const char* required : {"name", "cpus", "memory_gib"}) {
        if (!node[required]) {
          return absl::InvalidArgumentError(absl::StrCat(at, ".", required, " (", YamlWhere(node), "): required"));
        }
      }
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "name", at, &m.name));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "cpus", at, &m.cpus));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "memory_gib", at, &m.memory_gib));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "network_gbps", at, &m.network_gbps));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "price_per_hour", at, &m.price_per_hour));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "gpus", at, &m.gpus));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "accelerator", at, &m.accelerator));
      HYREC_RETURN_IF_ERROR(ReadScalar(node, "local_ssd_gib", at, &m.local_ssd_gib));
      if (m.name.empty() || m.cpus < 1 || !(m.memory_gib > 1) || m.network_gbps < 0 || m.price_per_hour < 0 ||
          m.gpus < 0 || !(m.local_ssd_gib >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, " (", YamlWhere(node),
            "): a machine type needs a name, cpus >= 1 and memory_gib > 1; bandwidth, price, gpus and local_ssd_gib "
            ">= 0"));
      }
      types.push_back(m);
    }
    return absl::OkStatus();
  }));
  return types;
}

double AllocatableCpus(const MachineType& machine) { return std::max(1.0, std::floor(machine.cpus * 0.9)); }

}  // namespace hyrec::planner
