#include "hyrec/embedding_ps/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace hyrec::embedding_ps {
namespace {

// The optimizer loops, written to vectorize (this file builds with -fno-math-errno and the
// dynamic vectorizer cost model, CMakeLists.txt) and cloned for AVX2 where the CPU has it (GCC's
// target_clones picks at load time): one row of the default DLRM (dim 16) is two AVX2 steps
// instead of sixteen scalar square roots and divisions. No FMA in either clone, so both give the
// same bits. `kAdjust`: the gradient is clipped and/or decayed first (loop-invariant, so the
// common plain case carries no per-element branch). The loops are forced inline so that each
// clone of Step compiles them for its own target.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HYREC_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HYREC_VECTOR_CLONES
#endif

template <bool kAdjust>
[[gnu::always_inline]] inline float EffectiveGrad(const OptimizerConfig& c, float g, float w) {
  if constexpr (kAdjust) {
    if (c.grad_clip > 0.0f) g = std::clamp(g, -c.grad_clip, c.grad_clip);
    g += c.weight_decay * w;
  }
  return g;
}

template <bool kAdjust>
[[gnu::always_inline]] inline void Sgd(const OptimizerConfig& c, int dim, const float* __restrict grad,
                                       float* __restrict w) {
  const float lr = c.learning_rate;
  for (int i = 0; i < dim; ++i) w[i] -= lr * EffectiveGrad<kAdjust>(c, grad[i], w[i]);
}

template <bool kAdjust>
[[gnu::always_inline]] inline void Adagrad(const OptimizerConfig& c, int dim, const float* __restrict grad,
                                           float* __restrict w, float* __restrict acc) {
  const float lr = c.learning_rate, eps = c.epsilon;
  for (int i = 0; i < dim; ++i) {
    const float g = EffectiveGrad<kAdjust>(c, grad[i], w[i]);
    acc[i] += g * g;
    w[i] -= lr * g / (std::sqrt(acc[i]) + eps);
  }
}

template <bool kAdjust>
[[gnu::always_inline]] inline void Adam(const OptimizerConfig& c, int dim, const float* __restrict grad,
                                        float* __restrict w, float* __restrict m, float* __restrict v,
                                        float correction1, float correction2) {
  const float lr = c.learning_rate, eps = c.epsilon, b1 = c.beta1, b2 = c.beta2;
  for (int i = 0; i < dim; ++i) {
    const float g = EffectiveGrad<kAdjust>(c, grad[i], w[i]);
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    const float m_hat = m[i] / correction1;
    const float v_hat = v[i] / correction2;
    w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

template <bool kAdjust>
[[gnu::always_inline]] inline void Ftrl(const OptimizerConfig& c, int dim, const float* __restrict grad,
                                        float* __restrict w, float* __restrict z, float* __restrict n) {
  const float lr = c.learning_rate, l1 = c.ftrl_l1, l2 = c.ftrl_l2, beta = c.ftrl_beta;
  for (int i = 0; i < dim; ++i) {
    const float g = EffectiveGrad<kAdjust>(c, grad[i], w[i]);
    const float n_new = n[i] + g * g;
    const float sigma = (std::sqrt(n_new) - std::sqrt(n[i])) / lr;
    const float z_new = z[i] + (g - sigma * w[i]);
    z[i] = z_new;
    n[i] = n_new;
    const float sign = z_new > 0.0f ? 1.0f : -1.0f;
    const float shrunk = -(z_new - sign * l1) / ((beta + std::sqrt(n_new)) / lr + l2);
    w[i] = std::fabs(z_new) <= l1 ? 0.0f : shrunk;
  }
}

template <bool kAdjust>
[[gnu::always_inline]] inline void AdagradRowwise(const OptimizerConfig& c, int dim, const float* __restrict grad,
                                                  float* __restrict w, float* __restrict acc) {
  const float lr = c.learning_rate, eps = c.epsilon;
  float squares = 0.0f;
  for (int i = 0; i < dim; ++i) {
    const float g = EffectiveGrad<kAdjust>(c, grad[i], w[i]);
    squares += g * g;
  }
  *acc += squares / static_cast<float>(dim);
  const float step = lr / (std::sqrt(*acc) + eps);
  for (int i = 0; i < dim; ++i) w[i] -= step * EffectiveGrad<kAdjust>(c, grad[i], w[i]);
}

template <bool kAdjust>
[[gnu::always_inline]] inline void AdamRowwise(const OptimizerConfig& c, int dim, const float* __restrict grad,
                                               float* __restrict w, float* __restrict m, float* __restrict v,
                                               float correction1, float correction2) {
  const float lr = c.learning_rate, eps = c.epsilon, b1 = c.beta1, b2 = c.beta2;
  float squares = 0.0f;
  for (int i = 0; i < dim; ++i) {
    const float g = EffectiveGrad<kAdjust>(c, grad[i], w[i]);
    squares += g * g;
  }
  *v = b2 * *v + (1.0f - b2) * (squares / static_cast<float>(dim));
  const float denominator = std::sqrt(*v / correction2) + eps;
  for (int i = 0; i < dim; ++i) {
    const float g = EffectiveGrad<kAdjust>(c, grad[i], w[i]);
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    w[i] -= lr * (m[i] / correction1) / denominator;
  }
}

HYREC_VECTOR_CLONES void Step(const OptimizerConfig& c, int dim, const float* grad, float* w, float* state,
                              float correction1, float correction2) {
  const bool adjust = c.grad_clip > 0.0f || c.weight_decay != 0.0f;
  switch (c.kind) {
    case OptimizerKind::kSgd:
      adjust ? Sgd<true>(c, dim, grad, w) : Sgd<false>(c, dim, grad, w);
      break;
    case OptimizerKind::kAdagrad:
      adjust ? Adagrad<true>(c, dim, grad, w, state) : Adagrad<false>(c, dim, grad, w, state);
      break;
    case OptimizerKind::kAdam:
      adjust ? Adam<true>(c, dim, grad, w, state, state + dim, correction1, correction2)
             : Adam<false>(c, dim, grad, w, state, state + dim, correction1, correction2);
      break;
    case OptimizerKind::kFtrl:
      adjust ? Ftrl<true>(c, dim, grad, w, state, state + dim) : Ftrl<false>(c, dim, grad, w, state, state + dim);
      break;
    case OptimizerKind::kAdagradRowwise:
      adjust ? AdagradRowwise<true>(c, dim, grad, w, state) : AdagradRowwise<false>(c, dim, grad, w, state);
      break;
    case OptimizerKind::kAdamRowwise:
      adjust ? AdamRowwise<true>(c, dim, grad, w, state, state + dim, correction1, correction2)
             : AdamRowwise<false>(c, dim, grad, w, state, state + dim, correction1, correction2);
      break;
  }
  if (c.value_clip > 0.0f) {
    const float clip = c.value_clip;
    for (int i = 0; i < dim; ++i) w[i] = std::min(std::max(w[i], -clip), clip);
  }
}

}  // namespace

namespace {

// Where Adam's step counter lives in a row's state.
int AdamStepIndex(OptimizerKind kind, int dim) { return kind == OptimizerKind::kAdamRowwise ? dim + 1 : 2 * dim; }

}  // namespace

uint32_t AdamStep(OptimizerKind kind, const float* state, int dim) {
  uint32_t step;
  std::memcpy(&step, state + AdamStepIndex(kind, dim), sizeof(step));
  return step;
}

int OptimizerFloatStateFloats(OptimizerKind kind, int dim) {
  const bool counter = kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamRowwise;
  return OptimizerStateFloats(kind, dim) - (counter ? 1 : 0);
}

void InitOptimizerState(const OptimizerConfig& config, int dim, float* state) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return;
    case OptimizerKind::kAdagrad:
      std::fill(state, state + dim, config.initial_accumulator);
      return;
    case OptimizerKind::kAdam: {
      std::fill(state, state + 2 * dim, 0.0f);
      const uint32_t zero = 0;
      std::memcpy(state + 2 * dim, &zero, sizeof(zero));
      return;
    }
    case OptimizerKind::kFtrl:
      std::fill(state, state + dim, 0.0f);                                  // z
      std::fill(state + dim, state + 2 * dim, config.initial_accumulator);  // n
      return;
    case OptimizerKind::kAdagradRowwise:
      state[0] = config.initial_accumulator;
      return;
    case OptimizerKind::kAdamRowwise: {
      std::fill(state, state + dim + 1, 0.0f);  // m, v
      const uint32_t zero = 0;
      std::memcpy(state + dim + 1, &zero, sizeof(zero));
      return;
    }
  }
}

void ApplyOptimizer(const OptimizerConfig& c, int dim, const float* grad, float* w, float* state) {
  float correction1 = 1.0f, correction2 = 1.0f;
  if (c.kind == OptimizerKind::kAdam || c.kind == OptimizerKind::kAdamRowwise) {
    const uint32_t step = AdamStep(c.kind, state, dim) + 1;
    std::memcpy(state + AdamStepIndex(c.kind, dim), &step, sizeof(step));
    const double t = static_cast<double>(step);
    correction1 = static_cast<float>(1.0 - std::pow(double{c.beta1}, t));
    correction2 = static_cast<float>(1.0 - std::pow(double{c.beta2}, t));
  }
  Step(c, dim, grad, w, state, correction1, correction2);
}

}  // namespace hyrec::embedding_ps
