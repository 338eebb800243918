// How a row's weights are stored in its slot, per table precision (TableConfig::precision):
//   fp32: dim floats.
//   fp16: dim IEEE binary16 halves, padded to 4 bytes.
//   int8: the row's smallest and largest weight as two floats, then dim bytes, padded to 4; byte
//         q stands for min + (max - min) * q / 255 (q = 0 is min exactly, q = 255 max exactly).
//         Writing a row takes its min and max afresh, so a row's grid follows its weights.
// The optimizer's state that follows the weights stays fp32, and the optimizer's math runs on
// fp32 weights decoded from the slot. Writing weights back rounds them: to the nearest value
// (an initial row, a restored one: weights a row of the precision decodes to encode to a row that
// decodes to the same weights), or
// stochastically (an optimizer step: up or down with the probabilities that make the rounding
// unbiased, so that updates smaller than a step still move the row in expectation). The
// stochastic rounding draws from a seed the caller gives; the store derives it from the row's id,
// the update's (worker, sequence), the row's place in the call and its values (decoded weights and
// state) before the step, so that a replay of the same updates rounds the same way, from a
// checkpoint too, while every update draws anew.
#ifndef HYREC_SRC_EMBEDDING_PS_ROW_CODEC_H_
#define HYREC_SRC_EMBEDDING_PS_ROW_CODEC_H_

#include <cstdint>

#include "hyrec/embedding_ps/table_config.h"

namespace hyrec::embedding_ps {

// Bytes of a row's weights in its slot (a multiple of 4, so the fp32 state after it is aligned).
uint32_t WeightBytes(RowPrecision precision, int dim);

// Bytes of a row's weights in shard files, deltas and exports: WeightBytes without the padding.
uint32_t PackedWeightBytes(RowPrecision precision, int dim);

// The row's `dim` weights as floats.
void DecodeWeights(RowPrecision precision, const char* in, int dim, float* out);

// Whether every one of `dim` finite weights fits the precision (fp16: at most 65504 in magnitude;
// fp32 and int8: any finite weight).
bool FitsPrecision(RowPrecision precision, const float* weights, int dim);

// Stores `dim` finite weights; `seed` 0 rounds to nearest, any other seed stochastically.
// Returns false, writing nothing, when the weights do not fit the precision (an fp16 weight past
// 65504): the step that made them is refused as a non-finite one is.
bool EncodeWeights(RowPrecision precision, const float* in, int dim, uint64_t seed, char* out);

// The half below or above |x| (finite, at most 65504), signed as x, chosen so that rounding is
// unbiased: above with probability equal to |x|'s distance from the one below, in steps, which
// `u` in [0, 1) draws (above when u is less). Exposed for tests; hyrec/common/fp16.h converts
// to nearest.
uint16_t FloatToHalfStochastic(float x, float u);

// An int8 row's byte for `x` (between lo and hi, lo < hi): the grid step below or above it,
// above with probability equal to x's distance past the one below, in steps (above when u is
// less); u < 0 rounds to nearest. Exposed for tests.
uint8_t QuantizeStochastic(float x, float lo, float hi, float u);
// The weight an int8 row's byte q stands for.
float Dequantize(uint8_t q, float lo, float hi);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_SRC_EMBEDDING_PS_ROW_CODEC_H_
