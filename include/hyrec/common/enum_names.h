// EnumName tables: one table per enum of its values and their names, from which both the name of
// a value and the value of a name come, and the list an error message offers, so that parsing
// and printing cannot disagree.
//
//   inline constexpr EnumName<Color> kColorNames[] = {{Color::kRed, "red"}, {Color::kBlue, "blue"}};
//   NameOf(kColorNames, Color::kBlue);                  // "blue"
//   ParseName(kColorNames, "green", "color");           // InvalidArgument: unknown color 'green'
//                                                       // (expected red or blue)
#ifndef HYREC_COMMON_ENUM_NAMES_H_
#define HYREC_COMMON_ENUM_NAMES_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hyrec {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value`; "unknown" for a value the table lacks.
template <typename E, size_t N>
const char* NameOf(const EnumName<E> (&names)[N], E value) {
  for (const EnumName<E>& entry : names) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

// "a, b or c": every name, for a message.
template <typename E, size_t N>
std::string NameList(const EnumName<E> (&names)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) absl::StrAppend(&out, i == 0 ? "" : i + 1 == N ? " or " : ", ", names[i].name);
  return out;
}

// The value named `name`, or false.
template <typename E, size_t N>
bool FindName(const EnumName<E> (&names)[N], absl::string_view name, E* value) {
  for (const EnumName<E>& entry : names) {
    if (name == entry.name) {
      *value = entry.value;
      return true;
    }
  }
  return false;
}

// The value named `name`; InvalidArgument "unknown <what> '<name>' (expected a, b or c)".
template <typename E, size_t N>
absl::StatusOr<E> ParseName(const EnumName<E> (&names)[N], absl::string_view name, absl::string_view what) {
  E value;
  if (FindName(names, name, &value)) return value;
  return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " '", name, "' (expected ", NameList(names), ")"));
}

}  // namespace hyrec

#endif  // HYREC_COMMON_ENUM_NAMES_H_
