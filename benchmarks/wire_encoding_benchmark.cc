// How to carry ids and rows in protobuf: packed repeated fields or raw little-endian bytes.
// Each benchmark fills a message from arrays, serializes it, parses it back and copies the
// values out: what a Lookup costs in encoding on both ends. The floor is a plain memcpy of the
// same bytes (what the bytes encoding can at best approach).
//
//   build/benchmarks/wire_encoding_benchmark
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "wire_encoding.pb.h"

namespace {

constexpr int kDim = 16;

struct Payload {
  std::vector<uint64_t> ids;
  std::vector<float> values;
};

Payload MakePayload(size_t n) {
  Payload p;
  std::mt19937_64 rng(1);
  p.ids.resize(n);
  for (auto& id : p.ids) id = rng();  // Hashed feature ids: full 64-bit values.
  p.values.resize(n * kDim);
  for (size_t i = 0; i < p.values.size(); ++i) p.values[i] = static_cast<float>(i % 1000) * 1e-3f;
  return p;
}

void BM_MemcpyFloor(benchmark::State& state) {
  const Payload p = MakePayload(state.range(0));
  std::string wire, copy;
  Payload out;
  out.ids.resize(p.ids.size());
  out.values.resize(p.values.size());
  for (auto _ : state) {
    wire.resize(p.ids.size() * 8 + p.values.size() * 4);
    std::memcpy(wire.data(), p.ids.data(), p.ids.size() * 8);
    std::memcpy(wire.data() + p.ids.size() * 8, p.values.data(), p.values.size() * 4);
    copy.assign(wire);  // the transport's copy
    std::memcpy(out.ids.data(), copy.data(), p.ids.size() * 8);
    std::memcpy(out.values.data(), copy.data() + p.ids.size() * 8, p.values.size() * 4);
    benchmark::DoNotOptimize(out.values.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

template <typename Message>
void RoundTripRepeated(benchmark::State& state) {
  const Payload p = MakePayload(state.range(0));
  Payload out;
  Message m, parsed;  // Reused, as a server reuses its buffers: no allocation in the loop.
  std::string wire;
  for (auto _ : state) {
    m.Clear();
    m.mutable_ids()->Add(p.ids.begin(), p.ids.end());
    m.mutable_values()->Add(p.values.begin(), p.values.end());
    m.SerializeToString(&wire);
    parsed.ParseFromString(wire);
    out.ids.assign(parsed.ids().begin(), parsed.ids().end());
    out.values.assign(parsed.values().begin(), parsed.values().end());
    benchmark::DoNotOptimize(out.values.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_Packed(benchmark::State& state) { RoundTripRepeated<hyrec::bench::PackedPayload>(state); }
void BM_Varint(benchmark::State& state) { RoundTripRepeated<hyrec::bench::VarintPayload>(state); }

void BM_Bytes(benchmark::State& state) {
  const Payload p = MakePayload(state.range(0));
  Payload out;
  out.ids.resize(p.ids.size());
  out.values.resize(p.values.size());
  hyrec::bench::BytesPayload m, parsed;
  std::string wire;
  for (auto _ : state) {
    m.mutable_ids()->assign(reinterpret_cast<const char*>(p.ids.data()), p.ids.size() * 8);
    m.mutable_values()->assign(reinterpret_cast<const char*>(p.values.data()), p.values.size() * 4);
    m.SerializeToString(&wire);
    parsed.ParseFromString(wire);
    std::memcpy(out.ids.data(), parsed.ids().data(), parsed.ids().size());
    std::memcpy(out.values.data(), parsed.values().data(), parsed.values().size());
    benchmark::DoNotOptimize(out.values.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_MemcpyFloor)->Arg(1024)->Arg(16384);
BENCHMARK(BM_Packed)->Arg(1024)->Arg(16384);
BENCHMARK(BM_Varint)->Arg(1024)->Arg(16384);
BENCHMARK(BM_Bytes)->Arg(1024)->Arg(16384);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  hyrec::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-8s %12s %12s %12s %12s   (rows/s, dim %d; ratio to the memcpy floor)\n", "ids", "floor", "packed",
              "varint", "bytes", kDim);
  for (int n : {1024, 16384}) {
    const std::string arg = "/" + std::to_string(n);
    const double floor = reporter.ItemsPerSecond("BM_MemcpyFloor" + arg);
    auto cell = [&](const char* name) {
      const double v = reporter.ItemsPerSecond(std::string(name) + arg);
      return hyrec::bench::Millions(v) + " (" + std::to_string(v / floor).substr(0, 4) + ")";
    };
    std::printf("%-8d %12s %18s %18s %18s\n", n, hyrec::bench::Millions(floor).c_str(), cell("BM_Packed").c_str(),
                cell("BM_Varint").c_str(), cell("BM_Bytes").c_str());
  }
  return 0;
}
