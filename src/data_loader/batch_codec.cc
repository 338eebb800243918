#include "src/data_loader/batch_codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::data_loader {
namespace {

template <typename T>
void PutArray(const std::vector<T>& v, std::string* out) {
  out->assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
bool GetArray(const std::string& in, size_t expected, std::vector<T>* v) {
  if (in.size() % sizeof(T) != 0) return false;
  if (expected != SIZE_MAX && in.size() != expected * sizeof(T)) return false;
  v->resize(in.size() / sizeof(T));
  if (!in.empty()) std::memcpy(v->data(), in.data(), in.size());
  return true;
}

// Offsets of `count` bags over `total` entries: count + 1 of them, from 0, never decreasing, to total.
absl::Status CheckOffsets(const std::vector<uint32_t>& offsets, size_t count, size_t total, uint64_t batch_id,
                          const std::string& field) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("malformed batch ", batch_id, " from the loader: ", field, " ", what));
  };
  if (offsets.size() != count + 1) return bad(absl::StrCat("holds ", offsets.size(), " offsets, expected ", count + 1));
  if (offsets[0] != 0) return bad(absl::StrCat("starts at ", offsets[0], ", not 0"));
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) return bad(absl::StrCat("decreases at ", i));
  }
  if (offsets.back() != total) return bad(absl::StrCat("ends at ", offsets.back(), ", expected ", total));
  return absl::OkStatus();
}

}  // namespace

void ToProto(const ReaderPosition& p, proto::ReaderPosition* out) {
  out->set_epoch(p.epoch);
  out->set_window_batch(p.window_batch);
  out->set_window_global(p.window_global);
  out->set_file_index(p.file_index);
  out->set_byte_offset(p.byte_offset);
  out->set_line_number(p.line_number);
  out->set_next_batch(p.next_batch);
  for (const PartitionRange& r : p.partitions) {
    proto::PartitionRange* range = out->add_partitions();
    range->set_partition(r.partition);
    range->set_start(r.start);
    range->set_end(r.end);
  }
}

ReaderPosition FromProto(const proto::ReaderPosition& p) {
  ReaderPosition out;
  out.epoch = p.epoch();
  out.window_batch = p.window_batch();
  out.window_global = p.window_global();
  out.file_index = p.file_index();
  out.byte_offset = p.byte_offset();
  out.line_number = p.line_number();
  out.next_batch = p.next_batch();
  for (const proto::PartitionRange& r : p.partitions()) out.partitions.push_back({r.partition(), r.start(), r.end()});
  return out;
}

void EncodeBatch(const Batch& b, proto::BatchProto* out) {
  out->set_batch_id(b.batch_id);
  out->set_epoch(b.epoch);
  out->set_batch_size(static_cast<uint32_t>(b.batch_size));
  out->set_num_dense(static_cast<uint32_t>(b.num_dense));
  PutArray(b.labels, out->mutable_labels());
  PutArray(b.dense, out->mutable_dense());
  for (const SlotIds& s : b.slots) {
    proto::SlotIdsProto* p = out->add_slots();
    PutArray(s.offsets, p->mutable_offsets());
    PutArray(s.ids, p->mutable_ids());
    if (!s.weights.empty()) PutArray(s.weights, p->mutable_weights());
  }
  for (const TableIds& t : b.tables) {
    proto::TableIdsProto* p = out->add_tables();
    PutArray(t.unique_ids, p->mutable_unique_ids());
    PutArray(t.shard_offsets, p->mutable_shard_offsets());
    for (const auto& inverse : t.inverse) PutArray(inverse, p->add_inverse());
  }
  ToProto(b.next_position, out->mutable_next_position());
  out->set_bytes_read(b.bytes_read);
  out->set_bytes_total(b.bytes_total);
  out->set_data_time(b.data_time);
}

absl::Status DecodeBatch(const proto::BatchProto& p, Batch* b) {
  b->batch_id = p.batch_id();
  b->epoch = p.epoch();
  b->batch_size = static_cast<int>(std::min<uint32_t>(p.batch_size(), INT32_MAX));
  b->num_dense = static_cast<int>(std::min<uint32_t>(p.num_dense(), INT32_MAX));
  b->data_time = p.data_time();
  auto malformed = [&](absl::string_view field) {
    return absl::DataLossError(absl::StrCat("malformed batch ", p.batch_id(), " from the loader: ", field,
                                            " is not a whole number of values"));
  };
  if (!GetArray(p.labels(), SIZE_MAX, &b->labels)) return malformed("labels");
  if (!GetArray(p.dense(), SIZE_MAX, &b->dense)) return malformed("dense");
  b->slots.resize(p.slots_size());
  for (int s = 0; s < p.slots_size(); ++s) {
    SlotIds& slot = b->slots[s];
    if (!GetArray(p.slots(s).offsets(), SIZE_MAX, &slot.offsets))
      return malformed(absl::StrCat("slots[", s, "].offsets"));
    if (!GetArray(p.slots(s).ids(), SIZE_MAX, &slot.ids)) return malformed(absl::StrCat("slots[", s, "].ids"));
    slot.weights.clear();
    if (!GetArray(p.slots(s).weights(), SIZE_MAX, &slot.weights)) {
      return malformed(absl::StrCat("slots[", s, "].weights"));
    }
  }
  b->tables.resize(p.tables_size());
  for (int t = 0; t < p.tables_size(); ++t) {
    TableIds& table = b->tables[t];
    if (!GetArray(p.tables(t).unique_ids(), SIZE_MAX, &table.unique_ids)) {
      return malformed(absl::StrCat("tables[", t, "].unique_ids"));
    }
    if (!GetArray(p.tables(t).shard_offsets(), SIZE_MAX, &table.shard_offsets)) {
      return malformed(absl::StrCat("tables[", t, "].shard_offsets"));
    }
    table.inverse.resize(p.tables(t).inverse_size());
    for (int s = 0; s < p.tables(t).inverse_size(); ++s) {
      if (!GetArray(p.tables(t).inverse(s), SIZE_MAX, &table.inverse[s])) {
        return malformed(absl::StrCat("tables[", t, "].inverse[", s, "]"));
      }
    }
  }
  b->next_position = FromProto(p.next_position());
  b->bytes_read = p.bytes_read();
  b->bytes_total = p.bytes_total();
  return absl::OkStatus();
}

absl::Status ValidateBatch(const Batch& b, const BatchShape& shape) {
  const uint64_t id = b.batch_id;
  auto bad = [id](const std::string& what) {
    return absl::DataLossError(absl::StrCat("malformed batch ", id, " from the loader: ", what));
  };
  const size_t n = static_cast<size_t>(std::max(0, b.batch_size));
  if (b.batch_size <= 0 || b.labels.size() != n) {
    return bad(absl::StrCat("batch_size ", b.batch_size, " with ", b.labels.size(), " labels"));
  }
  if (shape.num_dense >= 0 && b.num_dense != shape.num_dense) {
    return bad(absl::StrCat("num_dense is ", b.num_dense, "; the model takes ", shape.num_dense));
  }
  if (b.num_dense < 0 || b.dense.size() != n * static_cast<size_t>(b.num_dense)) {
    return bad(absl::StrCat("dense holds ", b.dense.size(), " values, expected ", n, " x ", b.num_dense));
  }
  if (!shape.slot_tables.empty() && b.slots.size() != shape.slot_tables.size()) {
    return bad(absl::StrCat(b.slots.size(), " slots; the model takes ", shape.slot_tables.size()));
  }
  if (shape.num_tables >= 0 && b.tables.size() != static_cast<size_t>(shape.num_tables)) {
    return bad(absl::StrCat(b.tables.size(), " tables; the model takes ", shape.num_tables));
  }
  for (size_t s = 0; s < b.slots.size(); ++s) {
    const SlotIds& slot = b.slots[s];
    const std::string field = absl::StrCat("slots[", s, "]");
    HYREC_RETURN_IF_ERROR(CheckOffsets(slot.offsets, n, slot.ids.size(), id, field + ".offsets"));
    if (!slot.weights.empty() && slot.weights.size() != slot.ids.size()) {
      return bad(absl::StrCat(field, ".weights holds ", slot.weights.size(), " values for ", slot.ids.size(), " ids"));
    }
  }
  for (size_t t = 0; t < b.tables.size(); ++t) {
    const TableIds& table = b.tables[t];
    const std::string field = absl::StrCat("tables[", t, "]");
    const size_t shards = shape.num_shards >= 0 ? static_cast<size_t>(shape.num_shards)
                                                : (table.shard_offsets.empty() ? 0 : table.shard_offsets.size() - 1);
    HYREC_RETURN_IF_ERROR(
        CheckOffsets(table.shard_offsets, shards, table.unique_ids.size(), id, field + ".shard_offsets"));
    if (table.inverse.size() > b.slots.size()) {
      return bad(absl::StrCat(field, " has inverses for ", table.inverse.size(), " slots of ", b.slots.size()));
    }
    for (size_t s = 0; s < table.inverse.size(); ++s) {
      const std::vector<uint32_t>& inverse = table.inverse[s];
      if (inverse.empty()) continue;
      if (inverse.size() != b.slots[s].ids.size()) {
        return bad(absl::StrCat(field, ".inverse[", s, "] holds ", inverse.size(), " indices for ",
                                b.slots[s].ids.size(), " ids"));
      }
      for (size_t j = 0; j < inverse.size(); ++j) {
        if (inverse[j] >= table.unique_ids.size()) {
          return bad(absl::StrCat(field, ".inverse[", s, "][", j, "] is ", inverse[j], ", past the ",
                                  table.unique_ids.size(), " unique ids"));
        }
      }
    }
  }
  // Every slot with ids is covered by its table's inverse (the model reads it there).
  for (size_t s = 0; s < shape.slot_tables.size(); ++s) {
    const int t = shape.slot_tables[s];
    if (b.slots[s].ids.empty()) continue;
    if (t < 0 || static_cast<size_t>(t) >= b.tables.size() || b.tables[t].inverse.size() <= s ||
        b.tables[t].inverse[s].empty()) {
      return bad(absl::StrCat("slots[", s, "] has ", b.slots[s].ids.size(), " ids but tables[", t, "].inverse[", s,
                              "] is missing"));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeBatchMessage(const std::string& bytes, const BatchShape& shape, Batch* batch) {
  proto::BatchProto message;
  if (!message.ParseFromString(bytes)) return absl::DataLossError("a batch message that does not parse");
  HYREC_RETURN_IF_ERROR(DecodeBatch(message, batch));
  return ValidateBatch(*batch, shape);
}

}  // namespace hyrec::data_loader
