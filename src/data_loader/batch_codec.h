// Batches on the wire (proto/data.proto): what the DataService sends and what a worker decodes
// and checks (ValidateBatch, data_service.h) before it uses one. No gRPC here, so the batch
// fuzzer (tests/fuzz/rpc_fuzz.cc) links it alone.
#ifndef HYREC_SRC_DATA_LOADER_BATCH_CODEC_H_
#define HYREC_SRC_DATA_LOADER_BATCH_CODEC_H_

#include "absl/status/status.h"
#include "data.pb.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/data_loader/sample.h"

namespace hyrec::data_loader {

void ToProto(const ReaderPosition& p, proto::ReaderPosition* out);
ReaderPosition FromProto(const proto::ReaderPosition& p);

void EncodeBatch(const Batch& b, proto::BatchProto* out);

// Copies the message's arrays into the batch: DATA_LOSS for a field that is not a whole number
// of values. Whether the arrays fit together is ValidateBatch's to say.
absl::Status DecodeBatch(const proto::BatchProto& p, Batch* b);

}  // namespace hyrec::data_loader

#endif  // HYREC_SRC_DATA_LOADER_BATCH_CODEC_H_
