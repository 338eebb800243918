// KValue: an ordered tree of Kubernetes object fields, and its YAML text.
//
// Maps keep the order their keys were set in, so rendered manifests read in the conventional
// order (apiVersion, kind, metadata, spec) and a render is byte-for-byte reproducible. Strings
// that YAML would read as anything but a string ("true", "9090", "0.5", "null", "") are quoted,
// so an annotation or an environment value stays a string; multi-line strings are literal blocks.
#ifndef HYREC_SRC_DEPLOY_K8S_VALUE_H_
#define HYREC_SRC_DEPLOY_K8S_VALUE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace hyrec::deploy {

class KValue {
 public:
  enum class Kind { kNull, kMap, kList, kString, kInt, kBool };

  KValue() = default;
  KValue(const char* s) : kind_(Kind::kString), text_(s) {}             // NOLINT: implicit, as a literal reads.
  KValue(std::string s) : kind_(Kind::kString), text_(std::move(s)) {}  // NOLINT
  KValue(int v) : kind_(Kind::kInt), int_(v) {}                         // NOLINT
  KValue(int64_t v) : kind_(Kind::kInt), int_(v) {}                     // NOLINT
  KValue(bool v) : kind_(Kind::kBool), int_(v ? 1 : 0) {}               // NOLINT

  static KValue Map() {
    KValue v;
    v.kind_ = Kind::kMap;
    return v;
  }
  static KValue Map(std::initializer_list<std::pair<std::string, KValue>> entries) {
    KValue v = Map();
    for (const auto& e : entries) v.Set(e.first, e.second);
    return v;
  }
  static KValue List(std::initializer_list<KValue> items = {}) {
    KValue v;
    v.kind_ = Kind::kList;
    v.items_ = items;
    return v;
  }

  // Sets `key` (replacing its value when present, keeping its place) and returns *this.
  KValue& Set(const std::string& key, KValue value);
  // The value at `key`, added as null when absent.
  KValue& operator[](const std::string& key);
  KValue& Append(KValue value);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }

  // YAML block text of this value as a document (a map or a list), ending in a newline.
  std::string Yaml() const;

 private:
  void Emit(int indent, std::string* out) const;
  void EmitScalar(int indent, std::string* out) const;

  Kind kind_ = Kind::kNull;
  std::string text_;
  int64_t int_ = 0;
  std::vector<std::pair<std::string, KValue>> entries_;
  std::vector<KValue> items_;
};

}  // namespace hyrec::deploy

#endif  // HYREC_SRC_DEPLOY_K8S_VALUE_H_
