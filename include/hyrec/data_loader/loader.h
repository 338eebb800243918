// Loader: turns a source (Criteo, libsvm, libffm or csv files, or the synthetic teacher) into batches
// for `num_workers` dense workers.
//
//   LoaderOptions options;
//   options.source.format = Format::kCriteo;
//   options.source.files = {"day_0.gz"};
//   options.batch_size = 4096;
//   options.num_workers = 2;
//   HYREC_ASSIGN_OR_RETURN(auto loader, Loader::Start(options, /*resume=*/{}));
//   for (Batch batch; loader->stream(0)->Next(&batch, absl::Seconds(30)).ok();) std::cout << batch.batch_size;
//   ReaderPosition saved = loader->stream(0)->Position();   // resume from here later
//
// The epoch's sample order is the sources' lines in file order, cut into shuffle windows of
// `shuffle_window` samples, each permuted by a seed of (seed, epoch, window). Batches are
// consecutive `batch_size` samples of that order and get global ids 0, 1, 2, ...; batch b goes to
// worker b % num_workers. Parsing and batching run on `threads` threads; the batches are identical
// for any thread count. Each worker's queue holds at most `prefetch_batches`; a slow worker slows
// the loader, nothing is dropped, memory stays bounded.
//
// Bad lines are counted and logged with file:line and skipped while bad / read stays within
// max_bad_fraction (checked once min_lines_for_bad_check lines were read, and at each epoch's end);
// beyond it every stream fails with DATA_LOSS naming the file and the first bad lines. A file
// whose first lines (kHeadLines, or min_lines_for_bad_check if fewer) are all bad fails at once
// the same way. A batch whose lines were all bad is not delivered.
//
// Files are data, never optional: Start checks that every file opens and has a first line, and a
// file that cannot be opened, is empty, is corrupt or truncated (gzip), or shrinks or disappears
// while it is read stops the loader with DATA_LOSS naming it (NotFound at Start for a missing
// one). With source.skip_bad_files such a file is logged, counted as one bad line and skipped.
#ifndef HYREC_DATA_LOADER_LOADER_H_
#define HYREC_DATA_LOADER_LOADER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hyrec/data_loader/kafka_options.h"
#include "hyrec/data_loader/parsers.h"
#include "hyrec/data_loader/sample.h"
#include "hyrec/data_loader/synthetic.h"

namespace hyrec::data_loader {

struct SourceConfig {
  Format format = Format::kSynthetic;
  std::vector<std::string> files;  // Plain or gzip; read in this order every epoch.
  // A stream source: records from a Kafka topic, one sample each in `format` (csv, criteo,
  // libsvm, libffm; a csv has no header), in place of files. Its one epoch does not end: the
  // loader reads until stopped. A sample without a time of its own (a csv time column) takes its
  // record's timestamp.
  std::optional<KafkaOptions> kafka;
  // A file that cannot be read whole is skipped (one bad line) instead of failing the loader;
  // at least one file must still be usable at Start.
  bool skip_bad_files = false;
  CriteoOptions criteo;
  LibsvmOptions libsvm;  // Also libffm.
  CsvOptions csv;        // Resolved against the files' header by Loader::Start.
  SyntheticConfig synthetic;
  // Columns whose raw values every batch carries (Batch::kept), for scoring: csv, the names of
  // its header's fields (csv.keep); criteo, label, I1..I13, C1..C26. Other formats take none.
  std::vector<std::string> keep;

  int num_slots() const;
  int num_dense() const;
};

struct LoaderOptions {
  SourceConfig source;
  int batch_size = 4096;
  int threads = 2;
  int num_workers = 1;
  uint64_t epochs = 1;  // 0: forever.
  bool shuffle = true;
  uint64_t shuffle_window = 1 << 16;  // Samples; rounded up to a multiple of batch_size.
  uint64_t seed = 1;
  int num_shards = 1;            // PS shards: each table's unique ids are grouped by shard.
  std::vector<int> slot_tables;  // Batch slot -> table index; empty: slot k is table k.
  // Batch slots after the source's: batch slot num_slots() + k holds the ids (and weights) of
  // source slot slot_copies[k] again, for another table (a wide model's dim-1 weights).
  std::vector<int> slot_copies;
  double max_bad_fraction = 0.001;
  uint64_t min_lines_for_bad_check = 10'000;
  int prefetch_batches = 8;  // Per worker.
  bool drop_last = false;    // Drop each epoch's final partial batch.
  int thread_nice = 0;       // Nice increment of the loader's threads (0: as the caller;
                             // kIdleNice: SCHED_IDLE, see common/thread_priority.h).

  absl::Status Validate() const;
  int num_tables() const;
  int num_batch_slots() const { return source.num_slots() + static_cast<int>(slot_copies.size()); }
};

// The most leading lines of a file that may all be bad before the loader fails.
inline constexpr uint64_t kHeadLines = 100;

struct LoaderStats {
  uint64_t lines = 0;
  uint64_t bad_lines = 0;
  uint64_t samples = 0;
  uint64_t batches = 0;
  std::vector<std::string> first_bad;  // "file:line: reason" of the first few bad lines.
  uint64_t skipped_batches = 0;        // Batches not delivered because every line was bad.
  // A stream source: the records of its topic not yet read into a window (consumer lag), as last
  // asked of the brokers (about once a second); -1: not a stream, or not known yet.
  int64_t stream_lag = -1;
};

// One worker's batches. Not thread-safe; one consumer per stream.
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  // The next batch of this worker. OUT_OF_RANGE after the last epoch; DEADLINE_EXCEEDED when
  // none arrived within `timeout`; any other error is the loader's (sticky) failure.
  virtual absl::Status Next(Batch* batch, absl::Duration timeout) = 0;
  // Where to resume after the last batch Next returned (or where the stream started).
  virtual ReaderPosition Position() const = 0;
};

class Loader {
 public:
  // Starts reading. `resume` is empty (start at the beginning) or one position per worker, as
  // returned by their streams' Position(): each worker then receives exactly the batches it had
  // not received, in the same order and with the same contents.
  static absl::StatusOr<std::unique_ptr<Loader>> Start(const LoaderOptions& options,
                                                       const std::vector<ReaderPosition>& resume);
  virtual ~Loader() = default;

  virtual BatchStream* stream(int worker) = 0;
  virtual LoaderStats Stats() const = 0;
  // OK while the loader is healthy (also after the end of the data); its failure once it failed
  // (what every stream then returns).
  virtual absl::Status status() const = 0;
  // Stops the threads; streams then return CANCELLED.
  virtual void Stop() = 0;
};

// Checks a file source before reading it: every file exists, is a regular file, opens and
// yields a first line (a csv file with a header: a header and a row, every file the same
// header, which places the named columns). The first problem is NotFound (a missing file), FailedPrecondition (not a
// regular file) or DataLoss (unreadable, empty, corrupt), naming the file; with
// source.skip_bad_files problems are logged and only a source with no usable file fails.
// Returns the files' total bytes on disk. A synthetic source passes with 0; a stream source
// (kafka) with 0 once its brokers answered and have its topic (UNAVAILABLE, NOT_FOUND naming it).
absl::StatusOr<uint64_t> CheckSourceFiles(const SourceConfig& source);

// Parses one line of `source` (its format's parser and options; a csv source must be resolved,
// CsvOptions::Resolve) into `out`: InvalidArgument saying what is wrong, for a synthetic source
// too (it has no lines).
absl::Status ParseSourceLine(const SourceConfig& source, absl::string_view line, Sample* out);

// Builds a Batch from parsed samples: labels, dense, per-slot CSR ids, and per table the unique
// ids grouped by PS shard with their inverse maps. `num_slots` is the samples' slots; the batch
// has as many again as `slot_copies` names (LoaderOptions::slot_copies).
void BuildBatch(const std::vector<Sample>& samples, size_t count, int num_dense, int num_slots,
                const std::vector<int>& slot_tables, int num_tables, int num_shards, Batch* batch,
                const std::vector<int>& slot_copies = {});

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_LOADER_H_
