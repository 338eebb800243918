// Encoding of ids and float rows in the `bytes` fields of proto/embedding.proto (docs/wire.md).
// Ids are little-endian uint64; values are little-endian binary32 or binary16.
#ifndef HYREC_EMBEDDING_PS_WIRE_H_
#define HYREC_EMBEDDING_PS_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "embedding.pb.h"
#include "hyrec/common/fp16.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "hyrec's wire format assumes a little-endian host"
#endif

namespace hyrec::embedding_ps::wire {

inline size_t BytesPerValue(proto::Precision precision) { return precision == proto::PRECISION_FP16 ? 2 : 4; }

inline bool ValidPrecision(int precision) {
  return precision == proto::PRECISION_FP32 || precision == proto::PRECISION_FP16;
}

inline void EncodeIds(absl::Span<const uint64_t> ids, std::string* out) {
  out->resize(ids.size() * sizeof(uint64_t));
  if (!ids.empty()) std::memcpy(out->data(), ids.data(), out->size());
}

// InvalidArgument when the field is not a whole number of ids.
inline absl::Status DecodeIds(const std::string& field, std::vector<uint64_t>* ids) {
  if (field.size() % sizeof(uint64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ids field holds ", field.size(), " bytes, not a multiple of 8"));
  }
  ids->resize(field.size() / sizeof(uint64_t));
  if (!ids->empty()) std::memcpy(ids->data(), field.data(), field.size());
  return absl::OkStatus();
}

inline void EncodeValues(absl::Span<const float> values, proto::Precision precision, std::string* out) {
  out->resize(values.size() * BytesPerValue(precision));
  if (values.empty()) return;
  if (precision == proto::PRECISION_FP16) {
    FloatsToHalves(values.data(), reinterpret_cast<uint16_t*>(out->data()), values.size());
  } else {
    std::memcpy(out->data(), values.data(), out->size());
  }
}

// Decodes exactly out.size() values; InvalidArgument naming `what` when the length is wrong.
inline absl::Status DecodeValues(const std::string& field, proto::Precision precision, absl::string_view what,
                                 absl::Span<float> out) {
  const size_t expected = out.size() * BytesPerValue(precision);
  if (field.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, " field holds ", field.size(), " bytes, expected ", expected));
  }
  if (out.empty()) return absl::OkStatus();
  if (precision == proto::PRECISION_FP16) {
    HalvesToFloats(reinterpret_cast<const uint16_t*>(field.data()), out.data(), out.size());
  } else {
    std::memcpy(out.data(), field.data(), field.size());
  }
  return absl::OkStatus();
}

}  // namespace hyrec::embedding_ps::wire

#endif  // HYREC_EMBEDDING_PS_WIRE_H_
