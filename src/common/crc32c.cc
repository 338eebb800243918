#include "hyrec/common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace hyrec {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // Castagnoli, reflected.

// table[k][b]: the crc of byte b followed by k zero bytes (slicing by 8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPolynomial : 0);
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

const Tables& GetTables() {
  static const Tables tables = MakeTables();
  return tables;
}

// On the inverted crc (as the instruction keeps it).
uint32_t PortableRaw(const char* p, size_t n, uint32_t c) {
  const Tables& t = GetTables();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; ++p, --n) c = (c >> 8) ^ t[0][(c ^ static_cast<uint8_t>(*p)) & 0xff];
  return c;
}

#if defined(__x86_64__)
// With `dst`, the bytes are stored there as they are read.
__attribute__((target("sse4.2"))) uint32_t HardwareRaw(const char* p, size_t n, uint32_t c, char* dst) {
  uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    if (dst != nullptr) {
      std::memcpy(dst, &v, 8);
      dst += 8;
    }
    c64 = _mm_crc32_u64(c64, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  for (; n > 0; ++p, --n) {
    if (dst != nullptr) *dst++ = *p;
    c32 = _mm_crc32_u8(c32, static_cast<uint8_t>(*p));
  }
  return c32;
}

bool HaveHardware() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#else
uint32_t HardwareRaw(const char*, size_t, uint32_t c, char*) { return c; }
bool HaveHardware() { return false; }
#endif

}  // namespace

uint32_t Crc32c(absl::string_view data, uint32_t crc) {
  const uint32_t c = ~crc;
  return ~(HaveHardware() ? HardwareRaw(data.data(), data.size(), c, nullptr)
                          : PortableRaw(data.data(), data.size(), c));
}

uint32_t Crc32cCopy(char* dst, absl::string_view data, uint32_t crc) {
  if (HaveHardware()) return ~HardwareRaw(data.data(), data.size(), ~crc, dst);
  std::memcpy(dst, data.data(), data.size());
  return ~PortableRaw(data.data(), data.size(), ~crc);
}

namespace crc32c_internal {
uint32_t Portable(absl::string_view data, uint32_t crc) { return ~PortableRaw(data.data(), data.size(), ~crc); }
bool Accelerated() { return HaveHardware(); }
}  // namespace crc32c_internal

}  // namespace hyrec
