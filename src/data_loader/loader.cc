#include "hyrec/data_loader/loader.h"

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/thread_priority.h"
#include "spdlog/spdlog.h"
#include "src/data_loader/line_reader.h"
#include "src/data_loader/source_files.h"
#ifdef HYREC_HAS_KAFKA
#include "src/data_loader/stream_windows.h"
#endif

namespace hyrec::data_loader {

namespace {

constexpr size_t kMaxBadMessages = 5;
constexpr int kMaxLoggedBadLines = 20;

// A batch as read: lines (files) or sample indices (synthetic), before parsing.
struct RawBatch {
  uint64_t sequence = 0;   // Order in which the dispatcher must deliver.
  bool end = false;        // No batches follow.
  bool epoch_end = false;  // Last batch of its epoch (may carry no samples).
  bool deliver = true;     // False: a batch a resumed worker already had; its lines still count.
  uint64_t global_id = 0;
  uint64_t epoch = 0;
  ReaderPosition window;  // Window that holds this batch (next_batch unused).
  std::vector<std::string> lines;
  std::vector<std::pair<uint32_t, uint64_t>> origins;  // (file index, line number) per line
  std::vector<uint64_t> times;  // Stream sources: each line's record time in seconds; else empty.
  std::vector<uint64_t> sample_indices;
  std::vector<std::string> read_errors;  // File-level problems met while reading (skip_bad_files).
  absl::Status fatal;                    // A file-level problem that stops the loader.
  uint64_t bytes_read = 0;               // Of the epoch's files, when the window was read.
};

struct ParsedBatch {
  RawBatch raw;        // Lines released after parsing.
  uint64_t lines = 0;  // Lines the batch was parsed from.
  Batch batch;
  uint64_t bad = 0;
  std::vector<std::string> bad_messages;
  bool skipped = false;  // Every line was bad: the batch is not delivered.
};

class WorkerQueue final : public BatchStream {
 public:
  WorkerQueue(int capacity, ReaderPosition start) : capacity_(capacity), position_(start) {}

  absl::Status Next(Batch* batch, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || !status_.ok(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("no batch within ", absl::FormatDuration(timeout)));
    }
    if (queue_.empty()) return status_;
    *batch = std::move(queue_.front());
    queue_.pop_front();
    position_ = batch->next_position;
    return absl::OkStatus();
  }

  ReaderPosition Position() const override {
    absl::MutexLock lock(&mu_);
    return position_;
  }

  // Blocks while full; false once the queue was closed (the loader stopped or failed).
  bool Push(Batch batch) {
    absl::MutexLock lock(&mu_);
    auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(queue_.size()) < capacity_ || !status_.ok();
    };
    mu_.Await(absl::Condition(&room));
    if (!status_.ok()) return false;
    queue_.push_back(std::move(batch));
    return true;
  }

  void Close(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = status;
  }

 private:
  const int capacity_;
  mutable absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // Non-OK once closed.
  ReaderPosition position_ ABSL_GUARDED_BY(mu_);
};

class LoaderImpl final : public Loader {
 public:
  LoaderImpl(LoaderOptions options, std::vector<ReaderPosition> resume, std::vector<uint64_t> file_bytes)
      : options_(std::move(options)),
        window_batches_(
            std::max<uint64_t>(1, (options_.shuffle_window + options_.batch_size - 1) / options_.batch_size)),
        num_slots_(options_.source.num_slots()),
        num_dense_(options_.source.num_dense()),
        num_tables_(options_.num_tables()),
        csv_header_(options_.source.format == Format::kCsv && options_.source.csv.header),
        head_lines_(std::min(kHeadLines, std::max<uint64_t>(1, options_.min_lines_for_bad_check))),
        file_bytes_(std::move(file_bytes)),
        head_seen_(file_bytes_.size(), 0),
        head_bad_(file_bytes_.size(), 0) {
    if (options_.source.format == Format::kCsv) keep_fields_ = options_.source.csv.keep_index;
    if (options_.source.format == Format::kCriteo && !options_.source.keep.empty()) {
      keep_fields_ = *CriteoFields(options_.source.keep);  // Checked by Start.
    }
    bytes_before_.assign(file_bytes_.size() + 1, 0);
    for (size_t i = 0; i < file_bytes_.size(); ++i) bytes_before_[i + 1] = bytes_before_[i] + file_bytes_[i];
    if (options_.source.format == Format::kSynthetic) {
      synthetic_ = std::make_unique<SyntheticSource>(options_.source.synthetic);
    }
    for (int w = 0; w < options_.num_workers; ++w) {
      ReaderPosition start;
      start.next_batch = static_cast<uint64_t>(w);
      if (!resume.empty()) start = resume[w];
      next_for_worker_.push_back(start.next_batch);
      queues_.push_back(std::make_unique<WorkerQueue>(options_.prefetch_batches, start));
    }
    // Read from the earliest window any worker still needs.
    start_ = resume.empty() ? ReaderPosition() : resume[0];
    for (const ReaderPosition& p : resume) {
      if (p.window_global < start_.window_global) start_ = p;
    }
  }

  ~LoaderImpl() override { Stop(); }

  void Begin() {
    producer_ = std::thread([this] { Produce(); });
    for (int t = 0; t < options_.threads; ++t) parsers_.emplace_back([this] { Parse(); });
    dispatcher_ = std::thread([this] { Dispatch(); });
  }

  BatchStream* stream(int worker) override { return queues_[worker].get(); }

  LoaderStats Stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return failure_;
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stopping_ = true;
    }
    for (auto& q : queues_) q->Close(absl::CancelledError("the loader was stopped"));
    if (producer_.joinable()) producer_.join();
    for (auto& t : parsers_) t.join();
    if (dispatcher_.joinable()) dispatcher_.join();
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

 private:
  // ---- producer: reads windows, shuffles, cuts batches ----
  bool PushRaw(RawBatch raw) {
    absl::MutexLock lock(&mu_);
    const size_t limit = static_cast<size_t>(4 * options_.threads + 4);
    auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (raw_queue_.size() < limit && in_flight_ < 2 * limit);
    };
    mu_.Await(absl::Condition(&room));
    if (stopping_) return false;
    raw.sequence = next_sequence_++;
    ++in_flight_;
    raw_queue_.push_back(std::move(raw));
    return true;
  }

  bool Needed(uint64_t global_id) const { return global_id >= next_for_worker_[global_id % options_.num_workers]; }

  // Where the producer reads: the next window's position, and the open file.
  struct Cursor {
    ReaderPosition at;  // next_batch unused; window_global is the next batch's global id.
    std::unique_ptr<LineReader> reader;
    bool reader_from_start = false;  // The reader was opened at the file's first byte.
    uint64_t reader_lines = 0;       // Lines the reader returned.
  };

  // One shuffle window as read: its lines with their origins (files) or its sample indices
  // (synthetic), and the file-level problems met while reading it.
  struct Window {
    ReaderPosition start;
    std::vector<std::string> lines;
    // (file index, line number) per line; a stream's (partition, offset).
    std::vector<std::pair<uint32_t, uint64_t>> origins;
    std::vector<uint64_t> times;  // Stream sources: each line's record time in seconds.
    std::vector<uint64_t> indices;
    std::vector<std::string> read_errors;
    absl::Status fatal;       // A file-level problem that stops the loader (it ends the window).
    bool epoch_done = false;  // The epoch's data ends with this window.
    uint64_t bytes_read = 0;  // Of the epoch's files, after the window.
  };

  void Produce() {
    LowerThisThreadsPriority(options_.thread_nice);
    Cursor cursor;
    cursor.at = start_;
    for (; options_.epochs == 0 || cursor.at.epoch < options_.epochs; ++cursor.at.epoch) {
      for (bool epoch_done = false; !epoch_done;) {
        Window window = ReadWindow(&cursor);
        JudgeHeads(&window);
        epoch_done = window.epoch_done;
        const bool fatal = !window.fatal.ok();
        if (!CutWindow(std::move(window), &cursor.at) || fatal) return;
      }
      cursor.at.window_batch = 0;
      cursor.at.file_index = 0;
      cursor.at.byte_offset = 0;
      cursor.at.line_number = 1;
      cursor.reader.reset();
    }
    RawBatch end;
    end.end = true;
    end.deliver = false;
    PushRaw(std::move(end));
  }

  // Reads the window at the cursor and moves the cursor past it.
  Window ReadWindow(Cursor* cursor) {
#ifdef HYREC_HAS_KAFKA
    if (stream_ != nullptr) return ReadStreamWindow(&cursor->at);
#endif
    Window w;
    w.start = cursor->at;
    const uint64_t want = window_batches_ * static_cast<uint64_t>(options_.batch_size);
    if (synthetic_ != nullptr) {
      const uint64_t first = cursor->at.window_batch * static_cast<uint64_t>(options_.batch_size);
      const uint64_t n = options_.source.synthetic.num_samples;
      for (uint64_t i = first; i < std::min(n, first + want); ++i) w.indices.push_back(i);
      w.epoch_done = first + want >= n;
      return w;
    }
    ReaderPosition& at = cursor->at;
    const std::vector<std::string>& files = options_.source.files;
    while (w.lines.size() < want) {
      if (cursor->reader == nullptr) {
        if (at.file_index >= files.size()) {
          w.epoch_done = true;
          w.bytes_read = bytes_before_.back();
          return w;
        }
        auto opened = LineReader::Open(files[at.file_index], at.byte_offset, at.line_number);
        if (!opened.ok()) {
          if (FileProblem(opened.status(), &w)) return w;
          NextFile(&at);
          continue;
        }
        cursor->reader = std::move(*opened);
        cursor->reader_from_start = at.byte_offset == 0;
        cursor->reader_lines = 0;
      }
      std::string line;
      uint64_t number = 0;
      absl::Status error;
      const LineReader::Result r = cursor->reader->Next(kMaxLineBytes, &line, &number, &error);
      if (r == LineReader::Result::kLine) {
        ++cursor->reader_lines;
        if (number == 1 && csv_header_ && FileHasHeader(at.file_index)) {  // Checked at Start; not data.
          at.byte_offset = cursor->reader->offset();
          at.line_number = cursor->reader->line_number();
          continue;
        }
        w.lines.push_back(std::move(line));
        w.origins.emplace_back(at.file_index, number);
        at.byte_offset = cursor->reader->offset();
        at.line_number = cursor->reader->line_number();
        continue;
      }
      if (r == LineReader::Result::kEnd && cursor->reader_from_start && cursor->reader_lines == 0) {
        error = absl::DataLossError(absl::StrCat("'", files[at.file_index], "' is empty: it has no lines"));
      }
      cursor->reader.reset();
      if (!error.ok() && FileProblem(error, &w)) return w;
      NextFile(&at);
    }
    w.epoch_done = cursor->reader == nullptr && at.file_index >= files.size();
    w.bytes_read = bytes_before_[std::min<size_t>(at.file_index, files.size())];
    if (cursor->reader != nullptr) {
      w.bytes_read += std::min(cursor->reader->raw_offset(), file_bytes_[at.file_index]);
    }
    return w;
  }

  // Each file's first head_lines_ lines are parsed as they are read, in file order, before the
  // window is shuffled: when all of them are bad the file is probably not in the declared
  // format, and the window ends at once with that error (its lines are not handed on).
  void JudgeHeads(Window* w) {
    if (options_.source.kafka.has_value()) return;  // Records, not files.
    Sample scratch;
    for (size_t i = 0; i < w->lines.size() && w->fatal.ok(); ++i) {
      const auto [file, number] = w->origins[i];
      if (number > head_lines_ || head_seen_[file] >= head_lines_) continue;
      const absl::Status s = ParseLine(w->lines[i], &scratch);
      ++head_seen_[file];
      if (!s.ok()) {
        ++head_bad_[file];
        if (head_examples_.size() < 3) {
          head_examples_.push_back(absl::StrCat(options_.source.files[file], ":", number, ": ", s.message()));
        }
      }
      if (head_seen_[file] == head_lines_ && head_bad_[file] == head_lines_) {
        w->fatal = absl::DataLossError(absl::StrCat(
            "the first ", head_lines_, " lines of '", options_.source.files[file], "' are all bad (is it in the ",
            FormatName(options_.source.format), " format?); first: ", absl::StrJoin(head_examples_, "; ")));
        w->lines.clear();
        w->origins.clear();
      }
    }
  }

  // A file that cannot be read whole: noted in the window under skip_bad_files (false: read on),
  // else the window's fatal error (true: the window ends here).
  bool FileProblem(const absl::Status& problem, Window* w) const {
    if (options_.source.skip_bad_files) {
      w->read_errors.push_back(std::string(problem.message()));
      return false;
    }
    w->fatal = absl::DataLossError(problem.message());
    return true;
  }

  // Shuffles a window and hands its batches to the parsers, those a resumed worker already had
  // included (their lines still count). `at` moves past the window's batches. False once the
  // loader stops.
  bool CutWindow(Window w, ReaderPosition* at) {
    const uint64_t B = static_cast<uint64_t>(options_.batch_size);
    const bool synthetic = synthetic_ != nullptr;
    const size_t count = synthetic ? w.indices.size() : w.lines.size();
    std::vector<uint32_t> order(count);
    for (size_t i = 0; i < count; ++i) order[i] = static_cast<uint32_t>(i);
    if (options_.shuffle) {
      std::mt19937_64 rng(HashCombine(options_.seed, (w.start.epoch << 32) ^ w.start.window_batch));
      for (size_t i = count; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
    }
    const uint64_t batches_here = (count + B - 1) / B;
    const bool notes = w.epoch_done || !w.read_errors.empty() || !w.fatal.ok();
    for (uint64_t k = 0; k < batches_here || (k == 0 && notes); ++k) {
      const size_t begin = static_cast<size_t>(k * B);
      const size_t end = std::min(count, begin + static_cast<size_t>(B));
      RawBatch raw;
      raw.epoch = w.start.epoch;
      raw.window = w.start;
      if (k == 0) {
        raw.read_errors = w.read_errors;
        raw.fatal = w.fatal;
      }
      raw.bytes_read = w.bytes_read;
      raw.epoch_end = w.epoch_done && k + 1 >= batches_here;
      const bool has_batch = end > begin && !(end - begin < B && options_.drop_last);
      raw.global_id = at->window_global;
      raw.deliver = has_batch && Needed(raw.global_id);
      // A batch not delivered is not parsed into samples, but its lines still count as read.
      if (raw.deliver || !synthetic) {
        for (size_t i = begin; i < end; ++i) {
          if (synthetic) {
            raw.sample_indices.push_back(w.indices[order[i]]);
          } else {
            raw.lines.push_back(std::move(w.lines[order[i]]));
            raw.origins.push_back(w.origins[order[i]]);
            if (!w.times.empty()) raw.times.push_back(w.times[order[i]]);
          }
        }
      }
      if (has_batch) ++at->window_global;
      if (!raw.deliver && !raw.epoch_end && raw.read_errors.empty() && raw.fatal.ok() && raw.lines.empty()) continue;
      if (!PushRaw(std::move(raw))) return false;
    }
    at->window_batch += batches_here;
    return true;
  }

#ifdef HYREC_HAS_KAFKA
 public:
  // A stream source: connects to its topic and starts at the earliest window a worker needs
  // (every partition from its earliest record on a fresh start). Before Begin.
  absl::Status OpenStream() {
    const KafkaOptions& kafka = *options_.source.kafka;
    HYREC_ASSIGN_OR_RETURN(std::unique_ptr<KafkaReader> reader, KafkaReader::Open(kafka, 0, 1));
    const uint64_t B = static_cast<uint64_t>(options_.batch_size);
    stream_ = std::make_unique<StreamWindows>(std::move(reader), B, window_batches_ * B, kafka);
    return stream_->Start(start_.partitions);
  }

 private:
  bool Stopping() const {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  // The stream's next window; `at` moves to the window after it.
  Window ReadStreamWindow(ReaderPosition* at) {
    Window w;
    absl::StatusOr<StreamWindow> read = stream_->Next([this] { return Stopping(); });
    w.start = *at;
    if (!read.ok()) {
      w.fatal = read.status();
      return w;
    }
    w.start.partitions = read->ranges;
    w.epoch_done = read->last;
    if (read->lag >= 0) {
      absl::MutexLock lock(&mu_);
      stats_.stream_lag = read->lag;
    }
    for (KafkaRecord& r : read->records) {
      w.lines.push_back(std::move(r.value));
      w.origins.emplace_back(static_cast<uint32_t>(r.partition), static_cast<uint64_t>(r.offset));
      w.times.push_back(r.timestamp_ms > 0 ? static_cast<uint64_t>(r.timestamp_ms / 1000) : 0);
    }
    at->partitions = read->ranges;
    for (PartitionRange& r : at->partitions) r.start = r.end;
    return w;
  }
#endif

  static void NextFile(ReaderPosition* at) {
    ++at->file_index;
    at->byte_offset = 0;
    at->line_number = 1;
  }

  // ---- parsers: raw batch -> Batch, any order; the dispatcher restores it ----
  void Parse() {
    LowerThisThreadsPriority(options_.thread_nice);
    std::vector<Sample> samples;
    for (;;) {
      RawBatch raw;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !raw_queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        raw = std::move(raw_queue_.front());
        raw_queue_.pop_front();
      }
      ParsedBatch parsed;
      std::vector<std::string> kept;
      const size_t n = std::max(raw.lines.size(), raw.sample_indices.size());
      if (samples.size() < n) samples.resize(n);
      size_t good = 0;
      for (size_t i = 0; i < raw.sample_indices.size(); ++i) {
        synthetic_->Generate(options_.source.synthetic.first_index + raw.sample_indices[i], &samples[good++]);
      }
      for (size_t i = 0; i < raw.lines.size(); ++i) {
        absl::Status s = ParseLine(raw.lines[i], &samples[good]);
        if (s.ok()) {
          if (!raw.times.empty() && samples[good].time == 0) samples[good].time = raw.times[i];
          if (!keep_fields_.empty()) Keep(raw.lines[i], &kept);
          ++good;
        } else {
          ++parsed.bad;
          if (parsed.bad_messages.size() < kMaxBadMessages) {
            // With header: false, a bad first line is most often a header.
            const bool header_like = options_.source.format == Format::kCsv && !csv_header_ &&
                                     !options_.source.kafka.has_value() && raw.origins[i].second == 1;
            parsed.bad_messages.push_back(
                absl::StrCat(Where(raw.origins[i]), ": ", s.message(),
                             header_like ? " (a header line? then set csv.header: true)" : ""));
          }
        }
      }
      parsed.skipped = raw.deliver && good == 0;
      if (parsed.skipped) raw.deliver = false;
      if (raw.deliver) {
        BuildBatch(samples, good, num_dense_, num_slots_, options_.slot_tables, num_tables_, options_.num_shards,
                   &parsed.batch, options_.slot_copies);
        parsed.batch.batch_id = raw.global_id;
        parsed.batch.epoch = raw.epoch;
        parsed.batch.next_position = raw.window;
        parsed.batch.next_position.next_batch = raw.global_id + options_.num_workers;
        parsed.batch.bytes_read = raw.bytes_read;
        parsed.batch.bytes_total = bytes_before_.back();
        parsed.batch.kept = std::move(kept);
      }
      parsed.raw.sequence = raw.sequence;
      parsed.raw.end = raw.end;
      parsed.raw.epoch_end = raw.epoch_end;
      parsed.raw.deliver = raw.deliver;
      parsed.raw.global_id = raw.global_id;
      parsed.raw.read_errors = std::move(raw.read_errors);
      parsed.raw.fatal = std::move(raw.fatal);
      parsed.lines = raw.lines.size();
      absl::MutexLock lock(&mu_);
      parsed_.emplace(parsed.raw.sequence, std::move(parsed));
    }
  }

  // Where a line came from: file:line, or a stream's topic[partition]@offset.
  std::string Where(const std::pair<uint32_t, uint64_t>& origin) const {
    if (options_.source.kafka.has_value()) {
      return absl::StrCat(options_.source.kafka->topic, "[", origin.first, "]@", origin.second);
    }
    return absl::StrCat(options_.source.files[origin.first], ":", origin.second);
  }

  // Appends the kept fields of `line`, a good one.
  void Keep(const std::string& line, std::vector<std::string>* kept) const {
    thread_local std::vector<std::string> fields;
    if (options_.source.format == Format::kCsv) {
      (void)SplitCsvLine(line, options_.source.csv, &fields);  // It parsed.
    } else {
      fields = absl::StrSplit(absl::StripSuffix(line, "\r"), '\t');
      // A line without its label (label_optional) starts at I1.
      if (fields.size() == kCriteoDense + kCriteoSlots) fields.insert(fields.begin(), std::string());
    }
    for (int f : keep_fields_) kept->push_back(f < static_cast<int>(fields.size()) ? fields[f] : std::string());
  }

  absl::Status ParseLine(const std::string& line, Sample* sample) const {
    return ParseSourceLine(options_.source, line, sample);
  }

  // ---- dispatcher: in order, accounting, routing ----
  void Dispatch() {
    LowerThisThreadsPriority(options_.thread_nice);
    uint64_t expected = 0;
    for (;;) {
      ParsedBatch parsed;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || parsed_.count(expected) > 0; };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        auto it = parsed_.find(expected);
        parsed = std::move(it->second);
        parsed_.erase(it);
        --in_flight_;
        ++expected;
      }
      if (parsed.raw.end) {
        for (auto& q : queues_) q->Close(absl::OutOfRangeError("end of data"));
        return;
      }
      absl::Status failure = Account(parsed);
      if (!failure.ok()) {
        spdlog::error("loader: {}", failure.ToString());
        {
          absl::MutexLock lock(&mu_);
          failure_ = failure;
        }
        for (auto& q : queues_) q->Close(failure);
        return;
      }
      if (!parsed.raw.deliver) continue;
      const int worker = static_cast<int>(parsed.batch.batch_id % options_.num_workers);
      if (!queues_[worker]->Push(std::move(parsed.batch))) return;
    }
  }

  // Adds a batch's counts; returns the failure when a file could not be read whole (or its first
  // lines are all bad: JudgeHeads), or when bad lines exceed the allowed fraction.
  absl::Status Account(const ParsedBatch& parsed) {
    absl::MutexLock lock(&mu_);
    if (!parsed.raw.fatal.ok()) return parsed.raw.fatal;
    for (const std::string& e : parsed.raw.read_errors) {
      ++stats_.bad_lines;
      if (stats_.first_bad.size() < kMaxBadMessages) stats_.first_bad.push_back(e);
      spdlog::warn("loader: {}", e);
    }
    stats_.lines += parsed.lines + parsed.raw.read_errors.size();
    stats_.bad_lines += parsed.bad;
    for (const std::string& m : parsed.bad_messages) {
      if (stats_.first_bad.size() < kMaxBadMessages) stats_.first_bad.push_back(m);
      if (logged_bad_ < kMaxLoggedBadLines) {
        spdlog::warn("loader: bad line skipped: {}", m);
        ++logged_bad_;
      }
    }
    if (parsed.raw.deliver) {
      stats_.samples += static_cast<uint64_t>(parsed.batch.batch_size);
      ++stats_.batches;
    }
    if (parsed.skipped) {
      ++stats_.skipped_batches;
      spdlog::warn("loader: batch {} is not delivered: all of its {} lines were bad", parsed.raw.global_id,
                   parsed.lines);
    }
    const bool check = stats_.lines >= options_.min_lines_for_bad_check || parsed.raw.epoch_end;
    if (check && static_cast<double>(stats_.bad_lines) >
                     options_.max_bad_fraction * static_cast<double>(std::max<uint64_t>(stats_.lines, 1))) {
      return absl::DataLossError(absl::StrCat("too many bad lines: ", stats_.bad_lines, " of ", stats_.lines,
                                              " read exceed max_bad_fraction ", options_.max_bad_fraction,
                                              "; first: ", absl::StrJoin(stats_.first_bad, "; ")));
    }
    return absl::OkStatus();
  }

  const LoaderOptions options_;
  const uint64_t window_batches_;
  const int num_slots_;
  const int num_dense_;
  const int num_tables_;
  // Whether line 1 of file `index` is its header (CheckFiles found it so).
  bool FileHasHeader(uint32_t index) const {
    const std::vector<bool>& has = options_.source.csv.file_has_header;
    return index >= has.size() || has[index];
  }

  const bool csv_header_;         // Files start with a header (FileHasHeader says which do).
  std::vector<int> keep_fields_;  // The fields of SourceConfig::keep.
  const uint64_t head_lines_;
  const std::vector<uint64_t> file_bytes_;  // Per file, on disk at Start.
  std::vector<uint64_t> bytes_before_;      // bytes_before_[i]: of the files before file i.
  std::unique_ptr<SyntheticSource> synthetic_;
#ifdef HYREC_HAS_KAFKA
  std::unique_ptr<StreamWindows> stream_;  // A stream source's windows; null for others.
#endif
  std::vector<uint64_t> next_for_worker_;
  std::vector<std::unique_ptr<WorkerQueue>> queues_;
  ReaderPosition start_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<RawBatch> raw_queue_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ParsedBatch> parsed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  LoaderStats stats_ ABSL_GUARDED_BY(mu_);
  int logged_bad_ ABSL_GUARDED_BY(mu_) = 0;
  // The producer's own: per file, its first head_lines_ lines parsed and how many were bad, and
  // the first few bad ones in file order.
  std::vector<uint64_t> head_seen_;
  std::vector<uint64_t> head_bad_;
  std::vector<std::string> head_examples_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);

  std::thread producer_;
  std::vector<std::thread> parsers_;
  std::thread dispatcher_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Loader>> Loader::Start(const LoaderOptions& options,
                                                      const std::vector<ReaderPosition>& resume) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  if (!resume.empty() && static_cast<int>(resume.size()) != options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume holds ", resume.size(), " positions for ", options.num_workers, " workers"));
  }
  for (size_t w = 0; w < resume.size(); ++w) {
    if (resume[w].next_batch % options.num_workers != w) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume position ", w, " (", resume[w].DebugString(), ") does not belong to worker ", w));
    }
    if (options.source.format != Format::kSynthetic && !options.source.kafka.has_value() &&
        resume[w].file_index >= options.source.files.size()) {
      return absl::InvalidArgumentError(absl::StrCat("resume position ", w, " names file ", resume[w].file_index,
                                                     " of ", options.source.files.size()));
    }
  }
  LoaderOptions resolved = options;
  if (!resolved.source.keep.empty()) {
    if (resolved.source.format == Format::kCsv) {
      resolved.source.csv.keep = resolved.source.keep;  // Placed by the header.
    } else if (resolved.source.format != Format::kCriteo) {
      return absl::InvalidArgumentError(
          absl::StrCat("kept columns are for csv and criteo sources, not ", FormatName(resolved.source.format)));
    } else if (absl::StatusOr<std::vector<int>> at = CriteoFields(resolved.source.keep); !at.ok()) {
      return at.status();
    }
  }
  absl::StatusOr<std::vector<uint64_t>> file_bytes = CheckFiles(&resolved.source);
  if (!file_bytes.ok()) return file_bytes.status();
  auto loader = std::make_unique<LoaderImpl>(std::move(resolved), resume, std::move(*file_bytes));
  if (options.source.kafka.has_value()) {
#ifdef HYREC_HAS_KAFKA
    HYREC_RETURN_IF_ERROR(loader->OpenStream());
#else
    return absl::FailedPreconditionError(
        "loader.source.kafka: this build of hyrec has no Kafka source (librdkafka-dev was missing when it was built)");
#endif
  }
  loader->Begin();
  return std::unique_ptr<Loader>(std::move(loader));
}

}  // namespace hyrec::data_loader
