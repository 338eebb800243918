// JobSpec: one training job as its YAML file describes it, parsed and validated.
//
// A job names its input features (the source's sparse columns, in order) and its embedding
// tables: each table has a name, the features it serves (a feature may share a table with
// others, a shared vocabulary, or have its own), a dim, a pooling per feature, a sparse
// optimizer with its settings, an initializer, an admission policy and a capacity. The rest is
// the data source, the dense model, the dense optimizer with its learning-rate schedule, the PS
// shards, the workers and the endpoints of hand-started roles.
//
//   HYREC_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec("examples/configs/user-item.yaml"));
//   for (const TableSpec& t : spec.tables) std::cout << t.config.name << " " << t.config.dim << "\n";
//
// Parsing is strict: an unknown key, a value of the wrong type or shape, or one out of range is
// InvalidArgument naming the key path and the line (with a suggestion for a misspelled key), and
// no document shape throws. docs/configuration.md lists every key with its default. The older
// flat keys (model.embedding_dim, model.pooling, ps.optimizer, ps.learning_rate, ps.init_stddev,
// train.dense_learning_rate) stay as shorthand: they are the defaults of every table and of the
// dense optimizer, and a job without `tables` gets one table per feature, named after it.
//
// This target links neither LibTorch nor gRPC, so tools that only read jobs (the Kubernetes
// renderer, a capacity planner) link it alone.
#ifndef HYREC_JOB_JOB_SPEC_H_
#define HYREC_JOB_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hyrec/common/enum_names.h"
#include "hyrec/data_loader/loader.h"
#include "hyrec/embedding_ps/table_config.h"
#include "hyrec/embedding_ps/update_log.h"

namespace YAML {
class Node;
}

namespace hyrec::job {

// How a feature's ids within one sample are combined into one vector.
enum class Pooling { kSum, kMean, kSqrtN };
absl::string_view PoolingName(Pooling pooling);
absl::StatusOr<Pooling> ParsePooling(absl::string_view name);

// One feature a table serves, and how its ids pool.
struct TableFeature {
  std::string name;
  Pooling pooling = Pooling::kSum;
};

struct TableSpec {
  // name, dim, seed (default: the table's position), initializer, optimizer, admission.
  embedding_ps::TableConfig config;
  std::vector<TableFeature> features;
  // Most rows of the whole table (all shards together; each shard holds its share, rounded up);
  // 0: bounded only by ps.capacity_rows.
  uint64_t capacity_rows = 0;
};

// The dense optimizer's learning rate over optimizer steps: a linear warm-up from 0 over
// `warmup_steps`, then constant, or a linear or cosine decay that reaches
// `final_fraction` x the base rate at step `decay_steps` and stays there.
struct LrSchedule {
  enum class Kind { kConstant, kLinear, kCosine };
  Kind kind = Kind::kConstant;
  int64_t warmup_steps = 0;
  // Step at which the decay ends (counted from the first step, warm-up included); 0: the job's
  // planned steps per worker (known only for a synthetic source with a set number of epochs).
  int64_t decay_steps = 0;
  double final_fraction = 0.0;

  // The multiplier of the base rate for optimizer step `step` (0-based), in (0, 1].
  double Factor(int64_t step) const;
};
inline constexpr EnumName<LrSchedule::Kind> kLrScheduleNames[] = {{LrSchedule::Kind::kConstant, "constant"},
                                                                  {LrSchedule::Kind::kLinear, "linear"},
                                                                  {LrSchedule::Kind::kCosine, "cosine"}};
inline absl::string_view LrScheduleName(LrSchedule::Kind kind) { return NameOf(kLrScheduleNames, kind); }

enum class DenseOptimizerKind { kAdam, kAdamW, kAdagrad, kSgd };
inline constexpr EnumName<DenseOptimizerKind> kDenseOptimizerNames[] = {{DenseOptimizerKind::kAdam, "adam"},
                                                                        {DenseOptimizerKind::kAdamW, "adamw"},
                                                                        {DenseOptimizerKind::kAdagrad, "adagrad"},
                                                                        {DenseOptimizerKind::kSgd, "sgd"}};

struct DenseOptimizerSpec {
  DenseOptimizerKind kind = DenseOptimizerKind::kAdam;
  double learning_rate = 1e-3;
  double weight_decay = 0.0;  // L2 added to the gradient; adamw: decoupled from it
  double momentum = 0.0;      // sgd
  double beta1 = 0.9;         // adam, adamw
  double beta2 = 0.999;       // adam, adamw
  double epsilon = 1e-8;      // adam, adamw, adagrad
  LrSchedule schedule;
};

struct ModelSpec {
  std::string kind = "dlrm";  // dlrm | dcn | lr | wide_deep | deepfm | fm | torchscript | a registered kind
  int embedding_dim = 16;     // Default table dim; DLRM's interaction dim.
  std::vector<int> bottom = {512, 256};
  std::vector<int> top = {512, 256};
  int cross_layers = 3;  // dcn
  double dropout = 0;    // Dropout after every hidden layer of the MLPs while training.
  // model.options, for a registered model: its own settings, kept as YAML text (a mapping).
  std::string options_yaml;
  // kind torchscript: the module's TorchScript file (torch.jit.save), as given (a relative path is
  // read from each worker's working directory).
  std::string path;
};

// When worker 0 evaluates on the held-out split: every every_batches steps, at every epoch's end,
// and at the end (unless interrupted); the best evaluation is reported beside the last.
struct EvalSpec {
  uint64_t samples = 50'000;       // Held-out synthetic samples.
  std::vector<std::string> files;  // Held-out files (file sources).
  // Test data: never used to choose (not for early stopping, not for the best model); scored
  // once, with the model the job keeps, and reported beside the held-out figure.
  std::vector<std::string> test_files;  // File sources.
  uint64_t test_samples = 0;            // Synthetic sources: test samples, apart from the held-out ones.
  int every_batches = 0;                // 0: not by batches.
  bool every_epoch = false;             // Also at the end of every epoch (file sources: a pass).
  // Early stopping: stop once this many evaluations in a row did not improve on the best (0:
  // never). Needs every_batches or every_epoch.
  int patience = 0;
  std::string metric = "auc";    // What "improve" means: auc (higher) or log_loss (lower).
  double timeout_seconds = 600;  // Other workers wait this long for worker 0's evaluation.
  // Progressive validation: worker 0 scores each of its batches before training on it and
  // reports the AUC and log loss over its last this many samples so scored; 0: off.
  uint64_t progressive_window = 0;
};

struct PsSpec {
  int shards = 2;
  uint64_t capacity_rows = 0;   // Per shard, all tables; 0: unbounded.
  uint64_t capacity_bytes = 0;  // Per shard; 0: unbounded.
  int num_stripes = 64;
  uint32_t admission_sketch_counters = 1 << 20;
  uint64_t max_ids_per_request = 1 << 22;
  int threads = 0;  // gRPC polling threads of a PS process; 0: one per core.
  // The shards' update logs (embedding_ps/update_log.h), which let one restarted shard recover
  // every update it acknowledged. On by default when the job takes checkpoints (the log is
  // truncated at each one); a PS process writes its own under `<dir>/ps-<index>`.
  bool update_log = true;
  std::string update_log_dir;  // Empty: <checkpoint.dir>/update-log.
  embedding_ps::LogSync update_log_sync = embedding_ps::LogSync::kEveryGroup;
  double update_log_sync_interval_seconds = 0.1;
  // When a shard's log passes this many bytes since the last checkpoint, worker 0 cuts one at
  // the next step: what a recovery replays stays bounded. 0: no bound.
  uint64_t update_log_max_bytes = uint64_t{1} << 30;
  // How long a worker's call waits for a shard that is down before it fails: a restarted shard
  // recovers within it (used only when the shards have update logs).
  double recovery_timeout_seconds = 120;
  // How rows and gradients travel between the workers and the shards: false fp32; true fp16
  // (half the bytes, each value rounded to the nearest fp16; the embedded job's in-process
  // shards round alike).
  bool wire_fp16 = false;
  // A disk tier under each shard's DRAM rows (StoreOptions::disk): shard i's file is
  // <disk_dir>/ps-<i>.tier, at most disk_capacity_bytes. Empty dir: none.
  std::string disk_dir;
  uint64_t disk_capacity_bytes = 0;
  int disk_queue_depth = 32;
};

struct TrainSpec {
  int workers = 1;
  int embedding_staleness = 4;
  DenseOptimizerSpec dense_optimizer;
  int log_every_batches = 100;
  uint64_t seed = 1;                   // Dense initialization.
  std::string device = "cpu";          // cpu | cuda | auto
  double sync_timeout_seconds = 60;    // Rendezvous and every collective.
  double batch_timeout_seconds = 120;  // A worker waits this long for its next batch.
  // A lost worker other than worker 0 is replaced and heals from its live peers: the survivors
  // wait this long for the replacement to join the group's next generation. 0: no heal (a lost
  // worker stops the job, which falls back to its latest checkpoint).
  double heal_timeout_seconds = 60;
};

// Where hand-started roles and Kubernetes pods find each other: "host:port" each.
struct ClusterSpec {
  std::vector<std::string> ps;  // One per shard, in shard order; default 127.0.0.1:7000+i.
  std::string loader = "127.0.0.1:7100";
  std::string master = "127.0.0.1:29500";  // Worker 0 hosts the c10d rendezvous here.
  // How long a worker waits at its start for the PS shards and the loader to answer (they may
  // still be starting or restoring), logging what it waits for every 10 s.
  double startup_timeout_seconds = 600;
  // Every connection between the job's roles is closed once its peer has been silent this long
  // (gRPC keepalive, rpc::SetKeepalive), so that a cut-off or frozen host is noticed in bounded
  // time and its calls retried elsewhere. 0: off (the kernel's TCP timeouts, minutes).
  double keepalive_seconds = 20;
  // Hand-started (and Kubernetes) PS shards and the loader exit 0 once the job's workers have
  // finished: when worker 0 says so at the end of a run that was not interrupted (JobDone).
  // false: they serve until stopped.
  bool services_exit_when_done = false;
};

// Checkpoints (docs/checkpoint-format.md): one consistent cut of the whole job, written under
// `dir` by every role (PS shards their rows, worker 0 the dense state and the manifest, every
// worker its loader position), periodically, on SIGUSR1, at the end and on interrupt.
struct CheckpointSpec {
  std::string dir;               // Empty: no checkpoints. Every role must see the same directory.
  int64_t every_steps = 0;       // 0: not by steps.
  double every_seconds = 0;      // 0: not by time.
  int keep_last = 3;             // Committed checkpoints kept (the best evaluation's is kept too).
  bool at_end = true;            // When training ends (the data, early stopping).
  bool on_interrupt = true;      // When training is interrupted (Ctrl-C, SIGTERM).
  bool fail_on_error = false;    // A checkpoint that cannot be written fails the job (else: logged).
  double timeout_seconds = 600;  // Most time the shards may take to write one.
};

// The trained model for serving (hyrec predict): written at the end from the final checkpoint
// (the best evaluation's with early stopping), and deltas of the rows changed since the last.
struct ExportSpec {
  std::string dir;                 // Empty: no export. Needs checkpoint.dir.
  int64_t delta_every_steps = 0;   // 0: no deltas by steps.
  double delta_every_seconds = 0;  // 0: no deltas by time.
  // Compaction, with deltas: once this many deltas were committed since the last base export,
  // the next committed checkpoint is exported as a new base (as are a run's first checkpoint and
  // the next after a delta that failed), so a follower that starts late loads one base and the
  // deltas after it. 0: after the first, bases only at the end.
  int64_t base_every_deltas = 20;
  // With deltas: the base exports kept (the newest); older ones go, with every delta they cover.
  int keep_bases = 2;
  // Whether the job writes deltas at all (then the shards track the rows each changes).
  bool takes_deltas() const { return delta_every_steps > 0 || delta_every_seconds > 0; }
};

// How the job's services authenticate each other (docs/security.md): mutual TLS with the job's
// CA, each role's identity from its certificate, and optionally bearer tokens.
struct SecuritySpec {
  bool mtls = true;  // mode: mtls | none. none: plaintext, any process that reaches a port is trusted.
  // The job's files, as `hyrec certs` writes them: ca.pem, <identity>.pem and .key, token.secret.
  // Every role must see it (a Kubernetes Secret); `--certs` overrides it for one process.
  std::string dir = "certs";
  bool tokens = false;  // Servers also take bearer tokens signed with <dir>/token.secret.
};

struct JobSpec {
  std::string source_name;             // The file the spec came from (for messages).
  std::string text;                    // Its text (kept in checkpoints), overrides applied.
  std::vector<std::string> overrides;  // The `--set key.path=value` overrides applied, in order.
  data_loader::LoaderOptions loader;   // As parsed; the plan sets workers, shards, tables.
  std::vector<std::string> features;   // Sparse features, in the source's slot order.
  std::vector<TableSpec> tables;
  EvalSpec eval;
  ModelSpec model;
  PsSpec ps;
  TrainSpec train;
  ClusterSpec cluster;
  CheckpointSpec checkpoint;
  ExportSpec serving;  // The `export` section.
  SecuritySpec security;
};

// The feature names a source has when the job names none: C1..C26 for Criteo (its columns'
// names), a csv source's sparse column names, f0, f1, ... otherwise.
std::vector<std::string> DefaultFeatureNames(const data_loader::SourceConfig& source);

// Parses and validates a job. `source_name` prefixes every message.
absl::StatusOr<JobSpec> ParseJobSpec(const YAML::Node& root, absl::string_view source_name);
// Reads, parses and validates a job file. `overrides` ("key.path=value", the `--set` flag of
// every role) replace or add keys of the file's mappings before it is checked, as if the file
// said so: "train.workers=2", "loader.source.files=[a.csv, b.csv]" (a value is a YAML scalar, or
// a flow sequence or mapping). A missing mapping on the path is created; a path through a value
// that is not a mapping is InvalidArgument naming the override. With overrides, `text` is the
// merged document (what checkpoints keep), headed by a comment naming them.
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path, const std::vector<std::string>& overrides = {});
absl::StatusOr<JobSpec> ParseJobSpecText(const std::string& yaml, absl::string_view source_name);

// Cross-field checks (every feature in exactly one table, unique names, ranges); ParseJobSpec
// calls it, and so does Plan for a spec built in code.
absl::Status ValidateJobSpec(const JobSpec& spec);

}  // namespace hyrec::job

#endif  // HYREC_JOB_JOB_SPEC_H_
