// `hyrec plan --calibrate`: what this machine's PS process, store and calls cost, and its file.
#include "hyrec/planner/capacity.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/embedding_ps/client.h"

namespace hyrec::planner {

absl::StatusOr<uint64_t> ResidentBytes(int pid) { return ProcessStatusBytes(pid, "VmRSS"); }

namespace {

// A PS process of a one-table store (dim 64): its resident memory once it listens, and its growth
// beyond its rows while it serves responses of 1 MiB and then 4 MiB.
absl::Status MeasurePsProcess(const std::string& ps_binary, const std::string& dir, Calibration* c) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string job = absl::StrCat(dir, "/calibrate.yaml");
  std::ofstream(job) << "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n"
                     << "features: [f]\ntables: [{name: t, features: [f], dim: 64}]\n"
                     << "ps: {shards: 1}\nsecurity: {mode: none}\n";
  HYREC_ASSIGN_OR_RETURN(auto ps, Subprocess::Spawn({ps_binary, "--config=" + job, "--shard_index=0", "--port=0"}));
  auto measure = [&]() -> absl::Status {
    HYREC_ASSIGN_OR_RETURN(const int port, WaitForListeningPort(*ps, absl::Seconds(60)));
    HYREC_ASSIGN_OR_RETURN(c->process_bytes, ResidentBytes(ps->pid()));
    HYREC_ASSIGN_OR_RETURN(auto client, embedding_ps::ConnectEmbeddingClient({absl::StrCat("127.0.0.1:", port)}, {}));
    double serving[2] = {0, 0};
    const size_t sizes[2] = {4096, 16384};  // Rows a response: 1 MiB and 4 MiB at dim 64.
    for (int k = 0; k < 2; ++k) {
      std::vector<uint64_t> ids(sizes[k]);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = i + 1;
      std::vector<float> rows(ids.size() * 64);
      for (int call = 0; call < 30; ++call) HYREC_RETURN_IF_ERROR(client->Lookup("t", ids, absl::MakeSpan(rows)));
      HYREC_ASSIGN_OR_RETURN(const uint64_t rss, ResidentBytes(ps->pid()));
      HYREC_ASSIGN_OR_RETURN(const std::vector<embedding_ps::ShardStats> stats, client->Stats());
      serving[k] =
          static_cast<double>(rss) - static_cast<double>(c->process_bytes) - static_cast<double>(stats[0].store.bytes);
    }
    HYREC_RETURN_IF_ERROR(MeasureRpcCosts(*client, "t", 64, ps->pid(), c));
    const double mib = 1024.0 * 1024;
    c->serving_per_byte = std::max(0.0, (serving[1] - serving[0]) / (3 * mib));
    c->serving_fixed_bytes = static_cast<uint64_t>(std::max(0.0, serving[0] - c->serving_per_byte * mib));
    return absl::OkStatus();
  };
  const absl::Status status = measure();
  ps->Signal(SIGKILL);
  (void)ps->Wait(absl::Seconds(10));
  std::filesystem::remove(job, error);
  if (!status.ok()) return absl::UnavailableError(absl::StrCat(ps_binary, ": ", status.message()));
  return absl::OkStatus();
}

// The one list of a calibration file's fields: visit(key, member, digits) for each, in the order
// written, `digits` the decimals a double is written with. `C` is Calibration or its const, so
// that the writer, the reader and its key check share the list.
template <typename C, typename Visit>
void MachineFields(C& c, Visit&& visit) {
  visit("machine", c.machine, 0);
  visit("cpus", c.cpus, 0);
  visit("process_bytes", c.process_bytes, 0);
  visit("serving_fixed_bytes", c.serving_fixed_bytes, 0);
  visit("serving_per_byte", c.serving_per_byte, 3);
  visit("lookup_ns_per_row", c.lookup_ns_per_row, 2);
  visit("update_ns_per_row", c.update_ns_per_row, 2);
  visit("rpc_dim", c.rpc_dim, 0);
  visit("rpc_client_us", c.rpc_client_us, 2);
  visit("rpc_server_us", c.rpc_server_us, 2);
  visit("lookup_client_ns_per_row", c.lookup_client_ns_per_row, 2);
  visit("lookup_server_ns_per_row", c.lookup_server_ns_per_row, 2);
  visit("update_client_ns_per_row", c.update_client_ns_per_row, 2);
  visit("update_server_ns_per_row", c.update_server_ns_per_row, 2);
}
// The `step` mapping's: StepCosts.
template <typename S, typename Visit>
void StepFields(S& s, Visit&& visit) {
  visit("batch_size", s.batch_size, 0);
  visit("shards", s.shards, 0);
  visit("train_ms", s.train_ms, 4);
  visit("lookup_client_ms", s.lookup_client_ms, 4);
  visit("update_client_ms", s.update_client_ms, 4);
  visit("lookup_server_ms", s.lookup_server_ms, 4);
  visit("update_server_ms", s.update_server_ms, 4);
  visit("loader_ms", s.loader_ms, 4);
  visit("rpc_client_ms", s.rpc_client_ms, 4);
  visit("rpc_server_ms", s.rpc_server_ms, 4);
  visit("id_bytes", s.id_bytes, 4);
  visit("row_bytes", s.row_bytes, 4);
  visit("batch_bytes", s.batch_bytes, 4);
  visit("dense_bytes", s.dense_bytes, 4);
  visit("relay_ms", s.relay_ms, 4);
  visit("cores_used", s.cores_used, 4);
  visit("samples_per_second", s.samples_per_second, 4);
}

// Writes "<indent>key: value" lines for each field `fields` visits.
template <typename Fields>
void WriteFields(std::ostream& out, const char* indent, Fields&& fields) {
  fields([&](const char* key, const auto& value, int digits) {
    out << indent << key << ": ";
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(value)>>) {
      out << absl::StrFormat("%.*f", digits, value);
    } else {
      out << value;
    }
    out << "\n";
  });
}

// Checks `node`'s keys against the fields `fields` visits, then reads each one present.
template <typename Fields>
absl::Status ReadFields(const YAML::Node& node, const std::string& at, Fields&& fields,
                        std::vector<std::string> also_allowed = {}) {
  std::vector<std::string> keys = std::move(also_allowed);
  fields([&](const char* key, auto&, int) { keys.push_back(key); });
  HYREC_RETURN_IF_ERROR(CheckKeys(node, at, keys));
  absl::Status status;
  fields([&](const char* key, auto& value, int) {
    if (status.ok()) status = ReadScalar(node, key, at, &value);
  });
  return status;
}

}  // namespace

absl::StatusOr<Calibration> Calibrate(const std::string& ps_binary, const std::string& scratch_dir) {
  Calibration c;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  c.machine = host;
  c.cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  HYREC_RETURN_IF_ERROR(MeasurePsProcess(ps_binary, scratch_dir, &c));
  embedding_ps::TableConfig table;
  table.name = "t";
  table.dim = 16;
  table.optimizer.kind = embedding_ps::OptimizerKind::kAdagrad;
  embedding_ps::StoreOptions options;
  options.tables = {table};
  HYREC_ASSIGN_OR_RETURN(auto store, embedding_ps::EmbeddingShardStore::Create(options));
  constexpr uint64_t kRows = 1 << 20;
  constexpr size_t kBatch = 4096;
  std::vector<uint64_t> ids(kBatch);
  std::vector<float> rows(kBatch * 16), grads(kBatch * 16, 0.01f);
  for (uint64_t begin = 0; begin < kRows; begin += kBatch) {
    for (size_t i = 0; i < kBatch; ++i) ids[i] = begin + i;
    HYREC_RETURN_IF_ERROR(store->Lookup(0, ids, absl::MakeSpan(rows), nullptr));
  }
  std::mt19937_64 rng(1);
  absl::Duration lookup, update;
  constexpr int kBatches = 200;
  for (int b = 0; b < kBatches; ++b) {
    for (uint64_t& id : ids) id = rng() % kRows;
    absl::Time start = absl::Now();
    HYREC_RETURN_IF_ERROR(store->Lookup(0, ids, absl::MakeSpan(rows), nullptr));
    lookup += absl::Now() - start;
    start = absl::Now();
    HYREC_RETURN_IF_ERROR(store->Update(0, ids, grads, {}, nullptr));
    update += absl::Now() - start;
  }
  c.lookup_ns_per_row = absl::ToDoubleNanoseconds(lookup) / (kBatches * kBatch);
  c.update_ns_per_row = absl::ToDoubleNanoseconds(update) / (kBatches * kBatch);
  return c;
}

absl::Status WriteCalibration(const Calibration& c, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << "# hyrec plan --calibrate: measured on this machine; hyrec plan --calibration=" << path << "\n";
  WriteFields(out, "", [&](auto&& visit) { MachineFields(c, visit); });
  if (!c.job.empty()) {
    out << "# A batch of " << c.job << " here, one worker, in CPU ms (docs/capacity.md).\njob: " << c.job
        << "\nstep:\n";
    WriteFields(out, "  ", [&](auto&& visit) { StepFields(c.step, visit); });
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<Calibration> ReadCalibration(const std::string& path) {
  HYREC_ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlFile(path));
  Calibration c;
  HYREC_RETURN_IF_ERROR(CatchYamlErrors(path, [&]() -> absl::Status {
    HYREC_RETURN_IF_ERROR(ReadFields(root, path, [&](auto&& visit) { MachineFields(c, visit); }, {"job", "step"}));
    HYREC_RETURN_IF_ERROR(ReadScalar(root, "job", path, &c.job));
    if (const YAML::Node step = root["step"]) {
      const std::string at = JoinKey(path, "step");
      if (c.job.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": needs the job it was measured on (job)"));
      }
      HYREC_RETURN_IF_ERROR(ReadFields(step, at, [&](auto&& visit) { StepFields(c.step, visit); }));
      if (c.step.batch_size <= 0 || c.step.shards <= 0 || c.step.train_ms <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": batch_size, shards and train_ms are required and must be > 0"));
      }
    } else if (!c.job.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, "job"), ": without its step costs (step)"));
    }
    if (c.process_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, "process_bytes"), ": required, > 0"));
    }
    return absl::OkStatus();
  }));
  return c;
}

}  // namespace hyrec::planner
