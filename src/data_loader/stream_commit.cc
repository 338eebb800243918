#include <algorithm>

#include "hyrec/common/status_macros.h"
#include "hyrec/data_loader/kafka_options.h"
#ifdef HYREC_HAS_KAFKA
#include "src/data_loader/kafka_reader.h"
#endif

namespace hyrec::data_loader {

std::map<int32_t, int64_t> CutOffsets(const std::vector<ReaderPosition>& cut) {
  std::map<int32_t, int64_t> out;
  std::map<int32_t, size_t> known;  // How many workers' windows know the partition.
  for (const ReaderPosition& p : cut) {
    for (const PartitionRange& r : p.partitions) {
      auto [it, fresh] = out.emplace(r.partition, r.start);
      if (!fresh) it->second = std::min(it->second, r.start);
      ++known[r.partition];
    }
  }
  for (const auto& [partition, workers] : known) {
    if (workers < cut.size()) out.erase(partition);
  }
  return out;
}

absl::Status CommitCutOffsets(const KafkaOptions& kafka, const std::vector<ReaderPosition>& cut) {
#ifdef HYREC_HAS_KAFKA
  const std::map<int32_t, int64_t> offsets = CutOffsets(cut);
  if (offsets.empty()) return absl::OkStatus();
  HYREC_ASSIGN_OR_RETURN(std::unique_ptr<KafkaReader> reader, KafkaReader::Open(kafka, 0, 1));
  return reader->Commit(offsets);
#else
  (void)kafka;
  (void)cut;
  return absl::FailedPreconditionError("this build of hyrec has no Kafka source");
#endif
}

}  // namespace hyrec::data_loader
