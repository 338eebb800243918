// Block files: the container of every checkpoint, export and delta file (docs/checkpoint-format.md
// has the layout byte by byte).
//
//   header  "HYRECBLK" | u32 format version | u32 file kind | u32 crc32 of the 16 bytes before
//   block   u32 type | u32 0 | u64 payload length | payload | u32 crc32 of everything before it in the block
//   ...
//   end     a block of type kEndBlock whose payload is the u64 count of blocks before it
//
// All integers are little-endian. A reader checks every length against the file's remaining bytes
// and kMaxBlockBytes before reading, and every checksum, so a flipped bit or a truncation anywhere
// is DATA_LOSS naming the file and the byte offset, and nothing is returned from a bad block.
//
//   HYREC_ASSIGN_OR_RETURN(auto w, BlockWriter::Create(env, "ckpt/dense.blk", FileKind::kDense));
//   HYREC_RETURN_IF_ERROR(w->Add(1, payload));
//   HYREC_ASSIGN_OR_RETURN(FileEntry entry, w->Finish());   // durable under its final name
//
//   HYREC_ASSIGN_OR_RETURN(auto r, BlockReader::Open(env, "ckpt/dense.blk", FileKind::kDense));
//   for (Block b; r->Next(&b).value();) Use(b.type, b.payload);
#ifndef HYREC_COMMON_BLOCK_FILE_H_
#define HYREC_COMMON_BLOCK_FILE_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hyrec/common/env.h"

namespace hyrec {

inline constexpr char kBlockFileMagic[9] = "HYRECBLK";
inline constexpr uint32_t kBlockFormatVersion = 1;
inline constexpr uint32_t kEndBlock = 0;
// No block payload is larger; a length above it is corruption.
inline constexpr uint64_t kMaxBlockBytes = 1ull << 30;
inline constexpr size_t kBlockHeaderBytes = 20;

enum class FileKind : uint32_t {
  kManifest = 1,
  kPsShard = 2,     // A PS shard's rows with optimizer state, admission and dedup state.
  kDense = 3,       // Dense parameters, dense optimizer state, the training counters.
  kPosition = 4,    // One worker's loader position.
  kExportRows = 5,  // A shard's rows, weights only.
  kDeltaRows = 6,   // Rows changed since the previous delta, and tombstones.
};
absl::string_view FileKindName(FileKind kind);

// crc32 (zlib's polynomial) of `data`, continuing from `crc` (0 to start).
uint32_t Crc32(absl::string_view data, uint32_t crc = 0);

// A file a manifest lists.
struct FileEntry {
  std::string name;  // Within the checkpoint's directory.
  uint64_t length = 0;
  uint32_t crc32 = 0;  // Of the whole file.
};

class BlockWriter {
 public:
  // Writes `path` + ".tmp"; Finish renames it to `path`.
  static absl::StatusOr<std::unique_ptr<BlockWriter>> Create(Env* env, const std::string& path, FileKind kind);
  ~BlockWriter();

  absl::Status Add(uint32_t type, absl::string_view payload);
  // A block whose payload is `parts` one after another, written without copying them together.
  absl::Status AddParts(uint32_t type, std::initializer_list<absl::string_view> parts);
  // Appends the end block, syncs (unless `sync` is false: the caller then syncs the file with
  // Env::SyncFile before the manifest lists it), closes and renames into place (the directory is
  // not synced: the manifest's commit does that once for every file). After an error the
  // temporary file is removed and nothing is renamed.
  absl::StatusOr<FileEntry> Finish(bool sync = true);

 private:
  BlockWriter(Env* env, std::string path, std::unique_ptr<WritableFile> file)
      : env_(env), path_(std::move(path)), file_(std::move(file)) {}
  // Appends bytes to the file; `crc`: also fold them into the file's crc32 (AddParts folds whole
  // blocks in with crc32_combine instead).
  absl::Status Write(absl::string_view bytes, bool crc = true);
  absl::Status Flush();
  absl::Status Fail(absl::Status status);

  Env* const env_;
  const std::string path_;
  std::unique_ptr<WritableFile> file_;
  std::string buffer_;
  uint64_t length_ = 0;
  uint64_t blocks_ = 0;
  uint32_t crc_ = 0;
  absl::Status failed_;
};

struct Block {
  uint32_t type = 0;
  uint64_t offset = 0;  // Of the block's first byte in the file.
  std::string payload;
};

class BlockReader {
 public:
  // Opens `path` and checks its header: the magic, the format version and that it is a `kind`.
  // With `expect` (the file's manifest entry), the file must have its length, and the crc32 of
  // everything read must match it when the end block is reached: one pass both checks the file
  // and reads it. Blocks are checked on their own as they come, so a caller acts on no byte of a
  // bad block; it must still drop what it built from a file whose last Next fails.
  static absl::StatusOr<std::unique_ptr<BlockReader>> Open(Env* env, const std::string& path, FileKind kind,
                                                           const FileEntry* expect = nullptr);
  // The same over bytes in memory (fuzzing, tests); `name` stands for the path in messages.
  static absl::StatusOr<std::unique_ptr<BlockReader>> FromString(std::string name, std::string data, FileKind kind);

  // The next block: true with one, false after the end block (which must be the file's last
  // bytes); DATA_LOSS naming the file and offset for anything malformed.
  absl::StatusOr<bool> Next(Block* block);
  const std::string& path() const { return path_; }

 private:
  BlockReader(std::string path, std::unique_ptr<SequentialFile> file, uint64_t size)
      : path_(std::move(path)), file_(std::move(file)), size_(size) {}
  static absl::StatusOr<std::unique_ptr<BlockReader>> Start(std::unique_ptr<BlockReader> r, FileKind kind);
  absl::Status ReadExactly(size_t n, std::string* out);
  absl::Status Corrupt(uint64_t offset, absl::string_view what) const;

  const std::string path_;
  std::unique_ptr<SequentialFile> file_;
  const uint64_t size_;
  uint64_t offset_ = 0;
  uint64_t blocks_ = 0;
  uint32_t crc_ = 0;                    // Of every byte read.
  std::optional<uint32_t> expect_crc_;  // The manifest's, when given.
  bool done_ = false;
  std::string scratch_;
};

// Reads a BlockReader's blocks ahead on a thread of its own, up to `depth` blocks, so that reading
// and checking block n+1 overlaps what the caller does with block n. Used by one thread.
//
//   BlockPrefetcher blocks(std::move(reader));
//   for (const Block* b; blocks.Next(&b).value();) Use(b->type, b->payload);
class BlockPrefetcher {
 public:
  explicit BlockPrefetcher(std::unique_ptr<BlockReader> reader, int depth = 2);
  // Stops the thread once the block it is reading is read.
  ~BlockPrefetcher();
  BlockPrefetcher(const BlockPrefetcher&) = delete;
  BlockPrefetcher& operator=(const BlockPrefetcher&) = delete;

  // As BlockReader::Next; *block stays valid until the next call. After the end or an error,
  // every later call returns the same.
  absl::StatusOr<bool> Next(const Block** block);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A whole block file in memory, with its end block: the bytes BlockWriter writes for these blocks.
std::string EncodeBlockFile(FileKind kind, const std::vector<std::pair<uint32_t, std::string>>& blocks);

// Checks a whole file's length and crc32 against its manifest entry.
absl::Status VerifyFileEntry(Env* env, const std::string& dir, const FileEntry& entry);

// Little-endian encoding of block payloads.
class Encoder {
 public:
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Bytes(absl::string_view s) {
    U64(s.size());
    out_.append(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// Reads what an Encoder wrote; every read is bounds-checked. After a failed read ok() is false and
// every later read returns zeros.
class Decoder {
 public:
  explicit Decoder(absl::string_view in) : in_(in) {}
  uint32_t U32() {
    uint32_t v = 0;
    Raw(&v, 4);
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    Raw(&v, 8);
    return v;
  }
  double F64() {
    double v = 0;
    Raw(&v, 8);
    return v;
  }
  std::string Bytes() {
    const uint64_t n = U64();
    if (!ok_ || n > in_.size()) {
      ok_ = false;
      return {};
    }
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  // Views n bytes without copying.
  absl::string_view View(uint64_t n) {
    if (!ok_ || n > in_.size()) {
      ok_ = false;
      return {};
    }
    absl::string_view s = in_.substr(0, n);
    in_.remove_prefix(n);
    return s;
  }
  void Raw(void* p, size_t n) {
    if (!ok_ || n > in_.size()) {
      ok_ = false;
      return;
    }
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
  }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && in_.empty(); }
  size_t remaining() const { return in_.size(); }

 private:
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_BLOCK_FILE_H_
