// `hyrec export`, `hyrec predict` and `hyrec eval`: the trained model out of a checkpoint, and
// scores of new data with it (dense_worker/predictor.h).
//
//   hyrec export --config=job.yaml [--checkpoint=latest|DIR] [--out=DIR]   (default: export.dir)
//   hyrec predict --model=model/ --input=new.csv [--output=scores.txt]     (one probability a line)
//   hyrec predict --model=model/ --input=new.csv --keep=user_id,item_id    (csv: user_id,item_id,probability)
//   hyrec predict --model=model/ --follow < requests                        (the newest model, as it trains)
//   hyrec eval --model=model/ --input=heldout.csv                           (AUC and log loss)
#include <cmath>
#include <fstream>
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/flags.h"
#include "hyrec/common/program.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/dense_worker/checkpoint.h"
#include "hyrec/dense_worker/predictor.h"
#include "hyrec/job/job_plan.h"
#include "src/cli/follow.h"
#include "src/cli/job_flags.h"
#include "src/cli/logging.h"
#include "src/cli/roles.h"

namespace hyrec::cli {
namespace {

int Finish(const std::string& program, const absl::Status& status) {
  if (status.ok()) return kExitOk;
  std::cerr << program << ": " << status.message() << std::endl;
  return ExitCodeFor(status);
}

struct ScoreFlags {
  std::string model;
  std::string input;
  std::string output;
  std::string keep;
  bool deltas = true;
  bool follow = false;
  int poll_ms = 1000;
  CommonFlags common;
};

void AddScoreFlags(FlagSet& flags, ScoreFlags* f) {
  flags.String("model", &f->model, "DIR",
               "An export directory, or a directory of exports (export.dir): the newest that verifies (required).");
  flags.String("input", &f->input, "FILES", "Data files in the job's format, comma-separated (required).");
  flags.Bool("deltas", &f->deltas,
             "With a directory of exports: also apply the deltas written after the export (export.delta_every_*).");
  flags.AddLogLevel(&f->common.log_level);
}

// The predictor of --model, brought up to date with its deltas when --model is a directory of
// exports.
absl::StatusOr<std::unique_ptr<dense_worker::Predictor>> LoadPredictor(const ScoreFlags& f) {
  if (f.model.empty()) return absl::InvalidArgumentError("--model=DIR is required");
  if (f.input.empty()) return absl::InvalidArgumentError("--input=FILES is required");
  Env* env = Env::Default();
  HYREC_ASSIGN_OR_RETURN(const std::string dir, dense_worker::ResolveExport(env, f.model));
  HYREC_ASSIGN_OR_RETURN(dense_worker::ServingRows rows, dense_worker::ReadExport(env, dir));
  int deltas = 0;
  if (f.deltas && dir != f.model) {
    HYREC_ASSIGN_OR_RETURN(deltas, dense_worker::ApplyDeltas(env, f.model, &rows));
  }
  std::cerr << "model " << dir << " (step " << rows.step << (deltas > 0 ? absl::StrCat(", +", deltas, " deltas") : "")
            << ")" << std::endl;
  return dense_worker::Predictor::FromRows(rows, rows.job_yaml);
}

// A csv field as RFC 4180 writes it: quoted when it holds a comma, a quote or a line break.
std::string CsvField(const std::string& v) {
  if (v.find_first_of(",\"\r\n") == std::string::npos) return v;
  return absl::StrCat("\"", absl::StrReplaceAll(v, {{"\"", "\"\""}}), "\"");
}

absl::Status Predict(const ScoreFlags& f) {
  HYREC_ASSIGN_OR_RETURN(auto predictor, LoadPredictor(f));
  std::vector<float> logits, labels;
  std::vector<std::string> kept;
  dense_worker::Predictor::ScoreOptions score;
  score.label_optional = true;
  score.keep = absl::StrSplit(f.keep, ',', absl::SkipEmpty());
  HYREC_RETURN_IF_ERROR(
      predictor->Score(absl::StrSplit(f.input, ',', absl::SkipEmpty()), score, &logits, &labels, &kept).status());
  if (kept.size() != logits.size() * score.keep.size()) {
    return absl::InternalError(absl::StrCat(kept.size(), " kept values for ", logits.size(), " samples"));
  }
  std::ofstream file;
  if (!f.output.empty()) file.open(f.output);
  std::ostream& out = f.output.empty() ? std::cout : file;
  if (!score.keep.empty()) {
    for (const std::string& name : score.keep) out << CsvField(name) << ",";
    out << "probability\n";
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    for (size_t k = 0; k < score.keep.size(); ++k) out << CsvField(kept[i * score.keep.size() + k]) << ",";
    out << absl::StrFormat("%.9g\n", 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i]))));
  }
  out.flush();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write --output '", f.output, "'"));
  std::cerr << logits.size() << " samples scored" << std::endl;
  return absl::OkStatus();
}

absl::Status FollowAndScore(const ScoreFlags& f) {
  if (f.model.empty()) return absl::InvalidArgumentError("--model=DIR (the job's export.dir) is required");
  if (!f.input.empty()) {
    return absl::InvalidArgumentError(
        "--follow scores standard input, one sample a line; --input is not taken with it");
  }
  if (!f.keep.empty()) return absl::InvalidArgumentError("--keep is not taken with --follow");
  if (!f.deltas) return absl::InvalidArgumentError("--follow applies deltas; --nodeltas is not taken with it");
  if (Env::Default()->FileExists(JoinPath(f.model, kManifestName))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--follow takes a directory of exports (export.dir); ", f.model, " is one export"));
  }
  FollowOptions o;
  o.export_root = f.model;
  o.output = f.output;
  o.poll = absl::Milliseconds(f.poll_ms);
  return Follow(o);
}

absl::Status Eval(const ScoreFlags& f) {
  HYREC_ASSIGN_OR_RETURN(auto predictor, LoadPredictor(f));
  HYREC_ASSIGN_OR_RETURN(const dense_worker::Evaluation e,
                         predictor->Score(absl::StrSplit(f.input, ',', absl::SkipEmpty()), nullptr, nullptr));
  std::cout << absl::StrFormat("auc: %.9f\nlog_loss: %.9f\nsamples: %d\n", e.auc, e.log_loss, e.samples);
  return absl::OkStatus();
}

absl::Status Export(const std::string& config, const std::vector<std::string>& overrides, const std::string& which,
                    const std::string& out) {
  if (config.empty()) return absl::InvalidArgumentError("--config=JOB.yaml is required");
  HYREC_ASSIGN_OR_RETURN(const job::JobPlan plan, job::PlanJobFile(config, overrides));
  const std::string root = !out.empty() ? out : plan.spec.serving.dir;
  if (root.empty()) return absl::InvalidArgumentError("--out=DIR is required when the job has no export.dir");
  CheckpointManifest manifest;
  HYREC_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(Env::Default(), plan.spec.checkpoint.dir,
                                                                  kCheckpointPrefix, which, &manifest));
  HYREC_ASSIGN_OR_RETURN(const std::string exported, dense_worker::ExportCheckpoint(Env::Default(), dir, root));
  std::cout << "exported " << dir << " (step " << manifest.step << ") to " << exported << std::endl;
  return absl::OkStatus();
}

}  // namespace

int PredictMain(int argc, char** argv) {
  ScoreFlags f;
  FlagSet flags(ProgramName() + " predict",
                "Score data files with an exported model: one probability per line, in input order. The "
                "input may lack the label column.");
  AddScoreFlags(flags, &f);
  flags.String("output", &f.output, "FILE", "Where the scores go (default: standard output).");
  flags.String("keep", &f.keep, "COLS",
               "Columns of the input to write beside each score (csv: header names; criteo: label, I1..I13, "
               "C1..C26): the output is then csv with a header, the kept columns and `probability`.");
  flags.Bool("follow", &f.follow,
             "Serve the newest model of a training job's export.dir (--model) as it trains: score standard input, "
             "one sample a line, applying each base export and delta as it is committed.");
  flags.Int("poll_ms", &f.poll_ms, "With --follow: how often export.dir is looked at for a newer model (ms).", 1,
            3600000);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  SetUpLogging("predict", f.common.log_level);
  return Finish(ProgramName() + " predict", f.follow ? FollowAndScore(f) : Predict(f));
}

int EvalMain(int argc, char** argv) {
  ScoreFlags f;
  FlagSet flags(ProgramName() + " eval", "AUC and log loss of an exported model on labelled data files.");
  AddScoreFlags(flags, &f);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  SetUpLogging("eval", f.common.log_level);
  return Finish(ProgramName() + " eval", Eval(f));
}

int ExportMain(int argc, char** argv) {
  std::string config, which = "latest", out;
  std::vector<std::string> overrides;
  CommonFlags common;
  FlagSet flags(ProgramName() + " export", "Write the serving artifact of a job's checkpoint (model.pt and its rows).");
  flags.String("config", &config, "FILE", "The job's YAML file (required).");
  AddSetFlag(flags, &overrides);
  flags.String("checkpoint", &which, "DIR|latest", "The checkpoint to export.");
  flags.String("out", &out, "DIR", "Where the export directory is made (default: the job's export.dir).");
  flags.AddLogLevel(&common.log_level);
  if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
  SetUpLogging("export", common.log_level);
  return Finish(ProgramName() + " export", Export(config, overrides, which, out));
}

}  // namespace hyrec::cli
