// What a person sees of a job: the live line (cleared before any other line, with the elapsed
// time and the last AUC), plain lines off a terminal, the summary; and worker 0's events, which
// carry its reports to a launcher exactly.
#include "hyrec/dense_worker/monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "src/dense_worker/events.h"

namespace hyrec::dense_worker {
namespace {

Progress SomeProgress(uint64_t samples) {
  Progress p;
  p.samples = samples;
  p.planned_samples = 100000;
  p.batches = samples / 100;
  p.elapsed_seconds = samples / 1000.0;
  p.samples_per_second = 1000;
  p.loss = 0.4567;
  p.stats.lookup_ms = 1.5;
  p.stats.observed_staleness = 2.5;
  return p;
}

// Options of a monitor that draws the live line into `out`.
MonitorOptions LiveInto(std::ostringstream* out) {
  MonitorOptions options;
  options.out = out;
  options.live = true;
  return options;
}

// Progress through half of the first of two epochs of a file source's bytes.
Progress HalfOfTheFirstEpoch() {
  Progress p = SomeProgress(5000);
  p.bytes_read = 50'000'000;
  p.bytes_total = 100'000'000;
  p.epochs = 2;
  return p;
}

TEST(JobMonitor, TheLiveLineIsClearedBeforeOtherLinesAndShowsTheLastAuc) {
  setenv("COLUMNS", "100", 1);  // Wide enough for every part (TheLiveLineFitsTheTerminalsWidth).
  std::ostringstream out;
  {
    JobMonitor monitor(LiveInto(&out));
    monitor.OnProgress(SomeProgress(5000));
    EXPECT_EQ(out.str(), "\r\x1b[Ksamples 5000/100000  1000 samples/s  loss 0.4567  elapsed 5 s  ETA 95 s");
    out.str("");
    Evaluation e;
    e.auc = 0.7123;
    e.log_loss = 0.5;
    e.samples = 2000;
    monitor.OnEvaluation(5000, e);
    // The live line is erased first, so nothing of it is left beside the evaluation.
    EXPECT_EQ(out.str(), "\r\x1b[Keval at 5000 samples: AUC 0.7123  log loss 0.5000 (2000 held-out samples)\n");
    out.str("");
    monitor.OnProgress(SomeProgress(6000));
    EXPECT_TRUE(absl::StrContains(out.str(), "AUC 0.7123  elapsed 6 s  ETA 94 s")) << out.str();
    out.str("");
    monitor.Note("a note");
    EXPECT_EQ(out.str(), "\r\x1b[Ka note\n");
    monitor.OnProgress(SomeProgress(200000));
    out.str("");
  }
  EXPECT_EQ(out.str(), "\r\x1b[K");  // Nothing of the live line is left behind.
}

// A narrow terminal: the live line leaves out its least needed parts (elapsed, bytes, ETA, AUC)
// rather than wrap, since a carriage return rewrites only the last row of a wrapped line.
TEST(JobMonitor, TheLiveLineFitsTheTerminalsWidth) {
  std::ostringstream out;
  JobMonitor monitor(LiveInto(&out));
  const Progress p = HalfOfTheFirstEpoch();
  for (const int columns : {200, 80, 60, 40, 20}) {
    SCOPED_TRACE(columns);
    setenv("COLUMNS", std::to_string(columns).c_str(), 1);
    out.str("");
    monitor.OnProgress(p);
    const std::string line = out.str().substr(std::string("\r\x1b[K").size());
    EXPECT_LE(line.size(), static_cast<size_t>(std::max(columns - 1, 20))) << line;
    EXPECT_TRUE(absl::StartsWith(line, "samples 5000/100000")) << line;
    if (columns >= 40) EXPECT_TRUE(absl::StrContains(line, "1000 samples/s")) << line;
    if (columns == 200) EXPECT_TRUE(absl::StrContains(line, "MB of epoch 1/2") && absl::StrContains(line, "elapsed"));
    if (columns == 60) EXPECT_FALSE(absl::StrContains(line, "elapsed")) << line;
  }
  unsetenv("COLUMNS");
}

TEST(JobMonitor, AFileSourceShowsBytesReadAndAnEtaFromThem) {
  setenv("COLUMNS", "80", 1);
  std::ostringstream out;
  JobMonitor monitor(LiveInto(&out));
  Progress p = HalfOfTheFirstEpoch();
  p.planned_samples = 0;   // A file source: the samples are not known in advance.
  p.elapsed_seconds = 10;  // Half of the first of two epochs: a quarter done, 30 s to go.
  monitor.OnProgress(p);
  EXPECT_TRUE(absl::StrContains(out.str(), "samples 5000  50.0/100.0 MB of epoch 1/2  1000 samples/s")) << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "ETA 30 s")) << out.str();
  out.str("");
  p.epochs = 1;
  monitor.OnProgress(p);
  EXPECT_TRUE(absl::StrContains(out.str(), "samples 5000  50.0/100.0 MB  1000")) << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "ETA 10 s")) << out.str();
  out.str("");
  p.epochs = 0;  // Forever: no ETA.
  monitor.OnProgress(p);
  EXPECT_FALSE(absl::StrContains(out.str(), "ETA")) << out.str();
}

TEST(JobMonitor, AnEvaluationOfNoSamplesIsNoHeldOutData) {
  TrainReport r;
  r.samples = 100;
  r.has_final_eval = true;
  std::ostringstream out;
  PrintSummary(r, out);
  EXPECT_TRUE(absl::StrContains(out.str(), "no held-out data")) << out.str();
  EXPECT_FALSE(absl::StrContains(out.str(), "AUC 0.0000")) << out.str();
}

TEST(JobMonitor, TheSummaryGivesTheBestEvaluationBesideTheLastAndAnEarlyStop) {
  TrainReport r;
  r.samples = 3000;
  r.stopped_early = true;
  r.has_final_eval = true;
  r.final_eval = Evaluation{0.70, 0.52, 500};
  r.evals = {{1000, Evaluation{0.74, 0.48, 500}}, {2000, Evaluation{0.72, 0.50, 500}}, {3000, r.final_eval}};
  r.has_best_eval = true;
  r.best_eval = r.evals[0].second;
  r.best_eval_samples = 1000;
  std::ostringstream out;
  PrintSummary(r, out);
  EXPECT_TRUE(absl::StrContains(out.str(), "(stopped early: eval.patience evaluations without a better one)"))
      << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "held-out AUC 0.7000, log loss 0.5200 (500 samples)")) << out.str();
  EXPECT_TRUE(absl::StrContains(
      out.str(), "best held-out AUC 0.7400, log loss 0.4800 (at 1000 samples trained, of 3 evaluations)"))
      << out.str();
}

// A run that diverges does not look like success: the live reports warn once and the summary
// says so; a healthy run, whose loss falls and whose AUC holds, gets no warning.
TEST(JobMonitor, ADivergingRunIsWarnedAboutAndTheSummarySaysSo) {
  EXPECT_EQ(DivergenceWarning(0.69, 0.45, {{1000, Evaluation{0.74, 0.48, 500}}, {2000, Evaluation{0.73, 0.5, 500}}}),
            "");
  EXPECT_EQ(DivergenceWarning(0.10, 0.25, {}), "");  // Twice the start, but a small rise.
  EXPECT_TRUE(absl::StartsWith(DivergenceWarning(0.69, 13.1, {}), "the training loss rose from 0.6900 to 13.1000"));
  EXPECT_TRUE(absl::StartsWith(DivergenceWarning(0.69, std::nan(""), {}), "the training loss is nan"));
  EXPECT_TRUE(absl::StartsWith(
      DivergenceWarning(0.69, 0.6, {{1000, Evaluation{0.70, 0.5, 500}}, {2000, Evaluation{0.52, 0.69, 500}}}),
      "the held-out AUC fell from 0.7000 to 0.5200 at 2000 samples trained"));

  std::ostringstream out;
  MonitorOptions options;
  options.out = &out;
  JobMonitor monitor(options);
  Progress p = SomeProgress(1000);
  p.loss = 0.69;
  monitor.OnProgress(p);
  for (double loss : {2.5, 13.1}) {
    p.loss = loss;
    monitor.OnProgress(p);
  }
  const std::string lines = out.str();
  EXPECT_NE(lines.find("warning: the training loss rose from 0.6900 to 2.5000"), std::string::npos) << lines;
  EXPECT_EQ(lines.find("warning:", lines.find("warning:") + 1), std::string::npos) << "warned twice:\n" << lines;

  TrainReport r;
  r.samples = 1000;
  r.first_loss = 0.69;
  r.mean_loss_last = 13.1;
  std::ostringstream summary;
  PrintSummary(r, summary);
  EXPECT_TRUE(absl::StrContains(summary.str(),
                                "  warning: the training loss rose from 0.6900 to 13.1000 (the run "
                                "looks diverged"))
      << summary.str();
}

TEST(JobMonitor, OffATerminalEveryReportIsALineWithThePsFigures) {
  std::ostringstream out;
  MonitorOptions options;
  options.out = &out;
  MetricsRegistry metrics;
  options.metrics = &metrics;
  JobMonitor monitor(options);
  monitor.OnProgress(SomeProgress(5000));
  EXPECT_EQ(out.str(),
            "samples 5000/100000  1000 samples/s  loss 0.4567  lookup 1.5 ms  update 0.0 ms  waited 0.0 ms  "
            "staleness 2.50  ETA 95 s\n");
  EXPECT_EQ(metrics.Get("hyrec_train_samples_total", {}), 5000);
  EXPECT_EQ(metrics.Get("hyrec_observed_staleness", {{"worker", "0"}}), 2.5);
}

TEST(JobMonitor, TheSummarySaysWhatWasTrainedAndEvaluated) {
  TrainReport r;
  r.samples = 1234;
  r.samples_per_second = 100;
  r.elapsed_seconds = 12.3;
  std::ostringstream out;
  PrintSummary(r, out);
  EXPECT_TRUE(absl::StrContains(out.str(), "summary: 1234 samples, 100 samples/s, 12 s\n")) << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "no held-out data")) << out.str();
  EXPECT_FALSE(absl::StrContains(out.str(), "AUC 0.0000")) << out.str();
  r.interrupted = true;
  r.evals.emplace_back(1000, Evaluation{0.7, 0.5, 100});
  out.str("");
  PrintSummary(r, out);
  EXPECT_TRUE(absl::StrContains(out.str(), "(interrupted: stopped after the current batch)")) << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "last held-out AUC 0.7000, log loss 0.5000 (at 1000 samples trained)"))
      << out.str();
  r.has_final_eval = true;
  r.final_eval = Evaluation{0.81234, 0.4, 500};
  r.teacher_auc = 0.9;
  out.str("");
  PrintSummary(r, out);
  EXPECT_TRUE(absl::StrContains(out.str(), "held-out AUC 0.8123, log loss 0.4000 (500 samples)")) << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "gap 0.0877")) << out.str();
}

// Records what it is given.
struct Recorder : TrainObserver {
  std::vector<Progress> progress;
  std::vector<std::pair<uint64_t, Evaluation>> evals;
  void OnProgress(const Progress& p) override { progress.push_back(p); }
  void OnEvaluation(uint64_t samples, const Evaluation& e) override { evals.emplace_back(samples, e); }
  void OnFinish(const TrainReport&) override {}
};

TEST(Events, CarryWorkerReportsExactly) {
  std::ostringstream wire;
  EventWriter writer(&wire);
  Progress p = SomeProgress(5000);
  p.loss = 1.0 / 3.0;
  p.stats.update_ms = 0.1 + 0.2;
  p.bytes_read = 123456789;
  p.bytes_total = 987654321;
  p.epoch = 2;
  p.epochs = 3;
  writer.OnProgress(p);
  writer.OnEvaluation(5000, Evaluation{0.123456789012345, 2.0 / 7.0, 999});
  TrainReport r;
  r.samples = 10000;
  r.first_loss = 0.6931471805599453;
  r.dense_fingerprint = 0xfedcba9876543210ULL;
  r.dense_sum = -1e-300;
  r.has_final_eval = true;
  r.final_eval.auc = 0.75;
  r.interrupted = true;
  r.has_best_eval = true;
  r.best_eval = Evaluation{0.8125, 0.25, 400};
  r.best_eval_samples = 7000;
  r.has_test_eval = true;
  r.test_eval = Evaluation{0.7, 1.0 / 3.0, 300};
  r.test_eval_samples = 6000;
  r.stopped_early = true;
  r.stats.batches = 100;
  writer.OnFinish(r);

  Recorder recorder;
  EventReader reader(&recorder);
  std::istringstream lines(wire.str());
  for (std::string line; std::getline(lines, line);) {
    auto read = reader.Read(line);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(*read) << line;
  }
  ASSERT_EQ(recorder.progress.size(), 1u);
  EXPECT_EQ(recorder.progress[0].loss, 1.0 / 3.0);
  EXPECT_EQ(recorder.progress[0].stats.update_ms, 0.1 + 0.2);
  EXPECT_EQ(recorder.progress[0].samples, 5000u);
  EXPECT_EQ(recorder.progress[0].bytes_read, 123456789u);
  EXPECT_EQ(recorder.progress[0].bytes_total, 987654321u);
  EXPECT_EQ(recorder.progress[0].epoch, 2u);
  EXPECT_EQ(recorder.progress[0].epochs, 3u);
  ASSERT_EQ(recorder.evals.size(), 1u);
  EXPECT_EQ(recorder.evals[0].second.auc, 0.123456789012345);
  EXPECT_EQ(recorder.evals[0].second.samples, 999u);
  ASSERT_TRUE(reader.finished());
  const TrainReport& got = reader.report();
  EXPECT_EQ(got.first_loss, r.first_loss);
  EXPECT_EQ(got.dense_fingerprint, r.dense_fingerprint);
  EXPECT_EQ(got.dense_sum, r.dense_sum);
  EXPECT_TRUE(got.interrupted);
  EXPECT_TRUE(got.has_final_eval);
  EXPECT_EQ(got.stats.batches, 100u);
  EXPECT_TRUE(got.has_best_eval);
  EXPECT_EQ(got.best_eval.auc, 0.8125);
  EXPECT_EQ(got.best_eval.log_loss, 0.25);
  EXPECT_EQ(got.best_eval.samples, 400u);
  EXPECT_EQ(got.best_eval_samples, 7000u);
  EXPECT_TRUE(got.has_test_eval);
  EXPECT_EQ(got.test_eval.auc, 0.7);
  EXPECT_EQ(got.test_eval.log_loss, 1.0 / 3.0);
  EXPECT_EQ(got.test_eval.samples, 300u);
  EXPECT_EQ(got.test_eval_samples, 6000u);
  EXPECT_TRUE(got.stopped_early);
  EXPECT_EQ(got.losses.size(), 1u);  // The progress and evaluations seen before the end.
  EXPECT_EQ(got.evals.size(), 1u);
  // Other lines are not events; a malformed event is an error.
  EXPECT_FALSE(*reader.Read("hyrec worker 0 metrics: http://0.0.0.0:1/metrics"));
  EXPECT_FALSE(reader.Read("hyrec-event progress samples=x").ok());
  EXPECT_FALSE(reader.Read("hyrec-event launch").ok());
}

TEST(Events, CarryPathsWithSpacesAndSeparatorsWhole) {
  std::ostringstream wire;
  EventWriter writer(&wire);
  TrainReport r;
  r.last_checkpoint = "/data/my runs/ckpt=7%/step 100";
  r.best_checkpoint = "tab\there\nnewline";
  r.best_checkpoint[3] = '\t';
  r.export_dir = "ünïcode/exp ort";
  r.export_reason = TrainReport::ExportReason::kBestEvaluation;
  writer.OnFinish(r);
  const std::string line = wire.str().substr(0, wire.str().size() - 1);
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one event, one line";
  EventReader reader(nullptr);
  auto read = reader.Read(line);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(reader.report().last_checkpoint, r.last_checkpoint);
  EXPECT_EQ(reader.report().best_checkpoint, r.best_checkpoint);
  EXPECT_EQ(reader.report().export_dir, r.export_dir);
  EXPECT_EQ(reader.report().export_reason, r.export_reason);

  // A broken escape or a bool that is neither 0 nor 1 is refused by name.
  for (const std::string& bad :
       {std::string(" checkpoint=/a%2"), std::string(" checkpoint=/a%zz"), std::string(" interrupted=yes")}) {
    std::string edited = line;
    const std::string key = bad.substr(0, bad.find('=') + 1);
    const size_t at = edited.find(key);
    ASSERT_NE(at, std::string::npos);
    edited.replace(at, edited.find(' ', at + 1) - at, bad);
    EventReader again(nullptr);
    auto status = again.Read(edited);
    ASSERT_FALSE(status.ok()) << edited;
    EXPECT_NE(status.status().message().find(key.substr(1, key.size() - 2)), std::string::npos) << status.status();
  }
}

}  // namespace
}  // namespace hyrec::dense_worker
