#include "hyrec/common/fp16.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace hyrec {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void FloatsToHalvesF16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

__attribute__((target("avx,f16c"))) void HalvesToFloatsF16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

// CPUID and XGETBV directly (not __builtin_cpu_supports, whose "f16c" older clang lacks): F16C
// and AVX, and the OS saving the YMM registers.
bool HasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((ecx & bit_F16C) == 0 || (ecx & bit_AVX) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    return (xcr0_low & 6) == 6;
  }();
  return has;
}
#endif

}  // namespace

void FloatsToHalves(const float* in, uint16_t* out, size_t n) {
#if defined(__x86_64__)
  if (HasF16c()) return FloatsToHalvesF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

void HalvesToFloats(const uint16_t* in, float* out, size_t n) {
#if defined(__x86_64__)
  if (HasF16c()) return HalvesToFloatsF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

}  // namespace hyrec
