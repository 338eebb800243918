#include "src/embedding_ps/row_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hyrec/common/fp16.h"

namespace hyrec::embedding_ps {
namespace {

constexpr float kHalfMax = 65504.0f;

// The largest half magnitude at most `a` (finite, 0 <= a <= kHalfMax).
uint16_t HalfTowardZero(float a) {
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  const int e = static_cast<int>(bits >> 23) - 127;
  if (e < -24) return 0;
  if (e < -14) return static_cast<uint16_t>(std::floor(std::ldexp(a, 24)));  // A subnormal half.
  return static_cast<uint16_t>(((e + 15) << 10) | ((bits >> 13) & 0x3ff));
}

// splitmix64: the stream of draws a seed gives.
uint64_t NextDraw(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint16_t FloatToHalfStochastic(float x, float u) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const float a = std::fabs(x);
  const uint16_t low = HalfTowardZero(a);
  const float lo = HalfToFloat(low);
  const float p = (a - lo) / (HalfToFloat(low + 1) - lo);
  return sign | static_cast<uint16_t>(low + (u < p ? 1 : 0));
}

uint8_t QuantizeStochastic(float x, float lo, float hi, float u) {
  const double t = (static_cast<double>(x) - lo) / (static_cast<double>(hi) - lo) * 255.0;
  const double low = std::floor(t);
  double q = u < 0 ? std::nearbyint(t) : low + (u < t - low ? 1 : 0);
  q = std::min(255.0, std::max(0.0, q));
  return static_cast<uint8_t>(q);
}

float Dequantize(uint8_t q, float lo, float hi) {
  if (q == 0) return lo;
  if (q == 255) return hi;
  return static_cast<float>(lo + (static_cast<double>(hi) - lo) * q / 255.0);
}

uint32_t PackedWeightBytes(RowPrecision precision, int dim) {
  const uint32_t d = static_cast<uint32_t>(dim);
  switch (precision) {
    case RowPrecision::kFp32:
      return 4 * d;
    case RowPrecision::kFp16:
      return 2 * d;
    case RowPrecision::kInt8:
      return 2 * sizeof(float) + d;
  }
  return 0;
}

uint32_t WeightBytes(RowPrecision precision, int dim) { return (PackedWeightBytes(precision, dim) + 3) & ~uint32_t{3}; }

void DecodeWeights(RowPrecision precision, const char* in, int dim, float* out) {
  switch (precision) {
    case RowPrecision::kFp32:
      std::memcpy(out, in, sizeof(float) * dim);
      return;
    case RowPrecision::kFp16:  // Slots are 4-byte aligned (Slab), as the halves need.
      HalvesToFloats(reinterpret_cast<const uint16_t*>(in), out, dim);
      return;
    case RowPrecision::kInt8: {
      float range[2];
      std::memcpy(range, in, sizeof(range));
      const auto* q = reinterpret_cast<const uint8_t*>(in + sizeof(range));
      for (int i = 0; i < dim; ++i) out[i] = Dequantize(q[i], range[0], range[1]);
      return;
    }
  }
}

bool FitsPrecision(RowPrecision precision, const float* weights, int dim) {
  if (precision != RowPrecision::kFp16) return true;
  for (int i = 0; i < dim; ++i) {
    if (!(std::fabs(weights[i]) <= kHalfMax)) return false;
  }
  return true;
}

bool EncodeWeights(RowPrecision precision, const float* in, int dim, uint64_t seed, char* out) {
  switch (precision) {
    case RowPrecision::kFp32:
      std::memcpy(out, in, sizeof(float) * dim);
      return true;
    case RowPrecision::kFp16: {
      if (!FitsPrecision(precision, in, dim)) return false;
      uint16_t* halves = reinterpret_cast<uint16_t*>(out);
      if (seed == 0) {
        FloatsToHalves(in, halves, dim);
      } else {
        uint64_t state = seed;
        for (int i = 0; i < dim; ++i) {
          halves[i] = FloatToHalfStochastic(in[i], static_cast<float>(NextDraw(&state) >> 40) * 0x1p-24f);
        }
      }
      return true;
    }
    case RowPrecision::kInt8: {
      float range[2] = {in[0], in[0]};
      for (int i = 1; i < dim; ++i) {
        range[0] = std::min(range[0], in[i]);
        range[1] = std::max(range[1], in[i]);
      }
      std::memcpy(out, range, sizeof(range));
      auto* q = reinterpret_cast<uint8_t*>(out + sizeof(range));
      if (range[0] == range[1]) {
        std::memset(q, 0, dim);
        return true;
      }
      uint64_t state = seed;
      for (int i = 0; i < dim; ++i) {
        const float u = seed == 0 ? -1.0f : static_cast<float>(NextDraw(&state) >> 40) * 0x1p-24f;
        q[i] = QuantizeStochastic(in[i], range[0], range[1], u);
      }
      return true;
    }
  }
  return false;
}

}  // namespace hyrec::embedding_ps
