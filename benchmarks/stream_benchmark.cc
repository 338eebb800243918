// Batch streaming over gRPC on loopback (DataServer + ConnectBatchStream) beside the in-process
// stream of the same loader configuration: synthetic source, batch 4096, one worker.
//
//   build/benchmarks/stream_benchmark [batches]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "hyrec/data_loader/data_service.h"
#include "hyrec/data_loader/loader.h"

namespace {

using namespace hyrec::data_loader;
using Clock = std::chrono::steady_clock;

LoaderOptions Options(uint64_t batches) {
  LoaderOptions o;
  o.source.format = Format::kSynthetic;
  o.source.synthetic.num_samples = batches * 4096;
  o.batch_size = 4096;
  o.threads = 2;
  o.num_shards = 4;
  o.epochs = 1;
  return o;
}

double Drain(BatchStream* stream, uint64_t* samples, uint64_t* bytes) {
  const auto start = Clock::now();
  Batch b;
  while (stream->Next(&b, absl::Seconds(60)).ok()) {
    *samples += b.batch_size;
    *bytes += b.labels.size() * 4 + b.dense.size() * 4;
    for (const auto& s : b.slots) *bytes += s.ids.size() * 8 + s.offsets.size() * 4;
    for (const auto& t : b.tables) {
      *bytes += t.unique_ids.size() * 8;
      for (const auto& inv : t.inverse) *bytes += inv.size() * 4;
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t batches = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200;
  uint64_t local_samples = 0, local_bytes = 0, remote_samples = 0, remote_bytes = 0;
  double local_s = 0, remote_s = 0;
  {
    auto loader = Loader::Start(Options(batches), {});
    if (!loader.ok()) return 1;
    local_s = Drain((*loader)->stream(0), &local_samples, &local_bytes);
  }
  {
    auto loader = Loader::Start(Options(batches), {});
    if (!loader.ok()) return 1;
    DataServerOptions server_options;
    server_options.host = "127.0.0.1";
    auto server = DataServer::Start(std::move(*loader), Options(batches), {}, server_options);
    if (!server.ok()) return 1;
    auto stream = ConnectBatchStream("127.0.0.1:" + std::to_string((*server)->port()), 0, {});
    if (!stream.ok()) return 1;
    remote_s = Drain(stream->get(), &remote_samples, &remote_bytes);
  }
  std::printf("%-22s %12s %14s %10s\n", "stream (batch 4096)", "batches/s", "samples/s", "MB/s");
  std::printf("%-22s %12.1f %14.0f %10.0f\n", "in-process", batches / local_s, local_samples / local_s,
              local_bytes / local_s / 1e6);
  std::printf("%-22s %12.1f %14.0f %10.0f\n", "gRPC loopback", batches / remote_s, remote_samples / remote_s,
              remote_bytes / remote_s / 1e6);
  std::printf("ratio gRPC / in-process: %.2f\n", local_s / remote_s);
  return 0;
}
