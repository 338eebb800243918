// `hyrec loader`: the job's data loader as a process. Streams each dense worker its batches over
// gRPC (DataService); on SIGTERM it writes every worker's stream position to --positions_out so
// that a new loader can resume exactly (--resume).
//
//   hyrec loader --config=job.yaml                     # listens on the job's cluster.loader port
//   hyrec loader --config=job.yaml --resume=positions.txt
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/keepalive.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/ownership.h"
#include "hyrec/common/signals.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/data_loader/config.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/data_loader/loader_metrics.h"
#include "hyrec/data_loader/positions.h"
#include "hyrec/data_loader/synthetic.h"
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

using data_loader::ReaderPosition;

// The job's loader, held as an epoch in checkpoint.dir (`loader/EPOCH`): a loader replaced while
// it was frozen or cut off (a new one started on another host, the workers' streams moved to it by
// name) stops with exit 2 once it sees the raised epoch, and serves nothing after the new one
// began. Null without a checkpoint.dir (no volume the loaders share).
absl::StatusOr<std::shared_ptr<OwnershipEpoch>> ClaimLoader(const job::JobPlan& plan) {
  if (plan.spec.checkpoint.dir.empty()) return std::shared_ptr<OwnershipEpoch>();
  const std::string dir = JoinPath(plan.spec.checkpoint.dir, "loader");
  HYREC_RETURN_IF_ERROR(Annotate(Env::Default()->CreateDirs(dir), "the loader's EPOCH (checkpoint.dir)"));
  OwnershipOptions options;
  options.path = JoinPath(dir, "EPOCH");
  options.what = absl::StrCat("the job's loader (", options.path, ")");
  options.lease = kOwnershipLease;
  options.on_lost = [](const absl::Status& lost) {
    StopAtOnce("loader", absl::StrCat(lost.message(), ": this process no longer serves the job's batches"),
               kExitInvalidInput);
  };
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<OwnershipEpoch> claim, OwnershipEpoch::Take(options));
  return std::shared_ptr<OwnershipEpoch>(std::move(claim));
}

struct LoaderFlags {
  std::string config;
  std::vector<std::string> overrides;  // --set
  std::string host;                    // Empty: the host of the job's cluster.loader.
  int port = -1;
  std::string resume;
  std::string positions_out;
  int replay_batches = 32;
  int replay_mb = 64;
  int arrival_grace_ms = 5000;
  CommonFlags common;
  SecurityFlags security;
  std::string heartbeat_file;
  HealthFlags health;
};

// --resume: a positions file (--positions_out), or a checkpoint (a directory, or 'latest' under the
// job's checkpoint.dir) whose workers' positions are remapped to the job's workers.
absl::StatusOr<std::vector<ReaderPosition>> ReadPositions(const std::string& flag, const job::JobPlan& plan) {
  std::string note;
  const std::string path = ResolveResumeFlag(Env::Default(), plan.spec.checkpoint.dir, kCheckpointPrefix, flag, &note);
  if (!note.empty()) spdlog::info("{}", note);
  if (path.empty()) return std::vector<ReaderPosition>();
  if (path == "latest" || Env::Default()->FileExists(JoinPath(path, kManifestName))) {
    CheckpointManifest manifest;
    HYREC_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(Env::Default(), plan.spec.checkpoint.dir,
                                                                    kCheckpointPrefix, path, &manifest));
    absl::StatusOr<std::vector<ReaderPosition>> positions =
        data_loader::ReadPositionFiles(Env::Default(), dir, manifest, plan.loader.options.num_workers);
    if (!positions.ok()) return Annotate(positions.status(), "--resume");
    return positions;
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --resume file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = data_loader::ParsePositions(text.str());
  if (!parsed.ok()) return Annotate(parsed.status(), path);
  return parsed;
}

void PublishRoleMetrics(const data_loader::LoaderStats& s, MetricsRegistry* m) {
  data_loader::PublishLoaderMetrics(s, m);
  PublishLogMetrics(m);
}

// Waits for a stop signal (returns OK) or for the loader to fail (returns its failure, after
// `grace` so the workers' streams carry it to them first).
absl::Status WaitForStopOrFailure(const data_loader::DataServer& loader, absl::Duration grace) {
  for (;;) {
    pollfd fd = {StopSignalFd(), POLLIN, 0};
    if (poll(&fd, 1, 200) > 0 && (fd.revents & POLLIN) != 0) {
      unsigned char signal = 0;
      if (read(fd.fd, &signal, 1) == 1) spdlog::info("signal {}: shutting down", static_cast<int>(signal));
      return absl::OkStatus();
    }
    const absl::Status failure = loader.status();
    if (!failure.ok()) {
      spdlog::error("the loader failed; exiting in {}: {}", absl::FormatDuration(grace), failure.ToString());
      absl::SleepFor(grace);
      return failure;
    }
  }
}

absl::Status Serve(const LoaderFlags& f) {
  if (f.config.empty()) return absl::InvalidArgumentError("--config=JOB.yaml is required");
  HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile(f.config, f.overrides));
  SetKeepalive(absl::Seconds(plan.endpoints.keepalive_seconds));
  const data_loader::LoaderOptions& options = plan.loader.options;
  HYREC_ASSIGN_OR_RETURN(auto health, MaybeServeHealth(f.health, "hyrec loader"));
  HYREC_ASSIGN_OR_RETURN(std::vector<ReaderPosition> resume, ReadPositions(f.resume, plan));
  std::string host;
  int planned_port = 0;
  HYREC_RETURN_IF_ERROR(job::SplitHostPort(plan.endpoints.loader, "cluster.loader", &host, &planned_port));
  InstallStopSignalHandlers();
  Heartbeat heartbeat(f.heartbeat_file);
  if (options.source.format == data_loader::Format::kSynthetic) {
    const double auc = data_loader::SyntheticSource(options.source.synthetic).TeacherAuc(200'000);
    spdlog::info("synthetic source: the teacher's AUC (the best any model can reach) is {:.4f}", auc);
  }
  // The data is checked now, so that a bad file fails the role at its start; the loader reads
  // once every worker opened its stream, from where the workers stand if they all say so.
  HYREC_RETURN_IF_ERROR(options.Validate());
  HYREC_RETURN_IF_ERROR(data_loader::CheckSourceFiles(options.source).status());
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<OwnershipEpoch> claim, ClaimLoader(plan));
  data_loader::DataServerOptions server_options;
  if (claim != nullptr) {
    // A former loader's lease runs out before this one answers.
    server_options.check_owner = [claim]() -> absl::Status {
      if (const absl::Duration wait = claim->UntilServeable(); wait > absl::ZeroDuration()) {
        return absl::UnavailableError(absl::StrCat("the loader serves in ", absl::FormatDuration(wait),
                                                   ", once a former loader's lease has run out"));
      }
      return claim->CheckLease();
    };
  }
  PeriodicTask ownership(
      kOwnershipCheckPeriod, claim == nullptr ? std::function<void()>() : [claim] { (void)claim->CheckLease(); });
  server_options.host = f.host.empty() ? host : f.host;
  server_options.port = f.port >= 0 ? f.port : planned_port;
  server_options.replay_batches = f.replay_batches;
  server_options.replay_bytes = static_cast<size_t>(f.replay_mb) << 20;
  server_options.arrival_grace = absl::Milliseconds(f.arrival_grace_ms);
  server_options.security = ResolveSecurity(plan.spec.security, Identity{Role::kLoader, 0}, f.security);
  // JobDone from worker 0: the loader stops as on SIGTERM (exit 0) when the job's services exit
  // with its workers; otherwise it says so and serves on.
  server_options.on_job_done = [exit = plan.spec.cluster.services_exit_when_done] {
    if (!exit) {
      spdlog::info("the job's workers are done; serving on until stopped (cluster.services_exit_when_done: false)");
      return;
    }
    spdlog::info("the job's workers are done: stopping (cluster.services_exit_when_done)");
    kill(getpid(), SIGTERM);
  };
  const std::string port_setting =
      f.port >= 0 ? std::string("--port") : absl::StrCat("cluster.loader in ", f.config, " (or --port)");
  HYREC_ASSIGN_OR_RETURN(auto server, NamePortSetting(data_loader::DataServer::StartDeferred(
                                                          [options](const std::vector<ReaderPosition>& starts) {
                                                            return data_loader::Loader::Start(options, starts);
                                                          },
                                                          options, resume, server_options),
                                                      port_setting));
  const data_loader::DataServer* raw_server = server.get();
  MetricsRegistry metrics;
  std::unique_ptr<MetricsHttpServer> metrics_server;
  if (f.common.metrics_port >= 0) {
    metrics.AddCollector([raw_server](MetricsRegistry* m) { PublishRoleMetrics(raw_server->Stats(), m); });
    HYREC_ASSIGN_OR_RETURN(metrics_server, NamePortSetting(MetricsHttpServer::Start(f.common.metrics_host,
                                                                                    f.common.metrics_port, &metrics),
                                                           "--metrics_port"));
    std::cout << "hyrec loader metrics on " << f.common.metrics_host << ":" << metrics_server->port() << std::endl;
  }
  std::cout << "hyrec loader for " << options.num_workers << " worker(s) listening on " << server_options.host << ":"
            << server->port() << std::endl;
  SetServing(health.get(), true);
  const absl::Status failure = WaitForStopOrFailure(*server, absl::Seconds(2));
  SetServing(health.get(), false);
  if (metrics_server != nullptr) metrics_server->Stop();
  absl::Status written;
  if (!f.positions_out.empty()) {
    const std::vector<ReaderPosition> positions = server->Positions();
    std::ofstream out(f.positions_out);
    out << data_loader::FormatPositions(positions);
    out.close();
    if (!out) written = absl::UnavailableError(absl::StrCat("cannot write --positions_out '", f.positions_out, "'"));
  }
  server->Shutdown(absl::Seconds(2));
  server->Wait();
  return failure.ok() ? written : failure;
}

}  // namespace

int LoaderMain(int argc, char** argv) {
  LoaderFlags f;
  FlagSet flags("hyrec loader", "The job's data loader: streams each dense worker its batches (gRPC DataService).");
  flags.String("config", &f.config, "FILE", "The job's YAML file (required); its loader section and plan.");
  AddSetFlag(flags, &f.overrides);
  flags.String("host", &f.host, "HOST", "Address to listen on; default: the host of the job's cluster.loader.");
  flags.Int("port", &f.port, "Port; 0 picks a free one (printed); -1: the job's cluster.loader port.", -1, 65535);
  flags.String("resume", &f.resume, "FILE|DIR|latest",
               "Per-worker positions to resume from: a file written by --positions_out, or a checkpoint (its "
               "directory, or 'latest' under the job's checkpoint.dir).");
  flags.String("positions_out", &f.positions_out, "FILE", "Where to write the workers' positions on shutdown.");
  flags.Int("replay_batches", &f.replay_batches,
            "Batches kept per worker after sending, so that a broken stream reconnects, and a replacement worker takes "
            "over a lost one's stream, without losing or repeating a batch.",
            1, 4096);
  flags.Int("replay_mb", &f.replay_mb,
            "And at least this many MiB of them per worker (the transport holds many small batches in flight).", 0,
            65536);
  flags.Int("arrival_grace_ms", &f.arrival_grace_ms,
            "How long after the first worker's stream the loader waits for the others' before it reads for those that "
            "came (a lost worker's replacement may need its peers to train first).",
            0, 3600000);
  AddSecurityFlags(flags, &f.security);
  AddHeartbeatFlag(flags, &f.heartbeat_file);
  AddHealthFlags(flags, &f.health);
  flags.AddCommon(&f.common);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  SetUpServerLogging("loader", f.common.log_level);
  const absl::Status status = Serve(f);
  if (!status.ok()) std::cerr << "hyrec loader: " << status.message() << "\n";
  return FinishLogging(ExitCodeFor(status));
}

}  // namespace hyrec::cli
