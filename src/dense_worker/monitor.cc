#include "hyrec/dense_worker/monitor.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hyrec/common/program.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::dense_worker {
namespace {

constexpr char kClearLine[] = "\r\x1b[K";  // Carriage return, then erase to the end of the line.

std::string Duration(double seconds) {
  if (seconds < 120) return absl::StrFormat("%.0f s", seconds);
  if (seconds < 7200) return absl::StrFormat("%.0f min %02.0f s", std::floor(seconds / 60), std::fmod(seconds, 60));
  return absl::StrFormat("%.0f h %02.0f min", std::floor(seconds / 3600), std::floor(std::fmod(seconds, 3600) / 60));
}

std::string Megabytes(uint64_t bytes) { return absl::StrFormat("%.1f", static_cast<double>(bytes) / 1e6); }

// "  12.3/45.6 MB" (with the epoch when there are several) for a file source; empty otherwise.
std::string BytesRead(const Progress& p) {
  if (p.bytes_total == 0) return "";
  std::string out = absl::StrCat("  ", Megabytes(p.bytes_read), "/", Megabytes(p.bytes_total), " MB");
  if (p.epochs != 1) absl::StrAppend(&out, " of epoch ", p.epoch + 1, p.epochs > 1 ? absl::StrCat("/", p.epochs) : "");
  return out;
}

// Event-time freshness: now less the newest trained sample's time (never negative: a clock
// ahead of this one).
double EventFreshness(const Progress& p) {
  return std::max(0.0, absl::ToDoubleSeconds(absl::Now() - absl::FromUnixSeconds(static_cast<int64_t>(p.event_time))));
}

// Seconds left, from the planned samples or else from the bytes of a file source read over its
// epochs; negative when neither says.
double SecondsLeft(const Progress& p) {
  if (p.last || p.samples_per_second <= 0 || p.elapsed_seconds <= 0) return -1;
  if (p.planned_samples > 0) {
    return std::max(0.0, (static_cast<double>(p.planned_samples) - p.samples) / p.samples_per_second);
  }
  if (p.bytes_total == 0 || p.epochs == 0) return -1;
  const double done = (static_cast<double>(p.epoch) + static_cast<double>(p.bytes_read) / p.bytes_total) / p.epochs;
  if (done <= 0) return -1;
  return std::max(0.0, p.elapsed_seconds * (1 - std::min(done, 1.0)) / done);
}

// The terminal's width in columns: $COLUMNS when set (shells keep it without exporting it, so
// it is set on purpose), else stdout's when it is a terminal, else 80.
int TerminalColumns() {
  int columns = 0;
  const char* env = std::getenv("COLUMNS");
  if (env != nullptr && absl::SimpleAtoi(env, &columns) && columns > 0) return columns;
  winsize size{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// The parts of a live line in their order, each with a rank (0: always shown): the lowest
// ranked parts are left out until the line fits in `columns` - 1 (a line as wide as the
// terminal wraps on some), and what still does not fit is cut.
std::string FitLine(const std::vector<std::pair<std::string, int>>& parts, int columns) {
  const size_t room = static_cast<size_t>(std::max(columns - 1, 20));
  std::vector<bool> shown(parts.size(), true);
  for (;;) {
    std::string line;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (shown[i]) line += parts[i].first;
    }
    if (line.size() <= room) return line;
    int drop = -1;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (shown[i] && parts[i].second > 0 && (drop < 0 || parts[i].second > parts[drop].second)) {
        drop = static_cast<int>(i);
      }
    }
    if (drop < 0) return line.substr(0, room);
    shown[drop] = false;
  }
}

}  // namespace

std::string ExportedModel(const TrainReport& r) {
  switch (r.export_reason) {
    case TrainReport::ExportReason::kBestEvaluation:
      return absl::StrFormat(
          "the best held-out evaluation's model (AUC %.4f, log loss %.4f, at %d samples trained; checkpoint %s)",
          r.best_eval.auc, r.best_eval.log_loss, r.export_samples, r.export_checkpoint);
    case TrainReport::ExportReason::kNoEvaluation:
      return absl::StrFormat("the last model (at %d samples trained; no held-out evaluation ran)", r.export_samples);
    case TrainReport::ExportReason::kBestNotCommitted:
      return absl::StrFormat(
          "the last model (at %d samples trained): the best evaluation's checkpoint (at %d samples) was not committed",
          r.export_samples, r.best_eval_samples);
    case TrainReport::ExportReason::kNone:
      break;
  }
  return "";
}

JobMonitor::JobMonitor(MonitorOptions options) : options_(options) {}

JobMonitor::~JobMonitor() {
  std::lock_guard<std::mutex> lock(mu_);
  EndLiveLineLocked();
}

void JobMonitor::EndLiveLineLocked() {
  if (live_line_shown_ && options_.out != nullptr) *options_.out << kClearLine << std::flush;
  live_line_shown_ = false;
}

void JobMonitor::PrintLocked(const std::string& line) {
  if (options_.out == nullptr) return;
  EndLiveLineLocked();
  *options_.out << line << "\n" << std::flush;
}

void JobMonitor::Note(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  PrintLocked(line);
}

void JobMonitor::SetTeacherAuc(double auc) {
  if (options_.metrics == nullptr) return;
  options_.metrics->Describe("hyrec_teacher_auc", MetricType::kGauge,
                             "Synthetic data: the teacher's AUC, the best reachable.");
  options_.metrics->Set("hyrec_teacher_auc", {}, auc);
}

void JobMonitor::OnProgress(const Progress& p) {
  if (options_.metrics != nullptr) {
    PublishProgress(static_cast<double>(p.samples), p.samples_per_second, p.loss, {}, options_.metrics);
    if (p.progressive.samples > 0) PublishProgressive(p.progressive, options_.metrics);
    if (p.event_time > 0) PublishEventFreshness(EventFreshness(p), options_.metrics);
    PublishTrainerMetrics(p.stats, options_.worker, options_.metrics);
    if (options_.ps != nullptr) (void)PublishPsMetrics(options_.ps, options_.metrics);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.out == nullptr) return;
  if (first_loss_ < 0) first_loss_ = p.loss;
  if (const std::string diverged = DivergenceWarning(first_loss_, p.loss, evals_); !diverged.empty() && !warned_) {
    warned_ = true;
    PrintLocked("warning: " + diverged);
  }
  std::string line = absl::StrCat("samples ", p.samples);
  if (p.planned_samples > 0) absl::StrAppend(&line, "/", p.planned_samples);
  absl::StrAppend(&line, BytesRead(p));
  absl::StrAppend(&line, absl::StrFormat("  %.0f samples/s  loss %.4f", p.samples_per_second, p.loss));
  const double eta_seconds = SecondsLeft(p);
  const bool eta = eta_seconds >= 0;
  if (options_.live) {
    // Rewritten in place with a carriage return, which only works on a line that does not wrap.
    std::vector<std::pair<std::string, int>> parts = {
        {absl::StrCat("samples ", p.samples, p.planned_samples > 0 ? absl::StrCat("/", p.planned_samples) : ""), 0},
        {BytesRead(p), 4},
        {absl::StrFormat("  %.0f samples/s", p.samples_per_second), 0},
        {absl::StrFormat("  loss %.4f", p.loss), 1}};
    if (last_auc_ >= 0) parts.emplace_back(absl::StrFormat("  AUC %.4f", last_auc_), 2);
    if (p.progressive.samples > 0) parts.emplace_back(absl::StrFormat("  progressive AUC %.4f", p.progressive.auc), 2);
    if (p.stream && p.event_time > 0) parts.emplace_back(absl::StrCat("  freshness ", Duration(EventFreshness(p))), 2);
    parts.emplace_back(absl::StrCat("  elapsed ", Duration(p.elapsed_seconds)), 5);
    if (eta) parts.emplace_back(absl::StrCat("  ETA ", Duration(eta_seconds)), 3);
    *options_.out << kClearLine << FitLine(parts, TerminalColumns()) << std::flush;
    live_line_shown_ = true;
    return;
  }
  absl::StrAppend(&line,
                  absl::StrFormat("  lookup %.1f ms  update %.1f ms  waited %.1f ms  staleness %.2f", p.stats.lookup_ms,
                                  p.stats.update_ms, p.stats.wait_for_rows_ms, p.stats.observed_staleness));
  if (p.progressive.samples > 0) {
    absl::StrAppend(&line, absl::StrFormat("  progressive AUC %.4f log loss %.4f (%d samples)", p.progressive.auc,
                                           p.progressive.log_loss, p.progressive.samples));
  }
  if (p.stream && p.event_time > 0) absl::StrAppend(&line, "  freshness ", Duration(EventFreshness(p)));
  if (eta) absl::StrAppend(&line, "  ETA ", Duration(eta_seconds));
  PrintLocked(line);
}

void JobMonitor::OnEvaluation(uint64_t samples, const Evaluation& e) {
  PublishEvaluation(e, options_.metrics);
  std::lock_guard<std::mutex> lock(mu_);
  last_auc_ = e.auc;
  evals_.emplace_back(samples, e);
  PrintLocked(absl::StrFormat("eval at %d samples: AUC %.4f  log loss %.4f (%d held-out samples)", samples, e.auc,
                              e.log_loss, e.samples));
}

void JobMonitor::OnFinish(const TrainReport& report) {
  if (options_.metrics != nullptr) {
    PublishProgress(static_cast<double>(report.samples), report.samples_per_second, report.mean_loss_last, {},
                    options_.metrics);
    PublishTrainerMetrics(report.stats, options_.worker, options_.metrics);
    if (report.has_final_eval) PublishEvaluation(report.final_eval, options_.metrics);
    if (report.teacher_auc > 0) SetTeacherAuc(report.teacher_auc);
    if (options_.ps != nullptr) (void)PublishPsMetrics(options_.ps, options_.metrics);
  }
  std::lock_guard<std::mutex> lock(mu_);
  EndLiveLineLocked();
  if (options_.out != nullptr) PrintSummary(report, *options_.out);
}

void PrintSummary(const TrainReport& r, std::ostream& out) {
  if (r.resumed_at_end) {
    out << absl::StrFormat(
               "\nsummary: nothing left to train: resumed from step %d (%d samples), at the end of the data\n",
               r.resumed_step, r.samples)
        << std::flush;
    return;
  }
  out << absl::StrFormat("\nsummary: %d samples, %.0f samples/s, %s", r.samples, r.samples_per_second,
                         Duration(r.elapsed_seconds));
  if (r.steady_samples_per_second > 0) {
    out << absl::StrFormat(" (steady: %.0f samples/s after the first %d batches)", r.steady_samples_per_second,
                           TrainReport::kWarmupBatches);
  }
  if (r.interrupted) out << " (interrupted: stopped after the current batch)";
  if (r.stopped_early) out << " (stopped early: eval.patience evaluations without a better one)";
  out << "\n";
  if (r.has_final_eval && r.final_eval.samples == 0) {
    out << "  no held-out data (the held-out files gave no samples)\n";
  } else if (r.has_final_eval) {
    out << absl::StrFormat("  held-out AUC %.4f, log loss %.4f (%d samples)\n", r.final_eval.auc, r.final_eval.log_loss,
                           r.final_eval.samples);
  } else if (!r.evals.empty()) {
    const auto& [samples, e] = r.evals.back();
    out << absl::StrFormat("  last held-out AUC %.4f, log loss %.4f (at %d samples trained)\n", e.auc, e.log_loss,
                           samples);
  } else {
    out << (r.interrupted ? "  no held-out evaluation (interrupted before any)\n"
                          : "  no held-out data (eval.files is empty)\n");
  }
  if (r.has_test_eval) {
    out << absl::StrFormat("  test AUC %.4f, log loss %.4f (%d samples; the model evaluated at %d samples trained)\n",
                           r.test_eval.auc, r.test_eval.log_loss, r.test_eval.samples, r.test_eval_samples);
  }
  if (r.has_best_eval && r.evals.size() > 1) {
    out << absl::StrFormat("  best held-out AUC %.4f, log loss %.4f (at %d samples trained, of %d evaluations)\n",
                           r.best_eval.auc, r.best_eval.log_loss, r.best_eval_samples, r.evals.size());
  }
  if (r.teacher_auc > 0) {
    out << absl::StrFormat("  teacher AUC  %.4f (the best any model can reach on this data)", r.teacher_auc);
    if (r.has_final_eval) out << absl::StrFormat("; gap %.4f", r.teacher_auc - r.final_eval.auc);
    out << "\n";
  }
  if (const std::string diverged = DivergenceWarning(r.first_loss, r.mean_loss_last, r.evals); !diverged.empty()) {
    out << "  warning: " << diverged << "\n";
  }
  if (r.resumed_step > 0) out << absl::StrFormat("  resumed from step %d\n", r.resumed_step);
  if (r.heals > 0) out << absl::StrFormat("  the workers' group healed %d time(s) from a lost worker\n", r.heals);
  if (!r.last_checkpoint.empty() || r.checkpoint_failures > 0) {
    out << absl::StrFormat("  checkpoint %s (%d written this run, %d failed; training paused %.2f s for them)\n",
                           r.last_checkpoint.empty() ? "none" : r.last_checkpoint, r.checkpoints, r.checkpoint_failures,
                           r.checkpoint_pause_seconds);
  }
  if (!r.best_checkpoint.empty()) out << "  best evaluation's checkpoint " << r.best_checkpoint << "\n";
  if (!r.export_dir.empty()) {
    out << "  export " << r.export_dir << ": " << ExportedModel(r) << " (" << ProgramName()
        << " predict --model=" << r.export_dir << ")\n";
  }
  out << absl::StrFormat(
      "  PS lookup %.2f ms, update %.2f ms per batch; waited %.2f ms per batch for rows; observed staleness %.2f "
      "batches\n",
      r.stats.lookup_ms, r.stats.update_ms, r.stats.wait_for_rows_ms, r.stats.observed_staleness);
  out << std::flush;
}

std::string DivergenceWarning(double first_loss, double loss,
                              const std::vector<std::pair<uint64_t, Evaluation>>& evals) {
  constexpr char kAdvice[] =
      " (the run looks diverged: lower the learning rates, train.dense_optimizer's or the tables' optimizer's)";
  if (!std::isfinite(loss)) return absl::StrCat("the training loss is ", loss, kAdvice);
  if (first_loss >= 0 && loss > 2 * first_loss && loss > first_loss + 0.5) {
    return absl::StrFormat("the training loss rose from %.4f to %.4f%s", first_loss, loss, kAdvice);
  }
  double best = 0;
  for (const auto& [samples, e] : evals) {
    if (e.samples == 0) continue;
    best = std::max(best, e.auc);
    if (best >= 0.6 && e.auc <= 0.55) {
      return absl::StrFormat("the held-out AUC fell from %.4f to %.4f at %d samples trained%s", best, e.auc, samples,
                             kAdvice);
    }
  }
  return "";
}

void PublishProgress(double samples, double samples_per_second, double loss, const MetricLabels& labels,
                     MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_train_samples_total", MetricType::kCounter, "Samples trained.");
  m->Describe("hyrec_train_samples_per_second", MetricType::kGauge, "Samples trained per second since the start.");
  m->Describe("hyrec_train_loss", MetricType::kGauge, "Mean training loss over the last log interval.");
  m->Set("hyrec_train_samples_total", labels, samples);
  m->Set("hyrec_train_samples_per_second", labels, samples_per_second);
  m->Set("hyrec_train_loss", labels, loss);
}

void PublishTrainerMetrics(const TrainerStats& st, uint32_t worker, MetricsRegistry* m) {
  if (m == nullptr) return;
  const MetricLabels labels = {{"worker", std::to_string(worker)}};
  m->Describe("hyrec_ps_lookup_seconds", MetricType::kSummary, "Wall time of a batch's PS lookups (all tables).");
  m->Describe("hyrec_ps_update_seconds", MetricType::kSummary,
              "Wall time of a batch's PS update, until acknowledged (all tables).");
  m->Describe("hyrec_wait_for_rows_seconds", MetricType::kSummary,
              "Time a batch waited for its looked-up rows: PS latency not hidden by the pipeline.");
  m->Describe("hyrec_observed_staleness", MetricType::kGauge,
              "Mean batches whose updates were unacknowledged when a lookup was issued.");
  m->Describe("hyrec_worker_batches_total", MetricType::kCounter, "Batches trained by the worker.");
  m->SetSummary("hyrec_ps_lookup_seconds", labels, st.lookup_ms * st.lookup_count / 1000.0,
                static_cast<double>(st.lookup_count));
  m->SetSummary("hyrec_ps_update_seconds", labels, st.update_ms * st.update_count / 1000.0,
                static_cast<double>(st.update_count));
  m->SetSummary("hyrec_wait_for_rows_seconds", labels, st.wait_for_rows_ms * st.lookup_count / 1000.0,
                static_cast<double>(st.lookup_count));
  m->Set("hyrec_observed_staleness", labels, st.observed_staleness);
  m->Set("hyrec_worker_batches_total", labels, static_cast<double>(st.batches));
}

absl::Status PublishPsMetrics(embedding_ps::EmbeddingClient* ps, MetricsRegistry* m) {
  if (m == nullptr || ps == nullptr) return absl::OkStatus();
  HYREC_ASSIGN_OR_RETURN(std::vector<embedding_ps::ShardStats> shards, ps->Stats());
  for (const embedding_ps::ShardStats& shard : shards) {
    embedding_ps::PublishStoreMetrics(shard.store, {{"shard", std::to_string(shard.shard_index)}}, m);
  }
  return absl::OkStatus();
}

void PublishProgressive(const Evaluation& e, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_progressive_auc", MetricType::kGauge,
              "AUC of worker 0's last eval.progressive_window samples, each scored before it was trained on.");
  m->Describe("hyrec_progressive_log_loss", MetricType::kGauge, "Their mean log loss.");
  m->Set("hyrec_progressive_auc", {}, e.auc);
  m->Set("hyrec_progressive_log_loss", {}, e.log_loss);
}

void PublishEventFreshness(double seconds, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_event_freshness_seconds", MetricType::kGauge,
              "Now less the time of the newest sample worker 0 has trained (its source's event time).");
  m->Set("hyrec_event_freshness_seconds", {}, seconds);
}

void PublishEvaluation(const Evaluation& e, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_eval_auc", MetricType::kGauge, "AUC on the held-out split, at the last evaluation.");
  m->Describe("hyrec_eval_log_loss", MetricType::kGauge, "Mean log loss on the held-out split.");
  m->Describe("hyrec_eval_samples", MetricType::kGauge, "Held-out samples of the last evaluation.");
  m->Set("hyrec_eval_auc", {}, e.auc);
  m->Set("hyrec_eval_log_loss", {}, e.log_loss);
  m->Set("hyrec_eval_samples", {}, static_cast<double>(e.samples));
}

}  // namespace hyrec::dense_worker
