// hyrec-ps (`hyrec ps`): one embedding parameter-server shard.
//
//   hyrec ps --port=0 --shard_index=0 --num_shards=2 --capacity_rows=100000000
//            --tables=user:16:adagrad:0.05,item:32:adam:0.001
//   hyrec ps --config=ps.yaml
//
// Prints "hyrec ps shard I of N listening on HOST:PORT" on stdout once serving; stops cleanly on
// SIGTERM or SIGINT (in-flight requests get --shutdown_grace_ms to finish).
#include <csignal>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/signals.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one (printed on start).");
ABSL_FLAG(int, shard_index, 0, "This shard's index in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of PS shards in the job.");
ABSL_FLAG(uint64_t, capacity_rows, 0, "Most rows held (all tables); 0: unbounded.");
ABSL_FLAG(uint64_t, capacity_bytes, 0, "Most bytes held (all tables); 0: unbounded.");
ABSL_FLAG(int, threads, 0, "gRPC polling threads; 0: one per core.");
ABSL_FLAG(int, stripes, 64, "Lock stripes of the store.");
ABSL_FLAG(uint64_t, max_ids_per_request, 1 << 22, "Larger requests get RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, tables, "",
          "Tables as name:dim[:optimizer[:learning_rate]],... (or use --config).");
ABSL_FLAG(std::string, config, "", "YAML file with tables and capacity (see docs/architecture.md).");
ABSL_FLAG(int, shutdown_grace_ms, 2000, "Time in-flight requests get to finish on SIGTERM.");
ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics (rows, evictions, lookups, updates per table) at "
          "http://<host>:<port>/metrics, read at each scrape; 0: any free port; -1: off.");
ABSL_FLAG(std::string, log_level, "info", "spdlog level: trace, debug, info, warn, error.");

namespace {

using hyrec::embedding_ps::StoreOptions;

absl::Status ReadConfigFile(const std::string& path, StoreOptions* options) {
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, hyrec::LoadYamlFile(path));
  const std::string where = path;
  absl::Status keys = hyrec::CheckKeys(
      root, "", {"tables", "capacity_rows", "capacity_bytes", "num_stripes", "admission_sketch_counters"});
  if (!keys.ok()) return hyrec::Annotate(keys, where);
  for (auto [key, field] : {std::pair<const char*, uint64_t*>{"capacity_rows", &options->capacity_rows},
                            {"capacity_bytes", &options->capacity_bytes}}) {
    absl::Status s = hyrec::ReadScalar(root, key, "", field);
    if (!s.ok()) return hyrec::Annotate(s, where);
  }
  absl::Status s = hyrec::ReadScalar(root, "num_stripes", "", &options->num_stripes);
  if (s.ok()) s = hyrec::ReadScalar(root, "admission_sketch_counters", "", &options->admission_sketch_counters);
  if (!s.ok()) return hyrec::Annotate(s, where);
  if (!root["tables"]) return absl::InvalidArgumentError(absl::StrCat(where, ": no 'tables' key"));
  auto tables = hyrec::embedding_ps::ParseTableConfigs(root["tables"], "tables");
  if (!tables.ok()) return hyrec::Annotate(tables.status(), where);
  options->tables = std::move(*tables);
  return absl::OkStatus();
}

absl::Status Run() {
  StoreOptions store_options;
  store_options.capacity_rows = absl::GetFlag(FLAGS_capacity_rows);
  store_options.capacity_bytes = absl::GetFlag(FLAGS_capacity_bytes);
  store_options.num_stripes = absl::GetFlag(FLAGS_stripes);
  const std::string config = absl::GetFlag(FLAGS_config);
  const std::string tables = absl::GetFlag(FLAGS_tables);
  if (!config.empty() && !tables.empty()) {
    return absl::InvalidArgumentError("give --tables or --config, not both");
  }
  if (!config.empty()) {
    HYREC_RETURN_IF_ERROR(ReadConfigFile(config, &store_options));
  } else if (!tables.empty()) {
    auto parsed = hyrec::embedding_ps::ParseTableSpecs(tables);
    if (!parsed.ok()) return hyrec::Annotate(parsed.status(), "--tables");
    store_options.tables = std::move(*parsed);
  } else {
    return absl::InvalidArgumentError("no tables: give --tables=name:dim[:optimizer[:lr]],... or --config");
  }
  auto store = hyrec::embedding_ps::EmbeddingShardStore::Create(store_options);
  if (!store.ok()) return store.status();

  hyrec::embedding_ps::ServerOptions server_options;
  server_options.host = absl::GetFlag(FLAGS_host);
  server_options.port = absl::GetFlag(FLAGS_port);
  server_options.threads = absl::GetFlag(FLAGS_threads);
  server_options.shard_index = absl::GetFlag(FLAGS_shard_index);
  server_options.num_shards = absl::GetFlag(FLAGS_num_shards);
  server_options.max_ids_per_request = absl::GetFlag(FLAGS_max_ids_per_request);

  // Block the stop signals before gRPC starts its threads, then wait for them here.
  const sigset_t stop_signals = hyrec::BlockStopSignals();

  std::shared_ptr<hyrec::embedding_ps::EmbeddingShardStore> shared_store(std::move(*store));
  HYREC_ASSIGN_OR_RETURN(auto server, hyrec::embedding_ps::EmbeddingServer::Start(shared_store, server_options));
  // Metrics: the store's statistics, read at each scrape.
  hyrec::MetricsRegistry metrics;
  std::unique_ptr<hyrec::MetricsHttpServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    const hyrec::MetricLabels shard = {{"shard", std::to_string(server_options.shard_index)}};
    metrics.AddCollector([shared_store, shard](hyrec::MetricsRegistry* m) {
      hyrec::embedding_ps::PublishStoreMetrics(shared_store->Stats(), shard, m);
    });
    HYREC_ASSIGN_OR_RETURN(metrics_server, hyrec::MetricsHttpServer::Start(server_options.host,
                                                                         absl::GetFlag(FLAGS_metrics_port), &metrics));
    std::cout << "hyrec ps metrics on " << server_options.host << ":" << metrics_server->port() << std::endl;
  }
  std::cout << "hyrec ps shard " << server_options.shard_index << " of "
            << server_options.num_shards << " listening on " << server_options.host << ":"
            << server->port() << std::endl;
  spdlog::info("shard {}/{}: {} table(s), capacity {} rows / {} bytes, {} stripes",
               server_options.shard_index, server_options.num_shards, store_options.tables.size(),
               store_options.capacity_rows, store_options.capacity_bytes, store_options.num_stripes);
  const int signal = hyrec::WaitForStopSignal(stop_signals);
  spdlog::info("signal {}: shutting down", signal);
  if (metrics_server != nullptr) metrics_server->Stop();
  server->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->Wait();
  spdlog::info("stopped");
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("hyrec ps: one embedding parameter-server shard");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "hyrec ps: unexpected argument '" << rest[1] << "'\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [ps] [%l] %v");
  absl::Status status = Run();
  if (!status.ok()) {
    std::cerr << "hyrec ps: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
