// JobMonitor: what a person and Prometheus see of a training job, the same in every way it runs
// (embedded, --processes, a hand-started worker 0): the progress line, evaluations, metrics and
// the summary.
//
//   MetricsRegistry registry;
//   MonitorOptions options;
//   options.out = &std::cout;
//   options.live = isatty(1);          // one line rewritten in place instead of a line per report
//   options.metrics = &registry;       // optional: Prometheus families (docs/configuration.md)
//   JobMonitor monitor(options);
//   WorkerOptions worker_options;
//   worker_options.observer = &monitor;
//   ...
//
// On a terminal the live line shows samples (of the planned total), samples/s, the loss, the last
// held-out AUC, the elapsed time and the ETA; it is cleared before any other line is printed
// (evaluations, notes, the summary). Otherwise every report is a line of its own with the PS
// figures. Thread-safe: Note may come from another thread (a signal handler's).
#ifndef HYREC_DENSE_WORKER_MONITOR_H_
#define HYREC_DENSE_WORKER_MONITOR_H_

#include <mutex>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "hyrec/common/metrics.h"
#include "hyrec/dense_worker/report.h"
#include "hyrec/embedding_ps/client.h"

namespace hyrec::dense_worker {

struct MonitorOptions {
  std::ostream* out = nullptr;                  // null: nothing printed.
  bool live = false;                            // A live line (a terminal) rather than plain lines.
  MetricsRegistry* metrics = nullptr;           // null: no metrics.
  embedding_ps::EmbeddingClient* ps = nullptr;  // Shards whose statistics go to `metrics` at each report.
  uint32_t worker = 0;                          // The worker whose figures these are (metric label).
};

class JobMonitor : public TrainObserver {
 public:
  explicit JobMonitor(MonitorOptions options);
  ~JobMonitor() override;

  void OnProgress(const Progress& progress) override;
  void OnEvaluation(uint64_t samples, const Evaluation& evaluation) override;
  void OnFinish(const TrainReport& report) override;

  // Prints `line` on a line of its own (above the live line, which the next report redraws).
  void Note(const std::string& line);
  // Publishes the teacher's AUC (synthetic data) as hyrec_teacher_auc.
  void SetTeacherAuc(double auc);

 private:
  void PrintLocked(const std::string& line);
  void EndLiveLineLocked();

  const MonitorOptions options_;
  std::mutex mu_;
  bool live_line_shown_ = false;                        // Guarded by mu_.
  double last_auc_ = -1;                                // Guarded by mu_.
  double first_loss_ = -1;                              // Of the first report. Guarded by mu_.
  std::vector<std::pair<uint64_t, Evaluation>> evals_;  // Guarded by mu_.
  bool warned_ = false;                                 // Of divergence. Guarded by mu_.
};

// The summary `hyrec train` prints at the end.
void PrintSummary(const TrainReport& report, std::ostream& out);

// Which model the report's export holds and why, as the summary says it ("" without an export).
std::string ExportedModel(const TrainReport& report);

// What makes a run look diverged, or "" when nothing does: a training loss that is not finite,
// or rose to more than twice `first_loss` and by more than 0.5; or a held-out AUC that fell to
// 0.55 or less after reaching 0.6 (`evals`: (samples trained, evaluation), in order). The live
// line warns once, and the summary says so.
std::string DivergenceWarning(double first_loss, double loss,
                              const std::vector<std::pair<uint64_t, Evaluation>>& evals);

// hyrec_train_samples_total (counter), hyrec_train_samples_per_second and hyrec_train_loss
// (gauges), labelled with `labels`.
void PublishProgress(double samples, double samples_per_second, double loss, const MetricLabels& labels,
                     MetricsRegistry* metrics);
// Metric families (docs/configuration.md lists them), labelled worker="<id>":
//   hyrec_ps_lookup_seconds, hyrec_ps_update_seconds, hyrec_wait_for_rows_seconds (summaries:
//   per batch), hyrec_observed_staleness (gauge: mean batches of updates unapplied at lookup),
//   hyrec_worker_batches_total.
void PublishTrainerMetrics(const TrainerStats& stats, uint32_t worker, MetricsRegistry* metrics);
// Every PS shard's PublishStoreMetrics (rows, evictions, lookups, updates per table), labelled
// shard="<index>". Errors (a shard down) are returned.
absl::Status PublishPsMetrics(embedding_ps::EmbeddingClient* ps, MetricsRegistry* metrics);
// hyrec_eval_auc, hyrec_eval_log_loss, hyrec_eval_samples (gauges).
void PublishEvaluation(const Evaluation& evaluation, MetricsRegistry* metrics);
// hyrec_progressive_auc and hyrec_progressive_log_loss: progressive validation (Progress::progressive).
void PublishProgressive(const Evaluation& progressive, MetricsRegistry* metrics);
// hyrec_event_freshness_seconds: now less the newest trained sample's time.
void PublishEventFreshness(double seconds, MetricsRegistry* metrics);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_MONITOR_H_
