#include "hyrec/data_loader/config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"

namespace hyrec::data_loader {

namespace {

// index_ranges: [[first, last], ...].
absl::Status ReadIndexRanges(const YAML::Node& source, const std::string& sp, std::vector<IndexRange>* out) {
  const YAML::Node node = source["index_ranges"];
  if (!node) return absl::OkStatus();
  const std::string key = JoinKey(sp, "index_ranges");
  if (!node.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(key, " (", YamlWhere(node), "): expected a list of [first, last]"));
  }
  for (size_t k = 0; k < node.size(); ++k) {
    const YAML::Node r = node[k];
    const std::string rk = absl::StrCat(key, "[", k, "]");
    if (!r.IsSequence() || r.size() != 2 || !r[0].IsScalar() || !r[1].IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(rk, " (", YamlWhere(r), "): expected [first, last]"));
    }
    IndexRange range;
    if (!absl::SimpleAtoi(r[0].Scalar(), &range.first) || !absl::SimpleAtoi(r[1].Scalar(), &range.last)) {
      return absl::InvalidArgumentError(absl::StrCat(rk, " (", YamlWhere(r), "): indices are non-negative integers"));
    }
    out->push_back(range);
  }
  return absl::OkStatus();
}

// A one-byte setting: a one-character string ("\t" in YAML's double quotes is a tab); "" is '\0'
// when `allow_none`.
absl::Status ReadChar(const YAML::Node& node, const char* key, const std::string& p, bool allow_none, char* out) {
  if (!node[key]) return absl::OkStatus();
  std::string value;
  HYREC_RETURN_IF_ERROR(ReadScalar(node, key, p, &value));
  if (value.empty() && allow_none) {
    *out = '\0';
    return absl::OkStatus();
  }
  if (value.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(p, key), " (", YamlWhere(node[key]), "): '", value,
                                                   "' is not one character", allow_none ? " (or \"\" for none)" : ""));
  }
  *out = value[0];
  return absl::OkStatus();
}

absl::Status ReadCsvColumn(const YAML::Node& node, const std::string& p, CsvColumn* c) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, p,
                                  {"name", "index", "feature", "type", "positives", "negatives", "transform", "mean",
                                   "stddev", "separator", "weight_separator"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "name", p, &c->name));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "feature", p, &c->feature));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "index", p, &c->index));
  std::string type;
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "type", p, &type));
  static constexpr CsvColumn::Kind kKinds[] = {
      CsvColumn::Kind::kLabel,    CsvColumn::Kind::kDense,  CsvColumn::Kind::kCategorical, CsvColumn::Kind::kMulti,
      CsvColumn::Kind::kWeighted, CsvColumn::Kind::kIgnore, CsvColumn::Kind::kTime};
  bool known = false;
  for (CsvColumn::Kind kind : kKinds) {
    if (type == CsvKindName(kind)) {
      c->kind = kind;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat(JoinKey(p, "type"), " (", YamlWhere(node["type"] ? node["type"] : node), "): '", type,
                     "' is not label, dense, categorical, multi, weighted, time or ignore"));
  }
  HYREC_RETURN_IF_ERROR(ReadStringList(node, "positives", p, &c->positives));
  HYREC_RETURN_IF_ERROR(ReadStringList(node, "negatives", p, &c->negatives));
  std::string transform = "none";
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "transform", p, &transform));
  if (transform == "none") {
    c->transform = CsvColumn::Transform::kNone;
  } else if (transform == "log1p") {
    c->transform = CsvColumn::Transform::kLog1p;
  } else if (transform == "standardize") {
    c->transform = CsvColumn::Transform::kStandardize;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(p, "transform"), " (", YamlWhere(node["transform"]), "): '",
                                                   transform, "' is not none, log1p or standardize"));
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "mean", p, &c->mean));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "stddev", p, &c->stddev));
  HYREC_RETURN_IF_ERROR(ReadChar(node, "separator", p, false, &c->separator));
  HYREC_RETURN_IF_ERROR(ReadChar(node, "weight_separator", p, false, &c->weight_separator));
  return absl::OkStatus();
}

absl::Status ReadCsv(const YAML::Node& node, const std::string& p, CsvOptions* csv) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, p, {"delimiter", "quote", "header", "ignore_undeclared", "columns"}));
  HYREC_RETURN_IF_ERROR(ReadChar(node, "delimiter", p, false, &csv->delimiter));
  HYREC_RETURN_IF_ERROR(ReadChar(node, "quote", p, true, &csv->quote));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "header", p, &csv->header));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "ignore_undeclared", p, &csv->ignore_undeclared));
  const YAML::Node columns = node["columns"];
  if (!columns || !columns.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(p, "columns"), " (", YamlWhere(columns ? columns : node),
                                                   "): expected a list of columns"));
  }
  for (size_t k = 0; k < columns.size(); ++k) {
    const std::string ck = absl::StrCat(JoinKey(p, "columns"), "[", k, "]");
    if (!columns[k].IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ck, " (", YamlWhere(columns[k]), "): expected a mapping {name|index, type, ...}"));
    }
    csv->columns.emplace_back();
    HYREC_RETURN_IF_ERROR(ReadCsvColumn(columns[k], ck, &csv->columns.back()));
  }
  return absl::OkStatus();
}

// loader.source.synthetic.
absl::Status ReadSynthetic(const YAML::Node& syn, const std::string& yp, SyntheticConfig* config) {
  HYREC_RETURN_IF_ERROR(CheckKeys(syn, yp,
                                  {"num_samples", "num_dense", "num_slots", "vocabulary", "ids_per_sample", "zipf",
                                   "seed", "teacher_dim", "teacher_scale", "teacher_bias", "first_index"}));
  SyntheticConfig& c = *config;
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "num_samples", yp, &c.num_samples));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "num_dense", yp, &c.num_dense));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "num_slots", yp, &c.num_slots));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "vocabulary", yp, &c.vocabulary));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "ids_per_sample", yp, &c.ids_per_sample));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "zipf", yp, &c.zipf));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "seed", yp, &c.seed));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "teacher_dim", yp, &c.teacher_dim));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "teacher_scale", yp, &c.teacher_scale));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "teacher_bias", yp, &c.teacher_bias));
  HYREC_RETURN_IF_ERROR(ReadScalar(syn, "first_index", yp, &c.first_index));
  return absl::OkStatus();
}

// loader.source.kafka's end: bounded, end_offsets or end_time, at most one.
absl::Status ReadKafkaEnd(const YAML::Node& node, const std::string& kp, KafkaOptions* kafka) {
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "bounded", kp, &kafka->bounded));
  int ends = kafka->bounded ? 1 : 0;
  if (const YAML::Node offsets = node["end_offsets"]) {
    ++ends;
    const std::string op = JoinKey(kp, "end_offsets");
    if (!offsets.IsMap() || offsets.size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, " (", YamlWhere(offsets), "): expected a mapping of partition: end offset"));
    }
    for (const auto& item : offsets) {
      int32_t partition = 0;
      int64_t offset = 0;
      if (!item.first.IsScalar() || !absl::SimpleAtoi(item.first.Scalar(), &partition) || partition < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, " (", YamlWhere(item.first), "): a partition is a non-negative integer"));
      }
      const std::string at = JoinKey(op, item.first.Scalar());
      if (!item.second.IsScalar() || !absl::SimpleAtoi(item.second.Scalar(), &offset) || offset < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, " (", YamlWhere(item.second), "): an end offset is a non-negative integer"));
      }
      if (!kafka->end_offsets.emplace(partition, offset).second) {
        return absl::InvalidArgumentError(absl::StrCat(at, " (", YamlWhere(item.first), "): partition named twice"));
      }
    }
  }
  if (const YAML::Node time = node["end_time"]) {
    ++ends;
    absl::Time t;
    std::string error;
    if (!time.IsScalar() || !absl::ParseTime(absl::RFC3339_full, time.Scalar(), &t, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(kp, "end_time"), " (", YamlWhere(time),
                                                     "): expected an RFC 3339 time such as 2026-12-04T18:00:00Z"));
    }
    kafka->end_time = t;
  }
  if (ends > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kp, " (", YamlWhere(node), "): at most one of bounded, end_offsets and end_time"));
  }
  return absl::OkStatus();
}

// loader.source.kafka: a stream source's cluster, topic and consumer group.
absl::Status ReadKafka(const YAML::Node& node, const std::string& kp, KafkaOptions* kafka) {
  HYREC_RETURN_IF_ERROR(CheckKeys(node, kp,
                                  {"brokers", "topic", "group", "properties", "connect_timeout_seconds", "linger_ms",
                                   "bounded", "end_offsets", "end_time"}));
  for (const char* key : {"brokers", "topic", "group"}) {
    if (!node[key])
      return absl::InvalidArgumentError(absl::StrCat(kp, " (", YamlWhere(node), "): missing key '", key, "'"));
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "brokers", kp, &kafka->brokers));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "topic", kp, &kafka->topic));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "group", kp, &kafka->group));
  double connect_seconds = absl::ToDoubleSeconds(kafka->connect_timeout);
  double linger_ms = absl::ToDoubleMilliseconds(kafka->linger);
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "connect_timeout_seconds", kp, &connect_seconds));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "linger_ms", kp, &linger_ms));
  HYREC_RETURN_IF_ERROR(ReadKafkaEnd(node, kp, kafka));
  if (!(connect_seconds > 0 && connect_seconds <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(kp, "connect_timeout_seconds"), " (",
                                                   YamlWhere(node["connect_timeout_seconds"]),
                                                   "): must be in (0, 3600]"));
  }
  if (!(linger_ms >= 0 && linger_ms <= 60000)) {
    return absl::InvalidArgumentError(
        absl::StrCat(JoinKey(kp, "linger_ms"), " (", YamlWhere(node["linger_ms"]), "): must be in [0, 60000]"));
  }
  kafka->connect_timeout = absl::Seconds(connect_seconds);
  kafka->linger = absl::Milliseconds(linger_ms);
  for (const char* key : {"brokers", "topic", "group"}) {
    if (node[key].Scalar().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(JoinKey(kp, key), " (", YamlWhere(node[key]), "): must not be empty"));
    }
  }
  if (const YAML::Node properties = node["properties"]) {
    const std::string pp = JoinKey(kp, "properties");
    if (!properties.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(pp, " (", YamlWhere(properties), "): expected a mapping of librdkafka settings"));
    }
    for (const auto& item : properties) {
      const std::string key = item.first.as<std::string>();
      if (!item.second.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat(JoinKey(pp, key), " (", YamlWhere(item.second), "): expected a scalar"));
      }
      kafka->properties[key] = item.second.Scalar();
    }
  }
  return absl::OkStatus();
}

// loader.source: the format, its files and the format's own keys.
absl::Status ReadSource(const YAML::Node& node, const std::string& p, LoaderOptions& o) {
  const YAML::Node source = node["source"];
  if (!source) return absl::InvalidArgumentError(absl::StrCat(p, ": missing key 'source'"));
  const std::string sp = JoinKey(p, "source");
  HYREC_RETURN_IF_ERROR(CheckKeys(source, sp,
                                  {"format", "files", "skip_bad_files", "missing_id_for_empty", "num_slots",
                                   "field_base", "index_ranges", "fields", "use_values", "csv", "synthetic", "kafka"}));
  std::string format = "synthetic";
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "format", sp, &format));
  if (format == "criteo") {
    o.source.format = Format::kCriteo;
  } else if (format == "libsvm" || format == "libfm") {
    o.source.format = Format::kLibsvm;
  } else if (format == "libffm") {
    o.source.format = Format::kLibffm;
  } else if (format == "csv") {
    o.source.format = Format::kCsv;
  } else if (format == "synthetic") {
    o.source.format = Format::kSynthetic;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(sp, "format"), " (", YamlWhere(source["format"]), "): '",
                                                   format, "' is not criteo, libsvm, libffm, csv or synthetic"));
  }
  if (source["csv"] && o.source.format != Format::kCsv) {
    return absl::InvalidArgumentError(
        absl::StrCat(JoinKey(sp, "csv"), " (", YamlWhere(source["csv"]), "): only for format: csv"));
  }
  if (o.source.format == Format::kCsv) {
    if (!source["csv"]) return absl::InvalidArgumentError(absl::StrCat(sp, ": format csv needs a csv section"));
    HYREC_RETURN_IF_ERROR(ReadCsv(source["csv"], JoinKey(sp, "csv"), &o.source.csv));
  }
  HYREC_RETURN_IF_ERROR(ReadStringList(source, "files", sp, &o.source.files));
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "skip_bad_files", sp, &o.source.skip_bad_files));
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "missing_id_for_empty", sp, &o.source.criteo.missing_id_for_empty));
  o.source.csv.missing_id_for_empty = o.source.criteo.missing_id_for_empty;
  if (o.source.format == Format::kLibsvm && source["num_slots"]) {
    return absl::InvalidArgumentError(
        absl::StrCat(JoinKey(sp, "num_slots"), " (", YamlWhere(source["num_slots"]),
                     "): libsvm has no fields; its features are index_ranges (default: one feature of every index)"));
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "num_slots", sp, &o.source.libsvm.num_slots));
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "field_base", sp, &o.source.libsvm.field_base));
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "use_values", sp, &o.source.libsvm.use_values));
  HYREC_RETURN_IF_ERROR(ReadIndexRanges(source, sp, &o.source.libsvm.index_ranges));
  if (source["fields"] && o.source.format != Format::kLibsvm) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(sp, "fields"), " (", YamlWhere(source["fields"]),
                                                   "): only for format: libsvm or libfm (libffm names its fields)"));
  }
  HYREC_RETURN_IF_ERROR(ReadScalar(source, "fields", sp, &o.source.libsvm.positional_fields));
  if (const YAML::Node kafka = source["kafka"]) {
    o.source.kafka.emplace();
    HYREC_RETURN_IF_ERROR(ReadKafka(kafka, JoinKey(sp, "kafka"), &*o.source.kafka));
  }
  if (const YAML::Node syn = source["synthetic"]) {
    HYREC_RETURN_IF_ERROR(ReadSynthetic(syn, JoinKey(sp, "synthetic"), &o.source.synthetic));
  }
  return absl::OkStatus();
}

absl::Status ReadLoaderOptions(const YAML::Node& node, const std::string& p, LoaderOptions& o) {
  HYREC_RETURN_IF_ERROR(CheckKeys(
      node, p,
      {"source", "batch_size", "threads", "num_workers", "epochs", "shuffle", "shuffle_window", "seed", "num_shards",
       "slot_tables", "max_bad_fraction", "min_lines_for_bad_check", "prefetch_batches", "drop_last"}));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "batch_size", p, &o.batch_size));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "threads", p, &o.threads));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "num_workers", p, &o.num_workers));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "epochs", p, &o.epochs));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "shuffle", p, &o.shuffle));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "shuffle_window", p, &o.shuffle_window));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "seed", p, &o.seed));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "num_shards", p, &o.num_shards));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "max_bad_fraction", p, &o.max_bad_fraction));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "min_lines_for_bad_check", p, &o.min_lines_for_bad_check));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "prefetch_batches", p, &o.prefetch_batches));
  HYREC_RETURN_IF_ERROR(ReadScalar(node, "drop_last", p, &o.drop_last));
  HYREC_RETURN_IF_ERROR(ReadIntList(node, "slot_tables", p, 0, 4095, &o.slot_tables));
  HYREC_RETURN_IF_ERROR(ReadSource(node, p, o));
  absl::Status valid = o.Validate();
  if (!valid.ok()) return Annotate(valid, absl::StrCat(p, " (", YamlWhere(node), ")"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoaderOptions> ParseLoaderConfig(const YAML::Node& node, absl::string_view path) {
  LoaderOptions o;
  const std::string p(path);
  HYREC_RETURN_IF_ERROR(CatchYamlErrors(p.empty() ? "loader" : p, [&] { return ReadLoaderOptions(node, p, o); }));
  return o;
}

std::string FormatPartitionRanges(const std::vector<PartitionRange>& ranges) {
  std::string out;
  for (const PartitionRange& r : ranges) {
    absl::StrAppend(&out, out.empty() ? "" : ",", r.partition, ":", r.start, "-", r.end);
  }
  return out;
}

absl::StatusOr<std::vector<PartitionRange>> ParsePartitionRanges(absl::string_view text) {
  std::vector<PartitionRange> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> pr = absl::StrSplit(item, absl::MaxSplits(':', 1));
    std::pair<absl::string_view, absl::string_view> se = absl::StrSplit(pr.second, absl::MaxSplits('-', 1));
    PartitionRange r;
    if (!absl::SimpleAtoi(pr.first, &r.partition) || !absl::SimpleAtoi(se.first, &r.start) ||
        !absl::SimpleAtoi(se.second, &r.end) || r.partition < 0 || r.start < 0 || r.end < r.start) {
      return absl::InvalidArgumentError(
          absl::StrCat("partitions: '", item, "' is not PARTITION:START-END with 0 <= START <= END"));
    }
    out.push_back(r);
  }
  return out;
}

std::string FormatPositions(const std::vector<ReaderPosition>& positions) {
  std::string out;
  for (const ReaderPosition& p : positions) {
    absl::StrAppend(&out, "next_batch=", p.next_batch, " epoch=", p.epoch, " window_batch=", p.window_batch,
                    " window_global=", p.window_global, " file_index=", p.file_index, " byte_offset=", p.byte_offset,
                    " line_number=", p.line_number);
    if (!p.partitions.empty()) absl::StrAppend(&out, " partitions=", FormatPartitionRanges(p.partitions));
    absl::StrAppend(&out, "\n");
  }
  return out;
}

absl::StatusOr<std::vector<ReaderPosition>> ParsePositions(absl::string_view text) {
  std::vector<ReaderPosition> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.empty()) continue;
    ReaderPosition p;
    int seen = 0;
    for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      if (kv.first == "partitions") {
        absl::StatusOr<std::vector<PartitionRange>> ranges = ParsePartitionRanges(kv.second);
        if (!ranges.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("positions line ", line_number, ": ", ranges.status().message()));
        }
        p.partitions = *std::move(ranges);
        continue;
      }
      uint64_t value = 0;
      if (!absl::SimpleAtoi(kv.second, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("positions line ", line_number, ": '", field, "' is not key=integer"));
      }
      const absl::string_view k = kv.first;
      if (k == "next_batch")
        p.next_batch = value;
      else if (k == "epoch")
        p.epoch = value;
      else if (k == "window_batch")
        p.window_batch = value;
      else if (k == "window_global")
        p.window_global = value;
      else if (k == "file_index")
        p.file_index = static_cast<uint32_t>(value);
      else if (k == "byte_offset")
        p.byte_offset = value;
      else if (k == "line_number")
        p.line_number = value;
      else
        return absl::InvalidArgumentError(absl::StrCat("positions line ", line_number, ": unknown key '", k, "'"));
      ++seen;
    }
    if (seen != 7) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions line ", line_number, ": expected 7 fields, found ", seen));
    }
    out.push_back(p);
  }
  return out;
}

// ---- LoaderOptions and SourceConfig (loader.h): what they imply, and whether they hold ----

int SourceConfig::num_slots() const {
  switch (format) {
    case Format::kCriteo:
      return kCriteoSlots;
    case Format::kLibsvm:
      return libsvm.LibsvmSlots();
    case Format::kLibffm:
      return libsvm.num_slots;
    case Format::kCsv:
      return csv.num_slots();
    case Format::kSynthetic:
      return synthetic.num_slots;
  }
  return 0;
}

int SourceConfig::num_dense() const {
  switch (format) {
    case Format::kCriteo:
      return kCriteoDense;
    case Format::kLibsvm:
    case Format::kLibffm:
      return 0;
    case Format::kCsv:
      return csv.num_dense();
    case Format::kSynthetic:
      return synthetic.num_dense;
  }
  return 0;
}

int LoaderOptions::num_tables() const {
  if (slot_tables.empty()) return num_batch_slots();
  return *std::max_element(slot_tables.begin(), slot_tables.end()) + 1;
}

absl::Status LoaderOptions::Validate() const {
  if (batch_size < 1) return absl::InvalidArgumentError("loader.batch_size must be >= 1");
  if (threads < 1 || threads > 256) return absl::InvalidArgumentError("loader.threads must be in [1, 256]");
  if (num_workers < 1) return absl::InvalidArgumentError("loader.num_workers must be >= 1");
  if (num_shards < 1) return absl::InvalidArgumentError("loader.num_shards must be >= 1");
  if (prefetch_batches < 1) return absl::InvalidArgumentError("loader.prefetch_batches must be >= 1");
  if (!(max_bad_fraction >= 0 && max_bad_fraction <= 1)) {
    return absl::InvalidArgumentError("loader.max_bad_fraction must be in [0, 1]");
  }
  if (source.kafka.has_value()) {
    if (source.format == Format::kSynthetic) {
      return absl::InvalidArgumentError("loader.source.kafka: records are in a file format, not synthetic");
    }
    if (!source.files.empty()) return absl::InvalidArgumentError("loader.source: kafka or files, not both");
    if (source.format == Format::kCsv && source.csv.header) {
      return absl::InvalidArgumentError("loader.source.csv.header: a stream's records have no header line");
    }
    if (epochs != 1) {
      return absl::InvalidArgumentError("loader.epochs: a stream has one epoch, which does not end");
    }
  } else if (source.format == Format::kSynthetic) {
    absl::Status s = source.synthetic.Validate();
    if (!s.ok()) return s;
  } else if (source.files.empty()) {
    return absl::InvalidArgumentError("loader.files: a file source needs at least one file");
  }
  if (source.format == Format::kLibsvm || source.format == Format::kLibffm) {
    HYREC_RETURN_IF_ERROR(Annotate(source.libsvm.Validate(source.format == Format::kLibffm), "loader.source"));
  }
  if (source.format == Format::kCsv) HYREC_RETURN_IF_ERROR(Annotate(source.csv.Validate(), "loader.source"));
  for (const HashSlots* hash_slots : {&source.criteo.hash_slots, &source.libsvm.hash_slots}) {
    if (hash_slots->empty()) continue;
    if (static_cast<int>(hash_slots->size()) != source.num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("loader: ", hash_slots->size(), " hash slots for ", source.num_slots(), " slots"));
    }
    for (int s : *hash_slots) {
      if (s < 0 || s >= source.num_slots()) return absl::InvalidArgumentError("loader: a hash slot is out of range");
    }
  }
  for (int s : slot_copies) {
    if (s < 0 || s >= source.num_slots()) return absl::InvalidArgumentError("loader: a slot copy is out of range");
  }
  if (!slot_tables.empty()) {
    if (static_cast<int>(slot_tables.size()) != num_batch_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("loader.slot_tables has ", slot_tables.size(), " entries for ", num_batch_slots(), " slots"));
    }
    for (int t : slot_tables) {
      if (t < 0 || t >= 4096) return absl::InvalidArgumentError("loader.slot_tables entries must be in [0, 4096)");
    }
  }
  return absl::OkStatus();
}

}  // namespace hyrec::data_loader
