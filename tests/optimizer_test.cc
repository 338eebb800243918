// Each sparse optimizer against an independent double-precision reference over several steps,
// plus small cases computed by hand.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hyrec/embedding_ps/optimizer.h"

namespace hyrec::embedding_ps {
namespace {

constexpr int kDim = 3;
const std::vector<std::vector<double>> kGrads = {
    {0.5, -1.0, 0.25}, {0.1, 0.2, -0.3}, {-0.7, 0.0, 2.0}, {1.5, -0.5, 0.05}, {0.3, 0.3, -0.9}};
const std::vector<double> kInit = {0.1, -0.2, 0.05};

// Steps of gradients for one row, and the row's initial weights (of the same dim).
struct Problem {
  std::vector<std::vector<double>> grads = kGrads;
  std::vector<double> init = kInit;
  int dim() const { return static_cast<int>(init.size()); }
};

// A row of `dim` weights and `steps` gradients, every coordinate different, some past the
// clipping bounds the tests use.
Problem WideProblem(int dim, int steps) {
  Problem p;
  p.init.resize(dim);
  p.grads.assign(steps, std::vector<double>(dim));
  for (int i = 0; i < dim; ++i) p.init[i] = 0.1 * std::sin(1.0 + i);
  for (int s = 0; s < steps; ++s)
    for (int i = 0; i < dim; ++i) p.grads[s][i] = 1.3 * std::cos(0.7 * i + 2.1 * s);
  return p;
}

struct OptimizerRun {
  std::vector<float> w;
  std::vector<float> state;
};

OptimizerRun RunOptimizer(const OptimizerConfig& config, const Problem& p = Problem()) {
  OptimizerRun r;
  r.w.assign(p.init.begin(), p.init.end());
  r.state.resize(OptimizerStateFloats(config.kind, p.dim()));
  InitOptimizerState(config, p.dim(), r.state.data());
  for (const auto& g : p.grads) {
    std::vector<float> gf(g.begin(), g.end());
    ApplyOptimizer(config, p.dim(), gf.data(), r.w.data(), r.state.data());
  }
  return r;
}

double Preprocess(const OptimizerConfig& c, double g, double w) {
  if (c.grad_clip > 0) g = std::max<double>(-c.grad_clip, std::min<double>(c.grad_clip, g));
  return g + c.weight_decay * w;
}

double PostClip(const OptimizerConfig& c, double w) {
  if (c.value_clip > 0) w = std::max<double>(-c.value_clip, std::min<double>(c.value_clip, w));
  return w;
}

std::vector<double> ReferenceSgd(const OptimizerConfig& c, const Problem& p = Problem()) {
  const int dim = p.dim();
  std::vector<double> w = p.init;
  for (const auto& g : p.grads)
    for (int i = 0; i < dim; ++i) w[i] = PostClip(c, w[i] - c.learning_rate * Preprocess(c, g[i], w[i]));
  return w;
}

std::vector<double> ReferenceAdagrad(const OptimizerConfig& c, const Problem& p = Problem()) {
  const int dim = p.dim();
  std::vector<double> w = p.init, a(dim, c.initial_accumulator);
  for (const auto& g : p.grads)
    for (int i = 0; i < dim; ++i) {
      const double gi = Preprocess(c, g[i], w[i]);
      a[i] += gi * gi;
      w[i] = PostClip(c, w[i] - c.learning_rate * gi / (std::sqrt(a[i]) + c.epsilon));
    }
  return w;
}

std::vector<double> ReferenceAdam(const OptimizerConfig& c, const Problem& p = Problem()) {
  const int dim = p.dim();
  std::vector<double> w = p.init, m(dim, 0), v(dim, 0);
  int t = 0;
  for (const auto& g : p.grads) {
    ++t;
    for (int i = 0; i < dim; ++i) {
      const double gi = Preprocess(c, g[i], w[i]);
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * gi;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
      const double mh = m[i] / (1 - std::pow(c.beta1, t));
      const double vh = v[i] / (1 - std::pow(c.beta2, t));
      w[i] = PostClip(c, w[i] - c.learning_rate * mh / (std::sqrt(vh) + c.epsilon));
    }
  }
  return w;
}

std::vector<double> ReferenceFtrl(const OptimizerConfig& c, const Problem& p = Problem()) {
  const int dim = p.dim();
  std::vector<double> w = p.init, z(dim, 0), n(dim, c.initial_accumulator);
  const double alpha = c.learning_rate;
  for (const auto& g : p.grads)
    for (int i = 0; i < dim; ++i) {
      const double gi = Preprocess(c, g[i], w[i]);
      const double sigma = (std::sqrt(n[i] + gi * gi) - std::sqrt(n[i])) / alpha;
      z[i] += gi - sigma * w[i];
      n[i] += gi * gi;
      double wi = 0;
      if (std::fabs(z[i]) > c.ftrl_l1) {
        const double sign = z[i] > 0 ? 1 : -1;
        wi = -(z[i] - sign * c.ftrl_l1) / ((c.ftrl_beta + std::sqrt(n[i])) / alpha + c.ftrl_l2);
      }
      w[i] = PostClip(c, wi);
    }
  return w;
}

// FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator of the row's mean square.
std::vector<double> ReferenceAdagradRowwise(const OptimizerConfig& c, const Problem& p = Problem()) {
  const int dim = p.dim();
  std::vector<double> w = p.init;
  double a = c.initial_accumulator;
  for (const auto& g : p.grads) {
    std::vector<double> gi(dim);
    double squares = 0;
    for (int i = 0; i < dim; ++i) {
      gi[i] = Preprocess(c, g[i], w[i]);
      squares += gi[i] * gi[i];
    }
    a += squares / dim;
    for (int i = 0; i < dim; ++i) w[i] = PostClip(c, w[i] - c.learning_rate * gi[i] / (std::sqrt(a) + c.epsilon));
  }
  return w;
}

// FBGEMM's PARTIAL_ROWWISE_ADAM: m per element, v of the row's mean square.
std::vector<double> ReferenceAdamRowwise(const OptimizerConfig& c, const Problem& p = Problem()) {
  const int dim = p.dim();
  std::vector<double> w = p.init, m(dim, 0);
  double v = 0;
  int t = 0;
  for (const auto& g : p.grads) {
    ++t;
    std::vector<double> gi(dim);
    double squares = 0;
    for (int i = 0; i < dim; ++i) {
      gi[i] = Preprocess(c, g[i], w[i]);
      squares += gi[i] * gi[i];
    }
    v = c.beta2 * v + (1 - c.beta2) * squares / dim;
    const double vh = v / (1 - std::pow(c.beta2, t));
    for (int i = 0; i < dim; ++i) {
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * gi[i];
      const double mh = m[i] / (1 - std::pow(c.beta1, t));
      w[i] = PostClip(c, w[i] - c.learning_rate * mh / (std::sqrt(vh) + c.epsilon));
    }
  }
  return w;
}

// The reference of the config's optimizer.
std::vector<double> Reference(const OptimizerConfig& c, const Problem& p = Problem()) {
  switch (c.kind) {
    case OptimizerKind::kSgd:
      return ReferenceSgd(c, p);
    case OptimizerKind::kAdagrad:
      return ReferenceAdagrad(c, p);
    case OptimizerKind::kAdam:
      return ReferenceAdam(c, p);
    case OptimizerKind::kFtrl:
      return ReferenceFtrl(c, p);
    case OptimizerKind::kAdagradRowwise:
      return ReferenceAdagradRowwise(c, p);
    case OptimizerKind::kAdamRowwise:
      return ReferenceAdamRowwise(c, p);
  }
  return {};
}

constexpr OptimizerKind kEveryKind[] = {
    OptimizerKind::kSgd,  OptimizerKind::kAdagrad,        OptimizerKind::kAdam,
    OptimizerKind::kFtrl, OptimizerKind::kAdagradRowwise, OptimizerKind::kAdamRowwise};

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << "element " << i;
}

TEST(Optimizer, SgdHandComputed) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.learning_rate = 0.5f;
  float w[1] = {1.0f};
  const float g1[1] = {2.0f}, g2[1] = {-1.0f};
  ApplyOptimizer(c, 1, g1, w, nullptr);  // 1 - 0.5 * 2 = 0
  EXPECT_FLOAT_EQ(w[0], 0.0f);
  ApplyOptimizer(c, 1, g2, w, nullptr);  // 0 + 0.5 = 0.5
  EXPECT_FLOAT_EQ(w[0], 0.5f);
}

TEST(Optimizer, AdagradHandComputed) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.learning_rate = 1.0f;
  c.epsilon = 1e-10f;
  float w[1] = {1.0f}, a[1];
  InitOptimizerState(c, 1, a);
  const float g1[1] = {3.0f}, g2[1] = {4.0f};
  ApplyOptimizer(c, 1, g1, w, a);  // a = 9, w = 1 - 3/3 = 0
  EXPECT_FLOAT_EQ(a[0], 9.0f);
  EXPECT_NEAR(w[0], 0.0f, 1e-6);
  ApplyOptimizer(c, 1, g2, w, a);  // a = 25, w = 0 - 4/5 = -0.8
  EXPECT_FLOAT_EQ(a[0], 25.0f);
  EXPECT_NEAR(w[0], -0.8f, 1e-6);
}

TEST(Optimizer, AdamFirstStepMovesByLearningRate) {
  // With bias correction the first Adam step is lr * g / (|g| + eps) ~ lr * sign(g).
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.learning_rate = 0.1f;
  float w[2] = {0.0f, 0.0f};
  std::vector<float> state(OptimizerStateFloats(c.kind, 2));
  InitOptimizerState(c, 2, state.data());
  const float g[2] = {0.3f, -7.0f};
  ApplyOptimizer(c, 2, g, w, state.data());
  EXPECT_NEAR(w[0], -0.1f, 1e-6);
  EXPECT_NEAR(w[1], 0.1f, 1e-6);
  EXPECT_EQ(AdamStep(c.kind, state.data(), 2), 1u);
}

TEST(Optimizer, SgdMatchesReference) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.learning_rate = 0.1f;
  ExpectClose(RunOptimizer(c).w, ReferenceSgd(c));
}

TEST(Optimizer, AdagradMatchesReference) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.learning_rate = 0.05f;
  c.initial_accumulator = 0.1f;
  ExpectClose(RunOptimizer(c).w, ReferenceAdagrad(c));
}

TEST(Optimizer, AdamMatchesReferenceWithPerRowStep) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.learning_rate = 0.01f;
  OptimizerRun r = RunOptimizer(c);
  ExpectClose(r.w, ReferenceAdam(c));
  EXPECT_EQ(AdamStep(c.kind, r.state.data(), kDim), kGrads.size());
}

// Row-wise Adagrad by hand: one accumulator, the mean of the row's squared gradient.
TEST(Optimizer, AdagradRowwiseHandComputed) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagradRowwise;
  c.learning_rate = 1.0f;
  c.epsilon = 1e-10f;
  ASSERT_EQ(OptimizerStateFloats(c.kind, 2), 1);
  float w[2] = {1.0f, 1.0f}, a[1];
  InitOptimizerState(c, 2, a);
  const float g[2] = {3.0f, 5.0f};
  ApplyOptimizer(c, 2, g, w, a);  // a = (9 + 25) / 2 = 17; w = 1 - g / sqrt(17)
  EXPECT_FLOAT_EQ(a[0], 17.0f);
  EXPECT_NEAR(w[0], 1.0f - 3.0f / std::sqrt(17.0f), 1e-6);
  EXPECT_NEAR(w[1], 1.0f - 5.0f / std::sqrt(17.0f), 1e-6);
}

TEST(Optimizer, RowwiseKindsMatchReferenceWithOneAccumulatorARow) {
  for (OptimizerKind kind : {OptimizerKind::kAdagradRowwise, OptimizerKind::kAdamRowwise}) {
    SCOPED_TRACE(std::string(OptimizerName(kind)));
    OptimizerConfig c;
    c.kind = kind;
    c.learning_rate = 0.05f;
    c.initial_accumulator = 0.1f;
    OptimizerRun r = RunOptimizer(c);
    ExpectClose(r.w, Reference(c));
    if (kind == OptimizerKind::kAdamRowwise) {
      EXPECT_EQ(r.state.size(), static_cast<size_t>(kDim + 2));
      EXPECT_EQ(AdamStep(c.kind, r.state.data(), kDim), kGrads.size());
    } else {
      EXPECT_EQ(r.state.size(), 1u);
    }
  }
}

TEST(Optimizer, FtrlMatchesReference) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kFtrl;
  c.learning_rate = 0.1f;
  c.ftrl_beta = 1.0f;
  c.ftrl_l1 = 0.05f;
  c.ftrl_l2 = 0.01f;
  ExpectClose(RunOptimizer(c).w, ReferenceFtrl(c));
}

TEST(Optimizer, FtrlL1ZeroesSmallCoordinates) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kFtrl;
  c.learning_rate = 0.1f;
  c.ftrl_l1 = 100.0f;  // |z| never reaches it.
  OptimizerRun r = RunOptimizer(c);
  for (float w : r.w) EXPECT_EQ(w, 0.0f);
}

TEST(Optimizer, WeightDecayAndClippingWrapEveryOptimizer) {
  for (OptimizerKind kind : kEveryKind) {
    OptimizerConfig c;
    c.kind = kind;
    c.learning_rate = 0.2f;
    c.weight_decay = 0.01f;
    c.grad_clip = 0.6f;
    c.value_clip = 0.15f;
    OptimizerRun r = RunOptimizer(c);
    SCOPED_TRACE(std::string(OptimizerName(kind)));
    ExpectClose(r.w, Reference(c));
    for (float w : r.w) EXPECT_LE(std::fabs(w), 0.15f + 1e-7f);
  }
}

// Rows as wide as real tables: the optimizer loops are vectorized (SSE, and AVX2 where the CPU
// has it), so dims that fill whole vectors, and dims that leave a scalar remainder, must both
// match the scalar reference, plain and with clipping and decay.
TEST(Optimizer, EveryOptimizerMatchesReferenceAtVectorWidths) {
  for (int dim : {1, 7, 8, 16, 17, 64}) {
    const Problem p = WideProblem(dim, 6);
    for (bool adjust : {false, true}) {
      for (OptimizerKind kind : kEveryKind) {
        OptimizerConfig c;
        c.kind = kind;
        c.learning_rate = 0.05f;
        c.ftrl_beta = 1.0f;
        c.ftrl_l1 = 0.05f;
        c.ftrl_l2 = 0.01f;
        if (adjust) {
          c.weight_decay = 0.01f;
          c.grad_clip = 0.9f;
          c.value_clip = 0.12f;
        }
        SCOPED_TRACE(absl::StrCat(OptimizerName(kind), " dim ", dim, adjust ? " clipped, decayed" : ""));
        ExpectClose(RunOptimizer(c, p).w, Reference(c, p));
      }
    }
  }
}

}  // namespace
}  // namespace hyrec::embedding_ps
