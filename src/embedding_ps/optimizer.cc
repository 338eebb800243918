#include "hyrec/embedding_ps/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace hyrec::embedding_ps {
namespace {

// Gradient with clipping and weight decay applied, for coordinate i.
inline float EffectiveGrad(const OptimizerConfig& c, const float* grad, const float* w, int i) {
  float g = grad[i];
  if (c.grad_clip > 0.0f) g = std::clamp(g, -c.grad_clip, c.grad_clip);
  if (c.weight_decay != 0.0f) g += c.weight_decay * w[i];
  return g;
}

}  // namespace

uint32_t AdamStep(const float* state, int dim) {
  uint32_t step;
  std::memcpy(&step, state + 2 * dim, sizeof(step));
  return step;
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
      std::fill(state, state + dim, 0.0f);                                 // z
      std::fill(state + dim, state + 2 * dim, config.initial_accumulator);  // n
      return;
  }
}

void ApplyOptimizer(const OptimizerConfig& c, int dim, const float* grad, float* w,
                    float* state) {
  const float lr = c.learning_rate;
  switch (c.kind) {
    case OptimizerKind::kSgd:
      for (int i = 0; i < dim; ++i) w[i] -= lr * EffectiveGrad(c, grad, w, i);
      break;
    case OptimizerKind::kAdagrad: {
      float* acc = state;
      for (int i = 0; i < dim; ++i) {
        const float g = EffectiveGrad(c, grad, w, i);
        acc[i] += g * g;
        w[i] -= lr * g / (std::sqrt(acc[i]) + c.epsilon);
      }
      break;
    }
    case OptimizerKind::kAdam: {
      float* m = state;
      float* v = state + dim;
      uint32_t step = AdamStep(state, dim) + 1;
      std::memcpy(state + 2 * dim, &step, sizeof(step));
      const double t = static_cast<double>(step);
      const float correction1 = static_cast<float>(1.0 - std::pow(double{c.beta1}, t));
      const float correction2 = static_cast<float>(1.0 - std::pow(double{c.beta2}, t));
      for (int i = 0; i < dim; ++i) {
        const float g = EffectiveGrad(c, grad, w, i);
        m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g;
        v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
        const float m_hat = m[i] / correction1;
        const float v_hat = v[i] / correction2;
        w[i] -= lr * m_hat / (std::sqrt(v_hat) + c.epsilon);
      }
      break;
    }
    case OptimizerKind::kFtrl: {
      float* z = state;
      float* n = state + dim;
      for (int i = 0; i < dim; ++i) {
        const float g = EffectiveGrad(c, grad, w, i);
        const float n_new = n[i] + g * g;
        const float sigma = (std::sqrt(n_new) - std::sqrt(n[i])) / lr;
        z[i] += g - sigma * w[i];
        n[i] = n_new;
        if (std::fabs(z[i]) <= c.ftrl_l1) {
          w[i] = 0.0f;
        } else {
          const float sign = z[i] > 0.0f ? 1.0f : -1.0f;
          w[i] = -(z[i] - sign * c.ftrl_l1) / ((c.ftrl_beta + std::sqrt(n[i])) / lr + c.ftrl_l2);
        }
      }
      break;
    }
  }
  if (c.value_clip > 0.0f) {
    for (int i = 0; i < dim; ++i) w[i] = std::clamp(w[i], -c.value_clip, c.value_clip);
  }
}

}  // namespace hyrec::embedding_ps
