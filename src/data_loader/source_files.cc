#include "src/data_loader/source_files.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "hyrec/common/status_macros.h"
#include "spdlog/spdlog.h"
#include "src/data_loader/line_reader.h"
#ifdef HYREC_HAS_KAFKA
#include "src/data_loader/kafka_reader.h"
#endif

namespace hyrec::data_loader {

// The fields of Criteo columns named label, I1..I13 and C1..C26; InvalidArgument naming another.
absl::StatusOr<std::vector<int>> CriteoFields(const std::vector<std::string>& names) {
  std::vector<int> out;
  for (const std::string& name : names) {
    int k = 0;
    if (name == "label") {
      out.push_back(0);
    } else if (name.size() > 1 && name[0] == 'I' && absl::SimpleAtoi(name.substr(1), &k) && k >= 1 &&
               k <= kCriteoDense) {
      out.push_back(k);
    } else if (name.size() > 1 && name[0] == 'C' && absl::SimpleAtoi(name.substr(1), &k) && k >= 1 &&
               k <= kCriteoSlots) {
      out.push_back(kCriteoDense + k);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("kept column '", name, "' is not a Criteo column (label, I1..I13, C1..C26)"));
    }
  }
  return out;
}

namespace {

// A file's first lines: `lines` of them, or DataLoss when it has fewer (or cannot be read).
absl::StatusOr<std::vector<std::string>> FirstLines(const std::string& path, int lines, uint64_t* bytes) {
  absl::StatusOr<std::unique_ptr<LineReader>> reader = LineReader::Open(path, 0, 1);
  if (!reader.ok()) return reader.status();
  *bytes = (*reader)->file_bytes();
  std::vector<std::string> out(static_cast<size_t>(lines));
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t number = 0;
    absl::Status error;
    switch ((*reader)->Next(kMaxLineBytes, &out[i], &number, &error)) {
      case LineReader::Result::kLine:
        continue;
      case LineReader::Result::kEnd:
        return absl::DataLossError(
            absl::StrCat("'", path, "' is empty: it has no ", i > 0 ? "line after its header" : "lines"));
      case LineReader::Result::kError:
        return error;
    }
  }
  return out;
}

// The columns placed by `line`, a header, read from `where`.
absl::Status ResolveHeader(const std::string& line, const std::string& where, SourceConfig* source,
                           std::vector<std::string>* header) {
  std::vector<std::string> fields;
  HYREC_RETURN_IF_ERROR(Annotate(SplitCsvLine(line, source->csv, &fields), absl::StrCat(where, ":1 (header)")));
  HYREC_RETURN_IF_ERROR(Annotate(source->csv.Resolve(&fields), absl::StrCat(where, ":1 (header)")));
  *header = std::move(fields);
  return absl::OkStatus();
}

// Checks one file; for a csv source with a header, places the columns by the first file's header
// (or csv.header_file's, when the first file's first line is data) and requires every other file
// to start with the same one, or (a file without a header) with a line that parses as data. Sets
// `has_header`.
absl::StatusOr<uint64_t> CheckFile(const std::string& path, SourceConfig* source, std::vector<std::string>* header,
                                   bool* has_header) {
  const bool csv_header = source->format == Format::kCsv && source->csv.header;
  *has_header = csv_header;
  uint64_t bytes = 0;
  HYREC_ASSIGN_OR_RETURN(std::vector<std::string> first, FirstLines(path, 1, &bytes));
  if (!csv_header) return bytes;
  bool own_header = header->empty();
  const CsvOptions unresolved = source->csv;  // Resolve places the columns once.
  if (own_header && !source->csv.header_file.empty()) {
    // The first file's own header wins, unless its first line is data.
    uint64_t unused = 0;
    HYREC_ASSIGN_OR_RETURN(std::vector<std::string> line, FirstLines(source->csv.header_file, 1, &unused));
    HYREC_RETURN_IF_ERROR(ResolveHeader(line[0], source->csv.header_file, source, header));
    std::vector<std::string> fields;
    Sample sample;
    own_header = SplitCsvLine(first[0], source->csv, &fields).ok() && fields != *header &&
                 !ParseCsvLine(first[0], source->csv, &sample).ok();
  }
  if (own_header) {
    source->csv = unresolved;
    HYREC_RETURN_IF_ERROR(ResolveHeader(first[0], path, source, header));
  } else {
    std::vector<std::string> fields;
    const absl::Status split = SplitCsvLine(first[0], source->csv, &fields);
    if (!split.ok() || fields != *header) {
      Sample sample;
      if (!split.ok() || !ParseCsvLine(first[0], source->csv, &sample).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":1: its header differs from the first file's (", absl::StrJoin(*header, ","), ")"));
      }
      static absl::Mutex said_mu(absl::kConstInit);
      static auto* said = new std::set<std::string>();  // Once a file per process (every evaluation checks).
      absl::MutexLock lock(&said_mu);
      if (said->insert(path).second) {
        spdlog::info("loader: {} has no header (its first line is data): read with the columns of {}", path,
                     absl::StrJoin(*header, ","));
      }
      *has_header = false;
      return bytes;
    }
  }
  HYREC_RETURN_IF_ERROR(FirstLines(path, 2, &bytes).status());  // Data after the header.
  return bytes;
}

}  // namespace

// Per file, its bytes on disk (0 for a file skipped under skip_bad_files).
absl::StatusOr<std::vector<uint64_t>> CheckFiles(SourceConfig* source_config) {
  SourceConfig& source = *source_config;
  std::vector<uint64_t> bytes(source.files.size(), 0);
  if (source.format == Format::kSynthetic) return bytes;
  if (source.kafka.has_value()) {  // Records, not files; a csv record has no header.
    if (source.format == Format::kCsv) HYREC_RETURN_IF_ERROR(source.csv.Resolve(nullptr));
    return bytes;
  }
  if (source.format == Format::kCsv && !source.csv.header) HYREC_RETURN_IF_ERROR(source.csv.Resolve(nullptr));
  std::vector<std::string> header;
  absl::Status first;
  size_t usable = 0;
  source.csv.file_has_header.assign(source.files.size(), source.format == Format::kCsv && source.csv.header);
  for (size_t i = 0; i < source.files.size(); ++i) {
    bool has_header = false;
    absl::StatusOr<uint64_t> b = CheckFile(source.files[i], &source, &header, &has_header);
    source.csv.file_has_header[i] = has_header;
    if (b.ok()) {
      bytes[i] = *b;
      ++usable;
      continue;
    }
    if (!source.skip_bad_files) return b.status();
    spdlog::warn("loader: {} (skip_bad_files: the file is skipped)", std::string(b.status().message()));
    if (first.ok()) first = b.status();
  }
  if (usable == 0) {
    return absl::DataLossError(absl::StrCat("no usable data file among ", source.files.size(), ": ", first.message()));
  }
  return bytes;
}

absl::StatusOr<uint64_t> CheckSourceFiles(const SourceConfig& source) {
  if (source.kafka.has_value()) {  // The topic is there and its brokers answer.
#ifdef HYREC_HAS_KAFKA
    HYREC_RETURN_IF_ERROR(KafkaReader::Open(*source.kafka, 0, 1).status());
#else
    return absl::FailedPreconditionError(
        "loader.source.kafka: this build of hyrec has no Kafka source (librdkafka-dev was missing when it was built)");
#endif
  }
  SourceConfig resolved = source;
  absl::StatusOr<std::vector<uint64_t>> bytes = CheckFiles(&resolved);
  if (!bytes.ok()) return bytes.status();
  uint64_t total = 0;
  for (uint64_t b : *bytes) total += b;
  return total;
}

}  // namespace hyrec::data_loader
