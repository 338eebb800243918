// The per-worker counts of applied updates that `hyrec checkpoint inspect` prints for a
// checkpoint's shard files, for tests that check every acknowledged update was applied once.
#ifndef HYREC_TESTS_APPLIED_COUNTS_H_
#define HYREC_TESTS_APPLIED_COUNTS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace hyrec::testing {

// Of `inspect` (what `hyrec checkpoint inspect CHECKPOINT` printed): every "applied" line's
// count, per "<shard file> worker <w> table <t>".
inline std::map<std::string, uint64_t> AppliedCounts(absl::string_view inspect) {
  std::map<std::string, uint64_t> counts;
  for (absl::string_view line : absl::StrSplit(inspect, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "applied ")) continue;
    const size_t colon = line.find(':');
    uint64_t n = 0;
    if (colon == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(colon + 2);
    if (absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &n)) counts[std::string(line.substr(0, colon))] = n;
  }
  return counts;
}

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_APPLIED_COUNTS_H_
