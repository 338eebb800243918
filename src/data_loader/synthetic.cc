#include "hyrec/data_loader/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "hyrec/common/hash.h"
#include "hyrec/data_loader/parsers.h"

namespace hyrec::data_loader {
namespace {

constexpr int kZipfPieces = 1 << 16;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kTeacherAucBase = 1ULL << 62;  // Held-out indices for TeacherAuc.
constexpr uint64_t kHeadRanks = 1024;

// Counter-based generator: the stream of sample i is a pure function of (seed, i).
class SampleRng {
 public:
  explicit SampleRng(uint64_t state) : state_(state) {}
  uint64_t Next() { return Mix64(state_ += kGolden); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

inline void FormatHex8(uint32_t v, char* out) {
  static const char kDigits[] = "0123456789abcdef";
  for (int i = 7; i >= 0; --i) {
    out[i] = kDigits[v & 15];
    v >>= 4;
  }
}

}  // namespace

// Zipf over [0, vocabulary) as 65,536 equal-probability pieces: piece q covers ranks
// [bounds[q], bounds[q+1]); a draw picks a piece, then a rank uniformly within it. Head ranks that
// carry more than 1/65,536 of the mass span several pieces, so their probabilities are exact to
// that resolution; tail ranks are drawn uniformly within their piece.
struct SyntheticSource::Tables {
  std::vector<uint32_t> bounds;        // kZipfPieces + 1 (vocabulary <= 2^32 - 1)
  std::vector<float> slot_directions;  // num_slots x teacher_dim, unit vectors
  std::vector<float> dense_weights;    // num_dense
  std::vector<uint16_t> counts;        // 65,536 dense counts: floor(e^(6u)) - 1 at u = (k + 0.5) / 65536
  // The id and teacher term of each slot's kHeadRanks most frequent ranks, which make up most
  // draws: the same values Draw would compute, computed once.
  std::vector<uint64_t> head_ids;  // num_slots x kHeadRanks
  std::vector<float> head_dots;
};

absl::Status SyntheticConfig::Validate() const {
  if (num_samples == 0) return absl::InvalidArgumentError("synthetic.num_samples must be > 0");
  if (num_dense < 0 || num_dense > 1024) return absl::InvalidArgumentError("synthetic.num_dense must be in [0, 1024]");
  if (num_slots < 1 || num_slots > 1024) return absl::InvalidArgumentError("synthetic.num_slots must be in [1, 1024]");
  if (vocabulary < 1 || vocabulary >= (1ULL << 32)) {
    return absl::InvalidArgumentError("synthetic.vocabulary must be in [1, 2^32)");
  }
  if (ids_per_sample < 1 || ids_per_sample > 1024) {
    return absl::InvalidArgumentError("synthetic.ids_per_sample must be in [1, 1024]");
  }
  if (!(zipf > 0 && zipf < 10)) return absl::InvalidArgumentError("synthetic.zipf must be in (0, 10)");
  if (teacher_dim < 1 || teacher_dim > 64)
    return absl::InvalidArgumentError("synthetic.teacher_dim must be in [1, 64]");
  if (!std::isfinite(teacher_scale) || !std::isfinite(teacher_bias)) {
    return absl::InvalidArgumentError("synthetic teacher scale and bias must be finite");
  }
  return absl::OkStatus();
}

SyntheticSource::SyntheticSource(const SyntheticConfig& config) : config_(config), tables_(std::make_unique<Tables>()) {
  const uint64_t v = config.vocabulary;
  std::vector<double> cumulative(v);
  double total = 0;
  for (uint64_t r = 0; r < v; ++r) {
    total += std::pow(static_cast<double>(r + 1), -config.zipf);
    cumulative[r] = total;
  }
  tables_->bounds.resize(kZipfPieces + 1);
  uint64_t r = 0;
  for (int q = 0; q <= kZipfPieces; ++q) {
    const double target = total * q / kZipfPieces;
    while (r < v && cumulative[r] <= target) ++r;
    tables_->bounds[q] = static_cast<uint32_t>(std::min(r, v - 1));
  }
  tables_->bounds[kZipfPieces] = static_cast<uint32_t>(v);
  SampleRng rng(HashCombine(config.seed, 0x7465616368657200ULL));
  tables_->slot_directions.resize(static_cast<size_t>(config.num_slots) * config.teacher_dim);
  for (int s = 0; s < config.num_slots; ++s) {
    double norm = 0;
    float* u = &tables_->slot_directions[static_cast<size_t>(s) * config.teacher_dim];
    for (int j = 0; j < config.teacher_dim; ++j) {
      u[j] = static_cast<float>(rng.Uniform() * 2 - 1);
      norm += u[j] * u[j];
    }
    norm = std::sqrt(std::max(norm, 1e-12));
    for (int j = 0; j < config.teacher_dim; ++j) u[j] = static_cast<float>(u[j] / norm);
  }
  tables_->counts.resize(1 << 16);
  for (int k = 0; k < (1 << 16); ++k) {
    tables_->counts[k] = static_cast<uint16_t>(std::exp(6.0 * (k + 0.5) / 65536.0)) - 1;
  }
  tables_->dense_weights.resize(config.num_dense);
  for (float& w : tables_->dense_weights) w = static_cast<float>(rng.Uniform() * 2 - 1);
  const uint64_t head = std::min<uint64_t>(kHeadRanks, config.vocabulary);
  tables_->head_ids.resize(static_cast<size_t>(config.num_slots) * kHeadRanks);
  tables_->head_dots.resize(tables_->head_ids.size());
  for (int s = 0; s < config.num_slots; ++s) {
    for (uint64_t r = 0; r < head; ++r) {
      double dot = 0;
      IdAndTeacherTerm(s, r, &tables_->head_ids[s * kHeadRanks + r], &dot);
      tables_->head_dots[s * kHeadRanks + r] = static_cast<float>(dot);
    }
  }
}

SyntheticSource::~SyntheticSource() = default;

double SyntheticSource::Draw(uint64_t index, Sample* out, std::vector<uint64_t>* counts,
                             std::vector<uint64_t>* ranks) const {
  const SyntheticConfig& c = config_;
  SampleRng rng(HashCombine(c.seed, index));
  out->Clear(c.num_slots);
  out->dense.resize(c.num_dense);
  if (counts != nullptr) counts->resize(c.num_dense);
  double dense_term = 0;
  for (int k = 0; k < c.num_dense; ++k) {
    // Heavy-tailed counts like Criteo's: floor(e^(6u)) - 1 in [0, 402], u on a 2^-16 grid.
    const int64_t count = tables_->counts[rng.Next() >> 48];
    if (counts != nullptr) (*counts)[k] = static_cast<uint64_t>(count);
    out->dense[k] = CriteoDense(count);
    dense_term += tables_->dense_weights[k] * (out->dense[k] - 2.5) * (1.0 / 1.7);
  }
  if (c.num_dense > 0) dense_term /= std::sqrt(static_cast<double>(c.num_dense) / 3.0);
  if (ranks != nullptr) ranks->clear();
  double slot_term = 0;
  for (int s = 0; s < c.num_slots; ++s) {
    double slot_sum = 0;
    for (int k = 0; k < c.ids_per_sample; ++k) {
      // One 64-bit draw: 16 bits pick the piece, the other 48 the rank within it.
      const uint64_t bits = rng.Next();
      const uint32_t piece = static_cast<uint32_t>(bits & (kZipfPieces - 1));
      const uint64_t lo = tables_->bounds[piece];
      const uint64_t hi = std::max<uint64_t>(tables_->bounds[piece + 1], lo + 1);
      const uint64_t rank = lo + static_cast<uint64_t>((static_cast<unsigned __int128>(bits >> 16) * (hi - lo)) >> 48);
      if (ranks != nullptr) ranks->push_back(rank);
      uint64_t id;
      double dot;
      if (rank < kHeadRanks && rank < c.vocabulary) {
        id = tables_->head_ids[s * kHeadRanks + rank];
        dot = tables_->head_dots[s * kHeadRanks + rank];
      } else {
        IdAndTeacherTerm(s, rank, &id, &dot);
        dot = static_cast<float>(dot);  // As the head cache stores it.
      }
      out->ids.push_back(id);
      slot_sum += dot;
    }
    out->slot_offsets[s + 1] = static_cast<uint32_t>(out->ids.size());
    slot_term += slot_sum / c.ids_per_sample;
  }
  slot_term /= std::sqrt(static_cast<double>(c.num_slots));
  const double logit = c.teacher_scale * (0.8 * slot_term + 0.6 * dense_term) + c.teacher_bias;
  const double p = 1.0 / (1.0 + std::exp(-logit));
  out->label = rng.Uniform() < p ? 1.0f : 0.0f;
  return logit;
}

void SyntheticSource::IdAndTeacherTerm(int s, uint64_t rank, uint64_t* id, double* dot) const {
  const SyntheticConfig& c = config_;
  const uint64_t token_seed = HashCombine(c.seed, 0x746f6b656e730000ULL);
  const uint64_t teacher_seed = HashCombine(c.seed, 0x656d626564000000ULL);
  char token[8];
  FormatHex8(static_cast<uint32_t>(Mix64(token_seed ^ (static_cast<uint64_t>(s) << 40) ^ rank)), token);
  *id = HashToken(s, absl::string_view(token, 8));
  // Teacher embedding of the id: components uniform in [-sqrt(3), sqrt(3)] (unit variance),
  // 16 bits each, four from every 64-bit hash; the term is its dot with the slot's direction.
  const float* u = &tables_->slot_directions[static_cast<size_t>(s) * c.teacher_dim];
  const uint64_t e = Mix64(*id ^ teacher_seed);
  double sum = 0;
  uint64_t bits64 = 0;
  for (int j = 0; j < c.teacher_dim; ++j) {
    if (j % 4 == 0) bits64 = Mix64(e + j);
    const double component = ((static_cast<double>(bits64 & 0xffff) + 0.5) * (2.0 / 65536.0) - 1) * 1.7320508;
    bits64 >>= 16;
    sum += component * u[j];
  }
  *dot = sum;
}

void SyntheticSource::Generate(uint64_t index, Sample* out) const { Draw(index, out, nullptr, nullptr); }

double SyntheticSource::TeacherProbability(uint64_t index) const {
  Sample s;
  const double logit = Draw(index, &s, nullptr, nullptr);
  return 1.0 / (1.0 + std::exp(-logit));
}

double SyntheticSource::TeacherAuc(uint64_t samples) const {
  std::vector<float> scores(samples), labels(samples);
  Sample s;
  for (uint64_t i = 0; i < samples; ++i) {
    scores[i] = static_cast<float>(Draw(kTeacherAucBase + i, &s, nullptr, nullptr));
    labels[i] = s.label;
  }
  return ExactAuc(scores, labels);
}

absl::Status SyntheticSource::WriteCriteo(const std::string& path, uint64_t num_samples) const {
  if (config_.ids_per_sample != 1) {
    return absl::InvalidArgumentError("a Criteo file holds one token per slot: ids_per_sample must be 1");
  }
  if (config_.num_dense != kCriteoDense || config_.num_slots != kCriteoSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("a Criteo file has ", kCriteoDense, " dense and ", kCriteoSlots, " categorical fields"));
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot write '", path, "'"));
  Sample s;
  std::vector<uint64_t> counts, ranks;
  const uint64_t token_seed = HashCombine(config_.seed, 0x746f6b656e730000ULL);
  std::string line;
  char token[9] = {0};
  for (uint64_t i = 0; i < num_samples; ++i) {
    Draw(i, &s, &counts, &ranks);
    line.clear();
    absl::StrAppend(&line, s.label > 0 ? "1" : "0");
    for (uint64_t x : counts) absl::StrAppend(&line, "\t", x);
    for (int slot = 0; slot < kCriteoSlots; ++slot) {
      FormatHex8(static_cast<uint32_t>(Mix64(token_seed ^ (static_cast<uint64_t>(slot) << 40) ^ ranks[slot])), token);
      absl::StrAppend(&line, "\t", absl::string_view(token, 8));
    }
    line.push_back('\n');
    if (std::fwrite(line.data(), 1, line.size(), f) != line.size()) {
      std::fclose(f);
      return absl::DataLossError(absl::StrCat("short write to '", path, "'"));
    }
  }
  if (std::fclose(f) != 0) return absl::DataLossError(absl::StrCat("cannot close '", path, "'"));
  return absl::OkStatus();
}

double ExactAuc(const std::vector<float>& scores, const std::vector<float>& labels) {
  const size_t n = scores.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  double rank_sum = 0;
  uint64_t positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double average_rank = (static_cast<double>(i) + static_cast<double>(j) + 1) / 2.0;  // 1-based
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        rank_sum += average_rank;
        ++positives;
      }
    }
    i = j;
  }
  const uint64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - static_cast<double>(positives) * (positives + 1) / 2.0) /
         (static_cast<double>(positives) * negatives);
}

}  // namespace hyrec::data_loader
