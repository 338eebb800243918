// libFuzzer target for one line parser, chosen at compile time by HYREC_FUZZ_FORMAT
// (0 Criteo, 1 libsvm, 2 libffm, 3 csv). Each input is split into lines; every line must parse or be
// refused with InvalidArgument, and a parsed sample must be well-formed. Built with clang's
// -fsanitize=fuzzer,address when clang is installed; replay_main.cc runs the checked-in corpus
// through the same function under ctest with any compiler.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "hyrec/data_loader/parsers.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

void CheckSample(const hyrec::data_loader::Sample& s, int num_slots) {
  Check(s.slot_offsets.size() == static_cast<size_t>(num_slots) + 1);
  Check(s.slot_offsets.front() == 0);
  for (int k = 0; k < num_slots; ++k) Check(s.slot_offsets[k] <= s.slot_offsets[k + 1]);
  Check(s.slot_offsets.back() == s.ids.size());
  Check(s.label == 0.0f || s.label == 1.0f);
  for (float d : s.dense) Check(d >= 0.0f && d == d);
  Check(s.weights.empty() || s.weights.size() == s.ids.size());
  for (float w : s.weights) Check(w == w && w - w == 0.0f);  // Finite.
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyrec::data_loader;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  Sample sample;
  LibsvmOptions libsvm;
  libsvm.num_slots = 8;
#if HYREC_FUZZ_FORMAT == 3
  // label, dense (log1p), categorical, multi, weighted, ignored; by position, quoting on or off.
  CsvOptions csv;
  csv.header = false;
  csv.quote = size % 2 == 0 ? '"' : '\0';
  csv.ignore_undeclared = size % 3 == 0;
  const CsvColumn::Kind kinds[] = {CsvColumn::Kind::kLabel, CsvColumn::Kind::kDense,    CsvColumn::Kind::kCategorical,
                                   CsvColumn::Kind::kMulti, CsvColumn::Kind::kWeighted, CsvColumn::Kind::kIgnore};
  for (int k = 0; k < 6; ++k) {
    CsvColumn c;
    c.index = k;
    c.kind = kinds[k];
    c.transform = CsvColumn::Transform::kLog1p;
    csv.columns.push_back(c);
  }
  Check(csv.Resolve(nullptr).ok());
#endif
  libsvm.field_base = static_cast<int>(size % 2);
  if (size % 3 == 0) libsvm.index_ranges = {{0, 99}, {100, 100}, {1000, uint64_t{1} << 40}};
  CriteoOptions criteo;
  criteo.missing_id_for_empty = size % 2 == 0;
  while (true) {
    const size_t newline = input.find('\n');
    const absl::string_view line = input.substr(0, newline);
    absl::Status status;
#if HYREC_FUZZ_FORMAT == 0
    status = ParseCriteoLine(line, criteo, &sample);
    if (status.ok()) CheckSample(sample, kCriteoSlots);
#elif HYREC_FUZZ_FORMAT == 1
    status = ParseLibsvmLine(line, libsvm, &sample);
    if (status.ok()) CheckSample(sample, libsvm.LibsvmSlots());
#elif HYREC_FUZZ_FORMAT == 2
    status = ParseLibffmLine(line, libsvm, &sample);
    if (status.ok()) CheckSample(sample, libsvm.num_slots);
#else
    status = ParseCsvLine(line, csv, &sample);
    if (status.ok()) CheckSample(sample, csv.num_slots());
    if (status.ok()) Check(sample.weights.size() == sample.ids.size());
#endif
    Check(status.ok() || status.code() == absl::StatusCode::kInvalidArgument);
    if (newline == absl::string_view::npos) break;
    input.remove_prefix(newline + 1);
  }
  return 0;
}
