// A Kafka protocol proxy for tests, in front of one broker of librdkafka's mock cluster, that
// shows clients only the first N partitions of a topic until told to show more: to a client, a
// partition added to the topic, as a real cluster's CreatePartitions does (the mock cluster does
// not implement it). Every request and answer is relayed byte for byte, except:
//   - ApiVersions: Metadata is offered up to v8 and FindCoordinator up to v2, the newest versions
//     without flexible fields, so that the two answers below can be rewritten whole;
//   - Metadata: the topic's partitions from N on are left out, and every broker's address is the
//     proxy's, so that clients keep talking through it;
//   - FindCoordinator: the coordinator's address is the proxy's.
// The mock must have one broker. Not for production use: it trusts the broker's answers.
#ifndef HYREC_TESTS_KAFKA_PROXY_H_
#define HYREC_TESTS_KAFKA_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hyrec::testing {

namespace kafka_wire {

// Reads big-endian fields of a Kafka message; a read past the end sets `bad`.
class Reader {
 public:
  explicit Reader(const std::string& b, size_t at = 0) : b_(b), at_(at) {}
  bool bad() const { return bad_; }
  size_t at() const { return at_; }
  int16_t I16() { return static_cast<int16_t>(Big(2)); }
  int32_t I32() { return static_cast<int32_t>(Big(4)); }
  int8_t I8() { return static_cast<int8_t>(Big(1)); }
  // A (nullable) string: int16 length, -1 for null.
  std::optional<std::string> String() {
    const int16_t n = I16();
    if (n < 0) return std::nullopt;
    if (!Need(n)) return std::string();
    std::string s = b_.substr(at_, n);
    at_ += n;
    return s;
  }

 private:
  bool Need(size_t n) {
    if (at_ + n > b_.size()) bad_ = true;
    return !bad_;
  }
  uint64_t Big(int n) {
    if (!Need(n)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = v << 8 | static_cast<uint8_t>(b_[at_++]);
    return v;
  }
  const std::string& b_;
  size_t at_;
  bool bad_ = false;
};

class Writer {
 public:
  void I8(int8_t v) { Big(static_cast<uint8_t>(v), 1); }
  void I16(int16_t v) { Big(static_cast<uint16_t>(v), 2); }
  void I32(int32_t v) { Big(static_cast<uint32_t>(v), 4); }
  void String(const std::optional<std::string>& s) {
    if (!s.has_value()) {
      I16(-1);
      return;
    }
    I16(static_cast<int16_t>(s->size()));
    out_ += *s;
  }
  std::string& out() { return out_; }

 private:
  void Big(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  std::string out_;
};

constexpr int16_t kMetadata = 3;
constexpr int16_t kFindCoordinator = 10;
constexpr int16_t kApiVersions = 18;
constexpr int16_t kMaxMetadata = 8;
constexpr int16_t kMaxFindCoordinator = 2;

// Caps the offered versions in an ApiVersions answer `body` (after the correlation id), in place.
inline void CapVersions(std::string* body, int16_t version) {
  Reader r(*body);
  if (r.I16() != 0) return;  // An error answer is relayed as it is.
  int32_t n = 0;
  if (version >= 3) {  // A compact array: unsigned varint of n + 1.
    uint32_t v = 0;
    for (int shift = 0;; shift += 7) {
      const int8_t byte = r.I8();
      v |= static_cast<uint32_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0 || r.bad()) break;
    }
    n = static_cast<int32_t>(v) - 1;
  } else {
    n = r.I32();
  }
  for (int32_t i = 0; i < n && !r.bad(); ++i) {
    const int16_t key = r.I16();
    r.I16();
    const size_t max_at = r.at();
    const int16_t max = r.I16();
    if (version >= 3) r.I8();  // The entry's tagged fields: none.
    int16_t cap = max;
    if (key == kMetadata) cap = std::min(max, kMaxMetadata);
    if (key == kFindCoordinator) cap = std::min(max, kMaxFindCoordinator);
    (*body)[max_at] = static_cast<char>(cap >> 8);
    (*body)[max_at + 1] = static_cast<char>(cap & 0xff);
  }
}

// An int32 array, copied.
inline void CopyI32s(Reader& r, Writer& w) {
  const int32_t n = r.I32();
  w.I32(n);
  for (int32_t i = 0; i < n && !r.bad(); ++i) w.I32(r.I32());
}

// A Metadata answer `body` (v0..v8) with `topic`'s partitions from `visible` on left out and every
// broker at `port` on 127.0.0.1. Empty when it cannot be read.
inline std::string RewriteMetadata(const std::string& body, int16_t v, const std::string& topic, int visible,
                                   int port) {
  Reader r(body);
  Writer w;
  if (v >= 3) w.I32(r.I32());  // throttle_time_ms
  const int32_t brokers = r.I32();
  w.I32(brokers);
  for (int32_t i = 0; i < brokers && !r.bad(); ++i) {
    w.I32(r.I32());  // node_id
    r.String();
    r.I32();
    w.String("127.0.0.1");
    w.I32(port);
    if (v >= 1) w.String(r.String());  // rack
  }
  if (v >= 2) w.String(r.String());  // cluster_id
  if (v >= 1) w.I32(r.I32());        // controller_id
  const int32_t topics = r.I32();
  w.I32(topics);
  for (int32_t t = 0; t < topics && !r.bad(); ++t) {
    w.I16(r.I16());  // error_code
    const std::optional<std::string> name = r.String();
    w.String(name);
    if (v >= 1) w.I8(r.I8());  // is_internal
    const int32_t partitions = r.I32();
    Writer kept;
    int32_t shown = 0;
    for (int32_t p = 0; p < partitions && !r.bad(); ++p) {
      Writer one;
      one.I16(r.I16());  // error_code
      const int32_t index = r.I32();
      one.I32(index);
      one.I32(r.I32());              // leader_id
      if (v >= 7) one.I32(r.I32());  // leader_epoch
      CopyI32s(r, one);              // replica_nodes
      CopyI32s(r, one);              // isr_nodes
      if (v >= 5) CopyI32s(r, one);  // offline_replicas
      if (name != topic || index < visible) {
        kept.out() += one.out();
        ++shown;
      }
    }
    w.I32(shown);
    w.out() += kept.out();
    if (v >= 8) w.I32(r.I32());  // topic_authorized_operations
  }
  if (v >= 8) w.I32(r.I32());  // cluster_authorized_operations
  if (r.bad() || r.at() != body.size()) return std::string();
  return std::move(w.out());
}

// A FindCoordinator answer `body` (v0..v2) with the coordinator at `port` on 127.0.0.1.
inline std::string RewriteCoordinator(const std::string& body, int16_t v, int port) {
  Reader r(body);
  Writer w;
  if (v >= 1) w.I32(r.I32());        // throttle_time_ms
  w.I16(r.I16());                    // error_code
  if (v >= 1) w.String(r.String());  // error_message
  w.I32(r.I32());                    // node_id
  r.String();
  r.I32();
  w.String("127.0.0.1");
  w.I32(port);
  if (r.bad() || r.at() != body.size()) return std::string();
  return std::move(w.out());
}

}  // namespace kafka_wire

class KafkaPartitionProxy {
 public:
  // `broker`: the mock cluster's bootstrap address (host:port of its one broker).
  KafkaPartitionProxy(const std::string& broker, std::string topic, int visible)
      : topic_(std::move(topic)), visible_(visible) {
    const size_t colon = broker.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(broker.substr(colon + 1), &upstream_port_)) {
      throw std::runtime_error("KafkaPartitionProxy: one broker host:port expected, got " + broker);
    }
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof(a);
    if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listener_, 16) != 0 || getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("KafkaPartitionProxy: cannot listen on loopback");
    }
    port_ = ntohs(a.sin_port);
    accepter_ = std::thread([this] { Accept(); });
  }
  ~KafkaPartitionProxy() {
    stopping_ = true;
    accepter_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : relays_) t.join();
    for (int fd : fds_) close(fd);
    close(listener_);
  }
  KafkaPartitionProxy(const KafkaPartitionProxy&) = delete;
  KafkaPartitionProxy& operator=(const KafkaPartitionProxy&) = delete;

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // From now on, Metadata answers show the topic's first `n` partitions.
  void ShowPartitions(int n) { visible_ = n; }

 private:
  // A connection's requests in flight: correlation id -> (api key, version).
  using InFlight = std::map<int32_t, std::pair<int16_t, int16_t>>;

  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void Accept() {
    while (!stopping_) {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      const sockaddr_in up = Loopback(upstream_port_);
      if (server < 0 || connect(server, reinterpret_cast<const sockaddr*>(&up), sizeof(up)) != 0) {
        close(client);
        if (server >= 0) close(server);
        continue;
      }
      for (int fd : {client, server}) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      auto in_flight = std::make_shared<std::pair<std::mutex, InFlight>>();
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      relays_.emplace_back([this, client, server, in_flight] { Requests(client, server, in_flight.get()); });
      relays_.emplace_back([this, client, server, in_flight] { Answers(server, client, in_flight.get()); });
    }
  }

  // One frame: its int32 size, then the size's bytes. False at the connection's end.
  static bool ReadFrame(int fd, std::string* frame) {
    char size[4];
    if (!ReadAll(fd, size, 4)) return false;
    const uint32_t n = (static_cast<uint32_t>(static_cast<uint8_t>(size[0])) << 24) |
                       (static_cast<uint32_t>(static_cast<uint8_t>(size[1])) << 16) |
                       (static_cast<uint32_t>(static_cast<uint8_t>(size[2])) << 8) | static_cast<uint8_t>(size[3]);
    if (n > (64u << 20)) return false;
    frame->resize(n);
    return ReadAll(fd, frame->data(), n);
  }
  static bool ReadAll(int fd, char* p, size_t n) {
    while (n > 0) {
      const ssize_t got = read(fd, p, n);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  static bool WriteFrame(int fd, const std::string& frame) {
    kafka_wire::Writer w;
    w.I32(static_cast<int32_t>(frame.size()));
    std::string out = std::move(w.out()) + frame;
    const char* p = out.data();
    size_t n = out.size();
    while (n > 0) {
      const ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
      if (put <= 0) return false;
      p += put;
      n -= static_cast<size_t>(put);
    }
    return true;
  }
  // Ends both directions of a connection.
  static void Hangup(int a, int b) {
    shutdown(a, SHUT_RDWR);
    shutdown(b, SHUT_RDWR);
  }

  // Client -> broker: relayed as they are, each noted by its correlation id.
  void Requests(int client, int server, std::pair<std::mutex, InFlight>* in_flight) {
    std::string frame;
    while (ReadFrame(client, &frame)) {
      kafka_wire::Reader r(frame);
      const int16_t key = r.I16();
      const int16_t version = r.I16();
      const int32_t correlation = r.I32();
      if (r.bad()) break;
      {
        std::lock_guard<std::mutex> lock(in_flight->first);
        in_flight->second[correlation] = {key, version};
      }
      if (!WriteFrame(server, frame)) break;
    }
    Hangup(client, server);
  }

  // Broker -> client: the answers the proxy rewrites, rewritten; the rest as they are.
  void Answers(int server, int client, std::pair<std::mutex, InFlight>* in_flight) {
    std::string frame;
    while (ReadFrame(server, &frame)) {
      kafka_wire::Reader r(frame);
      const int32_t correlation = r.I32();
      if (r.bad()) break;
      std::pair<int16_t, int16_t> request{-1, -1};
      {
        std::lock_guard<std::mutex> lock(in_flight->first);
        auto it = in_flight->second.find(correlation);
        if (it != in_flight->second.end()) {
          request = it->second;
          in_flight->second.erase(it);
        }
      }
      const auto [key, version] = request;
      std::string body = frame.substr(4);
      if (key == kafka_wire::kApiVersions) {
        kafka_wire::CapVersions(&body, version);
      } else if (key == kafka_wire::kMetadata && version <= kafka_wire::kMaxMetadata) {
        body = kafka_wire::RewriteMetadata(body, version, topic_, visible_, port_);
      } else if (key == kafka_wire::kFindCoordinator && version <= kafka_wire::kMaxFindCoordinator) {
        body = kafka_wire::RewriteCoordinator(body, version, port_);
      }
      if (body.empty() || !WriteFrame(client, frame.substr(0, 4) + body)) break;
    }
    Hangup(server, client);
  }

  const std::string topic_;
  std::atomic<int> visible_;
  int upstream_port_ = 0;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accepter_;
  std::mutex mu_;
  std::vector<int> fds_;             // Guarded by mu_.
  std::vector<std::thread> relays_;  // Guarded by mu_ while the accepter runs.
};

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_KAFKA_PROXY_H_
