// Fields of the flat JSON the hyrec tools print (`hyrec plan --json`), read by key without a
// JSON library, for tests and benchmarks that check what a tool said.
#ifndef HYREC_TESTS_JSON_FIELDS_H_
#define HYREC_TESTS_JSON_FIELDS_H_

#include <string>

#include "absl/strings/numbers.h"

namespace hyrec::testing {

// The number after the first "key": at or after `from` in `json`; -1 when there is none.
inline double JsonNumber(const std::string& json, const std::string& key, size_t from = 0) {
  const size_t at = json.find("\"" + key + "\":", from);
  double value = -1;
  if (at == std::string::npos) return value;
  const std::string rest = json.substr(at + key.size() + 3);
  (void)absl::SimpleAtod(rest.substr(0, rest.find_first_of(",}")), &value);
  return value;
}

// The string after the first "key": at or after `from`; empty when there is none.
inline std::string JsonString(const std::string& json, const std::string& key, size_t from = 0) {
  const size_t at = json.find("\"" + key + "\":\"", from);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size() + 4;
  return json.substr(start, json.find('"', start) - start);
}

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_JSON_FIELDS_H_
