// Training throughput in samples/s on the synthetic teacher, for the default DLRM (26 slots,
// 13 dense, dim 16, bottom 512-256, top 512-256, batch 2048) and an embedding-heavy shape
// (dim 64, 10 ids per slot, MLPs 64-32):
//   (a) embedded hybrid (staleness 4)      (b) embedded sync (staleness 0)
//       [hyrec train's embedded job (RunTrainJob) on the batches preloaded for (e) and (f); also
//        reported with its own loader generating them on the same cores]
//   (c) processes hybrid                   (d) processes sync      [hyrec train --processes]
//   (e) reference: one LibTorch process with torch::nn::EmbeddingBag tables (sparse gradients,
//       hashing trick) and the same MLPs, batches pre-loaded in memory
//   (f) ceiling: the same MLPs on pre-materialized embeddings (the dense step alone)
//   (g) floor of (f): the matrix products of (f)'s step alone (each layer's forward, input-
//       gradient and weight-gradient GEMMs and the interaction's two batched products) into
//       preallocated outputs, no autograd, activations or optimizer
// then the added-PS-latency sweep (processes, batch 512).
//
//   build/benchmarks/train_benchmark [batches=150] [--only=default|heavy|latency|embedded|a|f|heavy_a] [--blas_spin]
//   build/benchmarks/train_benchmark 100 --device=cuda   # CUDA build: (a), (b), (e), (f) on GPU 0,
//                                                         # the dense sync through ProcessGroupNCCL
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/dense_worker/model.h"
#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/dense_worker/train_job.h"
#include "hyrec/dense_worker/worker.h"
#include "hyrec/job/job_plan.h"

namespace {

using namespace hyrec;
using Clock = std::chrono::steady_clock;

constexpr int kSlots = 26;
constexpr int64_t kRowsPerTable = 1 << 17;                             // Hashing trick for (e).
constexpr size_t kWarmup = dense_worker::TrainReport::kWarmupBatches;  // Untimed first batches of (a), (b), (e), (f).
constexpr int kRounds = 2;                                             // Interleaved repetitions; the best is reported.

// A model and data shape.
struct Shape {
  const char* name;
  int batch;
  int dim;
  int ids_per_slot;
  std::vector<int> bottom, top;
};
const Shape kDefault = {"default DLRM", 2048, 16, 1, {512, 256}, {512, 256}};
const Shape kHeavy = {"embedding-heavy", 2048, 64, 10, {64, 32}, {64, 32}};

torch::Device g_device = torch::kCPU;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The job of a configuration, as a job file says it: what (a)-(d) run.
std::string JobYaml(const Shape& shape, int staleness, int batches) {
  return absl::StrCat("loader:\n  source:\n    format: synthetic\n    synthetic: {num_samples: ",
                      static_cast<uint64_t>(batches) * shape.batch,
                      ", vocabulary: 100000, ids_per_sample: ", shape.ids_per_slot, "}\n  batch_size: ", shape.batch,
                      "\n  threads: 1\neval: {samples: 2048}\nmodel: {embedding_dim: ", shape.dim, ", bottom: [",
                      absl::StrJoin(shape.bottom, ", "), "], top: [", absl::StrJoin(shape.top, ", "),
                      "]}\ntrain: {embedding_staleness: ", staleness,
                      ", log_every_batches: 100000, device: ", g_device.is_cuda() ? "cuda" : "cpu", "}\n");
}

job::JobPlan Job(const Shape& shape, int staleness, int batches) {
  auto spec = job::ParseJobSpecText(JobYaml(shape, staleness, batches), "train_benchmark");
  auto plan = spec.ok() ? job::Plan(*spec) : spec.status();
  if (!plan.ok()) {
    std::fprintf(stderr, "train_benchmark: %s\n", plan.status().ToString().c_str());
    std::exit(1);
  }
  return *plan;
}

// The preloaded batches as a worker's stream: copied when it is made (before the job's clock
// starts), then handed out by move, as the loader's queue hands out its batches.
class PreloadedStream : public data_loader::BatchStream {
 public:
  explicit PreloadedStream(const std::vector<data_loader::Batch>& batches) : batches_(batches) {}
  absl::Status Next(data_loader::Batch* batch, absl::Duration) override {
    if (next_ == batches_.size()) return absl::OutOfRangeError("end of the preloaded batches");
    *batch = std::move(batches_[next_++]);
    return absl::OkStatus();
  }
  data_loader::ReaderPosition Position() const override { return {}; }

 private:
  std::vector<data_loader::Batch> batches_;
  size_t next_ = 0;
};

// hyrec train's embedded job (RunTrainJob): its loader generating the batches on the same cores,
// or, given `preloaded`, trained from those batches in memory, as (e) and (f) are.
double Embedded(const Shape& shape, int staleness, int batches,
                const std::vector<data_loader::Batch>* preloaded = nullptr) {
  std::unique_ptr<PreloadedStream> stream;
  if (preloaded != nullptr) stream = std::make_unique<PreloadedStream>(*preloaded);
  dense_worker::TrainJobOptions options;
  if (stream != nullptr) options.streams = {stream.get()};
  auto report = dense_worker::RunTrainJob(Job(shape, staleness, batches), options);
  if (!report.ok()) {
    std::fprintf(stderr, "%s\n", report.status().ToString().c_str());
    return 0;
  }
  std::printf("  staleness %d%s: observed %.2f, waited %.2f ms/batch for rows, lookup %.1f ms, update %.1f ms\n",
              staleness, preloaded != nullptr ? ", preloaded" : ", loader", report->stats.observed_staleness,
              report->stats.wait_for_rows_ms, report->stats.lookup_ms, report->stats.update_ms);
  // After the same warm-up as (e) and (f) (kWarmup batches).
  return report->steady_samples_per_second;
}

// hyrec train --processes; returns worker 0's steady samples/s (after the warm-up batches, as (a)
// and (f) are timed) and, in *waited_ms, the mean time a batch waited for its rows (PS latency
// that the pipeline did not hide).
double Processes(const Shape& shape, int staleness, int batches, double latency_ms = -1, double* waited_ms = nullptr) {
  const std::string config = "/tmp/hyrec_train_benchmark.yaml";
  std::ofstream(config) << JobYaml(shape, staleness, batches);
  std::vector<std::string> argv = {ExecutableDirectory() + "/../hyrec-train", "--processes", "--config=" + config,
                                   "--progress=lines", "--plot="};
  if (latency_ms >= 0) argv.push_back(absl::StrCat("--ps_latency_ms=", latency_ms));
  auto p = Subprocess::Spawn(argv);
  if (!p.ok()) return 0;
  double rate = 0;
  for (;;) {
    auto line = (*p)->ReadLine(absl::Minutes(10));
    if (!line.ok()) break;
    unsigned long long samples = 0;
    if (std::sscanf(line->c_str(), "summary: %llu samples, %lf", &samples, &rate) == 2) {
      // The steady rate, after the warm-up batches, as (a) and (f) are timed.
      const size_t steady = line->find("(steady: ");
      if (steady != std::string::npos) rate = std::atof(line->c_str() + steady + 9);
      continue;
    }
    const size_t waited = line->find("waited ");
    if (waited_ms != nullptr && waited != std::string::npos) *waited_ms = std::atof(line->c_str() + waited + 7);
  }
  (void)(*p)->Wait(absl::Seconds(30));
  return rate;
}

// (e) and (f): the same MLPs as DLRM, written directly in LibTorch.
struct Reference : torch::nn::Module {
  Reference(const Shape& shape, bool with_tables) {
    if (with_tables) {
      for (int s = 0; s < kSlots; ++s) {
        bags.push_back(register_module(
            "bag" + std::to_string(s),
            torch::nn::EmbeddingBag(
                torch::nn::EmbeddingBagOptions(kRowsPerTable, shape.dim).mode(torch::kSum).sparse(true))));
      }
    }
    dense_worker::DlrmOptions o;
    o.embedding_dim = shape.dim;
    o.bottom = shape.bottom;
    o.top = shape.top;
    dlrm = register_module("dlrm", std::make_shared<dense_worker::DlrmImpl>(o));
    to(g_device);
  }
  std::vector<torch::nn::EmbeddingBag> bags;
  std::shared_ptr<dense_worker::DlrmImpl> dlrm;
};

std::vector<data_loader::Batch> Preload(const Shape& shape, int batches) {
  data_loader::LoaderOptions o = Job(shape, 0, batches).loader.options;  // Ids grouped for the job's 2 PS shards.
  auto loader = *data_loader::Loader::Start(o, {});
  std::vector<data_loader::Batch> out;
  data_loader::Batch b;
  while (loader->stream(0)->Next(&b, absl::Seconds(60)).ok()) out.push_back(b);
  return out;
}

torch::Tensor OnDevice(const float* data, std::vector<int64_t> sizes) {
  return torch::from_blob(const_cast<float*>(data), sizes).to(g_device, /*non_blocking=*/false, /*copy=*/true);
}

double EmbeddingBagReference(const Shape& shape, const std::vector<data_loader::Batch>& batches) {
  torch::manual_seed(1);
  Reference model(shape, true);
  std::vector<torch::Tensor> sparse, dense;
  for (auto& b : model.bags) sparse.push_back(b->weight);
  for (auto& p : model.dlrm->parameters()) dense.push_back(p);
  torch::optim::Adagrad sparse_opt(sparse, torch::optim::AdagradOptions(0.05));
  torch::optim::Adam dense_opt(dense, torch::optim::AdamOptions(1e-3));
  auto start = Clock::now();
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i == kWarmup) start = Clock::now();
    const auto& b = batches[i];
    std::vector<torch::Tensor> pooled;
    for (int s = 0; s < kSlots; ++s) {
      std::vector<int64_t> idx(b.slots[s].ids.size());
      for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<int64_t>(b.slots[s].ids[j] % kRowsPerTable);
      std::vector<int64_t> offsets(b.slots[s].offsets.begin(), b.slots[s].offsets.end() - 1);
      pooled.push_back(model.bags[s]->forward(torch::tensor(idx).to(g_device), torch::tensor(offsets).to(g_device)));
    }
    torch::Tensor x = OnDevice(b.dense.data(), {b.batch_size, b.num_dense});
    torch::Tensor y = OnDevice(b.labels.data(), {b.batch_size});
    sparse_opt.zero_grad();
    dense_opt.zero_grad();
    torch::Tensor loss = torch::binary_cross_entropy_with_logits(model.dlrm->forward(x, pooled), y);
    loss.backward();
    sparse_opt.step();
    dense_opt.step();
    if (i + 1 == batches.size()) loss.item<float>();  // Waits for the device.
  }
  return (batches.size() - kWarmup) * static_cast<double>(shape.batch) / Seconds(start);
}

double DenseCeiling(const Shape& shape, const std::vector<data_loader::Batch>& batches) {
  torch::manual_seed(1);
  Reference model(shape, false);
  torch::optim::Adam dense_opt(model.dlrm->parameters(), torch::optim::AdamOptions(1e-3));
  std::vector<torch::Tensor> pooled;
  for (int s = 0; s < kSlots; ++s) pooled.push_back((torch::randn({shape.batch, shape.dim}) * 0.01).to(g_device));
  auto start = Clock::now();
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i == kWarmup) start = Clock::now();
    const auto& b = batches[i];
    torch::Tensor x = OnDevice(b.dense.data(), {b.batch_size, b.num_dense});
    torch::Tensor y = OnDevice(b.labels.data(), {b.batch_size});
    dense_opt.zero_grad();
    torch::Tensor loss = torch::binary_cross_entropy_with_logits(model.dlrm->forward(x, pooled), y);
    loss.backward();
    dense_opt.step();
    if (i + 1 == batches.size()) loss.item<float>();  // Waits for the device.
  }
  return (batches.size() - kWarmup) * static_cast<double>(shape.batch) / Seconds(start);
}

// (g): the GEMMs of one dense step of the DLRM of `shape`, timed alone: per Linear layer of the
// bottom and top MLPs (in -> out over a batch of B), the forward X W^T + b (addmm), the weight
// gradient dY^T X and, but for the first layer (whose input is data), the input gradient dY W;
// then the interaction's forward T T^T and backward (dZ + dZ^T) T as batched products.
double GemmFloor(const Shape& shape, int steps) {
  torch::manual_seed(1);
  const int64_t batch = shape.batch;
  const int64_t features = kSlots + 1;
  struct Layer {
    torch::Tensor x, w, b, y, dy, dx, dw;
    bool input_grad;
  };
  std::vector<Layer> layers;
  auto mlp = [&](int64_t in, std::vector<int> hidden, int64_t out) {
    hidden.push_back(static_cast<int>(out));
    for (size_t k = 0; k < hidden.size(); ++k) {
      const int64_t o = hidden[k];
      auto opts = torch::TensorOptions().device(g_device);
      layers.push_back({torch::randn({batch, in}, opts), torch::randn({o, in}, opts) * 0.01, torch::zeros({o}, opts),
                        torch::empty({batch, o}, opts), torch::randn({batch, o}, opts), torch::empty({batch, in}, opts),
                        torch::empty({o, in}, opts), k > 0});
      in = o;
    }
  };
  mlp(13, shape.bottom, shape.dim);
  mlp(shape.dim + features * (features - 1) / 2, shape.top, 1);
  layers[static_cast<size_t>(shape.bottom.size()) + 1].input_grad = true;  // The top's input has a gradient.
  auto opts = torch::TensorOptions().device(g_device);
  torch::Tensor t = torch::randn({batch, features, shape.dim}, opts);
  torch::Tensor z = torch::empty({batch, features, features}, opts);
  torch::Tensor dz = torch::randn({batch, features, features}, opts);
  torch::Tensor dzs = torch::empty_like(dz);
  torch::Tensor dt = torch::empty_like(t);
  auto step = [&] {
    for (Layer& l : layers) torch::addmm_out(l.y, l.b, l.x, l.w.t());
    torch::bmm_out(z, t, t.transpose(1, 2));
    torch::add_out(dzs, dz, dz.transpose(1, 2));
    torch::bmm_out(dt, dzs, t);
    for (Layer& l : layers) {
      torch::mm_out(l.dw, l.dy.t(), l.x);
      if (l.input_grad) torch::mm_out(l.dx, l.dy, l.w);
    }
  };
  for (size_t i = 0; i < kWarmup; ++i) step();
  if (!g_device.is_cpu()) z.sum().item<float>();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  if (!g_device.is_cpu()) z.sum().item<float>();  // Waits for the device.
  return steps * static_cast<double>(batch) / Seconds(start);
}

// (a)-(f) for one shape; processes (c), (d) only on the CPU.
void ThroughputTable(const Shape& shape, int batches, bool processes) {
  std::printf("\n%s: batch %d, dim %d, %d id(s) per slot, bottom %s, top %s, %d batches, device %s, best of %d\n",
              shape.name, shape.batch, shape.dim, shape.ids_per_slot, absl::StrJoin(shape.bottom, "-").c_str(),
              absl::StrJoin(shape.top, "-").c_str(), batches, g_device.str().c_str(), kRounds);
  const std::vector<data_loader::Batch> preloaded = Preload(shape, batches);
  // Every configuration trains on a thread of its own, as the embedded workers do (LibTorch's
  // intra-op settings are per thread; measured on the main thread after set_num_threads, the
  // same dense step ran 2x slower here).
  // Each of (f), (e), (a), (b) runs `kRounds` times, interleaved, and the best is kept: this
  // machine's speed drifts by tens of percent over minutes, which one run each would mix into the
  // ratios.
  double f = 0, e = 0, a = 0, b = 0, a_loader = 0, b_loader = 0, g = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::thread([&] { g = std::max(g, GemmFloor(shape, batches - static_cast<int>(kWarmup))); }).join();
    std::thread([&] { f = std::max(f, DenseCeiling(shape, preloaded)); }).join();
    std::thread([&] { e = std::max(e, EmbeddingBagReference(shape, preloaded)); }).join();
    a = std::max(a, Embedded(shape, 4, batches, &preloaded));
    b = std::max(b, Embedded(shape, 0, batches, &preloaded));
    a_loader = std::max(a_loader, Embedded(shape, 4, batches));
    b_loader = std::max(b_loader, Embedded(shape, 0, batches));
  }
  const bool with_processes = g_device.is_cpu() && processes;
  const double c = with_processes ? Processes(shape, 4, batches) : 0;
  const double d = with_processes ? Processes(shape, 0, batches) : 0;
  std::printf("%-52s %12s %10s\n", "configuration", "samples/s", "vs (f)");
  auto row = [&](const char* name, double v) { std::printf("%-52s %12.0f %10.2f\n", name, v, v / f); };
  row(g_device.is_cpu() ? "(a) embedded hybrid, staleness 4" : "(a) embedded hybrid, staleness 4, NCCL world 1", a);
  row("(b) embedded sync, staleness 0", b);
  row("(a) with its loader generating the batches", a_loader);
  row("(b) with its loader generating the batches", b_loader);
  if (with_processes) {
    row("(c) processes hybrid (2 PS, loader, 1 worker)", c);
    row("(d) processes sync", d);
  }
  row("(e) LibTorch EmbeddingBag reference, no PS", e);
  row("(f) dense step alone (ceiling)", f);
  row("(g) the dense step's GEMMs alone (floor of (f))", g);
  std::printf("targets: (a) >= 0.9 x (f): %s; (a) >= (e): %s; (f) >= 0.8 x (g): %s (%.2f)\n",
              a >= 0.9 * f ? "met" : "missed", a >= e ? "met" : "missed", f >= 0.8 * g ? "met" : "missed", f / g);
}

// Added PS latency: a delaying proxy in front of each PS, batch 512.
void LatencySweep(int batches) {
  Shape shape = kDefault;
  shape.batch = 512;
  std::printf("\nadded PS round-trip latency, processes, batch 512 (samples/s, best of %d)\n", kRounds);
  std::printf("%-8s %14s %14s %10s %12s %12s %12s %12s\n", "ms", "(c) hybrid", "(d) sync", "(c)/(d)", "(c)/(c@0)",
              "(d)/(d@0)", "(c) waited", "(d) waited");
  // Every run goes through the proxies (0 ms: no delay), so the ratios isolate the latency;
  // kRounds interleaved rounds, best kept.
  const std::vector<double> delays = {0.0, 1.0, 5.0, 20.0};
  std::vector<double> hybrid(delays.size(), 0), sync(delays.size(), 0);
  std::vector<double> hybrid_wait(delays.size(), 0), sync_wait(delays.size(), 0);
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < delays.size(); ++i) {
      double waited = 0;
      const double h = Processes(shape, 4, 2 * batches, delays[i], &waited);
      if (h > hybrid[i]) hybrid[i] = h, hybrid_wait[i] = waited;
      const double d = Processes(shape, 0, 2 * batches, delays[i], &waited);
      if (d > sync[i]) sync[i] = d, sync_wait[i] = waited;
    }
  }
  for (size_t i = 0; i < delays.size(); ++i) {
    std::printf("%-8.0f %14.0f %14.0f %10.2f %12.2f %12.2f %12.2f %12.2f\n", delays[i], hybrid[i], sync[i],
                hybrid[i] / sync[i], hybrid[i] / hybrid[0], sync[i] / sync[0], hybrid_wait[i], sync_wait[i]);
  }
  std::printf("targets: (c) >= 0.8 x its own 0 ms figure at 5 and 20 ms; at 20 ms (c) >= 1.5 x (d)\n");
}

}  // namespace

int main(int argc, char** argv) {
  int batches = 150;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--device=", 9) == 0) {
      auto device = dense_worker::ResolveDevice(argv[i] + 9, 0);
      if (!device.ok()) {
        std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
        return 1;
      }
      g_device = *device;
    } else if (std::strcmp(argv[i], "--blas_spin") == 0) {
      setenv("OPENBLAS_THREAD_TIMEOUT", "28", 1);  // OpenBLAS's default: idle threads spin ~2^28 cycles.
    } else if (std::strncmp(argv[i], "--only=", 7) == 0) {
      only = argv[i] + 7;
    } else {
      batches = std::atoi(argv[i]);
    }
  }
  const std::vector<std::string> kOnly = {"", "default", "heavy", "latency", "embedded", "a", "f", "heavy_a"};
  if (std::find(kOnly.begin(), kOnly.end(), only) == kOnly.end()) {
    std::fprintf(stderr,
                 "train_benchmark: --only must be one of default, heavy, latency, embedded, a, f, heavy_a; "
                 "got '%s'\n",
                 only.c_str());
    return 2;
  }
  if (batches <= static_cast<int>(kWarmup)) {
    std::fprintf(stderr, "train_benchmark: batches must be more than the %zu warm-up ones; got %d\n", kWarmup, batches);
    return 2;
  }
  // Every configuration, (e) and (f) included, runs with the BLAS and malloc settings the trainer uses.
  const bool asleep = dense_worker::SleepIdleBlasThreads();
  const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  std::printf("OpenBLAS idle threads: OPENBLAS_THREAD_TIMEOUT=%s%s\n", timeout != nullptr ? timeout : "unset",
              asleep ? " (set by SleepIdleBlasThreads: they sleep at once)" : " (from the environment)");
  const bool retained = dense_worker::RetainFreedMemory();
  std::printf("malloc: %s\n", retained ? "freed blocks up to 32 MiB stay mapped (set by RetainFreedMemory)"
                                       : "glibc's defaults or the environment's thresholds");
  if (only == "a" || only == "f" || only == "heavy_a") {  // One configuration alone, once: for profilers.
    const Shape& shape = only == "heavy_a" ? kHeavy : kDefault;
    const std::vector<data_loader::Batch> preloaded = Preload(shape, batches);
    if (only != "f") {
      std::printf("(a) embedded hybrid, staleness 4: %.0f samples/s\n", Embedded(shape, 4, batches, &preloaded));
    } else {
      double f = 0, g = 0;
      std::thread([&] { f = DenseCeiling(shape, preloaded); }).join();
      std::thread([&] { g = GemmFloor(shape, batches - static_cast<int>(kWarmup)); }).join();
      std::printf("(f) dense step alone: %.0f samples/s; (g) its GEMMs alone: %.0f; (f)/(g) %.2f\n", f, g, f / g);
    }
    return 0;
  }
  if (only.empty() || only == "default" || only == "embedded") ThroughputTable(kDefault, batches, only != "embedded");
  if (only.empty() || only == "heavy") ThroughputTable(kHeavy, batches, true);
  if (g_device.is_cpu() && (only.empty() || only == "latency")) LatencySweep(batches);
  return 0;
}
