// Row precision (src/embedding_ps/row_codec.h): stochastic rounding to a neighbouring half and
// unbiased (the mean of many roundings is the value), and an fp16
// table in a store: half the weight bytes, rows that read back what was written, the mean of
// many rows written with the same value is that value, and updates smaller than a half's step
// still move a row as they would an fp32 row, on average.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/common/fp16.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "src/embedding_ps/row_codec.h"

namespace hyrec::embedding_ps {
namespace {

// A half is never rounded, and a value between two halves is rounded to one of them.
TEST(RowCodec, StochasticRoundingGivesANeighbouringHalf) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (const uint16_t signed_h : {static_cast<uint16_t>(h), static_cast<uint16_t>(h | 0x8000)}) {
      EXPECT_EQ(FloatToHalfStochastic(HalfToFloat(signed_h), 0.999f), signed_h) << std::hex << signed_h;
    }
  }
  for (const float x : {0.1f, -1e-6f, 1000.3f}) {
    const uint16_t nearest = FloatToHalf(x);
    for (const float u : {0.0f, 0.3f, 0.7f, 0.9999f}) {
      const uint16_t got = FloatToHalfStochastic(x, u);
      EXPECT_LE(std::abs(static_cast<int>(got) - static_cast<int>(nearest)), 1) << x << " u " << u;
      EXPECT_LE(std::fabs(HalfToFloat(got) - x), std::fabs(HalfToFloat(nearest + 1) - HalfToFloat(nearest)));
    }
  }
}

// The mean of many stochastic roundings of x is x, within four standard errors, for normal and
// subnormal halves of either sign.
TEST(RowCodec, StochasticRoundingIsUnbiased) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (const float x : {0.1f, -0.3337f, 3.14159f, 1e-3f, 2.5e-6f, -7.1e-7f, 1000.3f}) {
    const uint16_t h = FloatToHalf(x);
    const double step = std::fabs(HalfToFloat(h + 1) - HalfToFloat(h));  // The spacing around x.
    constexpr int kDraws = 200000;
    double sum = 0;
    for (int i = 0; i < kDraws; ++i) sum += HalfToFloat(FloatToHalfStochastic(x, unit(rng)));
    const double mean = sum / kDraws;
    EXPECT_NEAR(mean, x, 4 * step * 0.5 / std::sqrt(kDraws)) << x;
    // Nearest rounding is biased by up to half a step where stochastic is not.
  }
  // Through EncodeWeights, whose seeds draw the rounding: the mean over many seeds.
  const float w[2] = {0.1f, -1.2345f};
  double sums[2] = {0, 0};
  constexpr int kSeeds = 100000;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    char out[4];
    ASSERT_TRUE(EncodeWeights(RowPrecision::kFp16, w, 2, seed * 0x9e3779b97f4a7c15ULL | 1, out));
    float back[2];
    DecodeWeights(RowPrecision::kFp16, out, 2, back);
    sums[0] += back[0];
    sums[1] += back[1];
  }
  EXPECT_NEAR(sums[0] / kSeeds, 0.1, 4 * 6.1e-5 * 0.5 / std::sqrt(kSeeds));
  EXPECT_NEAR(sums[1] / kSeeds, -1.2345, 4 * 9.8e-4 * 0.5 / std::sqrt(kSeeds));
  EXPECT_EQ(WeightBytes(RowPrecision::kFp16, 16), 32u);
  EXPECT_EQ(WeightBytes(RowPrecision::kFp16, 3), 8u) << "padded to 4 bytes";
  const float huge[1] = {70000.0f};
  char out[4] = {1, 2, 3, 4};
  EXPECT_FALSE(EncodeWeights(RowPrecision::kFp16, huge, 1, 5, out));
  EXPECT_EQ(out[0], 1) << "nothing written";
}

// An int8 row's bytes: the row's min and max stand exactly for themselves, a weight between them
// rounds to a neighbouring grid step without bias, and a row decoded and encoded again (to
// nearest, as checkpoints and restores do) is the same row.
TEST(RowCodec, Int8RowsAreUnbiasedAndRoundTrip) {
  EXPECT_EQ(WeightBytes(RowPrecision::kInt8, 16), 24u) << "min, max, 16 bytes";
  EXPECT_EQ(WeightBytes(RowPrecision::kInt8, 3), 12u) << "padded to 4 bytes";
  EXPECT_EQ(PackedWeightBytes(RowPrecision::kInt8, 3), 11u);
  EXPECT_EQ(QuantizeStochastic(-0.5f, -0.5f, 1.5f, 0.999f), 0);
  EXPECT_EQ(QuantizeStochastic(1.5f, -0.5f, 1.5f, 0.0f), 255);
  EXPECT_EQ(Dequantize(0, -0.5f, 1.5f), -0.5f);
  EXPECT_EQ(Dequantize(255, -0.5f, 1.5f), 1.5f);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (const float x : {0.1f, 0.333f, 1.49f, -0.4999f}) {
    constexpr int kDraws = 200000;
    const double step = 2.0 / 255;
    double sum = 0;
    for (int i = 0; i < kDraws; ++i) sum += Dequantize(QuantizeStochastic(x, -0.5f, 1.5f, unit(rng)), -0.5f, 1.5f);
    EXPECT_NEAR(sum / kDraws, x, 4 * step * 0.5 / std::sqrt(kDraws)) << x;
    const uint8_t nearest = QuantizeStochastic(x, -0.5f, 1.5f, -1.0f);
    EXPECT_LE(std::fabs(Dequantize(nearest, -0.5f, 1.5f) - x), step / 2 + 1e-7) << x;
  }
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int row = 0; row < 1000; ++row) {
    float w[16];
    for (float& v : w) v = normal(rng) + (row % 7 - 3);
    char a[24], b[24];
    ASSERT_TRUE(EncodeWeights(RowPrecision::kInt8, w, 16, row + 1, a));
    float back[16];
    DecodeWeights(RowPrecision::kInt8, a, 16, back);
    EXPECT_EQ(*std::min_element(back, back + 16), *std::min_element(w, w + 16)) << "min exact";
    EXPECT_EQ(*std::max_element(back, back + 16), *std::max_element(w, w + 16)) << "max exact";
    ASSERT_TRUE(EncodeWeights(RowPrecision::kInt8, back, 16, 0, b));
    ASSERT_EQ(std::memcmp(a, b, sizeof(a)), 0) << "row " << row;
  }
  const float same[3] = {0.25f, 0.25f, 0.25f};
  char out[12];
  ASSERT_TRUE(EncodeWeights(RowPrecision::kInt8, same, 3, 9, out));
  float back[3];
  DecodeWeights(RowPrecision::kInt8, out, 3, back);
  EXPECT_EQ(back[1], 0.25f) << "a row of one value holds it exactly";
}

std::unique_ptr<EmbeddingShardStore> Store(RowPrecision precision, OptimizerKind kind, float lr, int dim = 4) {
  TableConfig t;
  t.name = "t";
  t.dim = dim;
  t.precision = precision;
  t.optimizer.kind = kind;
  t.optimizer.learning_rate = lr;
  t.initializer.kind = InitializerKind::kZeros;
  StoreOptions o;
  o.tables = {t};
  auto store = EmbeddingShardStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

// Rows of ids 0..n-1, as a store reads them.
std::vector<float> Rows(EmbeddingShardStore& store, uint64_t n, int dim) {
  std::vector<uint64_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = i;
  std::vector<float> out(n * dim);
  EXPECT_TRUE(store.Lookup(0, ids, absl::MakeSpan(out), nullptr).ok());
  return out;
}

// One SGD step of `grad` on every one of ids 0..n-1.
void StepAll(EmbeddingShardStore& store, uint64_t n, int dim, float grad, uint64_t sequence) {
  std::vector<uint64_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = i;
  std::vector<float> grads(n * dim, grad);
  UpdateResult r;
  ASSERT_TRUE(store.Update(0, ids, grads, UpdateId{1, sequence}, &r).ok());
  ASSERT_EQ(r.applied, n);
}

TEST(RowPrecision, AnFp16TableHoldsHalfTheWeightBytesAndTheMeanOfItsRowsIsTheValueWritten) {
  constexpr int kDim = 4;
  constexpr uint64_t kRows = 50000;
  auto fp16 = Store(RowPrecision::kFp16, OptimizerKind::kSgd, 1.0f, kDim);
  auto fp32 = Store(RowPrecision::kFp32, OptimizerKind::kSgd, 1.0f, kDim);
  Rows(*fp16, kRows, kDim);
  Rows(*fp32, kRows, kDim);
  EXPECT_EQ(fp32->Stats().tables[0].row_bytes - fp16->Stats().tables[0].row_bytes, 8u)
      << "4 weights, 2 bytes less each";
  StepAll(*fp16, kRows, kDim, -0.1f, 1);  // Every weight: 0 - 1 * -0.1.
  double sum = 0;
  for (float w : Rows(*fp16, kRows, kDim)) {
    EXPECT_TRUE(w == HalfToFloat(FloatToHalf(w))) << "a half";
    EXPECT_NEAR(w, 0.1f, 6.2e-5f) << "one of the two halves around 0.1";
    sum += w;
  }
  EXPECT_NEAR(sum / (kRows * kDim), 0.1, 4 * 6.1e-5 * 0.5 / std::sqrt(kRows * kDim)) << "unbiased";
}

// A step smaller than a half's spacing moves an fp16 row in expectation: 1000 steps of 1e-4
// from 1.0 (where halves are 2^-10 apart) end near 1.1 on average, as fp32 does, where rounding
// to nearest would leave every row at 1.0.
TEST(RowPrecision, UpdatesSmallerThanAStepStillMoveTheRowsOnAverage) {
  constexpr int kDim = 2;
  constexpr uint64_t kRows = 2000;
  auto fp16 = Store(RowPrecision::kFp16, OptimizerKind::kSgd, 1.0f, kDim);
  auto fp32 = Store(RowPrecision::kFp32, OptimizerKind::kSgd, 1.0f, kDim);
  for (auto* store : {fp16.get(), fp32.get()}) {
    StepAll(*store, kRows, kDim, -1.0f, 1);
    for (uint64_t s = 0; s < 1000; ++s) StepAll(*store, kRows, kDim, -1e-4f, 2 + s);
  }
  double sum16 = 0, sum32 = 0;
  for (float w : Rows(*fp16, kRows, kDim)) sum16 += w;
  for (float w : Rows(*fp32, kRows, kDim)) sum32 += w;
  const double n = kRows * kDim;
  EXPECT_NEAR(sum32 / n, 1.1, 1e-3);
  EXPECT_NEAR(sum16 / n, sum32 / n, 1e-3);
}

// Two runs of one job round alike: a worker's update sequences are a clock-made origin (a
// multiple of 2^20) plus the step, so stores updated under different origins end with the same
// rows, while each step still rounds anew.
TEST(RowPrecision, RunsWhoseSequencesStartAtDifferentOriginsRoundAlike) {
  constexpr int kDim = 4;
  constexpr uint64_t kRows = 500;
  for (const RowPrecision precision : {RowPrecision::kFp16, RowPrecision::kInt8}) {
    auto first = Store(precision, OptimizerKind::kSgd, 1.0f, kDim);
    auto second = Store(precision, OptimizerKind::kSgd, 1.0f, kDim);
    auto shifted = Store(precision, OptimizerKind::kSgd, 1.0f, kDim);
    std::vector<uint64_t> ids(kRows);
    for (uint64_t i = 0; i < kRows; ++i) ids[i] = i;
    std::vector<float> grads(kRows * kDim);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.0123f * static_cast<float>(1 + (i % kDim) * (i % kDim));
    for (uint64_t step = 1; step <= 20; ++step) {
      ASSERT_TRUE(first->Update(0, ids, grads, UpdateId{1, (uint64_t{1700000000000} << 20) + step}, nullptr).ok());
      ASSERT_TRUE(second->Update(0, ids, grads, UpdateId{1, (uint64_t{1700000000777} << 20) + step}, nullptr).ok());
      ASSERT_TRUE(
          shifted->Update(0, ids, grads, UpdateId{1, (uint64_t{1700000000777} << 20) + step + 1}, nullptr).ok());
    }
    EXPECT_EQ(Rows(*first, kRows, kDim), Rows(*second, kRows, kDim)) << "the same steps round alike";
    EXPECT_NE(Rows(*first, kRows, kDim), Rows(*shifted, kRows, kDim)) << "other steps round otherwise";
  }
}

// An int8 table: a quarter of the weight bytes plus 8 a row; a weight between its row's min and
// max is unbiased over many rows, and steps far smaller than the row's grid move it on average.
TEST(RowPrecision, AnInt8TableHoldsAByteAWeightAndItsRowsMoveAsFp32RowsOnAverage) {
  constexpr int kDim = 3;
  constexpr uint64_t kRows = 20000;
  auto int8 = Store(RowPrecision::kInt8, OptimizerKind::kSgd, 1.0f, 16);
  auto fp32 = Store(RowPrecision::kFp32, OptimizerKind::kSgd, 1.0f, 16);
  Rows(*int8, 1, 16);
  Rows(*fp32, 1, 16);
  EXPECT_EQ(fp32->Stats().tables[0].row_bytes - int8->Stats().tables[0].row_bytes, 64u - 24u);

  auto store = Store(RowPrecision::kInt8, OptimizerKind::kSgd, 1.0f, kDim);
  std::vector<uint64_t> ids(kRows);
  for (uint64_t i = 0; i < kRows; ++i) ids[i] = i;
  std::vector<float> grads;
  for (uint64_t i = 0; i < kRows; ++i) grads.insert(grads.end(), {0.0f, -0.1f, -2.0f});  // Rows (0, 0.1, 2).
  UpdateResult r;
  ASSERT_TRUE(store->Update(0, ids, grads, UpdateId{1, 1}, &r).ok());
  const double step = 2.0 / 255;
  double sum = 0;
  std::vector<float> rows = Rows(*store, kRows, kDim);
  for (uint64_t i = 0; i < kRows; ++i) {
    EXPECT_EQ(rows[i * kDim], 0.0f);
    EXPECT_EQ(rows[i * kDim + 2], 2.0f);
    sum += rows[i * kDim + 1];
  }
  EXPECT_NEAR(sum / kRows, 0.1, 4 * step * 0.5 / std::sqrt(kRows)) << "unbiased";
  // 500 steps of 1e-4 (a 78th of the grid's step) on every weight: the middle one ends near 0.15.
  for (uint64_t s = 0; s < 500; ++s) StepAll(*store, kRows, kDim, -1e-4f, 2 + s);
  sum = 0;
  rows = Rows(*store, kRows, kDim);
  for (uint64_t i = 0; i < kRows; ++i) sum += rows[i * kDim + 1];
  // Each write adds at most step / 2 of independent, unbiased noise a row: 500 writes over
  // kRows rows leave the mean within 4 standard errors of 0.15.
  EXPECT_NEAR(sum / kRows, 0.15, 4 * step * 0.5 * std::sqrt(500.0 / kRows)) << "where fp32 ends";
  float max = 2.0f;
  for (int s = 0; s < 500; ++s) max -= 1.0f * -1e-4f;
  EXPECT_NEAR(rows[2], max, 1e-6f) << "the max, as fp32 steps it";
}

// A weight an fp16 row cannot hold is refused as a non-finite one: the row is unchanged.
TEST(RowPrecision, AStepPastTheLargestHalfLeavesTheRowUnchanged) {
  auto store = Store(RowPrecision::kFp16, OptimizerKind::kSgd, 1.0f, 1);
  StepAll(*store, 1, 1, -60000.0f, 1);
  UpdateResult r;
  ASSERT_TRUE(store->Update(0, std::vector<uint64_t>{0}, std::vector<float>{-10000.0f}, UpdateId{1, 2}, &r).ok());
  EXPECT_EQ(r.nonfinite, 1u);
  EXPECT_EQ(Rows(*store, 1, 1)[0], 60000.0f);
  // A restored row that fp16 cannot hold is refused, naming the row; nothing is restored.
  auto other = Store(RowPrecision::kFp16, OptimizerKind::kSgd, 1.0f, 1);
  const absl::Status s = other->RestoreRows(0, std::vector<uint64_t>{5, 6}, std::vector<float>{1.0f, 1e6f}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("id 6"), std::string::npos) << s;
  EXPECT_EQ(other->Stats().rows, 0u);
}

}  // namespace
}  // namespace hyrec::embedding_ps
