// KafkaOptions: where a stream source's records come from (loader.source.kafka).
#ifndef HYREC_DATA_LOADER_KAFKA_OPTIONS_H_
#define HYREC_DATA_LOADER_KAFKA_OPTIONS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "hyrec/data_loader/sample.h"

namespace hyrec::data_loader {

struct KafkaOptions {
  std::string brokers;  // bootstrap.servers: host:port[,host:port...]. Required.
  std::string topic;    // Required.
  std::string group;    // group.id, to which offsets are committed once a cut holds them. Required.
  // Passed to librdkafka as they are (security.protocol, ssl.*, sasl.*, ...): mTLS and SASL
  // settings reach the brokers without hyrec knowing them.
  std::map<std::string, std::string> properties;
  // The wait for the cluster's metadata at the start (brokers that do not answer are an error
  // then) and for each partition's offsets.
  absl::Duration connect_timeout = absl::Seconds(30);
  // How long the loader waits for more records once it holds a whole batch: a batch goes out
  // within this of its last record's arrival when records come slower than batches.
  absl::Duration linger = absl::Milliseconds(100);
  // Where the stream ends, as a file source's epoch ends; at most one of the three, and none: the
  // stream is read until the job is stopped.
  // bounded: the records each partition held when the loader started (its end offsets then; a
  // restarted loader takes them again): a backfill, or a test.
  bool bounded = false;
  // end_offsets: each partition's records before its offset here. It names every partition of
  // the topic; a partition added later is not read.
  std::map<int32_t, int64_t> end_offsets;
  // end_time: each partition's records before its first record stamped at or after end_time
  // (the records' Kafka timestamps, in offset order, as Kafka's offsets-for-times finds it). A
  // partition with no such record ends where it was read to, once the clock is past end_time and
  // the loader holds every record the partition has: a quiet partition does not hold the job.
  std::optional<absl::Time> end_time;

  // Whether the stream has an end (one of the three above).
  bool ends() const { return bounded || !end_offsets.empty() || end_time.has_value(); }
};

// The offsets a cut holds, as a consumer group's offsets: per partition, the earliest start of
// the workers' windows (every record before it was trained; the records of those windows may
// partly be). A partition some worker's window does not know yet is left out.
std::map<int32_t, int64_t> CutOffsets(const std::vector<ReaderPosition>& cut);

// Commits CutOffsets(cut) to `kafka`'s group, so that its lag shows what the job has trained.
// FAILED_PRECONDITION when this build has no Kafka source.
absl::Status CommitCutOffsets(const KafkaOptions& kafka, const std::vector<ReaderPosition>& cut);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_KAFKA_OPTIONS_H_
