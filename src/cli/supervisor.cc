#include "src/cli/supervisor.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/latency_proxy.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/embedding_ps/client.h"
#include "src/cli/heartbeat.h"
#include "src/cli/restart_policy.h"
#include "src/dense_worker/events.h"

namespace hyrec::cli {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(60);
constexpr absl::Duration kStopTimeout = absl::Seconds(10);
constexpr int kMaxFallbacks = 3;  // Restarts of the whole job from its latest checkpoint.

// Where a lost role's restart stands.
enum class Restarted { kYes, kLater, kNo };

std::vector<std::string> Command(const std::vector<std::string>& role, std::vector<std::string> args) {
  std::vector<std::string> argv = role;
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The launcher's restart policy: backoffs from 1 s, doubling in a crash loop to 8 s at most, so
// that a few losses in a row stay well inside the workers' waits for the role
// (train.batch_timeout_seconds, the PS recovery wait); the budget bounds a crash loop.
RestartPolicyOptions RestartPolicyFor(const ProcessesOptions& options) {
  RestartPolicyOptions policy;
  policy.budget = options.max_restarts;
  return policy;
}

// The processes of one run and the threads that read their output.
class Supervisor {
 public:
  explicit Supervisor(const ProcessesOptions& options) : options_(options), restarts_(RestartPolicyFor(options)) {}

  ~Supervisor() {
    for (auto& w : workers_) w->Signal(SIGKILL);
    StopServers();
    done_ = true;
    for (std::thread& t : readers_) t.join();
    if (!certs_dir_.empty()) (void)DeleteDirAndFiles(Env::Default(), certs_dir_);
    if (!run_dir_.empty()) (void)DeleteDirAndFiles(Env::Default(), run_dir_);
  }

  // Whether the run ended because a worker was lost (killed, frozen, a transient failure).
  bool worker_lost() const { return worker_lost_; }

  absl::StatusOr<ProcessesResult> Run() {
    HYREC_RETURN_IF_ERROR(MakeRunDirectory());
    HYREC_RETURN_IF_ERROR(StartServers());
    HYREC_RETURN_IF_ERROR(StartWorkers());
    ProcessesResult result;
    HYREC_ASSIGN_OR_RETURN(result.exit_code, WaitForWorkers());
    // A server lost near the end whose restart was still waiting out its backoff: the workers
    // did not need it.
    for (const std::string& role : restarts_.Pending()) {
      monitor_->Note(absl::StrCat(role, " was not restarted: the workers finished before its backoff ran out"));
    }
    restarts_.ClearPending();
    StopServers();
    done_ = true;
    for (std::thread& t : readers_) t.join();
    readers_.clear();
    if (result.exit_code == kExitOk || result.exit_code == kExitInterrupted) {
      if (!events_->finished()) return absl::InternalError("worker 0 exited without its summary");
      result.report = events_->report();
      monitor_->OnFinish(result.report);
    }
    return result;
  }

 private:
  const job::JobPlan& plan() const { return *options_.plan; }

  // Starts a child named `name` (its log lines are prefixed with it), with a heartbeat file
  // the watchdog reads.
  absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(std::vector<std::string> argv, const std::string& name) {
    SpawnOptions spawn;
    spawn.new_process_group = true;  // Ctrl-C reaches the launcher, which stops the roles in order.
    spawn.capture_stderr = true;
    std::string heartbeat;
    if (options_.watchdog > absl::ZeroDuration()) {
      heartbeat = JoinPath(run_dir_, absl::StrCat(absl::StrReplaceAll(name, {{" ", "-"}}), ".alive"));
      ::unlink(heartbeat.c_str());  // A restarted role's predecessor's is stale.
      argv.push_back("--heartbeat_file=" + heartbeat);
    }
    auto process = Subprocess::Spawn(argv, spawn);
    if (!process.ok()) return Annotate(process.status(), absl::StrCat("starting ", argv[0]));
    Subprocess* child = process->get();
    readers_.emplace_back([child, name] {
      for (;;) {
        absl::StatusOr<std::string> line = child->ReadErrorLine(absl::Hours(1));
        if (absl::IsDeadlineExceeded(line.status())) continue;
        if (!line.ok()) return;  // The child closed stderr: it exited.
        std::cerr << absl::StrCat("[", name, "] ", *line, "\n") << std::flush;
      }
    });
    watched_.push_back(Watched{child, name, heartbeat, absl::Now(), false});
    return process;
  }

  // A running child whose heartbeat is older than the watchdog timeout (or that has written
  // none that long after its start): its name.
  std::optional<std::string> Stalled() const {
    if (options_.watchdog <= absl::ZeroDuration()) return std::nullopt;
    const absl::Time now = absl::Now();
    for (const Watched& w : watched_) {
      if (w.heartbeat.empty() || w.killed || !w.process->running()) continue;
      const double age = SecondsSinceTouched(w.heartbeat);
      const bool stale = age < 0 ? now - w.started > options_.watchdog : age > absl::ToDoubleSeconds(options_.watchdog);
      if (stale) return w.name;
    }
    return std::nullopt;
  }

  absl::StatusOr<int> Listening(Subprocess& process, const std::string& what) {
    absl::StatusOr<int> port = WaitForListeningPort(process, kStartTimeout);
    if (port.ok()) return port;
    auto code = process.Wait(absl::Seconds(1));
    const int exit_code = code.ok() ? *code : kExitTransient;
    return absl::Status(
        exit_code == kExitInvalidInput ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kUnavailable,
        absl::StrCat(what, " did not start (",
                     code.ok() ? absl::StrCat("exit code ", *code) : std::string(port.status().message()),
                     "); its error is above"));
  }

  // A private temporary directory for the run (it goes when the run ends): the children's
  // heartbeats and, with security.mode mtls, a CA and a certificate per role made for this run.
  absl::Status MakeRunDirectory() {
    char pattern[] = "/tmp/hyrec-run-XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot create the run's directory: ", std::strerror(errno)));
    }
    run_dir_ = pattern;
    if (!plan().spec.security.mtls) return absl::OkStatus();
    certs_dir_ = JoinPath(run_dir_, "certs");
    CertificateRequest request;
    request.dir = certs_dir_;
    request.identities =
        JobIdentities(static_cast<int>(plan().workers.size()), static_cast<int>(plan().ps.size()), /*loaders=*/1);
    request.validity = absl::Hours(24 * 30);
    return Annotate(WriteJobCertificates(request), "the run's certificates");
  }

  // The job file and its --set overrides: every role reads the same job.
  std::vector<std::string> JobFlags() const {
    std::vector<std::string> flags = {"--config=" + options_.config_path};
    for (const std::string& o : options_.overrides) flags.push_back("--set=" + o);
    return flags;
  }

  std::vector<std::string> CertsFlag() const {
    if (certs_dir_.empty()) return {};
    return {"--certs=" + certs_dir_};
  }

  absl::Status StartServers() {
    std::vector<std::string> common = JobFlags();
    for (const char* flag : {"--host=127.0.0.1", "--port=0"}) common.push_back(flag);
    common.push_back("--log_level=" + options_.log_level);
    for (std::string& flag : CertsFlag()) common.push_back(std::move(flag));
    if (!options_.resume.empty()) common.push_back("--resume=" + options_.resume);
    for (size_t i = 0; i < plan().ps.size(); ++i) {
      std::vector<std::string> args = common;
      args.push_back(absl::StrCat("--shard_index=", i));
      HYREC_ASSIGN_OR_RETURN(auto ps, Spawn(Command(options_.roles.ps, args), absl::StrCat("ps ", i)));
      ps_.push_back(std::move(ps));
      ps_args_.push_back(std::move(args));
    }
    loader_args_ = common;
    HYREC_ASSIGN_OR_RETURN(loader_, Spawn(Command(options_.roles.loader, common), "loader"));
    for (size_t i = 0; i < ps_.size(); ++i) {
      HYREC_ASSIGN_OR_RETURN(int port, ListeningOrStartedAgain(options_.roles.ps, ps_args_[i], absl::StrCat("ps ", i),
                                                               {"ps", std::to_string(i)}, &ps_[i]));
      ps_ports_.push_back(port);
      std::string address = absl::StrCat("127.0.0.1:", port);
      if (options_.ps_latency_ms >= 0) {
        HYREC_ASSIGN_OR_RETURN(
            auto proxy, LatencyProxy::Start("127.0.0.1", port, absl::Microseconds(options_.ps_latency_ms * 500)));
        address = absl::StrCat("127.0.0.1:", proxy->port());
        proxies_.push_back(std::move(proxy));
      }
      ps_addresses_.push_back(address);
    }
    HYREC_ASSIGN_OR_RETURN(loader_port_, ListeningOrStartedAgain(options_.roles.loader, loader_args_, "loader",
                                                                 {"loader", "0"}, &loader_));
    loader_address_ = absl::StrCat("127.0.0.1:", loader_port_);
    dense_worker::MonitorOptions monitor = options_.monitor;
    if (monitor.metrics != nullptr) {  // The PS figures, read from the shards at each report.
      embedding_ps::ClientOptions client;
      client.security = job::RoleSecurity(plan().spec.security, Identity{Role::kAdmin, 0}, certs_dir_);
      HYREC_ASSIGN_OR_RETURN(metrics_client_, embedding_ps::ConnectEmbeddingClient(ps_addresses_, client));
      monitor.ps = metrics_client_.get();
    }
    monitor_ = std::make_unique<dense_worker::JobMonitor>(monitor);
    events_ = std::make_unique<dense_worker::EventReader>(monitor_.get());
    for (auto& ps : ps_) Drain(ps.get(), /*events=*/false);
    Drain(loader_.get(), /*events=*/false);
    monitor_->Note(absl::StrCat("processes: ", ps_.size(), " PS (", absl::StrJoin(ps_addresses_, ","), "), loader ",
                                loader_address_, ", ", plan().workers.size(), " worker(s)"));
    return absl::OkStatus();
  }

  absl::Status StartWorkers() {
    const int master_port = PickFreeLoopbackPort();
    for (size_t r = 0; r < plan().workers.size(); ++r) {
      std::vector<std::string> args = JobFlags();
      for (std::string& flag : std::vector<std::string>{
               absl::StrCat("--rank=", r), "--ps=" + absl::StrJoin(ps_addresses_, ","), "--loader=" + loader_address_,
               "--master_addr=127.0.0.1", absl::StrCat("--master_port=", master_port),
               r == 0 ? "--progress=events" : "--progress=none", "--plot=", "--log_level=" + options_.log_level,
               "--resume=" + options_.resume}) {
        args.push_back(std::move(flag));
      }
      for (std::string& flag : CertsFlag()) args.push_back(std::move(flag));
      HYREC_ASSIGN_OR_RETURN(auto worker, Spawn(Command(options_.roles.worker, args), absl::StrCat("worker ", r)));
      workers_.push_back(std::move(worker));
      worker_args_.push_back(std::move(args));
      Drain(workers_.back().get(), /*events=*/r == 0);
    }
    return absl::OkStatus();
  }

  // Reads a child's stdout until it closes: worker 0's events go to the monitor, other lines are
  // shown as they are. Nothing a child writes can fill its pipe and block it.
  void Drain(Subprocess* process, bool events) {
    readers_.emplace_back([this, process, events] {
      while (!done_) {
        absl::StatusOr<std::string> line = process->ReadLine(absl::Milliseconds(200));
        if (absl::IsDeadlineExceeded(line.status())) continue;
        if (!line.ok()) return;
        if (events) {
          absl::StatusOr<bool> event = events_->Read(*line);
          if (event.ok() && *event) continue;
          if (!event.ok()) monitor_->Note(absl::StrCat("(unreadable worker event: ", event.status().message(), ")"));
        }
        monitor_->Note(*line);
      }
    });
  }

  // A server (PS shard or loader) that exited while the workers run: restarted on its port after
  // a backoff, within the run's restart budget. A PS shard recovers from its update log
  // (--recover); a loader resumes every worker from where its stream stands. False when it
  // cannot be (a shard without a log, the budget spent, a failed start), with the reason noted.
  bool RestartDeadServers() {
    for (size_t i = 0; i < ps_.size(); ++i) {
      absl::StatusOr<int> code = ps_[i]->Wait(absl::ZeroDuration());
      if (!code.ok()) continue;                                                 // Running.
      if (*code == 0 && plan().spec.cluster.services_exit_when_done) continue;  // Worker 0 said the job is done.
      const std::string what = absl::StrCat("PS shard ", i, " exited (", ExitDescription(*ps_[i], *code), ")");
      if (plan().ps[i].update_log_dir.empty()) {
        monitor_->Note(what + "; the job keeps no update log (ps.update_log, checkpoint.dir) to recover it from");
        return false;
      }
      std::vector<std::string> args;
      for (const std::string& a : ps_args_[i]) {
        if (!absl::StartsWith(a, "--resume=")) args.push_back(a);
      }
      args.push_back("--recover");
      const Restarted restarted =
          Restart(what + "; restarting it to recover from its update log", options_.roles.ps, std::move(args),
                  ps_ports_[i], absl::StrCat("ps ", i), {"ps", std::to_string(i)}, &ps_[i]);
      if (restarted == Restarted::kNo) return false;
      if (restarted == Restarted::kLater) continue;
      monitor_->Note(absl::StrCat("PS shard ", i, " recovered and serves again on port ", ps_ports_[i]));
    }
    absl::StatusOr<int> loader_code = loader_->Wait(absl::ZeroDuration());
    if (loader_code.ok() && *loader_code == 0 && plan().spec.cluster.services_exit_when_done) {
      loader_code = absl::UnavailableError("done");  // Every worker read to the end of the data.
    }
    if (absl::StatusOr<int>& code = loader_code; code.ok()) {
      // The workers report where their streams stand; a worker that cannot (a replacement) is
      // started from the newest checkpoint's positions, not the run's first --resume, which the
      // checkpoints' retention may have deleted since.
      std::vector<std::string> args;
      for (const std::string& a : loader_args_) {
        if (!absl::StartsWith(a, "--resume=") || plan().spec.checkpoint.dir.empty()) args.push_back(a);
      }
      if (!plan().spec.checkpoint.dir.empty()) args.push_back("--resume=auto");
      const Restarted restarted =
          Restart(absl::StrCat("the loader exited (", ExitDescription(*loader_, *code),
                               "); restarting it to resume every worker where its stream stands"),
                  options_.roles.loader, std::move(args), loader_port_, "loader", {"loader", "0"}, &loader_);
      if (restarted == Restarted::kNo) return false;
      if (restarted == Restarted::kLater) return true;
      monitor_->Note(absl::StrCat("the loader serves again on port ", loader_port_));
    }
    return true;
  }

  // Starts `role` with `args` again on `port` once its backoff has passed, replacing *process:
  // kLater until then (the caller asks again; other roles are supervised meanwhile), kNo (noted)
  // when the budget is spent or the start fails.
  Restarted Restart(const std::string& why, const std::vector<std::string>& role, std::vector<std::string> args,
                    int port, const std::string& name, const std::pair<std::string, std::string>& label,
                    std::unique_ptr<Subprocess>* process) {
    args.erase(
        std::remove_if(args.begin(), args.end(), [](const std::string& a) { return absl::StartsWith(a, "--port="); }),
        args.end());
    args.push_back(absl::StrCat("--port=", port));
    if (const Restarted due = TakeRestart(why, label); due != Restarted::kYes) return due;
    absl::StatusOr<std::unique_ptr<Subprocess>> started = Spawn(Command(role, args), name);
    const absl::StatusOr<int> listening =
        started.ok() ? ListeningOrStartedAgain(role, args, name, label, &*started) : started.status();
    if (!listening.ok()) {
      monitor_->Note(absl::StrCat(name, " did not come back: ", listening.status().message()));
      return Restarted::kNo;
    }
    retired_.push_back(std::move(*process));  // Its reader threads may still hold it.
    *process = std::move(*started);
    Drain(process->get(), /*events=*/false);
    restarts_.Started(RoleName(label), absl::Now());  // Its run begins serving.
    return Restarted::kYes;
  }

  // Waits for the server *process (`role` with `args`) to listen and returns its port. One
  // killed by a signal while it started (lost again while it recovered, or while the whole job
  // restarted) is a loss like any other: started again within the restart budget, replacing
  // *process. Any other failed start is the error.
  absl::StatusOr<int> ListeningOrStartedAgain(const std::vector<std::string>& role,
                                              const std::vector<std::string>& args, const std::string& name,
                                              const std::pair<std::string, std::string>& label,
                                              std::unique_ptr<Subprocess>* process) {
    for (;;) {
      absl::StatusOr<int> listening = Listening(**process, name);
      if (listening.ok()) return listening;
      const absl::StatusOr<int> code = (*process)->Wait(absl::ZeroDuration());
      const bool lost =
          code.ok() && *code > 128 && *code != kExitInterrupted && !(options_.stop != nullptr && options_.stop->load());
      if (!lost) return listening.status();
      const std::string cause =
          absl::StrCat(name, " was lost while it started (", ExitDescription(**process, *code), "); starting it again");
      if (!TakeRestartNow(cause, label)) {
        return absl::UnavailableError(absl::StrCat(cause, ": the restart budget is spent"));
      }
      retired_.push_back(std::move(*process));  // Its reader threads may still hold it.
      HYREC_ASSIGN_OR_RETURN(*process, Spawn(Command(role, args), name));
    }
  }

  // Whether worker `r`'s exit with `code` is healed by a replacement: a worker other than
  // worker 0 (which hosts the group's rendezvous), killed by a signal (lost, not failed on its
  // input), in a job of several workers with train.heal_timeout_seconds.
  bool Healable(size_t r, int code) const {
    return r != 0 && plan().workers.size() > 1 && plan().workers[r].heal_timeout_seconds > 0 && code > 128 &&
           code != kExitInterrupted && !(options_.stop != nullptr && options_.stop->load());
  }

  // Starts worker `r` again with its flags once its backoff has passed: it joins its live peers'
  // group as a replacement. kLater until then, kNo (noted) when the budget is spent or it cannot
  // start.
  Restarted RestartWorker(size_t r, int code) {
    const std::string why = absl::StrCat("worker ", r, " exited (", ExitDescription(*workers_[r], code),
                                         "); restarting it to heal from its live peers");
    if (const Restarted due = TakeRestart(why, {"worker", std::to_string(r)}); due != Restarted::kYes) return due;
    // It heals from its peers' state; a --resume of this attempt (the run's, or a fallback's
    // checkpoint) names a checkpoint that the checkpoints' retention may have deleted since, so
    // it resumes from the newest one instead, as a replaced loader does.
    std::vector<std::string> args = worker_args_[r];
    for (std::string& a : args) {
      if (absl::StartsWith(a, "--resume=") && !plan().spec.checkpoint.dir.empty()) a = "--resume=auto";
    }
    absl::StatusOr<std::unique_ptr<Subprocess>> started =
        Spawn(Command(options_.roles.worker, args), absl::StrCat("worker ", r));
    if (!started.ok()) {
      monitor_->Note(absl::StrCat("worker ", r, " did not come back: ", started.status().message()));
      return Restarted::kNo;
    }
    retired_.push_back(std::move(workers_[r]));
    workers_[r] = std::move(*started);
    Drain(workers_[r].get(), /*events=*/false);
    return Restarted::kYes;
  }

  // A lost role's restart: the first call counts it against the budget (kNo, noted, when spent)
  // and sets its backoff; this call and the next ones are kLater until the backoff has passed,
  // then kYes once. The launcher supervises the other roles while one waits out its backoff.
  Restarted TakeRestart(const std::string& why, const std::pair<std::string, std::string>& label) {
    const RestartPolicy::Decision decision = restarts_.Take(RoleName(label), absl::Now());
    if (decision.verdict == RestartPolicy::Verdict::kYes) return Restarted::kYes;
    if (decision.verdict == RestartPolicy::Verdict::kNo) {
      Note(absl::StrCat(why.substr(0, why.find(';')), "; the restart budget (", restarts_.budget(), ") is spent"));
      return Restarted::kNo;
    }
    if (!decision.counted) return Restarted::kLater;
    Note(absl::StrCat(why, " (in ", absl::FormatDuration(absl::Trunc(decision.backoff, absl::Milliseconds(1))),
                      "; restart ", restarts_.restarts(), " of at most ", restarts_.budget(), ")"));
    if (options_.monitor.metrics != nullptr) {
      options_.monitor.metrics->Describe("hyrec_role_restarts_total", MetricType::kCounter,
                                         "Roles the launcher restarted after they exited.");
      options_.monitor.metrics->Add("hyrec_role_restarts_total", {{"role", label.first}, {"index", label.second}}, 1);
    }
    return Restarted::kLater;
  }
  static std::string RoleName(const std::pair<std::string, std::string>& label) {
    return absl::StrCat(label.first, " ", label.second);
  }

  // TakeRestart, waiting out the backoff here (a role lost while it started); false when the
  // budget is spent.
  bool TakeRestartNow(const std::string& why, const std::pair<std::string, std::string>& label) {
    for (;;) {
      const Restarted due = TakeRestart(why, label);
      if (due != Restarted::kLater) return due == Restarted::kYes;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  // A line of the run's log: through the monitor once the servers are up, before that (a role
  // restarted while the job starts) on the monitor's stream.
  void Note(const std::string& line) {
    if (monitor_ != nullptr) {
      monitor_->Note(line);
      return;
    }
    std::ostream& out = options_.monitor.out != nullptr ? *options_.monitor.out : std::cerr;
    out << line << std::endl;
  }

  // How `process` ended with `code` (its Wait's): killed by a signal, or an exit code of its own.
  static std::string ExitDescription(const Subprocess& process, int code) {
    return process.term_signal() > 0 ? absl::StrCat("killed by signal ", process.term_signal())
                                     : absl::StrCat("exit code ", code);
  }

  // The watchdog: a child whose heartbeat is stale (stopped or frozen) is killed. A PS shard with
  // update logs, the loader and a worker that heals are then restarted, once seen gone; any
  // other stalled child stops the job (`result`, and the others' kill time).
  void KillStalled(int* result, absl::Time* kill_at) {
    const std::optional<std::string> stalled = Stalled();
    if (!stalled.has_value()) return;
    size_t worker = 0;
    const bool restarted = *stalled == "loader" ||
                           (absl::StartsWith(*stalled, "ps ") && !plan().ps[0].update_log_dir.empty()) ||
                           (absl::StartsWith(*stalled, "worker ") && absl::SimpleAtoi(stalled->substr(7), &worker) &&
                            Healable(worker, 128 + SIGKILL));
    monitor_->Note(absl::StrCat(*stalled, " made no progress for ", absl::FormatDuration(options_.watchdog),
                                " (stopped or frozen); killing it ",
                                restarted ? "to restart it" : "and stopping the job"));
    for (Watched& w : watched_) {
      if (w.name != *stalled || !w.process->running()) continue;
      w.process->Signal(SIGKILL);
      w.killed = true;  // Not watched again; its replacement is.
    }
    if (restarted) return;
    worker_lost_ = absl::StartsWith(*stalled, "worker ");
    *result = kExitTransient;
    for (auto& w : workers_) w->Signal(SIGTERM);
    *kill_at = absl::Now() + kStopTimeout;
  }

  // The workers' exit: kExitOk when all succeeded, kExitInterrupted when they were stopped, else
  // the first failure's code (the others are then stopped).
  absl::StatusOr<int> WaitForWorkers() {
    bool forwarded = false;
    int result = kExitOk;
    absl::Time kill_at = absl::InfiniteFuture();
    for (;;) {
      if (options_.checkpoint_request != nullptr && options_.checkpoint_request->exchange(false)) {
        workers_[0]->Signal(SIGUSR1);  // Worker 0 decides when; the others follow its vote.
      }
      if (options_.stop != nullptr && options_.stop->load() && !forwarded) {
        for (auto& w : workers_) w->Signal(SIGINT);
        forwarded = true;
      }
      if (result == kExitOk && !RestartDeadServers()) {
        result = kExitTransient;
        for (auto& w : workers_) w->Signal(SIGTERM);
        kill_at = absl::Now() + kStopTimeout;
      }
      if (result == kExitOk) KillStalled(&result, &kill_at);
      bool running = false;
      for (size_t r = 0; r < workers_.size(); ++r) {
        absl::StatusOr<int> code = workers_[r]->Wait(absl::ZeroDuration());
        if (!code.ok()) {
          running = true;
          continue;
        }
        // Interrupted (SIGINT or SIGTERM, its batch finished): the run stops, and that is no failure.
        if (*code == kExitOk || (*code == kExitInterrupted && workers_[r]->term_signal() == 0 &&
                                 (result == kExitOk || result == kExitInterrupted))) {
          if (*code == kExitInterrupted) result = kExitInterrupted;
          continue;
        }
        if (result == kExitOk && Healable(r, *code) && RestartWorker(r, *code) != Restarted::kNo) {
          running = true;  // Restarted, or once its backoff has passed.
          continue;
        }
        if (result == kExitOk || result == kExitInterrupted) {
          // A worker killed by a signal lost its peer role, not its input: transient.
          result = *code > 128 && *code != kExitInterrupted ? kExitTransient : *code;
          worker_lost_ = result == kExitTransient;
          monitor_->Note(
              absl::StrCat("worker ", r, " failed (", ExitDescription(*workers_[r], *code), "); stopping the others"));
          for (auto& w : workers_) w->Signal(SIGTERM);
          kill_at = absl::Now() + absl::Seconds(plan().workers[0].sync_timeout_seconds) + kStopTimeout;
        }
      }
      if (!running) return result;
      if (absl::Now() > kill_at) {
        for (auto& w : workers_) w->Signal(SIGKILL);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  void StopServers() {
    std::vector<Subprocess*> servers;
    if (loader_ != nullptr) servers.push_back(loader_.get());
    for (auto& p : ps_) servers.push_back(p.get());
    for (Subprocess* s : servers) s->Signal(SIGTERM);
    for (Subprocess* s : servers) {
      if (s->Wait(kStopTimeout).ok()) continue;
      s->Signal(SIGKILL);
      (void)s->Wait(kStopTimeout);
    }
  }

  const ProcessesOptions& options_;
  std::unique_ptr<dense_worker::JobMonitor> monitor_;  // Once the servers are up.
  std::unique_ptr<dense_worker::EventReader> events_;  // Worker 0's events, into monitor_.
  std::vector<std::unique_ptr<Subprocess>> ps_;
  std::vector<std::vector<std::string>> ps_args_;  // Each shard's arguments, for a restart.
  std::vector<int> ps_ports_;
  std::vector<std::unique_ptr<Subprocess>> retired_;  // Restarted shards' old processes.
  // Restarts of PS shards, the loader and healing workers, by role ("ps 1", "loader 0", "worker 1").
  RestartPolicy restarts_;
  bool worker_lost_ = false;
  std::unique_ptr<Subprocess> loader_;
  std::vector<std::string> loader_args_;  // For a restart.
  int loader_port_ = 0;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::vector<std::vector<std::string>> worker_args_;  // Each worker's flags, for a replacement.
  std::vector<std::unique_ptr<LatencyProxy>> proxies_;
  std::unique_ptr<embedding_ps::EmbeddingClient> metrics_client_;
  std::vector<std::string> ps_addresses_;
  std::string loader_address_;
  struct Watched {
    Subprocess* process;
    std::string name;
    std::string heartbeat;  // Empty: not watched.
    absl::Time started;
    bool killed = false;  // By the watchdog.
  };

  std::string run_dir_;    // Private temporary directory: heartbeats, certificates.
  std::string certs_dir_;  // The run's certificates (security.mode mtls).
  std::vector<Watched> watched_;
  std::atomic<bool> done_{false};
  std::vector<std::thread> readers_;
};

}  // namespace

absl::StatusOr<ProcessesResult> RunProcesses(const ProcessesOptions& options) {
  if (options.plan == nullptr) return absl::InvalidArgumentError("RunProcesses needs the job's plan");
  ProcessesOptions attempt = options;
  for (int fallbacks = 0;; ++fallbacks) {
    absl::StatusOr<ProcessesResult> result;
    bool worker_lost = false;
    {
      Supervisor cluster(attempt);
      result = cluster.Run();
      worker_lost = cluster.worker_lost();
    }
    if (!result.ok() || result->exit_code != kExitTransient || !worker_lost) return result;
    if (options.stop != nullptr && options.stop->load()) return result;
    // A lost worker takes its dense replica and its place in the group: every role restarts
    // from the job's latest checkpoint, when there is one.
    std::ostream& out = options.monitor.out != nullptr ? *options.monitor.out : std::cerr;
    const std::string& root = options.plan->spec.checkpoint.dir;
    CheckpointManifest manifest;
    absl::StatusOr<std::string> latest =
        root.empty() ? absl::NotFoundError("the job keeps no checkpoints (checkpoint.dir)")
                     : ResolveCheckpoint(Env::Default(), root, kCheckpointPrefix, "latest", &manifest);
    if (!latest.ok()) {
      out << "a worker was lost and the job cannot fall back to a checkpoint: " << latest.status().message()
          << std::endl;
      return result;
    }
    if (fallbacks >= kMaxFallbacks) {
      out << "a worker was lost again; the job fell back to a checkpoint " << kMaxFallbacks
          << " times already and stops" << std::endl;
      return result;
    }
    out << "a worker was lost: every role restarts from the latest checkpoint, " << *latest << " (step "
        << manifest.step << "; fallback " << fallbacks + 1 << " of at most " << kMaxFallbacks << ")" << std::endl;
    attempt.resume = *latest;
  }
}

}  // namespace hyrec::cli
