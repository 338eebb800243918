#include "hyrec/nn_sync/dense_sync.h"

#include <torch/torch.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstring>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"
#include "src/nn_sync/rendezvous.h"

namespace hyrec::nn_sync {
namespace {

// Since LibTorch 2.0 the Gloo and NCCL classes are c10d::Backends (a ProcessGroup dispatches to
// them); before, they were ProcessGroups. Both have the collectives used here.
#if TORCH_VERSION_MAJOR >= 2
using Group = c10d::Backend;
#else
using Group = c10d::ProcessGroup;
#endif

std::chrono::milliseconds ToChrono(absl::Duration d) { return std::chrono::milliseconds(absl::ToInt64Milliseconds(d)); }

// Rendezvous keys of the generations. Generation 0's process group uses the store's top level
// (c10d's own keys); each later one a prefix of its own.
constexpr char kGenerationKey[] = "hyrec/generation";  // The newest generation opened (worker 0 sets it).
std::string JoinKey(int generation, int rank) {
  return generation == 0 ? absl::StrCat("hyrec/rendezvous/", rank)
                         : absl::StrCat("hyrec/gen/", generation, "/join/", rank);
}
std::string OpenKey(int generation) { return absl::StrCat("hyrec/gen/", generation, "/open"); }
std::string GroupPrefix(int generation) { return absl::StrCat("hyrec/gen/", generation, "/pg"); }
// Set by a replacement before it waits for `generation` to open: the survivors learn a peer was lost.
std::string WaitingKey(int generation) { return absl::StrCat("hyrec/gen/", generation, "/waiting"); }

// A failed collective or rendezvous, from the exception c10d throws.
absl::Status CollectiveError(absl::string_view what, const std::exception& e) {
  std::string message = e.what();
  const size_t newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);  // Drop the C++ stack trace.
  const bool timed_out = message.find("imed out") != std::string::npos || message.find("imeout") != std::string::npos ||
                         message.find("DEADLINE_EXCEEDED") != std::string::npos;
  return absl::Status(timed_out ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
                      absl::StrCat(what, " failed: ", message));
}

// c10d's Store over hyrec's rendezvous (rendezvous.h): c10d expects failures as exceptions.
// A wait without a timeout (c10d's kNoTimeout) gets the store's, so that none blocks for good.
class RendezvousStore final : public c10d::Store {
 public:
  RendezvousStore(std::shared_ptr<Rendezvous> rendezvous, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), rendezvous_(std::move(rendezvous)), fallback_timeout_(timeout) {}

  // Newer LibTorch's Store asks for a copy that threads may use on their own (its watchdogs);
  // the rendezvous is thread-safe, so copies share it. Not marked override: LibTorch 1.13's
  // Store has no clone().
  virtual c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<RendezvousStore>(rendezvous_, fallback_timeout_);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Check(rendezvous_->Set(key, std::string(value.begin(), value.end())));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    const std::string value = Value(rendezvous_->Get(key, Timeout(timeout_)));
    return std::vector<uint8_t>(value.begin(), value.end());
  }
  int64_t add(const std::string& key, int64_t value) override { return Value(rendezvous_->Add(key, value)); }
  bool deleteKey(const std::string& key) override { return Value(rendezvous_->Delete(key)); }
  bool check(const std::vector<std::string>& keys) override { return Value(rendezvous_->Check(keys)); }
  int64_t getNumKeys() override { return Value(rendezvous_->NumKeys()); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Check(rendezvous_->Wait(keys, Timeout(timeout)));
  }

 private:
  absl::Duration Timeout(std::chrono::milliseconds timeout) const {
    if (timeout == kNoTimeout) timeout = fallback_timeout_;
    return absl::Milliseconds(timeout.count());
  }
  static void Check(const absl::Status& status) {
    if (!status.ok()) throw std::runtime_error(status.ToString());
  }
  template <typename T>
  static T Value(absl::StatusOr<T> value) {
    Check(value.status());
    return *std::move(value);
  }

  const std::shared_ptr<Rendezvous> rendezvous_;
  const std::chrono::milliseconds fallback_timeout_;
};

SyncBackend ChosenBackend(const SyncOptions& options) {
  if (options.backend != SyncBackend::kAuto) return options.backend;
  return options.device_is_cuda ? SyncBackend::kNccl : SyncBackend::kGloo;
}
std::string BackendName(const SyncOptions& options) {
  return ChosenBackend(options) == SyncBackend::kNccl ? "nccl" : "gloo";
}

// The process group of the options' backend over `store` (every rank builds it at once).
absl::StatusOr<c10::intrusive_ptr<Group>> MakeGroup(const SyncOptions& options, c10::intrusive_ptr<c10d::Store> store) {
  if (ChosenBackend(options) == SyncBackend::kNccl) {
#ifdef USE_C10D_NCCL
    try {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = ToChrono(options.timeout);
      return c10::intrusive_ptr<Group>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options.rank, options.world_size, nccl_options));
    } catch (const std::exception& e) {
      return CollectiveError("creating the NCCL process group", e);
    }
#else
    return absl::UnimplementedError("this build's LibTorch has no CUDA, so no NCCL process group");
#endif
  }
#ifdef USE_C10D_GLOO
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create();
    gloo_options->timeout = ToChrono(options.timeout);
    const bool loopback = options.master_addr == "127.0.0.1" || options.master_addr == "localhost";
    gloo_options->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                             : c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::intrusive_ptr<Group>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size, gloo_options));
  } catch (const std::exception& e) {
    return CollectiveError("creating the Gloo process group", e);
  }
#else
  return absl::UnimplementedError("this build's LibTorch came without Gloo headers, so no Gloo process group");
#endif
}

class C10dSync final : public DenseSync {
 public:
  C10dSync(SyncOptions options, RendezvousOptions rendezvous_options, std::shared_ptr<Rendezvous> rendezvous,
           c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<Group> group, std::string backend, int generation)
      : options_(std::move(options)),
        rendezvous_options_(std::move(rendezvous_options)),
        rendezvous_(std::move(rendezvous)),
        store_(std::move(store)),
        group_(std::move(group)),
        backend_(std::move(backend)),
        generation_(generation) {}

  int generation() const override { return generation_; }
  bool replacement() const override { return generation_ > 0 && !regrouped_; }

  absl::Status Regroup(absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    ClearBucketsLocked(/*collectives_done=*/false);  // Their collectives belong to the old group.
    group_.reset();  // Its collectives failed or time out within the timeout; then it is gone.
    const int next = generation_ + 1;
    // The other ranks reach worker 0's rendezvous through calls bounded by `timeout`: when
    // worker 0 is gone, each fails within it rather than the store's own timeout.
    std::shared_ptr<Rendezvous> calls = rendezvous_;
    if (options_.rank == 0) {
      HYREC_RETURN_IF_ERROR(rendezvous_->Set(kGenerationKey, std::to_string(next)));
      HYREC_RETURN_IF_ERROR(rendezvous_->Set(OpenKey(next), "1"));
    } else {
      RendezvousOptions bounded = rendezvous_options_;
      bounded.timeout = timeout;
      HYREC_ASSIGN_OR_RETURN(calls, JoinRendezvous(bounded));
    }
    HYREC_ASSIGN_OR_RETURN(group_, JoinGeneration(options_, *calls, store_, next, timeout));
    generation_ = next;
    regrouped_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> ReplacementWaiting() override {  // The training thread's, as Regroup.
    return rendezvous_->Check({WaitingKey(generation_ + 1)});
  }

  absl::Status BroadcastBytes(std::string* bytes, int root) override {
    try {
      c10d::BroadcastOptions broadcast;
      broadcast.rootRank = root;
      broadcast.timeout = ToChrono(options_.timeout);
      const auto on_device = torch::TensorOptions().device(device_);
      std::vector<torch::Tensor> size = {
          torch::full({1}, static_cast<int64_t>(bytes->size()), on_device.dtype(torch::kLong))};
      group_->broadcast(size, broadcast)->wait(ToChrono(options_.timeout));
      const int64_t n = size[0].item<int64_t>();
      torch::Tensor cpu = torch::zeros({n}, torch::kUInt8);
      if (options_.rank == root) std::memcpy(cpu.data_ptr(), bytes->data(), bytes->size());
      std::vector<torch::Tensor> data = {cpu.to(device_)};
      if (n > 0) group_->broadcast(data, broadcast)->wait(ToChrono(options_.timeout));
      cpu = data[0].to(torch::kCPU).contiguous();
      bytes->assign(static_cast<const char*>(cpu.data_ptr()), static_cast<size_t>(n));
    } catch (const std::exception& e) {
      return CollectiveError("broadcast", e);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int64_t>> AllGather(int64_t value) override {
    torch::Tensor all = torch::zeros({options_.world_size}, torch::TensorOptions().dtype(torch::kLong));
    all[options_.rank] = value;
    std::vector<torch::Tensor> t = {all.to(device_)};
    try {
      c10d::AllreduceOptions allreduce;
      allreduce.timeout = ToChrono(options_.timeout);
      group_->allreduce(t, allreduce)->wait(ToChrono(options_.timeout));
    } catch (const std::exception& e) {
      return CollectiveError("gathering every rank's value", e);
    }
    all = t[0].to(torch::kCPU);
    return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + options_.world_size);
  }

  // Announces this rank in `generation` and waits for every rank there, then builds the
  // generation's process group on its prefix of the store.
  static absl::StatusOr<c10::intrusive_ptr<Group>> JoinGeneration(const SyncOptions& options, Rendezvous& rendezvous,
                                                                  const c10::intrusive_ptr<c10d::Store>& store,
                                                                  int generation, absl::Duration timeout) {
    const std::string where =
        absl::StrCat("generation ", generation, " of the dense group at ", options.master_addr, ":",
                     options.master_port, " (rank ", options.rank, " of ", options.world_size, ")");
    HYREC_RETURN_IF_ERROR(Annotate(rendezvous.Set(JoinKey(generation, options.rank), "1"), where));
    std::vector<std::string> everyone;
    for (int r = 0; r < options.world_size; ++r) everyone.push_back(JoinKey(generation, r));
    HYREC_RETURN_IF_ERROR(Annotate(rendezvous.Wait(everyone, timeout), where));
    c10::intrusive_ptr<c10d::Store> scoped = store;
    if (generation > 0) scoped = c10::make_intrusive<c10d::PrefixStore>(GroupPrefix(generation), store);
    return MakeGroup(options, scoped);
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string backend_name() const override { return backend_; }

  absl::Status BroadcastParameters(const std::vector<torch::Tensor>& params) override {
    if (params.empty()) return absl::OkStatus();
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> flat_parts;
    for (const auto& p : params) flat_parts.push_back(p.detach().reshape({-1}));
    std::vector<torch::Tensor> flat = {torch::cat(flat_parts)};
    try {
      c10d::BroadcastOptions broadcast;
      broadcast.rootRank = 0;
      broadcast.timeout = ToChrono(options_.timeout);
      auto work = group_->broadcast(flat, broadcast);
      work->wait(ToChrono(options_.timeout));
    } catch (const std::exception& e) {
      return CollectiveError("broadcast of the initial dense parameters", e);
    }
    int64_t offset = 0;
    for (const auto& p : params) {
      p.detach().copy_(flat[0].narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> AllMin(int value, absl::Duration timeout) override {
    // A float holds every int up to 2^24 exactly, on every backend.
    torch::Tensor vote = torch::full({1}, static_cast<float>(value), torch::TensorOptions().device(device_));
    try {
      std::vector<torch::Tensor> t = {vote};
      c10d::AllreduceOptions allreduce;
      allreduce.reduceOp = c10d::ReduceOp::MIN;
      allreduce.timeout = ToChrono(timeout);
      group_->allreduce(t, allreduce)->wait(ToChrono(timeout));
    } catch (const std::exception& e) {
      return CollectiveError("the workers' agreement (AllMin)", e);
    }
    return static_cast<int>(std::lround(vote.item<float>()));
  }

  void AttachToParameters(const std::vector<torch::Tensor>& params) override {
    if (!params.empty()) device_ = params.front().device();
    // Reverse order: the last layers' gradients are ready first.
    Bucket* bucket = nullptr;
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      const torch::Tensor& p = *it;
      const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
      if (bucket == nullptr || (bucket->bytes > 0 && bucket->bytes + bytes > options_.bucket_bytes)) {
        buckets_.emplace_back();
        bucket = &buckets_.back();
      }
      slots_.push_back(Slot{p, static_cast<int>(buckets_.size()) - 1, bucket->numel});
      bucket->numel += p.numel();
      bucket->bytes += bytes;
      ++bucket->params;
    }
    for (Bucket& b : buckets_) {
      b.buffer = torch::zeros({b.numel}, params.front().options().requires_grad(false));
    }
    for (size_t s = 0; s < slots_.size(); ++s) {
      slots_[s].param.register_hook([this, s](torch::Tensor grad) { OnGradient(s, grad); });
    }
  }

  absl::Status FinishGradientSync() override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status status;
    try {
      while (next_launch_ < buckets_.size()) LaunchLocked(next_launch_);
      for (Bucket& b : buckets_) {
        if (b.work) b.work->wait(ToChrono(options_.timeout));
      }
    } catch (const std::exception& e) {
      status = CollectiveError("gradient allreduce", e);
    }
    if (status.ok()) {
      torch::NoGradGuard no_grad;
      const double scale = 1.0 / options_.world_size;
      for (Bucket& b : buckets_) b.buffer.mul_(scale);
      for (Slot& slot : slots_) {
        torch::Tensor averaged =
            buckets_[slot.bucket].buffer.narrow(0, slot.offset, slot.param.numel()).view_as(slot.param);
        if (slot.param.grad().defined()) {
          slot.param.mutable_grad().copy_(averaged);
        } else {
          slot.param.mutable_grad() = averaged.clone();
        }
      }
    }
    ClearBucketsLocked(/*collectives_done=*/status.ok());
    return status;
  }

  absl::Status AllreduceMean(torch::Tensor values) override {
    try {
      std::vector<torch::Tensor> t = {values};
      c10d::AllreduceOptions allreduce;
      allreduce.timeout = ToChrono(options_.timeout);
      group_->allreduce(t, allreduce)->wait(ToChrono(options_.timeout));
    } catch (const std::exception& e) {
      return CollectiveError("allreduce", e);
    }
    torch::NoGradGuard no_grad;
    values.div_(options_.world_size);
    return absl::OkStatus();
  }

 private:
  struct Bucket {
    int64_t numel = 0;
    size_t bytes = 0;
    int params = 0;
    int ready = 0;
    torch::Tensor buffer;
    c10::intrusive_ptr<c10d::Work> work;
  };
  struct Slot {
    torch::Tensor param;
    int bucket;
    int64_t offset;
  };

  void OnGradient(size_t s, const torch::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mu_);
    const Slot& slot = slots_[s];
    Bucket& bucket = buckets_[slot.bucket];
    {
      torch::NoGradGuard no_grad;
      bucket.buffer.narrow(0, slot.offset, slot.param.numel()).add_(grad.reshape({-1}));
    }
    ++bucket.ready;
    // Launch ready buckets strictly in index order, so every rank issues the same sequence.
    try {
      while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready >= buckets_[next_launch_].params) {
        LaunchLocked(next_launch_);
      }
    } catch (const std::exception&) {
      // Reported by FinishGradientSync, which waits on the same group.
    }
  }

  // Ready for the next backward: empty buckets, nothing launched. A collective of a failed sync
  // (`collectives_done` false) may still be running on the old group and write into its bucket's
  // buffer (Gloo's ring adds what a live neighbour sent, in place): the buckets get fresh buffers,
  // and the old ones are left to it.
  void ClearBucketsLocked(bool collectives_done) {
    for (Bucket& b : buckets_) {
      if (collectives_done) {
        b.buffer.zero_();
      } else {
        b.buffer = torch::zeros_like(b.buffer);
      }
      b.ready = 0;
      b.work.reset();
    }
    next_launch_ = 0;
  }

  void LaunchLocked(size_t b) {
    std::vector<torch::Tensor> tensors = {buckets_[b].buffer};
    c10d::AllreduceOptions allreduce;
    allreduce.timeout = ToChrono(options_.timeout);
    ++next_launch_;
    buckets_[b].work = group_->allreduce(tensors, allreduce);
  }

  const SyncOptions options_;
  const RendezvousOptions rendezvous_options_;
  const std::shared_ptr<Rendezvous> rendezvous_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Group> group_;
  const std::string backend_;
  int generation_;
  bool regrouped_ = false;              // Regroup ran: a survivor, whatever generation it started in.
  torch::Device device_ = torch::kCPU;  // Where the parameters live (AllAgree's vote goes there).
  std::mutex mu_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  size_t next_launch_ = 0;
};

}  // namespace

absl::Status SyncOptions::ReadEnvironment(const std::function<const char*(const char*)>& getenv) {
  auto read_int = [&](const char* name, int* out) -> absl::Status {
    const char* value = getenv(name);
    if (value == nullptr) return absl::OkStatus();
    if (!absl::SimpleAtoi(value, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "='", value, "' is not an integer"));
    }
    return absl::OkStatus();
  };
  absl::Status s = read_int("RANK", &rank);
  if (s.ok()) s = read_int("WORLD_SIZE", &world_size);
  if (s.ok()) s = read_int("MASTER_PORT", &master_port);
  if (const char* addr = getenv("MASTER_ADDR")) master_addr = addr;
  return s;
}

absl::Status SyncOptions::Validate() const {
  if (world_size < 1) return absl::InvalidArgumentError("world_size must be >= 1");
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in [0, ", world_size, ")"));
  }
  if (master_port < 1 || master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("master_port ", master_port, " is out of range"));
  }
  if (timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be positive");
  if (bucket_bytes < 1024) return absl::InvalidArgumentError("bucket_bytes must be >= 1024");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DenseSync>> DenseSync::Create(const SyncOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  // Worker 0 hosts the rendezvous on the master address (only there: no other interface), the
  // others join it; every rank announces itself and waits for all the others, within the timeout.
  const std::string where = absl::StrCat("rendezvous at ", options.master_addr, ":", options.master_port, " (rank ",
                                         options.rank, " of ", options.world_size, ")");
  RendezvousOptions rendezvous_options;
  rendezvous_options.host = options.master_addr;
  rendezvous_options.port = options.master_port;
  rendezvous_options.security = options.security;
  rendezvous_options.timeout = options.timeout;
  absl::StatusOr<std::unique_ptr<Rendezvous>> made =
      options.rank == 0 ? HostRendezvous(rendezvous_options) : JoinRendezvous(rendezvous_options);
  if (!made.ok()) return Annotate(made.status(), where);
  std::shared_ptr<Rendezvous> rendezvous(*std::move(made));
  int generation = 0;
  if (options.rank == 0) {
    HYREC_RETURN_IF_ERROR(Annotate(rendezvous->Set(kGenerationKey, "0"), where));
  } else {
    // The first generation this rank has not joined: a process that replaces a lost rank finds
    // its rank in the current one and waits for the survivors to open the next.
    absl::StatusOr<std::string> newest = rendezvous->Get(kGenerationKey, options.timeout);
    if (!newest.ok()) return Annotate(newest.status(), where);
    if (!absl::SimpleAtoi(*newest, &generation) || generation < 0) {
      return absl::InternalError(absl::StrCat(where, ": the generation key holds '", *newest, "'"));
    }
    for (;;) {
      absl::StatusOr<bool> joined = rendezvous->Check({JoinKey(generation, options.rank)});
      if (!joined.ok()) return Annotate(joined.status(), where);
      if (!*joined) break;
      ++generation;
    }
    if (generation > 0) {
      HYREC_RETURN_IF_ERROR(Annotate(rendezvous->Add(WaitingKey(generation), 1).status(), where));
      HYREC_RETURN_IF_ERROR(
          Annotate(rendezvous->Wait({OpenKey(generation)}, 2 * options.timeout),
                   absl::StrCat(where, ": replacing a lost rank, waiting for the others to regroup")));
    }
  }
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<RendezvousStore>(rendezvous, ToChrono(options.timeout));
  HYREC_ASSIGN_OR_RETURN(c10::intrusive_ptr<Group> group,
                         C10dSync::JoinGeneration(options, *rendezvous, store, generation, options.timeout));
  return std::unique_ptr<DenseSync>(
      new C10dSync(options, rendezvous_options, rendezvous, store, std::move(group), BackendName(options), generation));
}

}  // namespace hyrec::nn_sync
