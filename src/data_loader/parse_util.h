// Helpers the line parsers share (parsers.cc, csv.cc).
#ifndef HYREC_DATA_LOADER_PARSE_UTIL_H_
#define HYREC_DATA_LOADER_PARSE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "hyrec/data_loader/parsers.h"

namespace hyrec::data_loader {

// A field as a message shows it: at most 32 bytes, non-printable bytes as \xNN.
inline std::string Printable(absl::string_view field) {
  std::string out;
  for (char c : field.substr(0, 32)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    }
  }
  if (field.size() > 32) out += "...";
  return out;
}

inline absl::string_view StripCr(absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

inline absl::Status LineTooLong(absl::string_view line) {
  return absl::InvalidArgumentError(
      absl::StrCat("line of ", line.size(), " bytes exceeds the limit of ", kMaxLineBytes));
}

// The slot whose seed hashes `slot`'s tokens.
inline int HashSlot(const HashSlots& hash_slots, int slot) {
  return static_cast<size_t>(slot) < hash_slots.size() ? hash_slots[slot] : slot;
}

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_PARSE_UTIL_H_
