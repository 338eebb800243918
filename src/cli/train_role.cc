// `hyrec train` (the job on one machine: embedded, or every role a process with --processes) and
// `hyrec worker` (one dense worker against remote PS shards and a remote loader). Both run the
// job's plan through RunWorker, so they show the same progress line, evaluations, metrics, plot
// and summary.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/keepalive.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/program.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/dense_worker/model_registry.h"
#include "hyrec/dense_worker/monitor.h"
#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/dense_worker/worker.h"
#include "hyrec/embedding_ps/job_done.h"
#include "src/cli/detached_output.h"
#include "src/cli/health_flags.h"
#include "src/cli/heartbeat.h"
#include "src/cli/job_flags.h"
#include "src/cli/logging.h"
#include "src/cli/plot.h"
#include "src/cli/port_setting.h"
#include "src/cli/roles.h"
#include "src/cli/security_flags.h"
#include "src/cli/stop_signals.h"
#include "src/cli/supervisor.h"
#include "src/dense_worker/events.h"

namespace hyrec::cli {
namespace {

using dense_worker::TrainReport;

// Flags of both training roles.
struct TrainingFlags {
  std::string config;
  std::vector<std::string> overrides;  // --set
  std::string resume;
  std::string progress = "auto";
  std::string plot;
  std::string report;
  CommonFlags common;
};

void AddTrainingFlags(FlagSet& flags, TrainingFlags* f, std::vector<std::string> progress_modes) {
  flags.String("config", &f->config, "FILE", "The job's YAML file (required; docs/configuration.md).");
  AddSetFlag(flags, &f->overrides);
  flags.Choice("progress", &f->progress, std::move(progress_modes),
               "How progress is shown: auto (a live line on a terminal, else a line per report), live, lines"
               " (or, for a worker started by a launcher, events or none).");
  flags.String("plot", &f->plot, "PNG",
               "When gnuplot is installed: held-out AUC and training loss against samples, written at the end "
               "(empty: no plot).");
  flags.String("report", &f->report, "FILE",
               "Also write the summary as YAML (samples, losses, AUC, the dense parameters' fingerprint).");
  flags.String("resume", &f->resume, "DIR|latest|auto",
               "Resume from a checkpoint: a checkpoint directory, or 'latest' (the newest one under the job's "
               "checkpoint.dir that verifies), or 'auto' (latest when there is one, else start fresh). Every role "
               "resumes from the same one; the shard and worker counts may differ from the run that wrote it.");
  flags.AddCommon(&f->common);
}

// --resume as it is used: "auto" resolved against the job's checkpoint.dir ("" to start fresh).
std::string ResumeFlag(const job::JobSpec& spec, const std::string& flag) {
  std::string note;
  std::string which = ResolveResumeFlag(Env::Default(), spec.checkpoint.dir, kCheckpointPrefix, flag, &note);
  if (!note.empty()) std::cerr << "hyrec: " << note << std::endl;
  return which;
}

absl::Status WriteReport(const TrainReport& r, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::ofstream out(path);
  out << absl::StrFormat(
      "samples: %d\nplanned_samples: %d\nsamples_per_second: %.17g\nfirst_loss: %.17g\nmean_loss_last: %.17g\n"
      "interrupted: %s\nhas_final_eval: %s\nauc: %.17g\nlog_loss: %.17g\neval_samples: %d\nteacher_auc: %.17g\n"
      "dense_fingerprint: \"%016x\"\ndense_sum: %.17g\ndense_parameters: %d\nbatches: %d\nobserved_staleness: %.17g\n"
      "checkpoint: \"%s\"\nexport: \"%s\"\ncheckpoints: %d\nresumed_step: %d\nheals: %d\nhas_test_eval: %s\n"
      "test_auc: %.17g\ntest_log_loss: %.17g\ntest_samples: %d\nhas_best_eval: %s\nbest_auc: %.17g\n"
      "best_log_loss: %.17g\nbest_at_samples: %d\nbest_checkpoint: \"%s\"\nexport_checkpoint: \"%s\"\n"
      "export_at_samples: %d\nexport_reason: %s\n",
      r.samples, r.planned_samples, r.samples_per_second, r.first_loss, r.mean_loss_last,
      r.interrupted ? "true" : "false", r.has_final_eval ? "true" : "false", r.final_eval.auc, r.final_eval.log_loss,
      r.final_eval.samples, r.teacher_auc, r.dense_fingerprint, r.dense_sum, r.dense_parameters, r.stats.batches,
      r.stats.observed_staleness, r.last_checkpoint, r.export_dir, r.checkpoints, r.resumed_step, r.heals,
      r.has_test_eval ? "true" : "false", r.test_eval.auc, r.test_eval.log_loss, r.test_eval.samples,
      r.has_best_eval ? "true" : "false", r.best_eval.auc, r.best_eval.log_loss, r.best_eval_samples, r.best_checkpoint,
      r.export_checkpoint, r.export_samples, ExportReasonName(r.export_reason));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write --report '", path, "'"));
  return absl::OkStatus();
}

bool LiveProgress(const std::string& mode) { return mode == "live" || (mode == "auto" && isatty(1) != 0); }

// The metrics endpoint, with POST /checkpoint setting `checkpoint` (null: no admin request).
// Who may ask for a checkpoint over HTTP: anyone who reaches the port without security; with
// mTLS, an admin token (security.tokens) in "Authorization: Bearer", else no one (SIGUSR1 still
// works for whoever may signal the process).
std::function<absl::Status(const std::string&)> CheckpointAuthorization(const job::SecuritySpec& security,
                                                                        const std::string& certs_dir) {
  if (!security.mtls) return {};
  if (!security.tokens) {
    return [](const std::string&) {
      return absl::PermissionDeniedError(
          "POST /checkpoint needs an admin token (security.tokens: true) with security.mode mtls; or send the "
          "process SIGUSR1");
    };
  }
  const std::string secret_file = JoinPath(certs_dir.empty() ? security.dir : certs_dir, "token.secret");
  return [secret_file](const std::string& authorization) -> absl::Status {
    if (!absl::StartsWith(authorization, "Bearer ")) {  // 401 before the secret is read.
      return absl::UnauthenticatedError("POST /checkpoint needs \"Authorization: Bearer <admin token>\"");
    }
    HYREC_ASSIGN_OR_RETURN(std::string secret, ReadFileToString(Env::Default(), secret_file, 1 << 20));
    HYREC_ASSIGN_OR_RETURN(const Identity identity,
                           VerifyBearerToken(absl::StripAsciiWhitespace(secret), authorization, absl::Now()));
    if (identity.role != Role::kAdmin) {
      return absl::PermissionDeniedError(
          absl::StrCat("POST /checkpoint is for admin; the token is ", IdentityName(identity), "'s"));
    }
    return absl::OkStatus();
  };
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MaybeServeMetrics(const CommonFlags& common, MetricsRegistry* m,
                                                                     const std::string& who,
                                                                     std::atomic<bool>* checkpoint,
                                                                     const job::SecuritySpec& security,
                                                                     const std::string& certs_dir) {
  if (common.metrics_port < 0) return std::unique_ptr<MetricsHttpServer>();
  AdminAction action;
  if (checkpoint != nullptr) {
    action.run = [checkpoint] {
      checkpoint->store(true);
      return std::string("a checkpoint is cut at the next step (the job's checkpoint.dir)\n");
    };
    action.authorize = CheckpointAuthorization(security, certs_dir);
  }
  HYREC_ASSIGN_OR_RETURN(auto server, NamePortSetting(MetricsHttpServer::Start(common.metrics_host, common.metrics_port,
                                                                               m, std::move(action)),
                                                      "--metrics_port"));
  std::cout << who << " metrics: http://" << common.metrics_host << ":" << server->port() << "/metrics" << std::endl;
  return server;
}

absl::StatusOr<job::JobPlan> PlanForTraining(const TrainingFlags& f) {
  const std::string& config = f.config;
  if (config.empty()) return absl::InvalidArgumentError("--config=JOB.yaml is required");
  HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile(config, f.overrides));
  SetKeepalive(absl::Seconds(plan.endpoints.keepalive_seconds));
  if (!dense_worker::IsRegisteredModel(plan.spec.model.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(config, ": model.kind '", plan.spec.model.kind,
                                                   "' is not a registered model (",
                                                   absl::StrJoin(dense_worker::RegisteredModels(), ", "), ")"));
  }
  return plan;
}

// ---- hyrec train ----

struct TrainFlags {
  TrainingFlags training;
  bool processes = false;
  double ps_latency_ms = -1;
  double watchdog_seconds = 60;
  int max_restarts = 5;
};

absl::StatusOr<int> Train(const TrainFlags& f, const RoleCommands& roles) {
  HYREC_ASSIGN_OR_RETURN(const job::JobPlan plan, PlanForTraining(f.training));
  const job::JobSpec& spec = plan.spec;
  std::cout << "hyrec train: " << spec.model.kind << ", " << spec.train.workers << " worker(s), " << spec.ps.shards
            << " PS shard(s), " << spec.tables.size() << " table(s), embedding staleness "
            << spec.train.embedding_staleness << ", batch " << spec.loader.batch_size
            << (f.processes ? ", every role a process" : "") << std::endl;
  if (!spec.overrides.empty()) std::cout << "  with --set " << absl::StrJoin(spec.overrides, ", --set ") << std::endl;
  StopSignals signals(
      [](int) {
        std::cerr << "\nhyrec train: stopping after the current batch (interrupt again to stop at once)" << std::endl;
      },
      nullptr);
  MetricsRegistry metrics;
  HYREC_ASSIGN_OR_RETURN(auto metrics_server, MaybeServeMetrics(f.training.common, &metrics, "hyrec train",
                                                                signals.checkpoint_flag(), plan.spec.security, ""));
  dense_worker::MonitorOptions monitor_options;
  monitor_options.out = &std::cout;
  monitor_options.live = LiveProgress(f.training.progress);
  monitor_options.metrics = metrics_server != nullptr ? &metrics : nullptr;
  TrainReport report;
  int code = kExitOk;
  if (f.processes) {
    ProcessesOptions options;
    options.config_path = f.training.config;
    options.overrides = f.training.overrides;
    options.plan = &plan;
    options.roles = roles;
    options.ps_latency_ms = f.ps_latency_ms;
    options.watchdog = absl::Seconds(f.watchdog_seconds);
    options.max_restarts = f.max_restarts;
    options.log_level = f.training.common.log_level == "info" ? "warn" : f.training.common.log_level;
    options.monitor = monitor_options;
    options.stop = signals.flag();
    options.checkpoint_request = signals.checkpoint_flag();
    // Resolved once, so that every role resumes from the same one.
    if (const std::string which = ResumeFlag(spec, f.training.resume); !which.empty()) {
      CheckpointManifest manifest;
      std::vector<std::string> skipped;
      absl::StatusOr<std::string> resolved =
          ResolveCheckpoint(Env::Default(), spec.checkpoint.dir, kCheckpointPrefix, which, &manifest, &skipped);
      for (const std::string& s : skipped) {  // Said as the embedded job says it.
        std::cerr << "hyrec: passing over a checkpoint that does not verify: " << s << "\n";
      }
      if (!resolved.ok()) return Annotate(resolved.status(), "--resume");
      options.resume = *resolved;
    }
    HYREC_ASSIGN_OR_RETURN(ProcessesResult result, RunProcesses(options));
    if (result.exit_code != kExitOk && result.exit_code != kExitInterrupted) return result.exit_code;
    report = result.report;
    code = result.exit_code;
  } else {
    dense_worker::JobMonitor monitor(monitor_options);
    dense_worker::TrainJobOptions options;
    options.observer = &monitor;
    options.metrics = monitor_options.metrics;
    options.stop = signals.flag();
    options.resume = ResumeFlag(spec, f.training.resume);
    options.checkpoint_request = signals.checkpoint_flag();
    HYREC_ASSIGN_OR_RETURN(report, dense_worker::RunTrainJob(plan, options));
    code = plan.workers[0].StoppedShort(report.interrupted) ? kExitInterrupted : kExitOk;
  }
  PlotIfAsked(report, f.training.plot, std::cout);
  HYREC_RETURN_IF_ERROR(WriteReport(report, f.training.report));
  return code;
}

// ---- hyrec worker ----

struct WorkerFlags {
  TrainingFlags training;
  int rank = -1;
  std::string ps;
  std::string loader;
  std::string master_addr;
  int master_port = 0;
  SecurityFlags security;
  std::string heartbeat_file;
  HealthFlags health;
  int restart_attempt = -1;  // -1: not given.
};

// --restart_attempt for worker 0 of a job whose workers heal: worker 0 hosts its group's
// rendezvous, so a worker 0 started a second time within one attempt of the job (its pod
// replaced after a loss) cannot join its peers. It fails, transient, so that the whole job
// restarts from its latest checkpoint; a first start records the attempt beside the checkpoints.
absl::Status CheckWorkerZeroAttempt(const job::JobPlan& plan, int attempt) {
  const std::string file = JoinPath(plan.spec.checkpoint.dir, "WORKER0_ATTEMPT");
  absl::StatusOr<std::string> seen = ReadFileToString(Env::Default(), file, 64);
  if (seen.ok() && *seen == std::to_string(attempt)) {
    return absl::UnavailableError(
        absl::StrCat("worker 0 was lost in restart attempt ", attempt,
                     " of this job and the workers' group (its rendezvous) went with it: failing so that every role "
                     "restarts from the latest checkpoint"));
  }
  HYREC_RETURN_IF_ERROR(Env::Default()->CreateDirs(plan.spec.checkpoint.dir));
  return Annotate(WriteFileAtomically(Env::Default(), file, std::to_string(attempt)), "--restart_attempt");
}

// Calls `connect` until it succeeds, fails for another reason than a peer that does not answer
// yet (still starting, or restoring a checkpoint), or `timeout` has passed; says every 10 s what
// it waits for.
template <typename T>
absl::StatusOr<T> WaitForPeer(const std::string& who, const std::string& what, absl::Duration timeout,
                              const std::function<absl::StatusOr<T>()>& connect) {
  const absl::Time start = absl::Now();
  absl::Time next_note = start + absl::Seconds(10);
  for (;;) {
    absl::StatusOr<T> connected = connect();
    // A peer that refuses this worker's certificate (another job's CA) is up: waiting cannot help.
    // A TCP connection that never came up ("tcp handshaker shutdown": the peer's host is cut off)
    // is not a refusal.
    const absl::string_view message = connected.status().message();
    const bool refused = (absl::StrContains(message, "andshake") && !absl::StrContains(message, "tcp handshaker")) ||
                         absl::StrContains(message, "ertificate");
    const bool waiting = !connected.ok() && !refused &&
                         (absl::IsUnavailable(connected.status()) || absl::IsDeadlineExceeded(connected.status()));
    if (!waiting) return connected;
    const absl::Duration waited = absl::Now() - start;
    if (waited >= timeout) {
      return Annotate(connected.status(), absl::StrCat(what, " did not answer within ", absl::FormatDuration(timeout),
                                                       " (cluster.startup_timeout_seconds)"));
    }
    if (absl::Now() >= next_note) {
      std::cerr << who << ": waiting for " << what << " ("
                << absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))) << " of "
                << absl::FormatDuration(timeout) << "): " << connected.status().message() << std::endl;
      next_note += absl::Seconds(10);
    }
    absl::SleepFor(absl::Seconds(1));
  }
}

// The worker's rank and endpoints: flags, else the environment Kubernetes jobs and torchrun set
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else the plan's.
absl::Status ApplyPlacement(const WorkerFlags& f, job::JobPlan* plan, int* rank) {
  int env_rank = -1, env_world = -1, env_port = 0;
  for (auto [name, out] :
       {std::pair<const char*, int*>{"RANK", &env_rank}, {"WORLD_SIZE", &env_world}, {"MASTER_PORT", &env_port}}) {
    const char* value = std::getenv(name);
    if (value != nullptr && !absl::SimpleAtoi(value, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "='", value, "' is not an integer"));
    }
  }
  const int world = static_cast<int>(plan->workers.size());
  if (env_world >= 0 && env_world != world) {
    return absl::InvalidArgumentError(absl::StrCat("WORLD_SIZE=", env_world, " but the job has train.workers ", world));
  }
  *rank = f.rank >= 0 ? f.rank : env_rank >= 0 ? env_rank : 0;
  if (*rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", *rank, " is not below the job's ", world, " workers (train.workers)"));
  }
  const char* env_addr = std::getenv("MASTER_ADDR");
  const std::string master_addr = !f.master_addr.empty() ? f.master_addr : env_addr != nullptr ? env_addr : "";
  const int master_port = f.master_port > 0 ? f.master_port : env_port;
  std::vector<std::string> ps = absl::StrSplit(f.ps, ',', absl::SkipEmpty());
  return job::SetEndpoints(ps, f.loader, master_addr, master_port, plan);
}

// What worker `rank`'s model takes of every batch (checked before the batch is used).
data_loader::BatchShape ModelBatchShape(const job::JobPlan& plan, int rank) {
  const job::WorkerPlan& worker = plan.workers[rank];
  data_loader::BatchShape shape;
  shape.num_dense = worker.num_dense;
  shape.num_tables = static_cast<int>(worker.table_names.size());
  shape.num_shards = static_cast<int>(plan.ps.size());
  shape.slot_tables = worker.slot_tables;
  return shape;
}

// The worker's client of the PS shards, waiting for them within the job's startup timeout.
absl::StatusOr<std::unique_ptr<embedding_ps::EmbeddingClient>> ConnectPs(const job::JobPlan& plan, int rank,
                                                                         const SecurityOptions& security,
                                                                         const std::string& who) {
  const absl::Duration startup = absl::Seconds(plan.endpoints.startup_timeout_seconds);
  embedding_ps::ClientOptions ps_options;
  ps_options.security = security;
  ps_options.precision =
      plan.workers[rank].ps_wire_fp16 ? embedding_ps::Precision::kFp16 : embedding_ps::Precision::kFp32;
  if (const double recovery = plan.workers[rank].ps_recovery_timeout_seconds; recovery > 0) {
    // The shards log their updates: a lost shard comes back with all of them (restarted by the
    // launcher or the cluster), so calls wait for it, retrying, rather than fail the worker.
    ps_options.call_timeout = absl::Seconds(recovery);
    ps_options.max_attempts = 1 << 20;
  }
  using ClientPtr = std::unique_ptr<embedding_ps::EmbeddingClient>;
  return WaitForPeer<ClientPtr>(who, absl::StrCat("the PS shards (", absl::StrJoin(plan.endpoints.ps, ","), ")"),
                                startup,
                                [&] { return embedding_ps::ConnectEmbeddingClient(plan.endpoints.ps, ps_options); });
}

// What receives worker 0's reports for --progress=`mode`: the launcher's event lines, or the
// monitor (lines and, with `metrics`, /metrics); null when nothing shows them.
std::unique_ptr<dense_worker::TrainObserver> MakeObserver(const std::string& mode, MetricsRegistry* metrics,
                                                          embedding_ps::EmbeddingClient* ps, int rank) {
  if (mode == "events") return std::make_unique<dense_worker::EventWriter>(&std::cout);
  if (mode == "none" && metrics == nullptr) return nullptr;
  dense_worker::MonitorOptions monitor;
  monitor.out = mode == "none" ? nullptr : &std::cout;
  monitor.live = LiveProgress(mode);
  monitor.metrics = metrics;
  monitor.ps = metrics != nullptr ? ps : nullptr;
  monitor.worker = static_cast<uint32_t>(rank);
  return std::make_unique<dense_worker::JobMonitor>(monitor);
}

// Worker 0 after training: the plot and report asked for, and (a finished job) telling the
// services they may go.
absl::Status FinishWorkerZero(const TrainReport& report, const WorkerFlags& f, const job::JobPlan& plan,
                              const SecurityOptions& security) {
  PlotIfAsked(report, f.training.plot, std::cout);
  HYREC_RETURN_IF_ERROR(WriteReport(report, f.training.report));
  if (!plan.workers[0].StoppedShort(report.interrupted) && plan.spec.cluster.services_exit_when_done) {
    // The job is finished (its final checkpoint and export included): the shards may go.
    for (const absl::Status& told :
         {embedding_ps::TellShardsJobDone(plan.endpoints.ps, security, absl::Seconds(10)),
          data_loader::TellLoaderJobDone(plan.endpoints.loader, security, absl::Seconds(10))}) {
      if (!told.ok()) std::cerr << "hyrec worker 0: " << told.message() << std::endl;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Work(const WorkerFlags& f) {
  HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, PlanForTraining(f.training));
  int rank = 0;
  HYREC_RETURN_IF_ERROR(ApplyPlacement(f, &plan, &rank));
  Heartbeat heartbeat(f.heartbeat_file);
  const int world = static_cast<int>(plan.workers.size());
  if (f.restart_attempt >= 0 && rank == 0 && plan.workers[0].heal_timeout_seconds > 0 &&
      !plan.spec.checkpoint.dir.empty()) {
    HYREC_RETURN_IF_ERROR(CheckWorkerZeroAttempt(plan, f.restart_attempt));
  }
  // Before training (waiting for peers, at the rendezvous) a stop has nothing to finish: the
  // worker exits at once as interrupted rather than wait out its timeouts.
  static std::atomic<bool> training{false};
  StopSignals signals(
      [rank](int) {
        if (!training) {
          std::cerr << "hyrec worker " << rank << ": stopped before training began" << std::endl;
          std::cout.flush();
          std::_Exit(kExitInterrupted);
        }
        std::cerr << "hyrec worker " << rank << ": stopping after the current batch (signal again to stop at once)"
                  << std::endl;
      },
      nullptr);
  MetricsRegistry metrics;
  HYREC_ASSIGN_OR_RETURN(
      auto metrics_server,
      MaybeServeMetrics(f.training.common, &metrics, absl::StrCat("hyrec worker ", rank),
                        rank == 0 ? signals.checkpoint_flag() : nullptr, plan.spec.security, f.security.certs));
  HYREC_ASSIGN_OR_RETURN(auto health, MaybeServeHealth(f.health, absl::StrCat("hyrec worker ", rank)));
  const SecurityOptions security = ResolveSecurity(plan.spec.security, Identity{Role::kWorker, rank}, f.security);
  const std::string who = absl::StrCat("hyrec worker ", rank);
  const absl::Duration startup = absl::Seconds(plan.endpoints.startup_timeout_seconds);
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<embedding_ps::EmbeddingClient> ps, ConnectPs(plan, rank, security, who));
  data_loader::StreamClientOptions stream_options;
  stream_options.security = security;
  stream_options.expect = ModelBatchShape(plan, rank);
  // A lost loader is replaced (by the launcher or the cluster) and resumes this worker from
  // where its stream stands; the stream waits for it within the batch timeout.
  stream_options.reconnect = true;
  using StreamPtr = std::unique_ptr<data_loader::BatchStream>;
  // Opened once the worker has joined its group, where it starts: a worker that replaces a lost
  // one goes on from that one's batch.
  auto open_stream = [&](int64_t next_batch) -> absl::StatusOr<StreamPtr> {
    data_loader::StreamClientOptions o = stream_options;
    o.next_batch = next_batch;
    absl::StatusOr<StreamPtr> stream =
        WaitForPeer<StreamPtr>(who, absl::StrCat("the loader (", plan.endpoints.loader, ")"), startup,
                               [&] { return data_loader::ConnectBatchStream(plan.endpoints.loader, rank, o); });
    if (stream.ok()) SetServing(health.get(), true);
    return stream;
  };
  std::unique_ptr<dense_worker::TrainObserver> observer =
      MakeObserver(f.training.progress, metrics_server != nullptr ? &metrics : nullptr, ps.get(), rank);
  std::optional<dense_worker::ResumePoint> resume;
  if (const std::string which = ResumeFlag(plan.spec, f.training.resume); !which.empty()) {
    HYREC_ASSIGN_OR_RETURN(resume,
                           dense_worker::LoadResumePoint(Env::Default(), plan.spec.checkpoint.dir, which, world));
  }
  CheckpointDirClaim claim;  // Worker 0 holds the run's checkpoint.dir until it exits.
  if (rank == 0) {
    HYREC_ASSIGN_OR_RETURN(claim, dense_worker::ClaimRunCheckpointDir(Env::Default(), plan.spec.checkpoint.dir,
                                                                      resume ? &*resume : nullptr));
  }
  dense_worker::WorkerOptions options;
  options.open_stream = open_stream;
  options.job_id = claim.job_id;
  options.ps = ps.get();
  options.observer = observer.get();
  options.stop = signals.flag();
  options.training = &training;
  options.resume = resume ? &resume->dense : nullptr;
  options.checkpoint_request = rank == 0 ? signals.checkpoint_flag() : nullptr;
  options.job_text = plan.spec.text;
  options.security = security;
  HYREC_ASSIGN_OR_RETURN(TrainReport report, dense_worker::RunWorker(plan.workers[rank], plan.endpoints, options));
  if (rank == 0) HYREC_RETURN_IF_ERROR(FinishWorkerZero(report, f, plan, security));
  return plan.workers[rank].StoppedShort(report.interrupted) ? kExitInterrupted : kExitOk;
}

int Finish(const std::string& program, const absl::StatusOr<int>& result) {
  if (result.ok()) return *result;
  std::cerr << program << ": " << result.status().message() << std::endl;
  return ExitCodeFor(result.status());
}

}  // namespace

RoleCommands SiblingRoleCommands() {
  const std::string dir = ExecutableDirectory();
  return RoleCommands{{dir + "/hyrec-ps"}, {dir + "/hyrec-loader"}, {dir + "/hyrec-worker"}};
}

RoleCommands SelfRoleCommands() {
  const std::string self = ExecutablePath();
  return RoleCommands{{self, "ps"}, {self, "loader"}, {self, "worker"}};
}

int TrainMainWith(int argc, char** argv, const RoleCommands& roles) {
  dense_worker::TuneTrainingProcess();  // Before any thread runs BLAS or allocates.
  TrainFlags f;
  f.training.plot = "hyrec-train.png";
  const std::string program = ProgramName();
  FlagSet flags(program + " train", program == "hyrec"
                                        ? "Train a job on one machine: every role in this process (the default), or "
                                          "each one a process of its own (--processes)."
                                        : absl::StrCat("Train a job on one machine: every role in this process (the "
                                                       "default), or each one a process of its own (--processes). `",
                                                       program,
                                                       " worker|ps|loader|predict|eval|export --help`: the "
                                                       "other roles, with this program's models."));
  AddTrainingFlags(flags, &f.training, {"auto", "live", "lines"});
  flags.Bool("processes", &f.processes,
             "Run every role as its own process on loopback (PS shards, the loader, the workers) with real gRPC "
             "and Gloo: the cluster topology on one machine.");
  flags.Double("ps_latency_ms", &f.ps_latency_ms,
               "With --processes: milliseconds added to every PS round trip by a delaying TCP proxy in front of "
               "each PS (half each way); 0 puts the proxy in with no delay (a latency sweep's baseline); -1: no "
               "proxy.",
               -1, 60000);
  flags.Double("watchdog_seconds", &f.watchdog_seconds,
               "With --processes: a role whose heartbeat is older than this (stopped, frozen) is killed and the "
               "job fails as transient (exit code 3); 0: no watchdog.",
               0, 86400);
  flags.Int("max_restarts", &f.max_restarts,
            "With --processes: restarts of lost PS shards and loaders a run may take before the job fails.", 0,
            1 << 20);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  if (f.ps_latency_ms >= 0 && !f.processes) {
    std::cerr << "hyrec train: --ps_latency_ms needs --processes (the embedded PS has no network)\n";
    return kExitInvalidInput;
  }
  SetUpServerLogging("train", f.training.common.log_level);
  // Progress, the summary and the roles' lines never hold training, the watchdog or a stop
  // signal back: a reader that stops reading costs dropped lines, not a frozen job.
  DetachedOutput::Install();
  const int code = Finish("hyrec train", Train(f, roles));
  DetachedOutput::Finish(absl::Seconds(2));
  return FinishLogging(code);
}

int WorkerMain(int argc, char** argv) {
  dense_worker::TuneTrainingProcess();  // Before any thread runs BLAS or allocates.
  WorkerFlags f;
  FlagSet flags("hyrec worker",
                "One dense worker of a job: its batches from the job's loader, its rows from the "
                "job's PS shards, its dense gradients synchronised with the other workers (c10d).");
  AddTrainingFlags(flags, &f.training, {"auto", "live", "lines", "events", "none"});
  flags.Int("rank", &f.rank, "This worker's rank (default: $RANK, else 0).", -1, 1023);
  flags.String("ps", &f.ps, "ADDRESSES",
               "PS addresses in shard order, comma-separated (default: the job's cluster.ps).");
  flags.String("loader", &f.loader, "ADDRESS", "The loader's address (default: the job's cluster.loader).");
  flags.String("master_addr", &f.master_addr, "HOST",
               "Worker 0's rendezvous host (default: $MASTER_ADDR, else the job's cluster.master).");
  flags.Int("master_port", &f.master_port,
            "Worker 0's rendezvous port (default: $MASTER_PORT, else the job's cluster.master).", 0, 65535);
  AddSecurityFlags(flags, &f.security);
  AddHeartbeatFlag(flags, &f.heartbeat_file);
  AddHealthFlags(flags, &f.health);
  flags.Int("restart_attempt", &f.restart_attempt,
            "The job's restart attempt (Kubernetes: the JobSet's): worker 0 started again within one attempt "
            "fails, transient, so that every role restarts from the latest checkpoint (default: not given).",
            -1, 1 << 30);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  SetUpServerLogging("worker", f.training.common.log_level);
  return FinishLogging(Finish("hyrec worker", Work(f)));
}

}  // namespace hyrec::cli
