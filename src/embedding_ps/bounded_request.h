// A multi-part request (LookupTables, UpdateTables) as the server reads it: its parts are counted
// on the wire, before any of them is decoded, so that a call of many tiny parts costs the shard
// its bytes and not an object per part (docs/security.md, "Sizes before memory").
//
//   BoundedRequest<proto::UpdateTablesRequest> in;
//   in.max_parts = 64;
//   streamer->Read(&in);               // grpc::SerializationTraits<BoundedRequest<...>> below
//   if (!in.refusal.ok()) return ...;  // RESOURCE_EXHAUSTED: too many parts; nothing decoded
//   Handle(in.request);
#ifndef HYREC_EMBEDDING_PS_BOUNDED_REQUEST_H_
#define HYREC_EMBEDDING_PS_BOUNDED_REQUEST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/impl/serialization_traits.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace hyrec::embedding_ps {

// `Request`'s parts are its field 1 (repeated, a message each), as in proto/embedding.proto.
template <typename Request>
struct BoundedRequest {
  Request request;
  uint64_t max_parts = 0;  // Set before reading: more parts are refused undecoded.
  // Set by the read instead of failing it, so that the handler answers with the reason:
  // RESOURCE_EXHAUSTED (too many parts) or INVALID_ARGUMENT (not a message of this type).
  absl::Status refusal;
};

// Counts the parts of the serialized request in `buffer` (field 1, length-delimited), skipping
// their bytes; false, with *refusal set, past `max_parts` or on bytes that are not a message.
inline bool CountParts(grpc::ByteBuffer* buffer, uint64_t max_parts, absl::Status* refusal) {
  using google::protobuf::internal::WireFormatLite;
  grpc::ProtoBufferReader reader(buffer);
  if (!reader.status().ok()) {
    *refusal = absl::InvalidArgumentError(reader.status().error_message());
    return false;
  }
  google::protobuf::io::CodedInputStream in(&reader);
  uint64_t parts = 0;
  while (const uint32_t tag = in.ReadTag()) {
    const bool part = WireFormatLite::GetTagFieldNumber(tag) == 1 &&
                      WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (part && ++parts > max_parts) {
      *refusal =
          absl::ResourceExhaustedError(absl::StrCat("the call has more than ", max_parts,
                                                    " parts (at most 4 per table of the shard, and 16): refused before "
                                                    "any was decoded"));
      return false;
    }
    if (!WireFormatLite::SkipField(&in, tag)) break;
  }
  if (!in.ConsumedEntireMessage()) {
    *refusal = absl::InvalidArgumentError("the request does not parse");
    return false;
  }
  return true;
}

}  // namespace hyrec::embedding_ps

namespace grpc {

template <typename Request>
class SerializationTraits<hyrec::embedding_ps::BoundedRequest<Request>> {
 public:
  static Status Deserialize(ByteBuffer* buffer, hyrec::embedding_ps::BoundedRequest<Request>* msg) {
    if (buffer == nullptr) return Status(StatusCode::INTERNAL, "no payload");
    if (hyrec::embedding_ps::CountParts(buffer, msg->max_parts, &msg->refusal)) {
      ProtoBufferReader reader(buffer);
      if (!reader.status().ok() || !msg->request.ParseFromZeroCopyStream(&reader)) {
        msg->refusal = absl::InvalidArgumentError("the request does not parse");
      }
    }
    buffer->Clear();
    return Status::OK;
  }
};

}  // namespace grpc

#endif  // HYREC_EMBEDDING_PS_BOUNDED_REQUEST_H_
