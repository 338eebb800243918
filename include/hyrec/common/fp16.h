// IEEE binary16 ("half") conversion for the fp16 transport of embeddings and gradients.
//
//   std::vector<float> values = {0.5f, -2.0f, 1e-3f};
//   std::vector<uint16_t> wire(values.size());
//   hyrec::FloatsToHalves(values.data(), wire.data(), values.size());   // round to nearest even
//   hyrec::HalvesToFloats(wire.data(), values.data(), values.size());
//
// Values beyond the half range become +/-Inf, NaN stays NaN, tiny values become subnormals or
// zero. The bulk functions use the CPU's F16C instructions when present; the scalar functions
// give bit-identical results.
#ifndef HYREC_COMMON_FP16_H_
#define HYREC_COMMON_FP16_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hyrec {

inline uint16_t FloatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t out;
  if (x >= 0x47800000u) {  // >= 65536, Inf or NaN.
    out = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {  // Below the smallest normal half: subnormal or zero.
    // Adding 0.5f aligns the mantissa so that the FPU's own rounding gives round-to-even.
    float f;
    std::memcpy(&f, &x, sizeof(f));
    f += 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    out = bits - 0x3f000000u;
  } else {
    const uint32_t mantissa_odd = (x >> 13) & 1u;
    x += 0xc8000fffu;  // Rebias the exponent (15 - 127) << 23, plus rounding bias 0xfff.
    x += mantissa_odd;
    out = x >> 13;
  }
  return static_cast<uint16_t>(out | sign);
}

inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      const float f = static_cast<float>(mantissa) * (1.0f / 16777216.0f);  // m * 2^-24
      std::memcpy(&bits, &f, sizeof(bits));
      bits |= sign;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Bulk conversions; `in` and `out` must not overlap.
void FloatsToHalves(const float* in, uint16_t* out, size_t n);
void HalvesToFloats(const uint16_t* in, float* out, size_t n);

}  // namespace hyrec

#endif  // HYREC_COMMON_FP16_H_
