// Finite checks over gradient buffers, fast enough to run on every update: the PS client and
// the store both refuse NaN and infinite gradients before anything is applied.
#ifndef HYREC_COMMON_FINITE_H_
#define HYREC_COMMON_FINITE_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hyrec {

// The index of the first NaN or infinity in data[0, n), or n when every element is finite.
// Blocks of 16 floats are tested without a branch (an exponent of all ones marks NaN and
// infinity), which vectorizes; only a block holding a bad element is searched one by one.
inline size_t FirstNonFinite(const float* data, size_t n) {
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint32_t bad = 0;
    for (size_t k = 0; k < kBlock; ++k) {
      uint32_t bits;
      std::memcpy(&bits, data + i + k, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad != 0) break;
  }
  for (; i < n; ++i) {
    if (!std::isfinite(data[i])) return i;
  }
  return n;
}

}  // namespace hyrec

#endif  // HYREC_COMMON_FINITE_H_
