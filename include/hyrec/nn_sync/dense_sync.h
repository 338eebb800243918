// DenseSync: synchronous data-parallel training of the dense network through LibTorch's c10d.
//
// Every dense worker holds a full replica of the dense parameters. DenseSync makes them start
// equal (broadcast from rank 0) and stay equal: during backward, gradients are packed into
// flattened buckets (in reverse parameter order, as they become ready) and each bucket's
// allreduce is launched as soon as its last gradient arrives, overlapping communication with the
// rest of backward; FinishGradientSync waits for them and leaves the averaged gradient in every
// parameter's .grad(), so the same optimizer step keeps the replicas identical.
//
//   SyncOptions options;                       // rank, world size, MASTER_ADDR/PORT, timeout
//   HYREC_ASSIGN_OR_RETURN(auto sync, DenseSync::Create(options));
//   torch::nn::Linear model(4, 1);
//   HYREC_RETURN_IF_ERROR(sync->BroadcastParameters(model->parameters()));
//   sync->AttachToParameters(model->parameters());
//   torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
//   for (int step = 0; step < 100; ++step) {
//     optimizer.zero_grad();
//     torch::Tensor loss = model->forward(torch::randn({8, 4})).pow(2).mean();
//     loss.backward();                         // buckets start their allreduce here
//     HYREC_RETURN_IF_ERROR(sync->FinishGradientSync());
//     optimizer.step();
//   }
//
// Backend: ProcessGroupGloo on CPU; ProcessGroupNCCL when LibTorch was built with CUDA and the
// parameters live on a GPU (compiled in only with a CUDA LibTorch; chosen at run time from the
// worker's device). Rendezvous goes through a store rank 0 hosts on master_addr:master_port
// only (gRPC; mTLS with `security`, admitting only the job's workers), in place of c10d's
// TCPStore, which listens on every interface and admits anyone. Every collective and the
// rendezvous have `timeout`: a dead or frozen peer becomes an error Status, never a hang.
//
// Generations: a group that lost a member heals. When a collective fails because a rank died
// or froze, the survivors call Regroup; a replacement started with the lost rank's options
// joins through Create, which finds that rank already in the current generation and waits for
// the next. Together they form generation + 1, a new process group on a fresh key prefix of the
// same rendezvous (as c10d's new_group does), and go on; what they exchange to agree on the
// dense state is the caller's (BroadcastBytes, AllGather). Worker 0 hosts the rendezvous: when
// it is lost nothing can regroup, and Regroup and a replacement's Create fail within their
// timeouts.
//
// Thread safety: one DenseSync per worker, used from the training thread (the gradient hooks run
// on autograd's thread during backward).
#ifndef HYREC_NN_SYNC_DENSE_SYNC_H_
#define HYREC_NN_SYNC_DENSE_SYNC_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/common/security.h"

namespace hyrec::nn_sync {

enum class SyncBackend { kAuto, kGloo, kNccl };

struct SyncOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  absl::Duration timeout = absl::Seconds(60);  // Rendezvous and every collective.
  size_t bucket_bytes = 4 << 20;               // Gradient bytes per allreduce bucket.
  // kAuto: NCCL when the parameters live on a GPU (device_is_cuda), Gloo otherwise.
  SyncBackend backend = SyncBackend::kAuto;
  bool device_is_cuda = false;
  // This rank's identity's files for the rendezvous (mTLS: rank 0 presents worker 0's
  // certificate, the others check that name). Off by default: ranks that are threads of one
  // process, or a trusted network.
  SecurityOptions security;

  // Fills rank, world_size, master_addr and master_port from the variables Kubernetes jobs and
  // torchrun set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as `getenv` returns them; a
  // missing variable keeps the current value, a malformed one is InvalidArgument naming it.
  absl::Status ReadEnvironment(const std::function<const char*(const char*)>& getenv);
  absl::Status Validate() const;
};

class DenseSync {
 public:
  // Joins the group: connects to (or, on rank 0, hosts) the rendezvous and creates the process
  // group. UNAVAILABLE when rank 0 cannot bind master_addr:master_port. DEADLINE_EXCEEDED /
  // UNAVAILABLE when the peers do not all arrive within the timeout. A rank that already joined
  // the rendezvous's current generation (this process replaces a lost one) waits up to twice the
  // timeout for the survivors to open the next generation and joins that (replacement()).
  static absl::StatusOr<std::unique_ptr<DenseSync>> Create(const SyncOptions& options);
  virtual ~DenseSync() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_name() const = 0;

  // Copies rank 0's values of `params` into every rank's.
  virtual absl::Status BroadcastParameters(const std::vector<torch::Tensor>& params) = 0;

  // Assigns `params` to buckets and registers their gradient hooks. Call once, before training.
  virtual void AttachToParameters(const std::vector<torch::Tensor>& params) = 0;

  // Completes this backward's allreduces (launching buckets whose gradients never arrived, with
  // zeros) and writes the averaged gradients into the parameters' .grad().
  virtual absl::Status FinishGradientSync() = 0;

  // Averages `values` across ranks in place (metrics, evaluation counts).
  virtual absl::Status AllreduceMean(torch::Tensor values) = 0;

  // The smallest of every rank's `value` (one allreduce of one small integer, on the parameters'
  // device once AttachToParameters ran): how ranks agree, e.g. whether all of them go on. Every
  // rank must call it at the same point; `timeout` bounds the wait for the slowest rank (one that
  // was evaluating, say).
  virtual absl::StatusOr<int> AllMin(int value, absl::Duration timeout) = 0;

  // The group's generation: 0 for the group the job started with.
  virtual int generation() const = 0;
  // Whether Create joined a later generation in place of a lost rank.
  virtual bool replacement() const = 0;
  // After a collective failed: leaves this generation's group and forms the next one with every
  // rank (the survivors and the lost ranks' replacements), within `timeout`. The gradient
  // buckets start empty. DEADLINE_EXCEEDED when a rank does not come; UNAVAILABLE when the
  // rendezvous (worker 0) is gone.
  virtual absl::Status Regroup(absl::Duration timeout) = 0;
  // Whether a replacement for a lost rank waits for the survivors to open the next generation
  // (it says so through the rendezvous before it waits). A survivor learns of a lost peer in a
  // collective; one that waits for something else (its next batch) asks this now and then, and
  // regroups when it is true. One rendezvous call, bounded by the timeout.
  virtual absl::StatusOr<bool> ReplacementWaiting() = 0;
  // Copies rank `root`'s bytes (any length) into every rank's.
  virtual absl::Status BroadcastBytes(std::string* bytes, int root) = 0;
  // Every rank's `value`, in rank order.
  virtual absl::StatusOr<std::vector<int64_t>> AllGather(int64_t value) = 0;
};

}  // namespace hyrec::nn_sync

#endif  // HYREC_NN_SYNC_DENSE_SYNC_H_
