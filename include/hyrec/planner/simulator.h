// A discrete-event model of one training job: its workers with their staleness window, the PS
// shards with their service times, the loader, the network and added latency; it predicts the
// samples/s, the time a batch waits for its rows, the observed staleness and what bounds the
// rate. Its costs are measured ones (StepCosts, from `hyrec plan --calibrate --config=...`);
// docs/capacity.md describes the model and how it was checked against measured runs.
//
//   HYREC_ASSIGN_OR_RETURN(Calibration c, ReadCalibration("calibration.yaml"));  // capacity.h
//   const StepCosts& costs = c.step;  // hyrec plan --calibrate --config=job.yaml measured it
//   SimulationOptions o;
//   o.workers = 2;
//   o.shards = 4;
//   o.staleness = 4;
//   o.added_rtt_ms = 10;
//   SimulationResult r = Simulate(costs, o);
//   std::cout << r.samples_per_second << " samples/s, bound by " << ResourceName(r.bottleneck) << "\n";
//
// What it models, as the trainer (dense_worker/trainer.h) behaves:
// - A worker's training thread asks for batch n+1 once batch n trained. Lookups run
//   max(1, (s+1)/2) batches ahead; the lookup of batch m waits until batch m-s-1 trained and the
//   updates of every batch < m-s were acknowledged (the wait blocks the training thread).
// - A lookup is one RPC to every shard at once: the worker's client work (its threads, at nice 10
//   against remote shards), the network (added round trip, bytes over each machine's egress
//   link), the shard's service (its own CPU), back; the rows are ready when every shard answered.
//   An update goes the same way after the batch trained and is acknowledged when every shard
//   applied it.
// - The dense step is CPU on the worker's training thread; with several workers each step ends
//   with the others' (the synchronous allreduce).
// - The loader's threads make each worker's batches ahead, up to prefetch_batches a worker.
// - CPU is shared as Linux shares it among runnable threads: in proportion to their nice weights,
//   at most one core a thread. Every role either shares one machine (as `hyrec train
//   --processes` runs) or has machines of its own (as on a cluster).
#ifndef HYREC_PLANNER_SIMULATOR_H_
#define HYREC_PLANNER_SIMULATOR_H_

#include <string>
#include <vector>

#include "hyrec/common/enum_names.h"

namespace hyrec::planner {

// The costs of one worker batch, measured on one machine. CPU figures are milliseconds of one
// core; "all shards" figures are the sum over the shards the costs were measured with.
struct StepCosts {
  int batch_size = 0;
  // The worker's training thread: pooling, forward, backward, the dense optimizer step and the
  // rows' gradients.
  double train_ms = 0;
  // The worker's other threads: a batch's lookup (requests, rows, embedding_bag's indices) and
  // its update (gradients), all shards; and its batch from the loader.
  double lookup_client_ms = 0;
  double update_client_ms = 0;
  // The PS shards serving a batch's lookup and its update, all shards.
  double lookup_server_ms = 0;
  double update_server_ms = 0;
  // The loader making and sending one batch.
  double loader_ms = 0;
  // What one RPC (one lookup or update to one shard) costs whatever its rows, on each side: part
  // of the figures above; the rest spreads over the shards with the rows.
  double rpc_client_ms = 0;
  double rpc_server_ms = 0;
  int shards = 1;  // The shards the figures above were measured with.
  // Bytes of a batch on the network: the ids of its lookups (sent again with the update), the
  // rows that come back (and the gradients that go out, as many), the batch itself (loader to
  // worker) and the dense gradients each worker sends and receives in the allreduce.
  double id_bytes = 0;
  double row_bytes = 0;
  double batch_bytes = 0;
  double dense_bytes = 0;
  // Measured where every role shares one machine (as `hyrec train --processes` runs them): the
  // CPU of the relays that delay the messages between workers and shards (`--ps_latency_ms`;
  // all shards, both ways), and the cores the job's processes kept busy together.
  double relay_ms = 0;
  double cores_used = 0;
  double samples_per_second = 0;  // The rate of the run they were measured in.
};

// What a message's bytes take on a link: TCP/IP (with timestamps) and Ethernet headers, 66 bytes
// for each full segment of 1,448 bytes of payload.
inline constexpr double kLinkFraming = (1448.0 + 66.0) / 1448.0;

struct SimulationOptions {
  int workers = 1;
  int shards = 1;
  int staleness = 4;         // train.embedding_staleness
  int batches = 200;         // Per worker.
  int warmup_batches = 5;    // Not counted in the rate (as hyrec train's steady rate).
  double added_rtt_ms = 0;   // Added round trip between the workers and each shard.
  int loader_threads = 1;    // loader.threads
  int prefetch_batches = 8;  // A worker's batches the loader may hold ready.
  // Placement. one_machine: every role on one machine of machine_cores cores (as hyrec train
  // --processes runs). Otherwise each worker has a machine of worker_cores, the shards share
  // ps_machines machines of ps_cores (shards spread evenly), the loader has loader_machines of
  // loader_cores (each worker's stream on one of them), and each machine's egress link carries
  // network_gbps (0: unbounded), each message's bytes with their framing (kLinkFraming).
  bool one_machine = true;
  int machine_cores = 2;
  // Of machine_cores, what the job's threads can keep busy together (0: all of them): below the
  // cores where runnable threads wait for one while another idles (docs/capacity.md).
  double usable_cores = 0;
  // One machine: the messages between workers and shards pass through relays on it (hyrec train
  // --ps_latency_ms), which cost StepCosts::relay_ms.
  bool relay = false;
  int worker_cores = 8;
  int ps_machines = 1;
  int ps_cores = 8;
  int loader_machines = 1;
  int loader_cores = 8;
  double network_gbps = 0;
};

// What a simulated job spends its time on, and what bounds it.
enum class Resource {
  kDenseStep,      // The workers' training threads.
  kPsCpu,          // The PS machines' cores.
  kPsNetwork,      // The PS machines' links.
  kLoader,         // The loader's threads.
  kWorkerNetwork,  // The workers' links.
  kWorkerCpu,      // The workers' other threads (lookups, updates, pooling).
  kCpu,            // Every core of one machine, every role on it.
  kLatency,        // None busy: round trips the staleness window does not hide.
};
inline constexpr EnumName<Resource> kResourceNames[] = {{Resource::kDenseStep, "dense step"},
                                                        {Resource::kPsCpu, "PS CPU"},
                                                        {Resource::kPsNetwork, "PS network"},
                                                        {Resource::kLoader, "loader"},
                                                        {Resource::kWorkerNetwork, "worker network"},
                                                        {Resource::kWorkerCpu, "worker CPU"},
                                                        {Resource::kCpu, "CPU"},
                                                        {Resource::kLatency, "latency"}};
inline const char* ResourceName(Resource r) { return NameOf(kResourceNames, r); }

struct SimulationResult {
  double samples_per_second = 0;  // Every worker's samples after the warm-up, over the time they took.
  double wait_for_rows_ms = 0;    // Mean time a worker's training thread waited for a batch's rows.
  double wait_for_acks_ms = 0;    // Mean time it waited for updates to be acknowledged (the window).
  double wait_for_loader_ms = 0;  // Mean time it waited for a batch from the loader.
  double observed_staleness = 0;  // As TrainerStats::observed_staleness.
  double lookup_ms = 0;           // Mean wall time of a batch's lookups.
  double update_ms = 0;           // Mean wall time of a batch's update, until acknowledged.
  // Busy fraction of each resource over the timed part, the busiest first: on one machine the
  // dense step and kCpu, else each but kCpu and kLatency.
  struct Use {
    Resource resource = Resource::kCpu;
    double busy = 0;
  };
  std::vector<Use> utilization;
  // What bounds the rate: the busiest resource when it is busy at least 85% of the time, else
  // kLatency.
  Resource bottleneck = Resource::kLatency;
};

SimulationResult Simulate(const StepCosts& costs, const SimulationOptions& options);

// The cores every role sharing one machine can keep busy together, from the run `costs` were
// measured in (`calibration`: its configuration, one machine): when Simulate, given every core,
// predicts that run faster than it measured (costs.samples_per_second), the cores with which it
// predicts the measured rate; 0 (every core) otherwise. Without a measured rate: the run's
// cores_used when Simulate finds it bound by the CPU. SimulationOptions::usable_cores for the
// configurations predicted from it.
double UsableCores(const StepCosts& costs, SimulationOptions calibration);

}  // namespace hyrec::planner

#endif  // HYREC_PLANNER_SIMULATOR_H_
