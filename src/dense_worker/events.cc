#include "src/dense_worker/events.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace hyrec::dense_worker {
namespace {

std::string Num(double v) { return absl::StrFormat("%.17g", v); }

void AppendStats(const TrainerStats& s, std::string* line) {
  absl::StrAppend(line, " trained_batches=", s.batches, " trained_samples=", s.samples, " lookup_ms=", Num(s.lookup_ms),
                  " update_ms=", Num(s.update_ms), " waited_ms=", Num(s.wait_for_rows_ms),
                  " staleness=", Num(s.observed_staleness), " lookups=", s.lookup_count, " updates=", s.update_count);
}

using Fields = std::map<std::string, std::string>;

class FieldReader {
 public:
  explicit FieldReader(const Fields& fields) : fields_(fields) {}
  template <typename T>
  void Get(const std::string& key, T* out) {
    auto it = fields_.find(key);
    bool ok = it != fields_.end();
    if (ok) {
      if constexpr (std::is_same_v<T, double>) {
        ok = absl::SimpleAtod(it->second, out);
      } else if constexpr (std::is_same_v<T, bool>) {
        *out = it->second == "1";
      } else if constexpr (std::is_same_v<T, std::string>) {
        *out = it->second;
      } else {
        ok = absl::SimpleAtoi(it->second, out);
      }
    }
    if (!ok && status_.ok())
      status_ = absl::InvalidArgumentError(absl::StrCat("event field '", key, "' missing or bad"));
  }
  void Stats(TrainerStats* s) {
    Get("trained_batches", &s->batches);
    Get("trained_samples", &s->samples);
    Get("lookup_ms", &s->lookup_ms);
    Get("update_ms", &s->update_ms);
    Get("waited_ms", &s->wait_for_rows_ms);
    Get("staleness", &s->observed_staleness);
    Get("lookups", &s->lookup_count);
    Get("updates", &s->update_count);
  }
  const absl::Status& status() const { return status_; }

 private:
  const Fields& fields_;
  absl::Status status_;
};

}  // namespace

void EventWriter::Write(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  *out_ << kEventPrefix << line << "\n" << std::flush;
}

void EventWriter::OnProgress(const Progress& p) {
  std::string line =
      absl::StrCat("progress samples=", p.samples, " planned=", p.planned_samples, " batches=", p.batches,
                   " epoch=", p.epoch, " bytes_read=", p.bytes_read, " bytes_total=", p.bytes_total,
                   " epochs=", p.epochs, " elapsed=", Num(p.elapsed_seconds), " rate=", Num(p.samples_per_second),
                   " loss=", Num(p.loss), " last=", p.last ? 1 : 0);
  AppendStats(p.stats, &line);
  Write(line);
}

void EventWriter::OnEvaluation(uint64_t samples, const Evaluation& e) {
  Write(absl::StrCat("eval at=", samples, " auc=", Num(e.auc), " log_loss=", Num(e.log_loss), " samples=", e.samples));
}

void EventWriter::OnFinish(const TrainReport& r) {
  std::string line = absl::StrCat(
      "finish samples=", r.samples, " planned=", r.planned_samples, " elapsed=", Num(r.elapsed_seconds),
      " rate=", Num(r.samples_per_second), " steady=", Num(r.steady_samples_per_second),
      " first_loss=", Num(r.first_loss), " mean_loss_last=", Num(r.mean_loss_last),
      " has_final_eval=", r.has_final_eval ? 1 : 0, " auc=", Num(r.final_eval.auc),
      " log_loss=", Num(r.final_eval.log_loss), " eval_samples=", r.final_eval.samples,
      " teacher_auc=", Num(r.teacher_auc), " interrupted=", r.interrupted ? 1 : 0,
      " has_best_eval=", r.has_best_eval ? 1 : 0, " best_at=", r.best_eval_samples, " best_auc=", Num(r.best_eval.auc),
      " best_log_loss=", Num(r.best_eval.log_loss), " best_samples=", r.best_eval.samples,
      " has_test_eval=", r.has_test_eval ? 1 : 0, " test_at=", r.test_eval_samples, " test_auc=", Num(r.test_eval.auc),
      " test_log_loss=", Num(r.test_eval.log_loss), " test_samples=", r.test_eval.samples,
      " stopped_early=", r.stopped_early ? 1 : 0, " fingerprint=", absl::StrFormat("%016x", r.dense_fingerprint),
      " dense_sum=", Num(r.dense_sum), " dense_parameters=", r.dense_parameters, " checkpoint=", r.last_checkpoint,
      " best_checkpoint=", r.best_checkpoint, " export=", r.export_dir, " export_checkpoint=", r.export_checkpoint,
      " export_at=", r.export_samples, " export_reason=", ExportReasonName(r.export_reason),
      " checkpoints=", r.checkpoints, " checkpoint_failures=", r.checkpoint_failures,
      " pause=", Num(r.checkpoint_pause_seconds), " write=", Num(r.checkpoint_write_seconds),
      " resumed_step=", r.resumed_step, " resumed_at_end=", r.resumed_at_end ? 1 : 0, " heals=", r.heals);
  AppendStats(r.stats, &line);
  Write(line);
}

absl::StatusOr<bool> EventReader::Read(const std::string& line) {
  if (!absl::StartsWith(line, kEventPrefix)) return false;
  std::vector<std::string> words = absl::StrSplit(line.substr(sizeof(kEventPrefix) - 1), ' ', absl::SkipEmpty());
  if (words.empty()) return absl::InvalidArgumentError("an empty worker event");
  Fields fields;
  for (size_t i = 1; i < words.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    fields[kv.first] = kv.second;
  }
  FieldReader f(fields);
  const std::string& kind = words[0];
  if (kind == "progress") {
    Progress p;
    f.Get("samples", &p.samples);
    f.Get("planned", &p.planned_samples);
    f.Get("batches", &p.batches);
    f.Get("epoch", &p.epoch);
    f.Get("bytes_read", &p.bytes_read);
    f.Get("bytes_total", &p.bytes_total);
    f.Get("epochs", &p.epochs);
    f.Get("elapsed", &p.elapsed_seconds);
    f.Get("rate", &p.samples_per_second);
    f.Get("loss", &p.loss);
    f.Get("last", &p.last);
    f.Stats(&p.stats);
    if (!f.status().ok()) return f.status();
    report_.losses.emplace_back(p.samples, p.loss);
    if (sink_ != nullptr) sink_->OnProgress(p);
    return true;
  }
  if (kind == "eval") {
    uint64_t at = 0;
    Evaluation e;
    f.Get("at", &at);
    f.Get("auc", &e.auc);
    f.Get("log_loss", &e.log_loss);
    f.Get("samples", &e.samples);
    if (!f.status().ok()) return f.status();
    report_.evals.emplace_back(at, e);
    if (sink_ != nullptr) sink_->OnEvaluation(at, e);
    return true;
  }
  if (kind == "finish") {
    TrainReport& r = report_;
    f.Get("samples", &r.samples);
    f.Get("planned", &r.planned_samples);
    f.Get("elapsed", &r.elapsed_seconds);
    f.Get("rate", &r.samples_per_second);
    f.Get("steady", &r.steady_samples_per_second);
    f.Get("first_loss", &r.first_loss);
    f.Get("mean_loss_last", &r.mean_loss_last);
    f.Get("has_final_eval", &r.has_final_eval);
    f.Get("auc", &r.final_eval.auc);
    f.Get("log_loss", &r.final_eval.log_loss);
    f.Get("eval_samples", &r.final_eval.samples);
    f.Get("teacher_auc", &r.teacher_auc);
    f.Get("interrupted", &r.interrupted);
    f.Get("has_best_eval", &r.has_best_eval);
    f.Get("best_at", &r.best_eval_samples);
    f.Get("best_auc", &r.best_eval.auc);
    f.Get("best_log_loss", &r.best_eval.log_loss);
    f.Get("best_samples", &r.best_eval.samples);
    f.Get("has_test_eval", &r.has_test_eval);
    f.Get("test_at", &r.test_eval_samples);
    f.Get("test_auc", &r.test_eval.auc);
    f.Get("test_log_loss", &r.test_eval.log_loss);
    f.Get("test_samples", &r.test_eval.samples);
    f.Get("stopped_early", &r.stopped_early);
    f.Get("checkpoint", &r.last_checkpoint);
    f.Get("best_checkpoint", &r.best_checkpoint);
    f.Get("export", &r.export_dir);
    f.Get("export_checkpoint", &r.export_checkpoint);
    f.Get("export_at", &r.export_samples);
    std::string reason = ExportReasonName(r.export_reason);
    f.Get("export_reason", &reason);
    if (!ParseExportReason(reason, &r.export_reason)) {
      return absl::InvalidArgumentError(absl::StrCat("a worker event's export_reason '", reason, "' is not known"));
    }
    f.Get("checkpoints", &r.checkpoints);
    f.Get("checkpoint_failures", &r.checkpoint_failures);
    f.Get("pause", &r.checkpoint_pause_seconds);
    f.Get("write", &r.checkpoint_write_seconds);
    f.Get("resumed_step", &r.resumed_step);
    f.Get("resumed_at_end", &r.resumed_at_end);
    f.Get("heals", &r.heals);
    f.Get("dense_sum", &r.dense_sum);
    f.Get("dense_parameters", &r.dense_parameters);
    f.Stats(&r.stats);
    if (!f.status().ok()) return f.status();
    const auto it = fields.find("fingerprint");
    if (it == fields.end() || !absl::SimpleHexAtoi(it->second, &r.dense_fingerprint)) {
      return absl::InvalidArgumentError("event field 'fingerprint' missing or bad");
    }
    finished_ = true;
    return true;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown worker event '", kind, "'"));
}

}  // namespace hyrec::dense_worker
