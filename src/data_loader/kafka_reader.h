// KafkaReader: the records of one Kafka topic as a loader reads them, through librdkafka. A
// reader is one of `members` that share the topic: it reads the partitions p with
// p % members == member, from offsets the caller gives (a consistent cut's), never from the
// consumer group's committed offsets; the group only hears of offsets the caller commits (after
// a cut commits, so that its lag shows real progress). Each record comes with its partition,
// offset and timestamp; positions() says where each partition goes on, so that a cut can keep it.
//
//   KafkaOptions o;
//   o.brokers = "kafka-0:9092";
//   o.topic = "clicks";
//   o.group = "hyrec-ctr";
//   HYREC_ASSIGN_OR_RETURN(auto reader, KafkaReader::Open(o, /*member=*/0, /*members=*/1));
//   HYREC_RETURN_IF_ERROR(reader->Seek(cut_offsets));    // {} : every partition from its start
//   std::vector<KafkaRecord> records;
//   HYREC_RETURN_IF_ERROR(reader->Poll(&records, 1024, absl::Milliseconds(100)));
//   ... train; once a cut holding reader->positions() commits:
//   HYREC_RETURN_IF_ERROR(reader->Commit(cut_positions));
//
// Errors: brokers that cannot be reached within connect_timeout are UNAVAILABLE; a topic the
// cluster does not have is NOT_FOUND naming it; a setting librdkafka refuses is
// INVALID_ARGUMENT naming it. A broker error while reading is retried by librdkafka and is not
// seen here unless it is fatal (then Poll returns it). Not thread-safe: one thread polls.
#ifndef HYREC_SRC_DATA_LOADER_KAFKA_READER_H_
#define HYREC_SRC_DATA_LOADER_KAFKA_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/data_loader/kafka_options.h"

namespace hyrec::data_loader {

struct KafkaRecord {
  int32_t partition = 0;
  int64_t offset = 0;
  int64_t timestamp_ms = -1;  // The record's (create or log-append) time; -1: none.
  std::string value;
};

// Partition -> the offset of the next record to read from it.
using PartitionOffsets = std::map<int32_t, int64_t>;

class KafkaReader {
 public:
  // Connects and learns the topic's partitions. INVALID_ARGUMENT for a bad member or setting.
  static absl::StatusOr<std::unique_ptr<KafkaReader>> Open(const KafkaOptions& options, int member, int members);
  virtual ~KafkaReader() = default;

  // This reader's partitions, ascending (may be none when there are more members than
  // partitions).
  virtual std::vector<int32_t> partitions() const = 0;

  // Reads each of this reader's partitions from `start`'s offset, a partition it lacks from its
  // earliest record. An offset below a partition's earliest record (retention deleted it) is
  // DATA_LOSS naming the partition: records would be skipped.
  virtual absl::Status Seek(const PartitionOffsets& start) = 0;

  // Appends up to `max` records to `out`, waiting up to `timeout` for the first; none on
  // timeout. Records of a partition come in offset order.
  virtual absl::Status Poll(std::vector<KafkaRecord>* out, size_t max, absl::Duration timeout) = 0;

  // Where each of this reader's partitions goes on: the offset after the last record Poll
  // returned from it, or where Seek started it.
  virtual PartitionOffsets positions() const = 0;

  // Looks for partitions added to the topic since Open or the last call; a new one of this
  // reader's is read from its earliest record. Returns how many were added.
  virtual absl::StatusOr<int> RefreshPartitions() = 0;

  // Commits `offsets` (this reader's partitions) to the group, synchronously.
  virtual absl::Status Commit(const PartitionOffsets& offsets) = 0;

  // Each of this reader's partitions' end offset (the offset its next record will have).
  virtual absl::StatusOr<PartitionOffsets> EndOffsets() = 0;

  // The records not yet read: each partition's end offset less its position, summed. The end
  // offsets are those the partition's last fetch brought (no request of its own), so Lag is cheap
  // enough to ask between windows; a partition not fetched yet is asked of the brokers.
  virtual absl::StatusOr<int64_t> Lag() = 0;
};

}  // namespace hyrec::data_loader

#endif  // HYREC_SRC_DATA_LOADER_KAFKA_READER_H_
