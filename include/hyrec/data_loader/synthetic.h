// SyntheticSource: an answer-known dataset. Labels come from a hidden teacher — a random
// embedding per id plus a dense term, through a logistic — so the best achievable AUC is known.
//
//   SyntheticConfig config;            // 26 slots x 100k ids, 13 dense, Zipf(1.05)
//   SyntheticSource source(config);
//   Sample s;
//   source.Generate(12345, &s);        // sample 12345: a pure function of (seed, index)
//   double best = source.TeacherAuc(200'000);
//   std::cout << "the teacher's AUC: " << best << "\n";
//
// Sample i depends only on (seed, i), so generation parallelizes with identical results. The
// samples use the Criteo conventions (dense = log(1 + count), categorical ids = HashToken of an
// 8-hex-digit token), so WriteCriteo writes a file that ParseCriteoLine reads back into exactly
// the same samples.
#ifndef HYREC_DATA_LOADER_SYNTHETIC_H_
#define HYREC_DATA_LOADER_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "hyrec/data_loader/sample.h"

namespace hyrec::data_loader {

struct SyntheticConfig {
  uint64_t num_samples = 1'000'000;  // Per epoch.
  int num_dense = 13;
  int num_slots = 26;
  uint64_t vocabulary = 100'000;  // Distinct ids per slot.
  int ids_per_sample = 1;         // Multi-hot: ids drawn per slot per sample.
  double zipf = 1.05;             // Exponent of the id distribution within a slot.
  uint64_t seed = 1;
  int teacher_dim = 4;         // Dimension of the teacher's id embeddings.
  double teacher_scale = 2.5;  // Logit scale: larger gives a higher best AUC.
  double teacher_bias = -1.0;  // Sets the positive rate (about 0.3 by default).
  uint64_t first_index = 0;    // Sample i of the dataset is drawn at index first_index + i:
                               // the same teacher, other samples (a held-out split).

  absl::Status Validate() const;
};

class SyntheticSource {
 public:
  explicit SyntheticSource(const SyntheticConfig& config);
  ~SyntheticSource();

  const SyntheticConfig& config() const { return config_; }

  // Writes sample `index` (any uint64) into *out.
  void Generate(uint64_t index, Sample* out) const;

  // The teacher's probability that sample `index` is positive.
  double TeacherProbability(uint64_t index) const;

  // The AUC of the teacher's own probabilities on `samples` samples drawn from indices beyond
  // the training range: the best AUC any model can reach on this data (up to sampling error).
  double TeacherAuc(uint64_t samples) const;

  // Writes samples [0, num_samples) as Criteo TSV lines. Requires ids_per_sample == 1.
  absl::Status WriteCriteo(const std::string& path, uint64_t num_samples) const;

 private:
  struct Tables;
  // Draws sample `index` and returns its teacher logit.
  double Draw(uint64_t index, Sample* out, std::vector<uint64_t>* counts, std::vector<uint64_t>* ranks) const;

  // The id of `rank` in slot `s` and its teacher term (embedding . slot direction).
  void IdAndTeacherTerm(int s, uint64_t rank, uint64_t* id, double* dot) const;

  SyntheticConfig config_;
  std::unique_ptr<Tables> tables_;
};

// Exact AUC of `scores` against binary `labels` (ties count one half). 0.5 when one class is empty.
double ExactAuc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_SYNTHETIC_H_
