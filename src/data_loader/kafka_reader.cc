#include "src/data_loader/kafka_reader.h"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::data_loader {
namespace {

int Millis(absl::Duration d) { return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, 1 << 30)); }

// A partition list that frees itself.
struct PartitionList {
  explicit PartitionList(int size) : list(rd_kafka_topic_partition_list_new(size)) {}
  ~PartitionList() { rd_kafka_topic_partition_list_destroy(list); }
  PartitionList(const PartitionList&) = delete;
  PartitionList& operator=(const PartitionList&) = delete;
  rd_kafka_topic_partition_list_t* list;
};

absl::Status KafkaError(rd_kafka_resp_err_t err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", rd_kafka_err2str(err));
  switch (err) {
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
      return absl::UnavailableError(message);
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
      return absl::NotFoundError(message);
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

class KafkaReaderImpl final : public KafkaReader {
 public:
  KafkaReaderImpl(const KafkaOptions& options, int member, int members)
      : o_(options), member_(member), members_(members) {}

  ~KafkaReaderImpl() override {
    if (rk_ == nullptr) return;
    rd_kafka_consumer_close(rk_);
    rd_kafka_destroy(rk_);
  }

  absl::Status Connect() {
    char error[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    std::vector<std::pair<std::string, std::string>> settings = {
        {"bootstrap.servers", o_.brokers},
        {"group.id", o_.group},
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        // An offset below the partition's earliest record is an error, never a silent jump.
        {"auto.offset.reset", "error"},
        {"allow.auto.create.topics", "false"},
    };
    for (const auto& [key, value] : o_.properties) settings.emplace_back(key, value);
    for (const auto& [key, value] : settings) {
      if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), error, sizeof(error)) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        return absl::InvalidArgumentError(absl::StrCat("kafka setting '", key, "': ", error));
      }
    }
    rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, error, sizeof(error));  // Takes conf on success.
    if (rk_ == nullptr) {
      rd_kafka_conf_destroy(conf);
      return absl::InvalidArgumentError(absl::StrCat("kafka consumer: ", error));
    }
    HYREC_ASSIGN_OR_RETURN(const std::vector<int32_t> all, TopicPartitions(o_.connect_timeout));
    for (int32_t p : all) {
      if (p % members_ == member_) mine_.push_back(p);
    }
    return absl::OkStatus();
  }

  std::vector<int32_t> partitions() const override { return mine_; }

  absl::Status Seek(const PartitionOffsets& start) override {
    positions_.clear();
    for (int32_t p : mine_) {
      HYREC_ASSIGN_OR_RETURN(const auto low_high, Watermarks(p));
      const auto [low, high] = low_high;
      auto it = start.find(p);
      if (it == start.end()) {
        positions_[p] = low;
        continue;
      }
      if (it->second < low || it->second > high) {
        return absl::DataLossError(absl::StrCat("topic '", o_.topic, "' partition ", p, ": resuming at offset ",
                                                it->second, ", but the partition holds offsets ", low, " to ", high,
                                                it->second < low ? " (retention deleted the records between)" : ""));
      }
      positions_[p] = it->second;
    }
    return Assign();
  }

  absl::Status Poll(std::vector<KafkaRecord>* out, size_t max, absl::Duration timeout) override {
    int wait = Millis(timeout);
    for (size_t taken = 0; taken < max; ++taken) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(rk_, wait);
      wait = 0;
      if (m == nullptr) break;
      const absl::Status s = Take(*m, out);
      rd_kafka_message_destroy(m);
      HYREC_RETURN_IF_ERROR(s);
    }
    return absl::OkStatus();
  }

  PartitionOffsets positions() const override { return positions_; }

  absl::StatusOr<int> RefreshPartitions() override {
    HYREC_ASSIGN_OR_RETURN(const std::vector<int32_t> now, TopicPartitions(o_.connect_timeout));
    int added = 0;
    for (int32_t p : now) {
      if (p % members_ != member_ || std::find(mine_.begin(), mine_.end(), p) != mine_.end()) continue;
      HYREC_ASSIGN_OR_RETURN(const auto low_high, Watermarks(p));
      mine_.push_back(p);
      positions_[p] = low_high.first;
      ++added;
    }
    if (added == 0) return 0;
    std::sort(mine_.begin(), mine_.end());
    HYREC_RETURN_IF_ERROR(Assign());
    return added;
  }

  absl::Status Commit(const PartitionOffsets& offsets) override {
    if (offsets.empty()) return absl::OkStatus();
    PartitionList list(static_cast<int>(offsets.size()));
    for (const auto& [p, offset] : offsets) {
      rd_kafka_topic_partition_list_add(list.list, o_.topic.c_str(), p)->offset = offset;
    }
    const rd_kafka_resp_err_t err = rd_kafka_commit(rk_, list.list, /*async=*/0);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return KafkaError(err, absl::StrCat("committing offsets of topic '", o_.topic, "' to group '", o_.group, "'"));
    }
    for (int i = 0; i < list.list->cnt; ++i) {
      if (list.list->elems[i].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return KafkaError(list.list->elems[i].err,
                          absl::StrCat("committing partition ", list.list->elems[i].partition, " of topic '", o_.topic,
                                       "' to group '", o_.group, "'"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<PartitionOffsets> EndOffsets() override {
    PartitionOffsets ends;
    for (int32_t p : mine_) {
      HYREC_ASSIGN_OR_RETURN(const auto low_high, Watermarks(p));
      ends[p] = low_high.second;
    }
    return ends;
  }

  absl::StatusOr<int64_t> Lag() override {
    int64_t lag = 0;
    for (const auto& [p, position] : positions_) {
      // The offsets the last fetch of the partition brought, without a request of its own; the
      // brokers are asked only for a partition not fetched yet.
      int64_t low = 0, high = 0;
      if (rd_kafka_get_watermark_offsets(rk_, o_.topic.c_str(), p, &low, &high) != RD_KAFKA_RESP_ERR_NO_ERROR ||
          low < 0 || high < 0) {
        HYREC_ASSIGN_OR_RETURN(std::tie(low, high), Watermarks(p));
      }
      lag += std::max<int64_t>(0, high - std::max(position, low));
    }
    return lag;
  }

 private:
  // Partition p's earliest offset and end offset.
  absl::StatusOr<std::pair<int64_t, int64_t>> Watermarks(int32_t p) {
    int64_t low = 0, high = 0;
    const rd_kafka_resp_err_t err =
        rd_kafka_query_watermark_offsets(rk_, o_.topic.c_str(), p, &low, &high, Millis(o_.connect_timeout));
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return KafkaError(err, absl::StrCat("topic '", o_.topic, "' partition ", p, ": its offsets"));
    }
    return std::make_pair(low, high);
  }

  // The topic's partitions, from the cluster's metadata.
  absl::StatusOr<std::vector<int32_t>> TopicPartitions(absl::Duration timeout) {
    rd_kafka_topic_t* topic = rd_kafka_topic_new(rk_, o_.topic.c_str(), nullptr);
    if (topic == nullptr) {
      return KafkaError(rd_kafka_last_error(), absl::StrCat("kafka topic '", o_.topic, "'"));
    }
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t err = rd_kafka_metadata(rk_, /*all_topics=*/0, topic, &md, Millis(timeout));
    rd_kafka_topic_destroy(topic);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return KafkaError(
          err, absl::StrCat("kafka brokers ", o_.brokers, " did not answer within ", absl::FormatDuration(timeout)));
    }
    std::vector<int32_t> out;
    absl::Status status;
    if (md->topic_cnt != 1) {
      status = absl::InternalError(
          absl::StrCat("kafka metadata for topic '", o_.topic, "' named ", md->topic_cnt, " topics"));
    } else if (md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      status = KafkaError(md->topics[0].err, absl::StrCat("kafka topic '", o_.topic, "' on ", o_.brokers));
    } else {
      for (int i = 0; i < md->topics[0].partition_cnt; ++i) out.push_back(md->topics[0].partitions[i].id);
      std::sort(out.begin(), out.end());
    }
    rd_kafka_metadata_destroy(md);
    if (!status.ok()) return status;
    return out;
  }

  // Reads every partition of this reader's from its position.
  absl::Status Assign() {
    PartitionList list(static_cast<int>(positions_.size()));
    for (const auto& [p, offset] : positions_) {
      rd_kafka_topic_partition_list_add(list.list, o_.topic.c_str(), p)->offset = offset;
    }
    const rd_kafka_resp_err_t err = rd_kafka_assign(rk_, list.list);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return KafkaError(err, absl::StrCat("reading topic '", o_.topic, "'"));
    }
    return absl::OkStatus();
  }

  absl::Status Take(const rd_kafka_message_t& m, std::vector<KafkaRecord>* out) {
    if (m.err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      KafkaRecord r;
      r.partition = m.partition;
      r.offset = m.offset;
      rd_kafka_timestamp_type_t type;
      r.timestamp_ms = rd_kafka_message_timestamp(&m, &type);
      if (m.payload != nullptr) r.value.assign(static_cast<const char*>(m.payload), m.len);
      positions_[m.partition] = m.offset + 1;
      out->push_back(std::move(r));
      return absl::OkStatus();
    }
    if (m.err == RD_KAFKA_RESP_ERR__PARTITION_EOF) return absl::OkStatus();
    const std::string where = absl::StrCat("topic '", o_.topic, "' partition ", m.partition);
    if (m.err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET || m.err == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE) {
      return absl::DataLossError(
          absl::StrCat(where, ": its position is no longer in the partition (", rd_kafka_message_errstr(&m), ")"));
    }
    char fatal[512];
    if (rd_kafka_fatal_error(rk_, fatal, sizeof(fatal)) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return absl::InternalError(absl::StrCat(where, ": ", fatal));
    }
    return absl::OkStatus();  // Transient: librdkafka retries it.
  }

  const KafkaOptions o_;
  const int member_;
  const int members_;
  rd_kafka_t* rk_ = nullptr;
  std::vector<int32_t> mine_;
  PartitionOffsets positions_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KafkaReader>> KafkaReader::Open(const KafkaOptions& options, int member, int members) {
  if (options.brokers.empty()) return absl::InvalidArgumentError("kafka: brokers is empty");
  if (options.topic.empty()) return absl::InvalidArgumentError("kafka: topic is empty");
  if (options.group.empty()) return absl::InvalidArgumentError("kafka: group is empty");
  if (members < 1 || member < 0 || member >= members) {
    return absl::InvalidArgumentError(absl::StrCat("kafka: member ", member, " of ", members));
  }
  auto reader = std::make_unique<KafkaReaderImpl>(options, member, members);
  HYREC_RETURN_IF_ERROR(reader->Connect());
  return std::unique_ptr<KafkaReader>(std::move(reader));
}

}  // namespace hyrec::data_loader
