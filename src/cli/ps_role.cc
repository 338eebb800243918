// `hyrec ps`: one embedding parameter-server shard.
//
//   hyrec ps --config=job.yaml --shard_index=1        # shard 1 of the job's plan
//   hyrec ps --tables=user:16:adagrad:0.05,item:32 --capacity_rows=1000000   # without a job
//
// Prints "hyrec ps shard I of N listening on HOST:PORT" on stdout once serving; stops cleanly on
// SIGTERM or SIGINT (in-flight requests get --shutdown_grace_ms to finish) and exits 0.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/keepalive.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/signals.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/server.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"
#include "hyrec/embedding_ps/update_log.h"
#include "hyrec/job/job_plan.h"
#include "src/cli/health_flags.h"
#include "src/cli/heartbeat.h"
#include "src/cli/job_flags.h"
#include "src/cli/lease_watch.h"
#include "src/cli/logging.h"
#include "src/cli/periodic_task.h"
#include "src/cli/port_setting.h"
#include "src/cli/roles.h"
#include "src/cli/security_flags.h"

namespace hyrec::cli {
namespace {

struct PsFlags {
  std::string config;
  std::vector<std::string> overrides;  // --set
  int shard_index = 0;
  std::string host;  // Empty: the host of the job's cluster.ps entry; 127.0.0.1 without a job.
  int port = -1;
  std::string tables;
  int num_shards = 1;
  uint64_t capacity_rows = 0;
  uint64_t capacity_bytes = 0;
  int stripes = 64;
  int threads = 0;
  uint64_t max_ids_per_request = 1 << 22;
  int shutdown_grace_ms = 2000;
  std::string resume;
  std::string security = "mtls";  // Without --config.
  std::string heartbeat_file;
  bool recover = false;
  int restart_attempt = -1;  // -1: not given.
  CommonFlags common;
  SecurityFlags security_files;
  HealthFlags health;
};

// The shard's update log, when its plan has one.
struct ShardLog {
  std::shared_ptr<embedding_ps::UpdateLog> log;
  std::string checkpoint_root;
};

// What a PS started without a job (--tables) serves.
absl::Status StandaloneShard(FlagSet& flags, const PsFlags& f, embedding_ps::StoreOptions* store,
                             embedding_ps::ServerOptions* server) {
  auto tables = embedding_ps::ParseTableSpecs(f.tables);
  if (!tables.ok()) return Annotate(tables.status(), "--tables");
  store->tables = std::move(*tables);
  store->capacity_rows = f.capacity_rows;
  store->capacity_bytes = f.capacity_bytes;
  store->num_stripes = f.stripes;
  server->port = f.port < 0 ? 0 : f.port;
  server->threads = f.threads;
  server->shard_index = f.shard_index;
  server->num_shards = f.num_shards;
  server->max_ids_per_request = f.max_ids_per_request;
  server->host = f.host.empty() ? "127.0.0.1" : f.host;
  if (f.security != "mtls" && f.security != "none") {
    return absl::InvalidArgumentError(absl::StrCat("--security must be mtls or none, not '", f.security, "'"));
  }
  job::SecuritySpec security;
  security.mtls = f.security == "mtls";
  server->security = ResolveSecurity(security, Identity{Role::kPs, f.shard_index}, f.security_files);
  if (f.shard_index >= f.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_index ", f.shard_index, " is not below --num_shards ", f.num_shards));
  }
  return absl::OkStatus();
}

// JobDone from worker 0: the process stops as on SIGTERM (exit 0) when the job's services exit
// with its workers (cluster.services_exit_when_done); otherwise it says so and serves on.
std::function<void()> OnJobDone(bool exit) {
  return [exit] {
    if (!exit) {
      spdlog::info("the job's workers are done; serving on until stopped (cluster.services_exit_when_done: false)");
      return;
    }
    spdlog::info("the job's workers are done: stopping (cluster.services_exit_when_done)");
    kill(getpid(), SIGTERM);
  };
}

// Shard --shard_index of the job's plan. Settings the plan holds are not flags here.
absl::Status PlannedShard(FlagSet& flags, const PsFlags& f, embedding_ps::StoreOptions* store,
                          embedding_ps::ServerOptions* server, job::PsShardPlan* planned) {
  for (const char* planned : {"tables", "num_shards", "capacity_rows", "capacity_bytes", "stripes", "threads",
                              "max_ids_per_request", "security"}) {
    if (flags.WasSet(planned)) {
      return absl::InvalidArgumentError(absl::StrCat("--", planned,
                                                     " with --config: the job file sets it (ps and tables "
                                                     "sections); give one or the other"));
    }
  }
  HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile(f.config, f.overrides));
  SetKeepalive(absl::Seconds(plan.endpoints.keepalive_seconds));
  server->on_job_done = OnJobDone(plan.spec.cluster.services_exit_when_done);
  if (f.shard_index >= static_cast<int>(plan.ps.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_index ", f.shard_index, ": the job has ", plan.ps.size(), " PS shards (ps.shards)"));
  }
  const job::PsShardPlan& shard = plan.ps[f.shard_index];
  *store = shard.store;
  std::string host;
  int planned_port = 0;
  HYREC_RETURN_IF_ERROR(job::SplitHostPort(plan.endpoints.ps[f.shard_index], "cluster.ps", &host, &planned_port));
  server->port = f.port >= 0 ? f.port : planned_port;
  server->host = f.host.empty() ? host : f.host;
  server->security = ResolveSecurity(plan.spec.security, Identity{Role::kPs, shard.shard_index}, f.security_files);
  server->threads = shard.threads;
  server->shard_index = shard.shard_index;
  server->num_shards = shard.num_shards;
  server->max_ids_per_request = shard.max_ids_per_request;
  server->checkpoint_root = shard.checkpoint_root;
  server->export_root = shard.export_root;
  *planned = shard;
  return absl::OkStatus();
}

// Opens the planned shard's update log (none without one in the plan, or without a job).
absl::StatusOr<ShardLog> OpenShardLog(const PsFlags& f, const job::PsShardPlan& shard) {
  if (f.config.empty()) {
    if (f.recover) return absl::InvalidArgumentError("--recover needs --config (the job's update log)");
    return ShardLog{};
  }
  if (shard.update_log_dir.empty()) {
    if (f.recover) {
      return absl::InvalidArgumentError(
          "--recover: the job keeps no update log (ps.update_log needs checkpoint.dir), so a shard cannot recover");
    }
    return ShardLog{};
  }
  embedding_ps::UpdateLogOptions options;
  options.dir = shard.update_log_dir;
  options.sync = shard.update_log_sync;
  options.sync_interval = absl::Seconds(shard.update_log_sync_interval_seconds);
  // Replaced by another process for this shard while frozen or cut off: it serves the shard now,
  // so this one stops at once rather than answering from rows it can no longer log.
  options.ownership_lease = kOwnershipLease;
  options.on_fenced = [](const absl::Status& fenced) {
    StopAtOnce("ps", std::string(fenced.message()), kExitInvalidInput);
  };
  HYREC_ASSIGN_OR_RETURN(auto log, embedding_ps::UpdateLog::Open(options));
  return ShardLog{std::shared_ptr<embedding_ps::UpdateLog>(std::move(log)), shard.checkpoint_root};
}

// A start that is not a recovery deletes the shard's log. Refused while a run of the job holds
// checkpoint.dir (its worker 0 runs: this is a lost shard restarted alone) and the log holds
// acknowledged updates: those are in no checkpoint, and only --recover keeps them.
absl::Status RefuseToResetALiveRunsLog(const ShardLog& shard) {
  if (shard.log == nullptr || shard.checkpoint_root.empty()) return absl::OkStatus();
  // A probe, not a lock: the job's other shards probe at the same time and must not take each
  // other for a run.
  const absl::Status probe = Env::Default()->ProbeLock(JoinPath(shard.checkpoint_root, kLockFileName));
  if (probe.ok() || !absl::IsFailedPrecondition(probe)) return absl::OkStatus();  // No run holds it.
  embedding_ps::ReplayStats stats;
  absl::Status read = shard.log->Replay(0, nullptr, &stats);
  if (read.ok() && stats.updates == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the update log ", shard.log->dir(), " holds ",
      read.ok() ? absl::StrCat(stats.updates, " acknowledged update(s)") : std::string("updates"),
      " of the run in progress (", probe.message(),
      "), which a fresh start would delete: restart this shard with --recover to keep them (or stop the run first "
      "to start over)"));
}

// Fills a planned shard's store from a checkpoint (resharding when it was cut with other counts).
absl::Status RestoreFromCheckpoint(const std::string& which, const embedding_ps::ServerOptions& server,
                                   embedding_ps::EmbeddingShardStore* store, std::string* restored) {
  CheckpointManifest manifest;
  HYREC_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(Env::Default(), server.checkpoint_root,
                                                                  kCheckpointPrefix, which, &manifest));
  const absl::Time start = absl::Now();
  HYREC_RETURN_IF_ERROR(
      embedding_ps::RestoreShard(Env::Default(), dir, manifest, server.shard_index, server.num_shards, store));
  spdlog::info("restored from {} (step {}, {} shard(s) then) in {}", dir, manifest.step, manifest.num_shards,
               absl::FormatDuration(absl::Now() - start));
  *restored = dir;
  return absl::OkStatus();
}

// A restarted shard's state: the checkpoint its log starts from, then every logged update
// (applied once: a repeat of an applied (worker, table, sequence) is recognized as one). The log
// then goes on in a new segment.
absl::Status Recover(const ShardLog& shard, const embedding_ps::ServerOptions& server,
                     embedding_ps::EmbeddingShardStore* store) {
  const absl::Time start = absl::Now();
  const std::string root = shard.checkpoint_root;
  HYREC_ASSIGN_OR_RETURN(embedding_ps::LogRecovery from, shard.log->FindRecovery([&](const std::string& name) {
    return VerifyCheckpoint(Env::Default(), JoinPath(root, name)).ok();
  }));
  std::string restored;
  if (!from.checkpoint.empty()) {
    HYREC_RETURN_IF_ERROR(RestoreFromCheckpoint(JoinPath(root, from.checkpoint), server, store, &restored));
  }
  embedding_ps::ReplayStats stats;
  const absl::Time replay = absl::Now();
  HYREC_RETURN_IF_ERROR(embedding_ps::ReplayInto(*shard.log, from.segment, store, &stats));
  const absl::Duration replayed = absl::Now() - replay;
  HYREC_RETURN_IF_ERROR(shard.log->StartWriting());
  spdlog::info(
      "recovered from {} and {} logged update(s) in {} record(s) of {} segment(s) ({} refused again, {} torn byte(s) "
      "at "
      "the end) in {} (the replay {})",
      restored.empty() ? "an empty store" : restored, stats.updates, stats.records, stats.segments, stats.refused,
      stats.torn_bytes, absl::FormatDuration(absl::Now() - start), absl::FormatDuration(replayed));
  return absl::OkStatus();
}

// The shard's /metrics with --metrics_port (null without): its store's and its log's figures.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> ServeMetrics(
    const PsFlags& f, int shard_index, std::shared_ptr<embedding_ps::EmbeddingShardStore> store,
    MetricsRegistry* metrics) {
  if (f.common.metrics_port < 0) return std::unique_ptr<MetricsHttpServer>();
  const MetricLabels shard = {{"shard", std::to_string(shard_index)}};
  metrics->AddCollector([store, shard](MetricsRegistry* m) {
    embedding_ps::PublishStoreMetrics(store->Stats(), shard, m);
    PublishLogMetrics(m);
  });
  HYREC_ASSIGN_OR_RETURN(
      std::unique_ptr<MetricsHttpServer> server,
      NamePortSetting(MetricsHttpServer::Start(f.common.metrics_host, f.common.metrics_port, metrics),
                      "--metrics_port"));
  std::cout << "hyrec ps metrics on " << f.common.metrics_host << ":" << server->port() << std::endl;
  return server;
}

// The shard's starting state: recovered from its update log (--recover, or the job's attempt
// says this shard was lost alone), else restored from a checkpoint (--resume) or empty, with the
// log reset to start from it.
absl::Status StartingState(const PsFlags& f, const job::PsShardPlan& planned, const ShardLog& shard_log,
                           const embedding_ps::ServerOptions& server_options,
                           embedding_ps::EmbeddingShardStore* store) {
  // --restart_attempt: a shard whose log began in this attempt of the job was lost alone (the
  // rest of the job runs on) and recovers; a later attempt restarted every role from a checkpoint.
  bool recover = f.recover;
  const std::string attempt_file =
      shard_log.log != nullptr && f.restart_attempt >= 0 ? JoinPath(planned.update_log_dir, "ATTEMPT") : "";
  if (!attempt_file.empty()) {
    absl::StatusOr<std::string> logged = ReadFileToString(Env::Default(), attempt_file, 64);
    recover = logged.ok() && *logged == std::to_string(f.restart_attempt);
    spdlog::info("restart attempt {}: {}", f.restart_attempt,
                 recover ? "this shard was lost alone; recovering from its update log"
                         : "the job starts (or restarted every role) here");
  }
  if (recover) {
    if (f.recover && !f.resume.empty()) {
      return absl::InvalidArgumentError("--recover and --resume: give one or the other");
    }
    HYREC_RETURN_IF_ERROR(Annotate(Recover(shard_log, server_options, store), "--recover"));
  } else {
    // With --restart_attempt the attempt decides: a later attempt restarts every role from a
    // checkpoint, whichever of its roles (worker 0 among them) started first.
    if (attempt_file.empty()) HYREC_RETURN_IF_ERROR(RefuseToResetALiveRunsLog(shard_log));
    std::string restored;
    if (!f.resume.empty()) {
      if (f.config.empty()) return absl::InvalidArgumentError("--resume needs --config (the job's checkpoints)");
      std::string note;
      const std::string which =
          ResolveResumeFlag(Env::Default(), server_options.checkpoint_root, kCheckpointPrefix, f.resume, &note);
      if (!note.empty()) spdlog::info("{}", note);
      if (!which.empty()) {
        HYREC_RETURN_IF_ERROR(Annotate(RestoreFromCheckpoint(which, server_options, store, &restored), "--resume"));
      }
    }
    // The job starts (or resumes) here: an earlier run's log does not apply to it.
    if (shard_log.log != nullptr) {
      const std::string base =
          restored.empty() ? "" : std::filesystem::absolute(std::filesystem::path(restored)).string();
      HYREC_RETURN_IF_ERROR(Annotate(shard_log.log->Reset(base), "the update log"));
    }
    if (!attempt_file.empty()) {
      HYREC_RETURN_IF_ERROR(Annotate(
          WriteFileAtomically(Env::Default(), attempt_file, std::to_string(f.restart_attempt)), "the update log"));
    }
  }
  return absl::OkStatus();
}

absl::Status Serve(FlagSet& flags, const PsFlags& f) {
  embedding_ps::StoreOptions store_options;
  embedding_ps::ServerOptions server_options;
  if (f.config.empty() == f.tables.empty()) {
    return absl::InvalidArgumentError(
        "give --config=JOB.yaml (with --shard_index) or --tables=name:dim[:optimizer[:lr[:precision]]],... (a PS "
        "without a job)");
  }
  job::PsShardPlan planned;  // Its update log's settings; none without a job.
  HYREC_RETURN_IF_ERROR(f.config.empty() ? StandaloneShard(flags, f, &store_options, &server_options)
                                         : PlannedShard(flags, f, &store_options, &server_options, &planned));
  if (!server_options.on_job_done) server_options.on_job_done = OnJobDone(false);
  // The health endpoint answers NOT_SERVING from the start, so that a probe sees a shard that is
  // still restoring, and SERVING only once the shard serves its restored rows.
  HYREC_ASSIGN_OR_RETURN(auto health, MaybeServeHealth(f.health, "hyrec ps"));
  InstallStopSignalHandlers();
  Heartbeat heartbeat(f.heartbeat_file);
  HYREC_ASSIGN_OR_RETURN(auto store, embedding_ps::EmbeddingShardStore::Create(store_options));
  HYREC_ASSIGN_OR_RETURN(ShardLog shard_log, OpenShardLog(f, planned));
  HYREC_RETURN_IF_ERROR(StartingState(f, planned, shard_log, server_options, store.get()));
  server_options.update_log = shard_log.log;
  PeriodicTask ownership(
      kOwnershipCheckPeriod,
      shard_log.log == nullptr ? std::function<void()>() : [log = shard_log.log] { (void)log->CheckLease(); });

  std::shared_ptr<embedding_ps::EmbeddingShardStore> shared_store(std::move(store));
  const std::string port_setting =
      f.port >= 0 || f.config.empty()
          ? std::string("--port")
          : absl::StrCat("cluster.ps[", server_options.shard_index, "] in ", f.config, " (or --port)");
  HYREC_ASSIGN_OR_RETURN(
      auto server, NamePortSetting(embedding_ps::EmbeddingServer::Start(shared_store, server_options), port_setting));
  MetricsRegistry metrics;
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<MetricsHttpServer> metrics_server,
                         ServeMetrics(f, server_options.shard_index, shared_store, &metrics));
  std::cout << "hyrec ps shard " << server_options.shard_index << " of " << server_options.num_shards
            << " listening on " << server_options.host << ":" << server->port() << std::endl;
  spdlog::info("shard {}/{}: {} table(s), capacity {} rows / {} bytes, {} stripes", server_options.shard_index,
               server_options.num_shards, store_options.tables.size(), store_options.capacity_rows,
               store_options.capacity_bytes, store_options.num_stripes);
  SetServing(health.get(), true);
  const int signal = WaitForStopSignal();
  spdlog::info("signal {}: shutting down", signal);
  SetServing(health.get(), false);
  if (metrics_server != nullptr) metrics_server->Stop();
  server->Shutdown(absl::Milliseconds(f.shutdown_grace_ms));
  server->Wait();
  spdlog::info("stopped");
  return absl::OkStatus();
}

}  // namespace

int PsMain(int argc, char** argv) {
  PsFlags f;
  FlagSet flags("hyrec ps",
                "One embedding parameter-server shard: of a job (--config, --shard_index), or one "
                "without a job (--tables).");
  flags.String("config", &f.config, "FILE", "The job's YAML file; the shard serves its plan's tables and capacity.");
  AddSetFlag(flags, &f.overrides);
  flags.Int("shard_index", &f.shard_index, "This shard's index in [0, shards).", 0, 1023);
  flags.String("host", &f.host, "HOST",
               "Address to listen on; default: the host of the job's cluster.ps entry (with --config), else "
               "127.0.0.1.");
  flags.Int("port", &f.port,
            "Port to listen on; 0 picks a free one (printed); -1: the job's cluster.ps port "
            "(with --config), else 0.",
            -1, 65535);
  flags.String("tables", &f.tables, "SPECS",
               "Without --config: tables as name:dim[:optimizer[:learning_rate[:precision]]],...");
  flags.Int("num_shards", &f.num_shards, "Without --config: the number of PS shards.", 1, 1024);
  flags.Uint64("capacity_rows", &f.capacity_rows, "Without --config: most rows held (all tables); 0: unbounded.");
  flags.Uint64("capacity_bytes", &f.capacity_bytes, "Without --config: most bytes held (all tables); 0: unbounded.");
  flags.Int("stripes", &f.stripes, "Without --config: lock stripes of the store.", 1, 65536);
  flags.Int("threads", &f.threads, "Without --config: gRPC threads kept waiting for calls; 0: 64.", 0, 1024);
  flags.Uint64("max_ids_per_request", &f.max_ids_per_request,
               "Without --config: larger requests get "
               "RESOURCE_EXHAUSTED.");
  flags.Int("shutdown_grace_ms", &f.shutdown_grace_ms, "Time in-flight requests get to finish on SIGTERM.", 0, 600000);
  flags.String("resume", &f.resume, "DIR|latest|auto",
               "With --config: fill the shard from a checkpoint before serving (its rows for this shard of the "
               "job's ps.shards, whatever the checkpoint's shard count); auto: the newest if there is one, else "
               "start empty.");
  flags.String("security", &f.security, "mtls|none",
               "Without --config: mtls (the certificates under --certs, default ./certs) or none (plaintext; any "
               "process that reaches the port may read and write rows).");
  AddSecurityFlags(flags, &f.security_files);
  flags.Bool("recover", &f.recover,
             "With --config: recover this shard after a crash from its update log and the checkpoint it starts "
             "from (what a supervisor passes when it restarts one shard of a running job).");
  flags.Int("restart_attempt", &f.restart_attempt,
            "With --config and an update log: the job's restart attempt (a JobSet's "
            "jobset.sigs.k8s.io/restart-attempt). A shard whose log began in the same attempt recovers from it (as "
            "--recover: it was lost alone); otherwise it starts as --resume says. -1: not given.",
            -1, 1 << 30);
  AddHeartbeatFlag(flags, &f.heartbeat_file);
  AddHealthFlags(flags, &f.health);
  flags.AddCommon(&f.common);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  SetUpServerLogging("ps", f.common.log_level);
  const absl::Status status = Serve(flags, f);
  if (!status.ok()) std::cerr << "hyrec ps: " << status.message() << "\n";
  return FinishLogging(ExitCodeFor(status));
}

}  // namespace hyrec::cli
