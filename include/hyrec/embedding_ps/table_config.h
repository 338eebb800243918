// Configuration of the embedding tables held by a parameter server.
//
// A table maps unbounded uint64 feature ids to rows of `dim` floats plus the state of its sparse
// optimizer. Each table chooses its own dim, initializer, optimizer and admission policy:
//
//   hyrec::embedding_ps::TableConfig t;
//   t.name = "user_id";
//   t.dim = 16;
//   t.optimizer.kind = hyrec::embedding_ps::OptimizerKind::kAdagrad;
//   t.optimizer.learning_rate = 0.05f;
//   HYREC_RETURN_IF_ERROR(t.Validate());
//
// Tables are also read from YAML (ParseTableConfigs) or from the compact flag form
// "name:dim[:optimizer[:learning_rate[:precision]]]" (ParseTableSpecs).
#ifndef HYREC_EMBEDDING_PS_TABLE_CONFIG_H_
#define HYREC_EMBEDDING_PS_TABLE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace YAML {
class Node;
}

namespace hyrec::embedding_ps {

enum class InitializerKind { kUniform, kNormal, kZeros };

struct InitializerConfig {
  InitializerKind kind = InitializerKind::kUniform;
  float low = -0.01f;  // kUniform: values in [low, high).
  float high = 0.01f;
  float mean = 0.0f;  // kNormal: N(mean, stddev^2).
  float stddev = 0.01f;
};

// The row-wise kinds keep one second-moment accumulator per row instead of one per element
// (FBGEMM's EXACT_ROWWISE_ADAGRAD and PARTIAL_ROWWISE_ADAM): a row of dim 16 then carries 1 or 18
// state floats instead of 16 or 33.
enum class OptimizerKind { kSgd, kAdagrad, kAdam, kFtrl, kAdagradRowwise, kAdamRowwise };

// Sparse optimizer applied on the PS to each updated row. For every step, with gradient g and
// weights w of one row:
//   g <- clip(g, -grad_clip, grad_clip)            when grad_clip > 0
//   g <- g + weight_decay * w                      (L2 weight decay)
//   w <- optimizer step (see optimizer.h)
//   w <- clip(w, -value_clip, value_clip)          when value_clip > 0
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdagrad;
  float learning_rate = 0.01f;  // FTRL: alpha.
  float weight_decay = 0.0f;
  float grad_clip = 0.0f;
  float value_clip = 0.0f;
  float epsilon = 1e-8f;             // Adagrad, Adam and their row-wise kinds.
  float initial_accumulator = 0.0f;  // Adagrad's initial sum of squares (row-wise: mean square); FTRL's n.
  float beta1 = 0.9f;                // Adam, adam_rowwise.
  float beta2 = 0.999f;              // Adam, adam_rowwise.
  float ftrl_beta = 1.0f;            // FTRL-Proximal.
  float ftrl_l1 = 0.0f;
  float ftrl_l2 = 0.0f;
};

// Admission of new ids. A lookup of an id that has no row counts one sighting of it; the row is
// created once the id has been seen `min_count` times (counted in a bounded, aging count-min
// sketch) and then a coin with probability `probability` comes up. Until then the id reads as
// zeros and updates to it are dropped and counted. The defaults admit every id at once.
struct AdmissionConfig {
  double probability = 1.0;
  uint32_t min_count = 0;  // 0 and 1 both mean "on first sight"; at most 255.

  bool AdmitsEverything() const { return probability >= 1.0 && min_count <= 1; }
};

// Which rows a bounded table gives up. Every policy keeps a 16-bit score per row and evicts, for a
// new row, the row it ranks first among those of the new row's index bucket (all of a small
// table's rows; docs/architecture.md):
//   kLru: the least recently used row (a lookup or an update uses it).
//   kLfu: the least frequently used row (any one of equal counts). A row's count
//         starts at 1 and grows by one per use (saturating at 65535); a stripe's counts of the
//         table are halved after `lfu_aging_touches` uses per row it holds, so that what was
//         popular long ago does not stay forever (aging).
//   kTtl: as kLru for capacity; besides, a row not used for `ttl_seconds` of data time (the
//         newest sample time the table has seen, EmbeddingShardStore::AdvanceDataTime) expires,
//         with or without a capacity. Data time, not wall time, so replaying old data does not
//         expire every row. Times are kept at 1/1024 of the TTL (at least a second).
enum class EvictionPolicy { kLru, kLfu, kTtl };

struct EvictionConfig {
  EvictionPolicy policy = EvictionPolicy::kLru;
  uint64_t ttl_seconds = 0;         // kTtl: > 0, at most 2^40.
  uint32_t lfu_aging_touches = 16;  // kLfu: >= 1.
};

// How a table's rows store their weights (src/embedding_ps/row_codec.h): fp32; fp16 (half the
// weights' bytes); or int8, each weight one byte on a grid of 256 steps between the row's own
// fp32 minimum and maximum (a quarter of the weights' bytes, plus 8 a row). Below fp32, the
// optimizer's math runs in fp32 and a step writes the row back with stochastic rounding. The
// optimizer's state stays fp32 in every precision; checkpoints, deltas and exports carry a
// table's weights in its precision, and a restore reads them as fp32 values.
enum class RowPrecision { kFp32, kFp16, kInt8 };

struct TableConfig {
  std::string name;
  int dim = 0;
  RowPrecision precision = RowPrecision::kFp32;
  uint64_t seed = 0;  // Row initialization is a pure function of (seed, id).
  // Most rows of this table one store holds; 0: bounded by the store's capacity only. A job's
  // table capacity is split evenly among its PS shards (include/hyrec/job/job_plan.h).
  uint64_t capacity_rows = 0;
  InitializerConfig initializer;
  OptimizerConfig optimizer;
  AdmissionConfig admission;
  EvictionConfig eviction;

  // OK when every field is in range; otherwise InvalidArgument naming the table and field.
  absl::Status Validate() const;
};

absl::string_view OptimizerName(OptimizerKind kind);
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);
absl::string_view InitializerName(InitializerKind kind);
absl::StatusOr<InitializerKind> ParseInitializerKind(absl::string_view name);
absl::string_view EvictionPolicyName(EvictionPolicy policy);
absl::string_view RowPrecisionName(RowPrecision precision);
absl::StatusOr<RowPrecision> ParseRowPrecision(absl::string_view name);
absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name);

// Number of optimizer-state floats stored after the `dim` weights of a row.
int OptimizerStateFloats(OptimizerKind kind, int dim);

// Read one part of a table's YAML over *out's current values (its defaults): the keys present
// replace fields, strictly (unknown keys, wrong types are InvalidArgument naming `path`, the key
// and the line). An initializer or optimizer may also be a plain word, its kind
// (`optimizer: sgd`). Range checks are TableConfig::Validate's.
absl::Status ReadInitializerConfig(const YAML::Node& node, absl::string_view path, InitializerConfig* out);
absl::Status ReadOptimizerConfig(const YAML::Node& node, absl::string_view path, OptimizerConfig* out);
absl::Status ReadAdmissionConfig(const YAML::Node& node, absl::string_view path, AdmissionConfig* out);
// `eviction: lfu`, or a mapping {policy, ttl_seconds, lfu_aging_touches}.
absl::Status ReadEvictionConfig(const YAML::Node& node, absl::string_view path, EvictionConfig* out);
// The `precision` key of `map` (fp32, fp16 or int8), when present.
absl::Status ReadRowPrecision(const YAML::Node& map, absl::string_view path, RowPrecision* out);

// Parses a YAML sequence of tables; `path` names the node in errors (e.g. "tables").
absl::StatusOr<std::vector<TableConfig>> ParseTableConfigs(const YAML::Node& node, absl::string_view path);

// Parses "name:dim[:optimizer[:learning_rate[:precision]]]" entries separated by commas, e.g.
// "user:16:adagrad:0.05,item:32:sgd,ads:16:adagrad_rowwise:0.05:fp16". Seeds default to the
// entry's position.
absl::StatusOr<std::vector<TableConfig>> ParseTableSpecs(absl::string_view specs);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_TABLE_CONFIG_H_
