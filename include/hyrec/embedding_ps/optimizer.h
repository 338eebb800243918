// Sparse optimizers applied row by row on the parameter server.
//
// A row stores `dim` weights followed by OptimizerStateFloats(kind, dim) state floats:
//   SGD      : no state.                      w -= lr * g
//   Adagrad  : a[dim] (sum of squares).       a += g^2; w -= lr * g / (sqrt(a) + eps)
//   Adam     : m[dim], v[dim], t (uint32 bit pattern in one float slot; per-row step).
//              t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//              w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
//   FTRL     : z[dim], n[dim] (McMahan et al. 2013, FTRL-Proximal, per coordinate).
//              sigma = (sqrt(n + g^2) - sqrt(n)) / lr; z += g - sigma w; n += g^2;
//              w = |z| <= l1 ? 0 : -(z - sign(z) l1) / ((beta + sqrt(n)) / lr + l2)
//   Adagrad, row-wise: a (one float: the row's accumulated mean square; FBGEMM's
//              EXACT_ROWWISE_ADAGRAD). a += mean(g^2); w -= lr * g / (sqrt(a) + eps)
//   Adam, row-wise: m[dim], v (one float), t (FBGEMM's PARTIAL_ROWWISE_ADAM).
//              t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) mean(g^2);
//              w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// The mean is over the row's gradient after clipping and weight decay.
// Gradient clipping, L2 weight decay and value clipping wrap every optimizer (table_config.h).
#ifndef HYREC_EMBEDDING_PS_OPTIMIZER_H_
#define HYREC_EMBEDDING_PS_OPTIMIZER_H_

#include <cstdint>

#include "hyrec/embedding_ps/table_config.h"

namespace hyrec::embedding_ps {

// Writes the initial optimizer state of a new row.
void InitOptimizerState(const OptimizerConfig& config, int dim, float* state);

// One step on one row. `grad` has dim floats and must be finite (the store checks first).
void ApplyOptimizer(const OptimizerConfig& config, int dim, const float* grad, float* weights, float* state);

// Adam's (or adam_rowwise's) per-row step counter, stored in the last state float.
uint32_t AdamStep(OptimizerKind kind, const float* state, int dim);

// How many of a row's state floats hold floats: all but Adam's step counter (a uint32).
int OptimizerFloatStateFloats(OptimizerKind kind, int dim);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_OPTIMIZER_H_
