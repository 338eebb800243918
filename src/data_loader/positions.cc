#include "hyrec/data_loader/positions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "hyrec/common/block_file.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::data_loader {
namespace {

constexpr uint32_t kPositionBlock = 20;  // u32 rank, then the 7 fields of ReaderPosition

}  // namespace

std::string PositionFileName(int rank) { return absl::StrCat("pos-", rank, ".blk"); }

absl::StatusOr<FileEntry> WritePositionFile(Env* env, const std::string& dir, int rank, const ReaderPosition& p,
                                            bool sync) {
  HYREC_ASSIGN_OR_RETURN(auto w, BlockWriter::Create(env, JoinPath(dir, PositionFileName(rank)), FileKind::kPosition));
  Encoder e;
  e.U32(static_cast<uint32_t>(rank));
  e.U64(p.epoch);
  e.U64(p.window_batch);
  e.U64(p.window_global);
  e.U32(p.file_index);
  e.U64(p.byte_offset);
  e.U64(p.line_number);
  e.U64(p.next_batch);
  // Stream sources' ranges follow; a position of a file source ends here, as before they existed.
  if (!p.partitions.empty()) {
    e.U32(static_cast<uint32_t>(p.partitions.size()));
    for (const PartitionRange& r : p.partitions) {
      e.U32(static_cast<uint32_t>(r.partition));
      e.U64(static_cast<uint64_t>(r.start));
      e.U64(static_cast<uint64_t>(r.end));
    }
  }
  HYREC_RETURN_IF_ERROR(w->Add(kPositionBlock, e.str()));
  return w->Finish(sync);
}

absl::StatusOr<std::vector<ReaderPosition>> ReadPositionFiles(Env* env, const std::string& dir,
                                                              const CheckpointManifest& manifest, int workers) {
  std::vector<ReaderPosition> saved;
  for (uint32_t r = 0; r < manifest.num_workers; ++r) {
    const std::string name = PositionFileName(static_cast<int>(r));
    const FileEntry* entry = manifest.Find(name);
    if (entry == nullptr) return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no ", name));
    HYREC_ASSIGN_OR_RETURN(auto reader, BlockReader::Open(env, JoinPath(dir, name), FileKind::kPosition, entry));
    Block b;
    HYREC_ASSIGN_OR_RETURN(const bool has, reader->Next(&b));
    Decoder d(b.payload);
    ReaderPosition p;
    const uint32_t rank = d.U32();
    p.epoch = d.U64();
    p.window_batch = d.U64();
    p.window_global = d.U64();
    p.file_index = d.U32();
    p.byte_offset = d.U64();
    p.line_number = d.U64();
    p.next_batch = d.U64();
    if (d.ok() && !d.done()) {
      const uint32_t ranges = d.U32();
      for (uint32_t i = 0; i < ranges && d.ok(); ++i) {
        PartitionRange r;
        r.partition = static_cast<int32_t>(d.U32());
        r.start = static_cast<int64_t>(d.U64());
        r.end = static_cast<int64_t>(d.U64());
        p.partitions.push_back(r);
      }
    }
    if (!has || b.type != kPositionBlock || !d.done() || rank != r) {
      return absl::DataLossError(absl::StrCat(reader->path(), ": malformed position block"));
    }
    HYREC_ASSIGN_OR_RETURN(const bool more, reader->Next(&b));  // The end block: checks the file's crc32.
    if (more) return absl::DataLossError(absl::StrCat(reader->path(), ": more than one position block"));
    saved.push_back(p);
  }
  if (saved.empty()) return absl::DataLossError(absl::StrCat(dir, ": the checkpoint holds no loader position"));
  return RemapPositions(saved, workers);
}

absl::StatusOr<std::vector<ReaderPosition>> RemapPositions(const std::vector<ReaderPosition>& positions, int workers) {
  if (positions.empty() || workers < 1) return absl::InvalidArgumentError("no positions to remap");
  const int saved = static_cast<int>(positions.size());
  uint64_t next = UINT64_MAX;
  size_t earliest = 0;
  for (size_t r = 0; r < positions.size(); ++r) {
    next = std::min(next, positions[r].next_batch);
    if (positions[r].window_global < positions[earliest].window_global) earliest = r;
  }
  // One cut: the W workers' next batches are next, next + 1, ..., next + W - 1.
  std::vector<bool> seen(saved, false);
  for (const ReaderPosition& p : positions) {
    const uint64_t k = p.next_batch - next;
    if (k >= static_cast<uint64_t>(saved) || seen[k]) {
      return absl::InvalidArgumentError("the loader positions are not of one consistent cut");
    }
    seen[k] = true;
  }
  if (saved == workers) return positions;
  std::vector<ReaderPosition> out(workers, positions[earliest]);
  for (int r = 0; r < workers; ++r) {
    const uint64_t w = static_cast<uint64_t>(workers);
    out[r].next_batch = next + (static_cast<uint64_t>(r) + w - next % w) % w;
  }
  return out;
}

}  // namespace hyrec::data_loader
