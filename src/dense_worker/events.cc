#include "src/dense_worker/events.h"

#include <map>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace hyrec::dense_worker {
namespace {

// A 64-bit value carried as 16 hex digits (the dense fingerprint); U is uint64_t or its const.
template <typename U>
struct Hex64 {
  U* value;
};
template <typename U>
Hex64<U> Hex(U& value) {
  return {&value};
}

// The one list of each report's fields: visit(key, member) for every field, in the order written.
// `S` is the struct or its const, so that the writer and the reader share the list.
template <typename S, typename Visit>
void StatsFields(S& s, Visit&& visit) {
  visit("trained_batches", s.batches);
  visit("trained_samples", s.samples);
  visit("lookup_ms", s.lookup_ms);
  visit("update_ms", s.update_ms);
  visit("waited_ms", s.wait_for_rows_ms);
  visit("staleness", s.observed_staleness);
  visit("lookups", s.lookup_count);
  visit("updates", s.update_count);
}

template <typename S, typename Visit>
void ProgressFields(S& p, Visit&& visit) {
  visit("samples", p.samples);
  visit("planned", p.planned_samples);
  visit("batches", p.batches);
  visit("epoch", p.epoch);
  visit("bytes_read", p.bytes_read);
  visit("bytes_total", p.bytes_total);
  visit("epochs", p.epochs);
  visit("elapsed", p.elapsed_seconds);
  visit("rate", p.samples_per_second);
  visit("loss", p.loss);
  visit("last", p.last);
  visit("progressive_auc", p.progressive.auc);
  visit("progressive_log_loss", p.progressive.log_loss);
  visit("progressive_samples", p.progressive.samples);
  visit("event_time", p.event_time);
  visit("stream", p.stream);
  StatsFields(p.stats, visit);
}

// An evaluation event: the samples trained when it was taken, and the evaluation.
template <typename At, typename E, typename Visit>
void EvaluationFields(At& at, E& e, Visit&& visit) {
  visit("at", at);
  visit("auc", e.auc);
  visit("log_loss", e.log_loss);
  visit("samples", e.samples);
}

template <typename R, typename Visit>
void ReportFields(R& r, Visit&& visit) {
  visit("samples", r.samples);
  visit("planned", r.planned_samples);
  visit("elapsed", r.elapsed_seconds);
  visit("rate", r.samples_per_second);
  visit("steady", r.steady_samples_per_second);
  visit("first_loss", r.first_loss);
  visit("mean_loss_last", r.mean_loss_last);
  visit("has_final_eval", r.has_final_eval);
  visit("auc", r.final_eval.auc);
  visit("log_loss", r.final_eval.log_loss);
  visit("eval_samples", r.final_eval.samples);
  visit("teacher_auc", r.teacher_auc);
  visit("interrupted", r.interrupted);
  visit("has_best_eval", r.has_best_eval);
  visit("best_at", r.best_eval_samples);
  visit("best_auc", r.best_eval.auc);
  visit("best_log_loss", r.best_eval.log_loss);
  visit("best_samples", r.best_eval.samples);
  visit("has_test_eval", r.has_test_eval);
  visit("test_at", r.test_eval_samples);
  visit("test_auc", r.test_eval.auc);
  visit("test_log_loss", r.test_eval.log_loss);
  visit("test_samples", r.test_eval.samples);
  visit("stopped_early", r.stopped_early);
  visit("fingerprint", Hex(r.dense_fingerprint));
  visit("dense_sum", r.dense_sum);
  visit("dense_parameters", r.dense_parameters);
  visit("checkpoint", r.last_checkpoint);
  visit("best_checkpoint", r.best_checkpoint);
  visit("export", r.export_dir);
  visit("export_checkpoint", r.export_checkpoint);
  visit("export_at", r.export_samples);
  visit("export_reason", r.export_reason);
  visit("checkpoints", r.checkpoints);
  visit("checkpoint_failures", r.checkpoint_failures);
  visit("pause", r.checkpoint_pause_seconds);
  visit("write", r.checkpoint_write_seconds);
  visit("resumed_step", r.resumed_step);
  visit("resumed_at_end", r.resumed_at_end);
  visit("heals", r.heals);
  StatsFields(r.stats, visit);
}

// A byte a value may carry as it is: anything printable but the separators and the escape.
bool Plain(unsigned char c) { return c > ' ' && c < 0x7f && c != '%' && c != '='; }

// `value` with every byte that is not Plain written as %XX, so that it is one word of an event.
std::string Escape(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (Plain(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The inverse of Escape; false for a '%' not followed by two hex digits.
bool Unescape(const std::string& text, std::string* value) {
  value->clear();
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      value->push_back(text[i]);
      continue;
    }
    const int high = i + 2 < text.size() ? HexDigit(text[i + 1]) : -1;
    const int low = i + 2 < text.size() ? HexDigit(text[i + 2]) : -1;
    if (high < 0 || low < 0) return false;
    value->push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return true;
}

// Writes "key=value" for each field.
class FieldWriter {
 public:
  explicit FieldWriter(std::string* line) : line_(line) {}
  template <typename T>
  void operator()(const char* key, const T& value) {
    absl::StrAppend(line_, " ", key, "=", Format(value));
  }

 private:
  static std::string Format(double v) { return absl::StrFormat("%.17g", v); }
  static std::string Format(bool v) { return v ? "1" : "0"; }
  static std::string Format(const std::string& v) { return Escape(v); }
  static std::string Format(TrainReport::ExportReason v) { return ExportReasonName(v); }
  static std::string Format(const Hex64<const uint64_t>& v) { return absl::StrFormat("%016x", *v.value); }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  static std::string Format(T v) {
    return absl::StrCat(v);
  }
  std::string* line_;
};

// Sets each field from the event's "key=value" words; the first missing or bad one is the status.
class FieldReader {
 public:
  explicit FieldReader(const std::map<std::string, std::string>& fields) : fields_(fields) {}
  // `out` is a member, or a Hex64 naming one.
  template <typename T>
  void operator()(const char* key, T&& out) {
    auto it = fields_.find(key);
    if (it != fields_.end() && Parse(it->second, &out)) return;
    if (status_.ok()) status_ = absl::InvalidArgumentError(absl::StrCat("event field '", key, "' missing or bad"));
  }
  const absl::Status& status() const { return status_; }

 private:
  static bool Parse(const std::string& text, double* v) { return absl::SimpleAtod(text, v); }
  static bool Parse(const std::string& text, bool* v) {
    *v = text == "1";
    return text == "1" || text == "0";
  }
  static bool Parse(const std::string& text, std::string* v) { return Unescape(text, v); }
  static bool Parse(const std::string& text, TrainReport::ExportReason* v) { return ParseExportReason(text, v); }
  static bool Parse(const std::string& text, Hex64<uint64_t>* v) { return absl::SimpleHexAtoi(text, v->value); }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  static bool Parse(const std::string& text, T* v) {
    return absl::SimpleAtoi(text, v);
  }
  const std::map<std::string, std::string>& fields_;
  absl::Status status_;
};

}  // namespace

void EventWriter::Write(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  *out_ << kEventPrefix << line << "\n" << std::flush;
}

void EventWriter::OnProgress(const Progress& p) {
  std::string line = "progress";
  ProgressFields(p, FieldWriter(&line));
  Write(line);
}

void EventWriter::OnEvaluation(uint64_t samples, const Evaluation& e) {
  std::string line = "eval";
  EvaluationFields(samples, e, FieldWriter(&line));
  Write(line);
}

void EventWriter::OnFinish(const TrainReport& r) {
  std::string line = "finish";
  ReportFields(r, FieldWriter(&line));
  Write(line);
}

absl::StatusOr<bool> EventReader::Read(const std::string& line) {
  if (!absl::StartsWith(line, kEventPrefix)) return false;
  std::vector<std::string> words = absl::StrSplit(line.substr(sizeof(kEventPrefix) - 1), ' ', absl::SkipEmpty());
  if (words.empty()) return absl::InvalidArgumentError("an empty worker event");
  std::map<std::string, std::string> fields;
  for (size_t i = 1; i < words.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    fields[kv.first] = kv.second;
  }
  FieldReader reader(fields);
  const std::string& kind = words[0];
  if (kind == "progress") {
    Progress p;
    ProgressFields(p, reader);
    if (!reader.status().ok()) return reader.status();
    report_.losses.emplace_back(p.samples, p.loss);
    if (sink_ != nullptr) sink_->OnProgress(p);
    return true;
  }
  if (kind == "eval") {
    uint64_t at = 0;
    Evaluation e;
    EvaluationFields(at, e, reader);
    if (!reader.status().ok()) return reader.status();
    report_.evals.emplace_back(at, e);
    if (sink_ != nullptr) sink_->OnEvaluation(at, e);
    return true;
  }
  if (kind == "finish") {
    ReportFields(report_, reader);
    if (!reader.status().ok()) return reader.status();
    finished_ = true;
    return true;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown worker event '", kind, "'"));
}

}  // namespace hyrec::dense_worker
