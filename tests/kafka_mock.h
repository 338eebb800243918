// A Kafka cluster for tests: librdkafka's mock cluster (a broker speaking the real protocol on
// loopback, with failure injection) and a producer that writes records to it.
#ifndef HYREC_TESTS_KAFKA_MOCK_H_
#define HYREC_TESTS_KAFKA_MOCK_H_

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hyrec::testing {

// A criteo line whose I1 is `id` (a test's name for the record), labelled by a rule of its
// categories so that a model learns something.
inline std::string CriteoRecord(int id) {
  std::string line = absl::StrCat((id % 7) < 3 ? 1 : 0, "\t", id);
  for (int i = 1; i < 13; ++i) absl::StrAppend(&line, "\t", i);
  for (int c = 0; c < 26; ++c) absl::StrAppend(&line, "\t", absl::Hex(0x1000 + c + id % 7));
  return line;
}

class MockKafka {
 public:
  explicit MockKafka(int brokers = 1) {
    char error[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", error, sizeof(error));
    host_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, error, sizeof(error));
    if (host_ == nullptr) throw std::runtime_error(error);
    cluster_ = rd_kafka_mock_cluster_new(host_, brokers);
    if (cluster_ == nullptr) throw std::runtime_error("rd_kafka_mock_cluster_new failed");
    bootstraps_ = rd_kafka_mock_cluster_bootstraps(cluster_);
    rd_kafka_conf_t* producer_conf = rd_kafka_conf_new();
    rd_kafka_conf_set(producer_conf, "bootstrap.servers", bootstraps_.c_str(), error, sizeof(error));
    rd_kafka_conf_set(producer_conf, "log_level", "3", error, sizeof(error));
    producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, producer_conf, error, sizeof(error));
    if (producer_ == nullptr) throw std::runtime_error(error);
  }
  ~MockKafka() {
    rd_kafka_destroy(producer_);
    rd_kafka_mock_cluster_destroy(cluster_);
    rd_kafka_destroy(host_);
  }
  MockKafka(const MockKafka&) = delete;
  MockKafka& operator=(const MockKafka&) = delete;

  const std::string& brokers() const { return bootstraps_; }
  rd_kafka_mock_cluster_t* cluster() { return cluster_; }

  bool CreateTopic(const std::string& topic, int partitions) {
    return rd_kafka_mock_topic_create(cluster_, topic.c_str(), partitions, 1) == RD_KAFKA_RESP_ERR_NO_ERROR;
  }

  // Appends a record to `partition`; Flush waits until every record is acknowledged.
  // A full producer queue waits for room.
  bool Produce(const std::string& topic, int partition, const std::string& value, int64_t timestamp_ms = 0) {
    for (;;) {
      const rd_kafka_resp_err_t err = rd_kafka_producev(
          producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
          RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
          RD_KAFKA_V_TIMESTAMP(timestamp_ms), RD_KAFKA_V_END);
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) return err == RD_KAFKA_RESP_ERR_NO_ERROR;
      rd_kafka_poll(producer_, 100);
    }
  }
  bool Flush() { return rd_kafka_flush(producer_, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR; }

  // The broker fails the next `n` Fetch requests (a leader moved away), as a real cluster does
  // while it rebalances; consumers retry.
  void FailFetches(int n) {
    constexpr int16_t kFetch = 1;
    std::vector<rd_kafka_resp_err_t> errors(n, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION);
    rd_kafka_mock_push_request_errors_array(cluster_, kFetch, errors.size(), errors.data());
  }

  // The offsets `group` has committed for partitions 0..partitions-1 of `topic` (-1: none).
  std::map<int32_t, int64_t> Committed(const std::string& group, const std::string& topic, int partitions) {
    char error[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps_.c_str(), error, sizeof(error));
    rd_kafka_conf_set(conf, "group.id", group.c_str(), error, sizeof(error));
    rd_kafka_conf_set(conf, "log_level", "3", error, sizeof(error));
    rd_kafka_t* consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, error, sizeof(error));
    std::map<int32_t, int64_t> out;
    if (consumer == nullptr) return out;
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; ++p) rd_kafka_topic_partition_list_add(list, topic.c_str(), p);
    if (rd_kafka_committed(consumer, list, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      for (int i = 0; i < list->cnt; ++i) out[list->elems[i].partition] = list->elems[i].offset;
    }
    rd_kafka_topic_partition_list_destroy(list);
    rd_kafka_destroy(consumer);
    return out;
  }

 private:
  rd_kafka_t* host_ = nullptr;
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
  rd_kafka_t* producer_ = nullptr;
  std::string bootstraps_;
};

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_KAFKA_MOCK_H_
