// CRC-32C (Castagnoli), the checksum of the PS update log's records: computed with the CPU's
// crc32 instruction where there is one (SSE 4.2), else with a table. Both give the same value.
//
//   uint32_t crc = Crc32c(header);
//   crc = Crc32cCopy(dst, payload, crc);  // copies payload to dst and extends crc over it
//
// A crc argument continues an earlier value: Crc32c(ab) == Crc32c(b, Crc32c(a)).
#ifndef HYREC_COMMON_CRC32C_H_
#define HYREC_COMMON_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace hyrec {

uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

// Copies `data` to `dst` (which must not overlap it) and returns Crc32c(data, crc), reading the
// bytes once.
uint32_t Crc32cCopy(char* dst, absl::string_view data, uint32_t crc = 0);

namespace crc32c_internal {
// The table-driven computation, whichever the CPU has; for tests.
uint32_t Portable(absl::string_view data, uint32_t crc);
// Whether Crc32c uses the crc32 instruction.
bool Accelerated();
}  // namespace crc32c_internal

}  // namespace hyrec

#endif  // HYREC_COMMON_CRC32C_H_
