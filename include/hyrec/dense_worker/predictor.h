// Predictor: scores data with an export (`hyrec export`, or export.dir at the end of training),
// without the training job: the dense model rebuilt from the export's job text and loaded from
// its model.pt (a LibTorch archive of the module's parameters, loadable with torch::load into
// the same model), the rows held in one in-process store, and the trainer's own pooling, so its
// scores are those of the trained model in memory.
//
//   HYREC_ASSIGN_OR_RETURN(auto predictor, Predictor::Load("model/model-000000001200-..."));
//   std::vector<float> logits, labels;
//   HYREC_ASSIGN_OR_RETURN(Evaluation e, predictor->Score({"new_clicks.csv"}, &logits, &labels));
//
// Ids the export does not hold get their table's initial row, as they would in training.
// Deltas (export.delta_every_*) bring an export's rows up to date: ServingRows holds them.
#ifndef HYREC_DENSE_WORKER_PREDICTOR_H_
#define HYREC_DENSE_WORKER_PREDICTOR_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/trainer.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/job/job_plan.h"

namespace hyrec::dense_worker {

// The rows of an export as a follower holds them: per table, id -> weights.
struct ServingRows {
  std::map<std::string, absl::flat_hash_map<uint64_t, std::vector<float>>> tables;
  std::string model;             // model.pt's bytes.
  std::string script;            // A TorchScript model's module.pt (torchscript_model.h); else empty.
  uint64_t step = 0;             // Of the export or of the last delta applied.
  uint64_t samples = 0;          // The job had trained at that cut.
  uint64_t created_unix_ms = 0;  // When that cut was taken (its manifest's creation).
  uint64_t delta_sequence = 0;   // The last delta folded in (an export: the last before its cut).
  std::string job_yaml;          // The job's text, from the export's manifest.
};

// Reads a verified export directory.
absl::StatusOr<ServingRows> ReadExport(Env* env, const std::string& dir);
// Applies one delta directory (its sequence must be delta_sequence + 1): tombstones removed
// first, then the changed rows written, and the dense model replaced.
absl::Status ApplyDelta(Env* env, const std::string& dir, ServingRows* rows);
// The committed deltas under `export_root` after delta `sequence`, in order, as directories
// (of the deltas a resumed job wrote twice under one number, the newer). One still being written
// (no MANIFEST yet) ends the list. A gap is DATA_LOSS naming the missing number and the delta that
// follows it: delta sequence + 1 absent, or uncommitted, while a later one is committed.
absl::StatusOr<std::vector<std::string>> DeltasAfter(Env* env, const std::string& export_root, uint64_t sequence);
// Applies every delta under `export_root` after rows->delta_sequence, in order (DeltasAfter);
// returns how many. A gap or a damaged delta is an error; `rows` then holds the deltas before it.
absl::StatusOr<int> ApplyDeltas(Env* env, const std::string& export_root, ServingRows* rows);

// "path" itself when it holds a MANIFEST, else the newest valid export under it.
absl::StatusOr<std::string> ResolveExport(Env* env, const std::string& path);

class Predictor {
 public:
  static absl::StatusOr<std::unique_ptr<Predictor>> Load(const std::string& path, Env* env = nullptr);
  // A predictor over rows already read (an export with its deltas applied) and the job's text.
  static absl::StatusOr<std::unique_ptr<Predictor>> FromRows(const ServingRows& rows, const std::string& job_yaml);

  const job::JobPlan& plan() const { return plan_; }
  const std::string& dir() const { return dir_; }

  struct ScoreOptions {
    // Data to score may lack its label: a Criteo line of 39 fields, a libsvm/libffm line that
    // starts with a feature, a csv file whose header does not name the label column (a csv file
    // without a header keeps its label column: the columns are placed by position). Such a
    // sample's label is NaN, and so are the AUC and log loss of data that has one.
    bool label_optional = false;
    // Columns passed through (data_loader::SourceConfig::keep): csv header names; criteo label,
    // I1..I13, C1..C26.
    std::vector<std::string> keep;
  };

  // Scores every sample of `files` (the job's source format and columns), in file order: one logit
  // and label each, and their AUC and log loss (as the trained job evaluates). A bad line is an
  // error naming it (nothing is skipped). With options.keep, `kept` receives each sample's kept
  // values, keep.size() a sample, in the same order.
  absl::StatusOr<Evaluation> Score(const std::vector<std::string>& files, std::vector<float>* logits,
                                   std::vector<float>* labels);
  absl::StatusOr<Evaluation> Score(const std::vector<std::string>& files, const ScoreOptions& options,
                                   std::vector<float>* logits, std::vector<float>* labels,
                                   std::vector<std::string>* kept);

  // Scoring lines as they come (`hyrec predict --follow`): the job's source with its labels
  // optional, for ScoreLines. A csv job with a header takes that header's line, which places the
  // columns (InvalidArgument naming a column it lacks); other formats ignore it.
  absl::StatusOr<data_loader::SourceConfig> LineSource(const std::string& header) const;
  // One logit per line of `lines` (one sample each, parsed with `source` from LineSource), in
  // order. A bad line is InvalidArgument naming its index; nothing is then scored.
  absl::Status ScoreLines(const data_loader::SourceConfig& source, const std::vector<std::string>& lines,
                          std::vector<float>* logits);

 private:
  Predictor() = default;
  job::JobPlan plan_;
  std::string dir_;
  std::shared_ptr<DenseModelImpl> model_;
  std::unique_ptr<embedding_ps::EmbeddingClient> rows_;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_PREDICTOR_H_
