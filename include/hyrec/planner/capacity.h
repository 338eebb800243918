// Capacity planning (`hyrec plan`): what a job needs at a given scale: rows, memory per PS shard
// and per machine, and the bytes each training step moves. Memory comes from the store's own
// accounting (embedding_ps::PlanStoreMemory), ids per batch and their deduplication from the
// job's own data (docs/capacity.md).
//
//   HYREC_ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJobFile("job.yaml"));
//   CapacityOptions o;
//   o.parameters = 100e12;  // --parameters=100T
//   HYREC_ASSIGN_OR_RETURN(CapacityPlan c, PlanCapacity(plan, o));
//   std::cout << FormatCapacityPlan(c);
#ifndef HYREC_PLANNER_CAPACITY_H_
#define HYREC_PLANNER_CAPACITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/job/job_plan.h"
#include "hyrec/planner/simulator.h"

namespace hyrec::planner {

// A machine type: what the pods of one node may use. The GKE list (GkeMachineTypes) holds each
// type's published vCPUs, memory and egress bandwidth: assumptions, not measurements.
struct MachineType {
  std::string name;
  int cpus = 0;
  double memory_gib = 0;
  double network_gbps = 0;    // Egress bandwidth; 0: unknown.
  double price_per_hour = 0;  // 0: unknown.
  int gpus = 0;
  std::string accelerator;   // cloud.google.com/gke-accelerator, for GPU machines.
  double local_ssd_gib = 0;  // Local SSD the machine comes with (a PS disk tier's); 0: none.
};

// What pods of a node may request: about nine tenths of its memory, less a GiB (what GKE
// reserves for the system).
double AllocatableGiB(const MachineType& machine);
const std::vector<MachineType>& GkeMachineTypes();
// `name` among `types`; InvalidArgument naming `key` and the known names otherwise.
absl::StatusOr<MachineType> FindMachineType(const std::vector<MachineType>& types, const std::string& name,
                                            absl::string_view key);
// Machine types from a YAML file: a list of maps with name, cpus, memory_gib, network_gbps,
// price_per_hour, gpus and accelerator (name, cpus and memory_gib required). Errors name the
// file, the entry and its line.
absl::StatusOr<std::vector<MachineType>> LoadMachineTypes(const std::string& path);

// What pods of a node may request in CPU: nine tenths of its vCPUs, whole ones (at least 1).
double AllocatableCpus(const MachineType& machine);

// How a job's PS shards are placed on machines of one type, as `hyrec plan` prints it and `hyrec
// k8s render` requests it: a node holds as many shards as its allocatable memory fits at the
// largest shard's request, and as its allocatable CPUs give each at least `min_cpus`, never more
// than the job has; the shards spread evenly over `machines` nodes, and each pod requests an equal
// share of its node's allocatable CPUs (millicores) and its shard's memory.
struct PsPlacement {
  int shards_per_machine = 0;  // The most one node holds.
  int machines = 0;
  int pods_per_machine = 0;  // Spread evenly: ceil(shards / machines).
  double cpus_per_pod = 0;
  uint64_t memory_per_pod = 0;  // The largest shard's request.
};
// The CPU a PS shard is given at least: ps.threads when the job sets it, else kPsMinCpus.
inline constexpr double kPsMinCpus = 2;
double PsMinCpus(const job::JobPlan& plan);
// `disk_bytes_per_shard`: each shard's disk tier (ps.disk.capacity_bytes), on the machine's
// local SSD; 0: none.
PsPlacement PlacePsShards(const MachineType& machine, int shards, uint64_t largest_request_bytes, double min_cpus,
                          uint64_t disk_bytes_per_shard = 0);

// A count with an optional suffix K, M, G, T or P (powers of 1000): "100T" is 1e14. InvalidArgument
// naming `key` for anything else, or a count that is not positive or passes `max`.
absl::StatusOr<double> ParseCount(absl::string_view text, absl::string_view key, double max = 1e21);

struct CapacityOptions {
  // Each table's logical rows: the ids it will see over the job. 0: from `parameters`, else the
  // table's capacity, else a synthetic source's vocabulary; a table with none of these is planned
  // at its store's bound (ps.capacity_rows, ps.capacity_bytes), or, without one, an error naming it.
  uint64_t rows_per_table = 0;
  // Logical parameters over every table (rows x dim), as rows spread evenly over the tables.
  double parameters = 0;
  int workers = 0;     // 0: the job's.
  int batch_size = 0;  // 0: the job's.
  int ps_shards = 0;   // 0: the job's.
  std::string ps_machine = "m3-megamem-64";
  std::vector<MachineType> machines;  // Empty: GkeMachineTypes().
  // Unique ids a batch over its ids, the same for every table; 0: measured on `measure_batches`
  // batches of the job's own data (1, and said so, when its data cannot be read here). With
  // measure_batches 0 the data is not read: one id a feature.
  double dedup_ratio = 0;
  int measure_batches = 20;
  // A PS process's memory beside its store and what it serves: the binary, gRPC, its threads. An
  // assumption, which `hyrec plan --calibrate` replaces with this machine's measurement.
  uint64_t process_bytes = 256ull << 20;
  // What serving holds beside that: the buffers of the lookups in flight, which the allocator
  // keeps once used: serving_fixed_bytes + serving_per_byte x the bytes of the responses a shard
  // has in flight for one batch of every worker (each table's rows). Assumptions until calibrated.
  uint64_t serving_fixed_bytes = 4ull << 20;
  double serving_per_byte = 6;
};

struct CapacityPlan {
  struct Table {
    std::string name;
    int dim = 0;
    std::string optimizer;
    std::string precision;  // Of the weights: fp32 or fp16.
    std::string eviction;
    uint64_t logical_rows = 0;   // 0: unknown (no size of its own, planned at its store's bound).
    uint64_t capacity_rows = 0;  // Over every shard; 0: unbounded.
    uint64_t resident_rows = 0;  // Over every shard: the logical rows, bounded by the capacities.
    // Bytes of one resident row, by what holds them: its key (8), eviction state beside the row
    // (none: its score is in its index entry), values (the weights in the table's precision: 4 dim
    // for fp32, 2 dim for fp16, padded to 4 bytes), optimizer state, and its share of
    // the index and of the slabs' last chunks.
    uint32_t key_bytes = 8;
    uint32_t eviction_bytes = 0;
    uint32_t value_bytes = 0;
    uint32_t state_bytes = 0;
    double index_bytes = 0;
    double bytes_per_row = 0;   // All of the above.
    double ids_per_sample = 0;  // Over the features that look it up.
    double dedup_ratio = 1;     // Unique ids a batch over its ids.
  };
  struct Shard {
    int index = 0;
    uint64_t resident_rows = 0;
    uint64_t store_bytes = 0;     // PlanStoreMemory: the store's accounting with these rows.
    uint64_t process_bytes = 0;   // CapacityOptions::process_bytes.
    uint64_t serving_bytes = 0;   // The lookups in flight (CapacityOptions::serving_*).
    uint64_t response_bytes = 0;  // The responses of one batch of every worker, fp32.
    uint64_t memory_bytes = 0;    // All three: the resident memory planned.
    uint64_t request_bytes = 0;   // The pod's request: at capacity (widest tables first), with 20% headroom.
    // With a disk tier (ps.disk): the rows on disk (in resident_rows too), the file they take
    // (PlanDiskTier) and the DRAM of its index (in memory_bytes and request_bytes).
    uint64_t disk_rows = 0;
    uint64_t disk_bytes = 0;
    uint64_t disk_index_bytes = 0;
  };
  std::vector<Table> tables;
  std::vector<Shard> shards;
  double logical_parameters = 0;
  double resident_parameters = 0;
  int workers = 0;
  int batch_size = 0;
  MachineType ps_machine;
  PsPlacement placement;       // The PS pods on ps_machine (PlacePsShards).
  int shards_per_machine = 0;  // placement.shards_per_machine.
  int ps_machines = 0;         // placement.machines.
  // One training step (a batch on every worker), between the workers and the PS: the ids sent,
  // the rows that come back, and the gradients (with their ids) sent after, in fp32 and with fp16
  // rows; and the loader's batches to the workers as the loader encodes them (each id as the slot's,
  // 8 bytes, and as an index among its table's unique ids, 4, with the unique ids; dense features,
  // labels and offsets 4 bytes each). Payload only: the wire adds its framing (a few percent:
  // docs/capacity.md).
  double id_bytes_per_step = 0;
  double row_bytes_per_step_fp32 = 0;
  double gradient_bytes_per_step_fp32 = 0;
  double loader_bytes_per_step = 0;
  // How the ids per sample and the deduplication were found: "measured on N batches of the job's
  // data", "given", or why they were not measured.
  std::string ids_source;
};

// Plans `plan` at the scale `options` gives. InvalidArgument naming the key for a table without a
// size, an unknown machine type, or a shard that no machine of its type can hold.
absl::StatusOr<CapacityPlan> PlanCapacity(const job::JobPlan& plan, const CapacityOptions& options);

// The resident rows of each table of a shard at its capacity, the widest tables filled first up
// to the store's own bound (the most memory its rows can take); empty when nothing bounds it.
std::vector<uint64_t> RowsAtCapacity(const embedding_ps::StoreOptions& store);

// What `hyrec plan --calibrate` measures on this machine, and the plan then uses in place of its
// assumptions.
struct Calibration {
  std::string machine;  // This host's name.
  int cpus = 0;
  uint64_t process_bytes = 0;  // A PS process's resident memory with an empty store.
  // Its growth while serving lookups, beyond the rows they add: fixed + per byte of response
  // (fitted on responses of 1 MiB and 4 MiB).
  uint64_t serving_fixed_bytes = 0;
  double serving_per_byte = 0;
  // The store's lookup and Adagrad update of random stored rows (1M rows of dim 16, batches of
  // 4,096), in one thread.
  double lookup_ns_per_row = 0;
  double update_ns_per_row = 0;
  // Calls to that PS process on loopback, one at a time (a table of dim rpc_dim, Adagrad), in
  // CPU time on each side: what every call costs whatever its rows (lookups and updates alike),
  // and each row more.
  int rpc_dim = 0;
  double rpc_client_us = 0;
  double rpc_server_us = 0;
  double lookup_client_ns_per_row = 0;
  double lookup_server_ns_per_row = 0;
  double update_client_ns_per_row = 0;
  double update_server_ns_per_row = 0;
  // With `hyrec plan --calibrate --config=JOB`: the job file and what one of its batches costs
  // here (MeasureStepCosts); empty `job` otherwise.
  std::string job;
  StepCosts step;
};
// Measures: starts `ps_binary` (hyrec-ps) on a one-table job in `scratch_dir` for the process's
// memory, empty and while it serves lookups, and times an in-process store.
absl::StatusOr<Calibration> Calibrate(const std::string& ps_binary, const std::string& scratch_dir);
// Times calls of 16 and 4,096 ids to a PS process (pid `ps_pid`, serving `table` of dim `dim`)
// through `client`, one at a time, and fills c's rpc_* and *_ns_per_row figures.
absl::Status MeasureRpcCosts(embedding_ps::EmbeddingClient& client, const std::string& table, int dim, int ps_pid,
                             Calibration* c);
// Runs `train_binary` (hyrec-train) --processes on `config` (with `overrides`, one worker) for
// `batches` batches after a warm-up, reads the CPU time of each role's process and of the worker's
// training thread from /proc, and stops it. The per-batch figures divide what was measured; the
// split between lookups and updates and the per-call costs come from `machine`
// (MeasureRpcCosts), the bytes from `capacity` (the same job planned at its own scale).
// FailedPrecondition when the job ends before enough batches, with its last lines.
struct StepMeasureOptions {
  int batches = 200;   // Timed, after max(10, batches / 5) of warm-up.
  bool relay = false;  // Through hyrec train's delaying relays, adding no delay (--ps_latency_ms=0): relay_ms.
};
absl::StatusOr<StepCosts> MeasureStepCosts(const std::string& train_binary, const std::string& config,
                                           const std::vector<std::string>& overrides, const job::JobPlan& plan,
                                           const CapacityPlan& capacity, const Calibration& machine,
                                           const StepMeasureOptions& options);

// `c` measured at its batch size, at `batch_size`, where a batch looks up rows of `id_bytes` (8
// a unique id) and `row_bytes` (0: in proportion to the batch): the training thread and the loader
// grow with the batch, the PS and the client's work a row and the relays with the rows; what each
// call costs whatever its rows stays.
StepCosts ScaleStepCosts(const StepCosts& c, int batch_size, double id_bytes, double row_bytes);

// The expected rate of a planned job on machines of its own: its workers on `worker_machine`
// nodes (one a worker), its shards on the plan's PS machines, `loader_machines` loader nodes,
// each machine's egress at the PS machine type's bandwidth; costs measured on this machine
// (Calibration::step) and scaled to the plan's batch size.
struct ThroughputOptions {
  StepCosts costs;
  std::vector<MachineType> machines;  // Empty: GkeMachineTypes().
  std::string worker_machine = "a2-highgpu-1g";
  std::string loader_machine = "c2-standard-30";
  int loader_machines = 0;   // 0: one a worker.
  double dense_step_ms = 0;  // A batch's dense step where the workers run (a GPU's); 0: costs.train_ms.
  int staleness = -1;        // -1: the job's train.embedding_staleness.
  double added_rtt_ms = 0;   // The network's round trip between workers and PS machines.
  bool fp16 = false;         // Rows and gradients travel in fp16: half their bytes (not the conversion's CPU).
  int batches = 60;          // Simulated batches a worker.
};
struct ThroughputPlan {
  StepCosts costs;  // As simulated.
  MachineType worker_machine, loader_machine;
  bool fp16 = false;
  SimulationOptions cluster_options;
  SimulationResult cluster;
};
// InvalidArgument naming --worker_machine or --loader_machine for a type not in o.machines.
absl::StatusOr<ThroughputPlan> PlanThroughput(const job::JobPlan& plan, const CapacityPlan& capacity,
                                              const ThroughputOptions& o);

// The planned job's rate at each of `workers` (the shards and PS machines as planned, one loader
// machine a worker unless ThroughputOptions says otherwise): weak scaling keeps the batch a
// worker; strong scaling keeps the global batch (the plan's batch x its workers) and splits it.
// Efficiency: samples/s over (the first point's samples/s a worker x workers).
struct ScalingPoint {
  int workers = 0;
  int batch_size = 0;  // A worker's.
  double efficiency = 0;
  SimulationResult result;
};
std::vector<ScalingPoint> ScalingCurve(const job::JobPlan& plan, const CapacityPlan& capacity,
                                       const ThroughputOptions& o, bool weak, const std::vector<int>& workers);
std::string FormatScaling(const std::vector<ScalingPoint>& weak, const std::vector<ScalingPoint>& strong);

std::string FormatSimulationResult(const SimulationResult& r);
std::string FormatThroughputPlan(const ThroughputPlan& t, const Calibration& c);

absl::Status WriteCalibration(const Calibration& calibration, const std::string& path);
// Errors name the file, the key and its line.
absl::StatusOr<Calibration> ReadCalibration(const std::string& path);

// A process's resident memory (VmRSS), from /proc; NotFound when there is no such process.
absl::StatusOr<uint64_t> ResidentBytes(int pid);

// The memory the Kubernetes renderer requests for shard `shard`'s pod: PlanCapacity's request with
// every table past its capacity and without reading the job's data (one id a feature, no
// deduplication). 0 when nothing bounds the shard.
uint64_t PodRequestBytes(const job::JobPlan& plan, int shard);

std::string FormatCapacityPlan(const CapacityPlan& plan);
// With `throughput` (PlanThroughput's) under "throughput"; null there without.
std::string CapacityPlanJson(const CapacityPlan& plan, const ThroughputPlan* throughput = nullptr);

}  // namespace hyrec::planner

#endif  // HYREC_PLANNER_CAPACITY_H_
