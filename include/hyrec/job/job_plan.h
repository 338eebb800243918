// JobPlan: every role's complete settings, derived once from a JobSpec.
//
// Every way hyrec runs takes its settings from the plan: the embedded `hyrec train` (all roles
// in one process), `hyrec train --processes` (each role its own process, started with the job
// file and its role and index), hand-started `hyrec ps --config`, `hyrec loader --config` and
// `hyrec worker --config`, and the Kubernetes manifests `hyrec k8s render` writes (hyrec/deploy/k8s.h). Table names,
// the slot-to-table map and every table's full configuration are assigned here, once; a role that needs one of them
// reads it from its plan, never from a copy of its own.
//
//   HYREC_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec("examples/configs/user-item.yaml"));
//   HYREC_ASSIGN_OR_RETURN(JobPlan plan, Plan(spec));
//   const PsShardPlan& shard = plan.ps[1];        // shard 1's store: tables, capacity, stripes
//   const WorkerPlan& worker = plan.workers[0];   // model, optimizer, staleness, table per slot
//   std::string ps0 = plan.endpoints.ps[0];       // where shard 0 listens
//   std::cout << shard.store.tables.size() << " tables, " << worker.slot_tables.size() << " features\n";
//
// Endpoints come from the job's `cluster` section; a launcher that picks ports at run time
// (`--processes`) or a role given addresses on its command line replaces them with
// SetEndpoints, which changes nothing else.
#ifndef HYREC_JOB_JOB_PLAN_H_
#define HYREC_JOB_JOB_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/security.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/job/job_spec.h"

namespace hyrec::job {

struct Endpoints {
  std::vector<std::string> ps;  // "host:port" of shard i, in shard order.
  std::string loader;           // "host:port"
  std::string master_addr;      // Worker 0's c10d rendezvous.
  int master_port = 29500;
  double startup_timeout_seconds = 600;  // cluster.startup_timeout_seconds
  double keepalive_seconds = 20;         // cluster.keepalive_seconds
};

struct PsShardPlan {
  int shard_index = 0;
  int num_shards = 1;
  // Every table's full configuration (the table's capacity as this shard's share), the shard's
  // capacity, stripes and admission sketch size.
  embedding_ps::StoreOptions store;
  uint64_t max_ids_per_request = 1 << 22;
  int threads = 0;
  // Where the shard writes checkpoints (checkpoint.dir) and deltas (export.dir); store.track_changes
  // is set when the job takes deltas.
  std::string checkpoint_root;
  std::string export_root;
  // The shard's update log: `<ps.update_log.dir or checkpoint.dir/update-log>/ps-<index>`; empty
  // when the job has none (ps.update_log false, or no checkpoint.dir to truncate it at).
  std::string update_log_dir;
  embedding_ps::LogSync update_log_sync = embedding_ps::LogSync::kEveryGroup;
  double update_log_sync_interval_seconds = 0.1;
};

struct LoaderPlan {
  // The source and batching as the job gives them, with num_workers, num_shards, the slot-to-
  // table map and the id namespaces of shared tables filled in.
  data_loader::LoaderOptions options;
};

struct WorkerPlan {
  int rank = 0;
  int world_size = 1;
  // Per table (the loader's table index): its PS name and dim.
  std::vector<std::string> table_names;
  std::vector<int> table_dims;
  // Per slot (sparse feature, in source order): its name, table, pooling and dim.
  std::vector<std::string> feature_names;
  std::vector<int> slot_tables;
  std::vector<Pooling> pooling;
  std::vector<int> slot_dims;
  // Models with a wide part (UsesWideTables): the last wide_slots slots are dim-1 copies of
  // slots 0 .. wide_slots - 1, looked up in the "<table>_wide" tables the plan adds.
  int wide_slots = 0;
  int num_dense = 0;
  int embedding_staleness = 4;
  ModelSpec model;
  DenseOptimizerSpec dense_optimizer;  // schedule.decay_steps resolved when it was 0
  uint64_t seed = 1;
  std::string device = "cpu";
  int log_every_batches = 100;
  double sync_timeout_seconds = 60;
  double batch_timeout_seconds = 120;
  double heal_timeout_seconds = 60;  // 0: a lost peer is not healed (train.heal_timeout_seconds).
  // With the shards' update logs: how long a PS call waits for a shard to come back (0: the
  // client's default deadline; a lost shard then fails the worker at once).
  double ps_recovery_timeout_seconds = 0;
  // Rows and gradients in fp16 between this worker and the shards (ps.wire_precision).
  bool ps_wire_fp16 = false;
  // With the shards' update logs, worker 0 cuts a checkpoint once one passes this many bytes
  // (ps.update_log.max_bytes); 0: no bound.
  uint64_t update_log_max_bytes = 0;
  // Optimizer steps this worker takes and samples the whole job trains, when the source says
  // (synthetic data, a set number of epochs); 0: unknown.
  int64_t planned_steps = 0;
  uint64_t planned_samples = 0;
  uint64_t epochs = 1;  // The loader's; 0: forever.
  EvalSpec eval;
  // Worker 0 runs the cuts (checkpoints, deltas) and writes the dense state, the manifests and the
  // export; every worker writes its loader position.
  CheckpointSpec checkpoint;
  ExportSpec serving;
  // The held-out split, read by worker 0 alone: the synthetic teacher's samples from index 2^40
  // (eval.samples of them), or eval.files in the training format; one epoch, no shuffle.
  data_loader::LoaderOptions eval_loader;
  bool has_eval_data = false;  // A synthetic source or eval.files.
  // The test split (eval.test_files, or eval.test_samples synthetic samples after the held-out
  // ones), read the same way.
  data_loader::LoaderOptions test_loader;
  bool has_test_data = false;
  bool synthetic = false;  // The teacher's AUC (the best reachable) is known.
  // A stream source (loader.source.kafka): worker 0 commits each checkpoint's offsets to its group.
  std::optional<data_loader::KafkaOptions> stream;
  // A stream without end (KafkaOptions::ends false): a stop request (SIGTERM, Ctrl-C) is how the
  // job ends, so it then exports as at the end of data and its processes exit 0.
  bool ends_on_stop() const { return stream.has_value() && !stream->ends(); }
  // Whether a run that a stop request ended (`interrupted`) stopped short of its end: what decides
  // exit code 130, checkpoint.on_interrupt over at_end, and no export.
  bool StoppedShort(bool interrupted) const { return interrupted && !ends_on_stop(); }
};

struct JobPlan {
  JobSpec spec;
  std::vector<PsShardPlan> ps;  // One per shard.
  LoaderPlan loader;
  std::vector<WorkerPlan> workers;  // One per rank.
  Endpoints endpoints;
};

// Plans a validated spec (ValidateJobSpec is run again): InvalidArgument naming the key when the
// combination cannot run (a schedule that needs a step count the source cannot give, a dense
// model too large to build).
absl::StatusOr<JobPlan> Plan(const JobSpec& spec);

// Loads, parses and plans a job file.
absl::StatusOr<JobPlan> PlanJobFile(const std::string& path, const std::vector<std::string>& overrides = {});

// Replaces the endpoints; empty arguments (and master_port 0) keep the current ones. The number
// of PS addresses must equal the shard count.
absl::Status SetEndpoints(const std::vector<std::string>& ps, const std::string& loader, const std::string& master_addr,
                          int master_port, JobPlan* plan);

// The security options of `identity` in this job: off with security.mode none, else the files
// of the identity under `certs_dir` (empty: the job's security.dir), and the token secret when
// the job takes tokens and the identity serves (ps, loader).
SecurityOptions RoleSecurity(const SecuritySpec& security, const Identity& identity, const std::string& certs_dir);

// Whether a built-in model kind has a wide (linear) part over the sparse features: wide_deep,
// deepfm and fm. The plan then adds, per table T, a dim-1 table "T_wide" (its optimizer,
// initialized to zeros) and per feature f a slot "f_wide" that repeats f's ids in it.
bool UsesWideTables(const std::string& kind);

// Dense parameters of the built-in models (dlrm, dcn, lr, wide_deep, deepfm, fm) for a worker's plan; 0 for other
// kinds.
uint64_t DenseParameterCount(const WorkerPlan& worker);

// Splits "host:port"; InvalidArgument naming `what` when it is not of that shape.
absl::Status SplitHostPort(const std::string& address, absl::string_view what, std::string* host, int* port);

}  // namespace hyrec::job

#endif  // HYREC_JOB_JOB_PLAN_H_
