// A Kafka cluster for tests: librdkafka's mock cluster (a broker speaking the real protocol on
// loopback, with failure injection) and a producer that writes records to it.
#ifndef HYREC_TESTS_KAFKA_MOCK_H_
#define HYREC_TESTS_KAFKA_MOCK_H_

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace hyrec::testing {

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
  bool Produce(const std::string& topic, int partition, const std::string& value, int64_t timestamp_ms = 0) {
    return rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
                             RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(timestamp_ms),
                             RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR;
  }
  bool Flush() { return rd_kafka_flush(producer_, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR; }

 private:
  rd_kafka_t* host_ = nullptr;
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
  rd_kafka_t* producer_ = nullptr;
  std::string bootstraps_;
};

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_KAFKA_MOCK_H_
