// The worker's side of a row: CPU the calling process spends per unique row to look a batch up
// and update it through the gRPC client, beside a copy of the same bytes in the same binary.
//
//   build/benchmarks/client_benchmark [--batches=100] [--tables=26] [--dim=16] [--batch=2048]
//                                     [--shards=2] [--fp16]
//
// `shards` `hyrec ps` processes on loopback serve `tables` tables (dim `dim`, Adagrad, 100k
// rows each, warmed). Each batch holds, per table, the unique ids of `batch` Zipf(1.05) draws,
// grouped by shard as the data loader delivers them (ids and shard offsets made untimed: no
// hashing is the client's). Timed, per batch: LookupShardedTables over every table, then
// UpdateShardedTables with a gradient per row. CPU is getrusage(RUSAGE_SELF) of this process,
// user + system, every thread (the client's and gRPC's); the servers run in their own processes.
// Figures, per unique row:
//   floor   copying the bytes a row moves through the client: its id out, its row in (and out of
//           a receive buffer), its gradient out: memcpy between buffers of the batch's size
//   socket  the same bytes through a loopback TCP connection to a child process that answers
//           each shard's lookup with its rows and each update with 8 bytes, as the client's calls
//           do: what the kernel alone charges the worker to move them
//   client  the lookup and the update through the client, with its user and system shares
// Target: client <= 8 x the floor's CPU.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/zipf.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/ps_cluster.h"

namespace {

using namespace hyrec::embedding_ps;

constexpr uint64_t kVocabulary = 100'000;

struct Options {
  int batches = 100;
  int tables = 26;
  int dim = 16;
  int batch = 2048;
  int shards = 2;
  bool fp16 = false;
};

// One batch: per table, unique ids grouped by shard, with the shard offsets.
struct Batch {
  std::vector<std::vector<uint64_t>> ids;
  std::vector<std::vector<uint32_t>> offsets;
  size_t rows = 0;
};

// CPU seconds of this process so far: user, system.
struct Cpu {
  double user = 0;
  double system = 0;
  double total() const { return user + system; }
};
Cpu CpuNow() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}
double CpuSeconds() { return CpuNow().total(); }

bool SendAll(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = send(fd, data, bytes, 0);
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}
bool RecvAll(int fd, char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = recv(fd, data, bytes, 0);
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// A child process on the far end of a loopback TCP connection: reads a header (request bytes,
// answer bytes), the request, and writes an answer of that size, until the connection closes.
class EchoPeer {
 public:
  // Forks the peer; fd() < 0 when any step failed.
  EchoPeer() {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return;
    }
    child_ = fork();
    if (child_ == 0) {
      const int peer = accept(listener, nullptr, nullptr);
      std::vector<char> buffer;
      uint64_t header[2];
      while (peer >= 0 && RecvAll(peer, reinterpret_cast<char*>(header), sizeof(header))) {
        buffer.resize(std::max(header[0], header[1]));
        if (!RecvAll(peer, buffer.data(), header[0]) || !SendAll(peer, buffer.data(), header[1])) break;
      }
      _exit(0);
    }
    close(listener);
    if (child_ < 0) return;
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    if (fd_ >= 0) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~EchoPeer() {
    if (fd_ >= 0) close(fd_);
    if (child_ > 0) waitpid(child_, nullptr, 0);
  }
  int fd() const { return fd_; }
  // Sends `request` and receives `answer` (its size) back.
  bool Call(const char* request, size_t request_bytes, char* answer, size_t answer_bytes) {
    const uint64_t header[2] = {request_bytes, answer_bytes};
    return SendAll(fd_, reinterpret_cast<const char*>(header), sizeof(header)) &&
           SendAll(fd_, request, request_bytes) && RecvAll(fd_, answer, answer_bytes);
  }

 private:
  pid_t child_ = -1;
  int fd_ = -1;
};

uint64_t IdOf(int table, uint64_t row) { return hyrec::Mix64((static_cast<uint64_t>(table) << 40) | row); }

std::vector<Batch> MakeBatches(const Options& o) {
  const hyrec::ZipfDistribution zipf(kVocabulary, 1.05);
  std::mt19937_64 rng(5);
  std::vector<Batch> out(o.batches);
  for (Batch& b : out) {
    for (int t = 0; t < o.tables; ++t) {
      absl::flat_hash_set<uint64_t> seen;
      std::vector<std::vector<uint64_t>> by_shard(o.shards);
      for (int i = 0; i < o.batch; ++i) {
        const uint64_t id = IdOf(t, zipf(rng) - 1);
        if (seen.insert(id).second) by_shard[hyrec::ShardForId(id, o.shards)].push_back(id);
      }
      std::vector<uint64_t> ids;
      std::vector<uint32_t> offsets = {0};
      for (const auto& shard : by_shard) {
        ids.insert(ids.end(), shard.begin(), shard.end());
        offsets.push_back(static_cast<uint32_t>(ids.size()));
      }
      b.rows += ids.size();
      b.ids.push_back(std::move(ids));
      b.offsets.push_back(std::move(offsets));
    }
  }
  return out;
}

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag, int* out) {
      const std::string prefix = absl::StrCat("--", flag, "=");
      return arg.rfind(prefix, 0) == 0 && absl::SimpleAtoi(arg.substr(prefix.size()), out) && *out > 0;
    };
    if (arg == "--fp16") {
      o->fp16 = true;
    } else if (!(value("batches", &o->batches) || value("tables", &o->tables) || value("dim", &o->dim) ||
                 value("batch", &o->batch) || value("shards", &o->shards))) {
      std::fprintf(stderr, "unknown or malformed argument: %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

// CPU ns per row of this process sending each batch's bytes through a loopback TCP connection, as
// the client's calls carry them (see the file comment); negative when the peer failed.
double SocketNsPerRow(const Options& o, const std::vector<Batch>& batches, const std::vector<std::vector<float>>& grads,
                      size_t total, EchoPeer& peer) {
  const size_t row_bytes = (o.fp16 ? 2 : 4) * static_cast<size_t>(o.dim);
  std::vector<char> request, answer;
  auto socket_batch = [&](const Batch& b) {
    for (int shard = 0; shard < o.shards; ++shard) {
      request.clear();
      size_t rows_in_shard = 0;
      for (int t = 0; t < o.tables; ++t) {
        const uint32_t begin = b.offsets[t][shard], end = b.offsets[t][shard + 1];
        const char* ids = reinterpret_cast<const char*>(b.ids[t].data() + begin);
        request.insert(request.end(), ids, ids + 8 * (end - begin));
        rows_in_shard += end - begin;
      }
      answer.resize(rows_in_shard * row_bytes);
      if (!peer.Call(request.data(), request.size(), answer.data(), answer.size())) return false;
      for (int t = 0; t < o.tables; ++t) {
        const uint32_t begin = b.offsets[t][shard], end = b.offsets[t][shard + 1];
        const char* grads_of = reinterpret_cast<const char*>(grads[t].data() + begin * o.dim);
        request.insert(request.end(), grads_of, grads_of + row_bytes * (end - begin));
      }
      if (!peer.Call(request.data(), request.size(), answer.data(), 8)) return false;
    }
    return true;
  };
  for (const Batch& b : batches) {  // Warm: the socket buffers grown.
    if (!socket_batch(b)) return -1;
  }
  const double socket_start = CpuSeconds();
  for (const Batch& b : batches) {
    if (!socket_batch(b)) return -1;
  }
  return (CpuSeconds() - socket_start) * 1e9 / static_cast<double>(total);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "client_benchmark: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 2;
  // Forked first, before this process has threads or large buffers to share copy-on-write.
  EchoPeer peer;
  if (peer.fd() < 0) return Fail(absl::InternalError("cannot connect to a loopback TCP peer"));
  std::string specs;
  std::vector<std::string> names;
  for (int t = 0; t < o.tables; ++t) {
    names.push_back(absl::StrCat("t", t));
    absl::StrAppend(&specs, t == 0 ? "" : ",", names.back(), ":", o.dim, ":adagrad:0.05");
  }
  PsClusterOptions cluster_options;
  cluster_options.binary = HYREC_PS_BINARY;
  cluster_options.num_shards = o.shards;
  cluster_options.args = {"--tables=" + specs, "--log_level=warn"};
  auto cluster = PsCluster::Launch(cluster_options);
  if (!cluster.ok()) return Fail(cluster.status());
  ClientOptions client_options;
  if (o.fp16) client_options.precision = Precision::kFp16;
  auto client = ConnectEmbeddingClient((*cluster)->addresses(), client_options);
  if (!client.ok()) return Fail(client.status());

  const std::vector<Batch> batches = MakeBatches(o);
  size_t most = 0;
  for (const Batch& b : batches) {
    for (const auto& ids : b.ids) most = std::max(most, ids.size());
  }
  std::vector<std::vector<float>> rows(o.tables, std::vector<float>(most * o.dim));
  std::vector<std::vector<float>> grads(o.tables, std::vector<float>(most * o.dim, 1e-4f));
  auto run = [&](const Batch& b, uint64_t sequence) -> absl::Status {
    std::vector<EmbeddingClient::ShardedLookup> lookups;
    std::vector<EmbeddingClient::ShardedUpdate> updates;
    for (int t = 0; t < o.tables; ++t) {
      const size_t floats = b.ids[t].size() * o.dim;
      lookups.push_back({names[t], b.ids[t], b.offsets[t], absl::MakeSpan(rows[t]).subspan(0, floats)});
      updates.push_back({names[t], b.ids[t], b.offsets[t], absl::MakeConstSpan(grads[t]).subspan(0, floats)});
    }
    if (absl::Status s = (*client)->LookupShardedTables(lookups); !s.ok()) return s;
    return (*client)->UpdateShardedTables(updates, UpdateId{1, sequence});
  };
  // Warm: every batch once (the rows are created, the channels and buffers grown).
  uint64_t sequence = 0;
  for (const Batch& b : batches) {
    if (absl::Status s = run(b, ++sequence); !s.ok()) return Fail(s);
  }
  size_t total = 0;
  for (const Batch& b : batches) total += b.rows;

  // The floor: the same bytes copied between buffers of the batch's size, per table: the ids out,
  // the rows in and out of a receive buffer, the gradients out.
  std::vector<char> out_buffer(most * (8 + 4 * o.dim)), in_buffer(most * 4 * o.dim);
  const double floor_start = CpuSeconds();
  for (int repeat = 0; repeat < 10; ++repeat) {
    for (const Batch& b : batches) {
      for (int t = 0; t < o.tables; ++t) {
        const size_t n = b.ids[t].size();
        const size_t row_bytes = n * 4 * o.dim;
        std::memcpy(out_buffer.data(), b.ids[t].data(), n * 8);
        std::memcpy(rows[t].data(), in_buffer.data(), row_bytes);
        std::memcpy(in_buffer.data(), rows[t].data(), row_bytes);
        std::memcpy(out_buffer.data() + n * 8, grads[t].data(), row_bytes);
      }
      asm volatile("" : : "r"(out_buffer.data()), "r"(in_buffer.data()) : "memory");
    }
  }
  const double floor_ns = (CpuSeconds() - floor_start) * 1e9 / (10.0 * static_cast<double>(total));

  // The socket floor: per batch and shard, one call carrying every table's ids that answers with
  // their rows, then one carrying the ids and gradients that answers with 8 bytes.
  const double socket_ns = SocketNsPerRow(o, batches, grads, total, peer);
  if (socket_ns < 0) return Fail(absl::InternalError("the loopback TCP peer failed"));

  const Cpu cpu_start = CpuNow();
  const auto wall_start = std::chrono::steady_clock::now();
  for (const Batch& b : batches) {
    if (absl::Status s = run(b, ++sequence); !s.ok()) return Fail(s);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  const Cpu cpu_end = CpuNow();
  const double client_ns = (cpu_end.total() - cpu_start.total()) * 1e9 / static_cast<double>(total);
  const double client_system_ns = (cpu_end.system - cpu_start.system) * 1e9 / static_cast<double>(total);

  std::printf(
      "%d tables (dim %d, Adagrad), %d shard(s), %s; %d batches of %d draws a table: %.0f unique rows a "
      "batch\n",
      o.tables, o.dim, o.shards, o.fp16 ? "fp16" : "fp32", o.batches, o.batch,
      static_cast<double>(total) / batches.size());
  std::printf("\n%-44s %10s %10s\n", "worker CPU per unique row", "ns", "x floor");
  std::printf("%-44s %10.1f %10.2f\n", "floor: copy of its id, row and gradient", floor_ns, 1.0);
  std::printf("%-44s %10.1f %10.2f\n", "the same bytes through a loopback TCP socket", socket_ns, socket_ns / floor_ns);
  std::printf("%-44s %10.1f %10.2f\n", "lookup + update through the gRPC client", client_ns, client_ns / floor_ns);
  std::printf("%-44s %10.1f %10.2f\n", "  of which in the kernel", client_system_ns, client_system_ns / floor_ns);
  std::printf("(wall %.0f ns a row, with the servers on the same cores)\ntarget: client <= 8 x the floor\n",
              wall * 1e9 / static_cast<double>(total));
  client->reset();
  return (*cluster)->Stop().ok() ? 0 : 1;
}
