#include "src/embedding_ps/row_codec.h"

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

uint32_t WeightBytes(RowPrecision precision, int dim) {
  switch (precision) {
    case RowPrecision::kFp32:
      return 4 * static_cast<uint32_t>(dim);
    case RowPrecision::kFp16:
      return (2 * static_cast<uint32_t>(dim) + 3) & ~uint32_t{3};
  }
  return 0;
}

void DecodeWeights(RowPrecision precision, const char* in, int dim, float* out) {
  switch (precision) {
    case RowPrecision::kFp32:
      std::memcpy(out, in, sizeof(float) * dim);
      return;
    case RowPrecision::kFp16:  // Slots are 4-byte aligned (Slab), as the halves need.
      HalvesToFloats(reinterpret_cast<const uint16_t*>(in), out, dim);
      return;
  }
}

bool FitsPrecision(RowPrecision precision, const float* weights, int dim) {
  if (precision == RowPrecision::kFp32) return true;
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
  }
  return false;
}

}  // namespace hyrec::embedding_ps
