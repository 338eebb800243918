// libFuzzer target for what reaches a service from the network: the first byte picks the
// handler, the rest is the serialized message. 0: a PS Lookup; 1: a PS Update (against a small
// bounded store with SGD, Adagrad and Adam tables); 3: a PS UpdateTables and the same bytes as a LookupTables (the same
// store); 2: a batch as a worker receives it from the loader, decoded and validated against a two-slot model. Every
// input must be answered or refused with an error Status (never a crash, an over-read, a non-finite row or an
// allocation the message does not bound). Built with clang's -fsanitize=fuzzer,address when clang is installed;
// replay_main.cc runs the checked-in corpus (tests/fuzz/corpus/rpc) under ctest.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>

#include "data.pb.h"
#include "embedding.pb.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "src/embedding_ps/handlers.h"

namespace {

using hyrec::embedding_ps::EmbeddingShardStore;

void Check(const absl::Status& s) {
  using absl::StatusCode;
  const StatusCode c = s.code();
  if (c != StatusCode::kOk && c != StatusCode::kDataLoss && c != StatusCode::kInvalidArgument &&
      c != StatusCode::kResourceExhausted && c != StatusCode::kFailedPrecondition && c != StatusCode::kNotFound) {
    std::abort();
  }
}

EmbeddingShardStore& Store() {
  static EmbeddingShardStore* store = [] {
    hyrec::embedding_ps::StoreOptions options;
    for (auto [name, dim, kind] : {std::tuple{"sgd", 4, hyrec::embedding_ps::OptimizerKind::kSgd},
                                   std::tuple{"adagrad", 3, hyrec::embedding_ps::OptimizerKind::kAdagrad},
                                   std::tuple{"adam", 2, hyrec::embedding_ps::OptimizerKind::kAdam}}) {
      hyrec::embedding_ps::TableConfig t;
      t.name = name;
      t.dim = dim;
      t.optimizer.kind = kind;
      options.tables.push_back(t);
    }
    options.capacity_rows = 4096;
    options.num_stripes = 4;
    return EmbeddingShardStore::Create(options)->release();
  }();
  return *store;
}

// Rows the fuzzer touched must stay finite, whatever the gradients were.
void CheckFinite(const hyrec::proto::LookupResponse& response) {
  const size_t n = response.values().size() / sizeof(float);
  if (response.precision() != hyrec::proto::PRECISION_FP32) return;
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, response.values().data() + i * sizeof(float), sizeof(float));
    if (!std::isfinite(v)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string message(reinterpret_cast<const char*>(data + 1), size - 1);
  hyrec::embedding_ps::RequestLimits limits;
  limits.max_ids_per_request = 1024;
  limits.max_message_bytes = 64 << 10;
  switch (data[0] % 4) {
    case 0: {
      hyrec::proto::LookupRequest request;
      if (!request.ParseFromString(message)) return 0;
      hyrec::proto::LookupResponse response;
      const absl::Status s = hyrec::embedding_ps::HandleLookup(Store(), limits, request, &response);
      Check(s);
      if (s.ok()) CheckFinite(response);
      return 0;
    }
    case 1: {
      hyrec::proto::UpdateRequest request;
      if (!request.ParseFromString(message)) return 0;
      hyrec::proto::UpdateResponse response;
      Check(hyrec::embedding_ps::HandleUpdate(Store(), limits, request, &response));
      // Read back what was updated: every row must still be finite.
      hyrec::proto::LookupRequest lookup;
      lookup.set_table(request.table());
      lookup.set_ids(request.ids());
      hyrec::proto::LookupResponse rows;
      if (hyrec::embedding_ps::HandleLookup(Store(), limits, lookup, &rows).ok()) CheckFinite(rows);
      return 0;
    }
    case 3: {
      hyrec::proto::UpdateTablesRequest request;
      if (!request.ParseFromString(message)) return 0;
      hyrec::proto::UpdateTablesResponse response;
      Check(hyrec::embedding_ps::HandleUpdateTables(Store(), limits, request, &response));
      // The same bytes as LookupTables (a LookupRequest's fields are an UpdateRequest's first three).
      hyrec::proto::LookupTablesRequest lookups;
      hyrec::proto::LookupTablesResponse answers;
      if (lookups.ParseFromString(message)) {
        const absl::Status s = hyrec::embedding_ps::HandleLookupTables(Store(), limits, lookups, &answers);
        Check(s);
        if (s.ok()) {
          for (const hyrec::proto::LookupResponse& r : answers.lookups()) CheckFinite(r);
        }
      }
      for (const hyrec::proto::UpdateRequest& u : request.updates()) {
        hyrec::proto::LookupRequest lookup;
        lookup.set_table(u.table());
        lookup.set_ids(u.ids());
        hyrec::proto::LookupResponse rows;
        if (hyrec::embedding_ps::HandleLookup(Store(), limits, lookup, &rows).ok()) CheckFinite(rows);
      }
      return 0;
    }
    default: {
      hyrec::data_loader::BatchShape shape;
      shape.num_dense = 2;
      shape.num_tables = 1;
      shape.num_shards = 2;
      shape.slot_tables = {0, 0};
      hyrec::data_loader::Batch batch;
      const absl::Status s = hyrec::data_loader::DecodeBatchMessage(message, shape, &batch);
      Check(s);
      if (!s.ok()) return 0;
      // What the model does with a valid batch: every index it follows must be in range.
      for (size_t k = 0; k < batch.slots.size(); ++k) {
        const auto& inverse = batch.tables[0].inverse[k];
        for (size_t j = 0; j < inverse.size(); ++j) {
          if (inverse[j] >= batch.tables[0].unique_ids.size()) std::abort();
        }
        for (int i = 0; i < batch.batch_size; ++i) {
          if (batch.slots[k].offsets[i + 1] > batch.slots[k].ids.size()) std::abort();
        }
      }
      return 0;
    }
  }
}
