#include "hyrec/common/block_file.h"

#include <zlib.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

constexpr size_t kFileHeaderBytes = 20;
constexpr size_t kFlushBytes = 4 << 20;

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A file held in memory (BlockReader::FromString).
class StringFile final : public SequentialFile {
 public:
  explicit StringFile(std::string data) : data_(std::move(data)) {}
  absl::StatusOr<size_t> Read(char* dst, size_t n) override {
    const size_t k = std::min(n, data_.size() - pos_);
    std::memcpy(dst, data_.data() + pos_, k);
    pos_ += k;
    return k;
  }

 private:
  const std::string data_;
  size_t pos_ = 0;
};

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The file header, and a block's bytes before its payload: the framing BlockWriter streams and
// EncodeBlockFile builds in memory.
std::string FileHeader(FileKind kind) {
  std::string header(kBlockFileMagic, 8);
  PutU32(&header, kBlockFormatVersion);
  PutU32(&header, static_cast<uint32_t>(kind));
  PutU32(&header, Crc32(header));
  return header;
}

std::string BlockHead(uint32_t type, uint64_t length) {
  std::string head;
  PutU32(&head, type);
  PutU32(&head, 0);
  PutU64(&head, length);
  return head;
}

std::string EndPayload(uint64_t blocks) {
  std::string count;
  PutU64(&count, blocks);
  return count;
}

}  // namespace

std::string EncodeBlockFile(FileKind kind, const std::vector<std::pair<uint32_t, std::string>>& blocks) {
  std::string out = FileHeader(kind);
  auto add = [&out](uint32_t type, const std::string& payload) {
    const std::string head = BlockHead(type, payload.size());
    const uint32_t crc = Crc32(payload, Crc32(head));
    out.append(head);
    out.append(payload);
    PutU32(&out, crc);
  };
  for (const auto& [type, payload] : blocks) add(type, payload);
  add(kEndBlock, EndPayload(blocks.size()));
  return out;
}

absl::string_view FileKindName(FileKind kind) {
  switch (kind) {
    case FileKind::kManifest:
      return "manifest";
    case FileKind::kPsShard:
      return "PS shard";
    case FileKind::kDense:
      return "dense state";
    case FileKind::kPosition:
      return "loader position";
    case FileKind::kExportRows:
      return "exported rows";
    case FileKind::kDeltaRows:
      return "delta rows";
  }
  return "unknown";
}

uint32_t Crc32(absl::string_view data, uint32_t crc) {
  uLong c = crc;
  while (!data.empty()) {
    const uInt n = static_cast<uInt>(std::min<size_t>(data.size(), 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(data.data()), n);
    data.remove_prefix(n);
  }
  return static_cast<uint32_t>(c);
}

// ---- BlockWriter ----

absl::StatusOr<std::unique_ptr<BlockWriter>> BlockWriter::Create(Env* env, const std::string& path, FileKind kind) {
  HYREC_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path + ".tmp"));
  std::unique_ptr<BlockWriter> w(new BlockWriter(env, path, std::move(file)));
  HYREC_RETURN_IF_ERROR(w->Write(FileHeader(kind)));
  return w;
}

BlockWriter::~BlockWriter() {
  if (file_ != nullptr) {  // Never finished: leave no temporary file behind.
    (void)file_->Close();
    (void)env_->DeleteFile(path_ + ".tmp");
  }
}

absl::Status BlockWriter::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = status;
  return status;
}

absl::Status BlockWriter::Write(absl::string_view bytes, bool crc) {
  if (!failed_.ok()) return failed_;
  if (crc) crc_ = Crc32(bytes, crc_);
  length_ += bytes.size();
  if (buffer_.size() + bytes.size() > kFlushBytes && !buffer_.empty()) HYREC_RETURN_IF_ERROR(Flush());
  if (bytes.size() >= kFlushBytes) {
    absl::Status s = file_->Append(bytes);
    return s.ok() ? s : Fail(s);
  }
  buffer_.append(bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::Status BlockWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = file_->Append(buffer_);
  buffer_.clear();
  return s.ok() ? s : Fail(s);
}

absl::Status BlockWriter::Add(uint32_t type, absl::string_view payload) { return AddParts(type, {payload}); }

absl::Status BlockWriter::AddParts(uint32_t type, std::initializer_list<absl::string_view> parts) {
  uint64_t length = 0;
  for (absl::string_view part : parts) length += part.size();
  if (length > kMaxBlockBytes) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("block of ", length, " bytes for '", path_, "' is over ", kMaxBlockBytes)));
  }
  // One crc32 pass: the block's, folded into the file's with crc32_combine.
  const std::string head = BlockHead(type, length);
  uint32_t crc = Crc32(head);
  HYREC_RETURN_IF_ERROR(Write(head, /*crc=*/false));
  for (absl::string_view part : parts) {
    crc = Crc32(part, crc);
    HYREC_RETURN_IF_ERROR(Write(part, /*crc=*/false));
  }
  std::string tail;
  PutU32(&tail, crc);
  HYREC_RETURN_IF_ERROR(Write(tail, /*crc=*/false));
  const uLong block_crc = crc32(crc, reinterpret_cast<const Bytef*>(tail.data()), 4);
  crc_ = static_cast<uint32_t>(crc32_combine(crc_, block_crc, static_cast<z_off_t>(head.size() + length + 4)));
  ++blocks_;
  return absl::OkStatus();
}

absl::StatusOr<FileEntry> BlockWriter::Finish(bool sync) {
  HYREC_RETURN_IF_ERROR(Add(kEndBlock, EndPayload(blocks_)));
  absl::Status s = Flush();
  if (s.ok() && sync) s = file_->Sync();
  const absl::Status closed = file_->Close();
  if (s.ok()) s = closed;
  if (s.ok()) s = env_->RenameFile(path_ + ".tmp", path_);
  file_.reset();
  if (!s.ok()) {
    (void)env_->DeleteFile(path_ + ".tmp");
    return Fail(s);
  }
  return FileEntry{BaseName(path_), length_, crc_};
}

// ---- BlockReader ----

absl::StatusOr<std::unique_ptr<BlockReader>> BlockReader::Open(Env* env, const std::string& path, FileKind kind,
                                                               const FileEntry* expect) {
  absl::StatusOr<uint64_t> size = env->GetFileSize(path);
  if (expect != nullptr && absl::IsNotFound(size.status())) {
    return absl::DataLossError(absl::StrCat(path, ": listed in the manifest but missing"));
  }
  if (!size.ok()) return size.status();
  if (expect != nullptr && *size != expect->length) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", *size, " bytes, the manifest says ", expect->length, " (truncated or replaced)"));
  }
  HYREC_ASSIGN_OR_RETURN(auto file, env->NewSequentialFile(path));
  std::unique_ptr<BlockReader> r(new BlockReader(path, std::move(file), *size));
  if (expect != nullptr) r->expect_crc_ = expect->crc32;
  return Start(std::move(r), kind);
}

absl::StatusOr<std::unique_ptr<BlockReader>> BlockReader::FromString(std::string name, std::string data,
                                                                     FileKind kind) {
  const uint64_t size = data.size();
  return Start(std::unique_ptr<BlockReader>(
                   new BlockReader(std::move(name), std::make_unique<StringFile>(std::move(data)), size)),
               kind);
}

absl::StatusOr<std::unique_ptr<BlockReader>> BlockReader::Start(std::unique_ptr<BlockReader> r, FileKind kind) {
  const uint64_t size = r->size_;
  std::string header;
  if (size < kFileHeaderBytes) return r->Corrupt(0, absl::StrCat("file of ", size, " bytes has no header"));
  HYREC_RETURN_IF_ERROR(r->ReadExactly(kFileHeaderBytes, &header));
  if (header.compare(0, 8, kBlockFileMagic) != 0) return r->Corrupt(0, "not a hyrec block file (bad magic)");
  if (Crc32(absl::string_view(header).substr(0, 16)) != GetU32(header.data() + 16)) {
    return r->Corrupt(0, "header checksum mismatch");
  }
  const uint32_t version = GetU32(header.data() + 8);
  if (version != kBlockFormatVersion) {
    return r->Corrupt(8, absl::StrCat("format version ", version, "; this build reads version ", kBlockFormatVersion));
  }
  const uint32_t got_kind = GetU32(header.data() + 12);
  if (got_kind != static_cast<uint32_t>(kind)) {
    return r->Corrupt(12, absl::StrCat("holds file kind ", got_kind, ", expected a ", FileKindName(kind), " file"));
  }
  return r;
}

absl::Status BlockReader::Corrupt(uint64_t offset, absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(path_, ": offset ", offset, ": ", what));
}

absl::Status BlockReader::ReadExactly(size_t n, std::string* out) {
  out->resize(n);  // Keeps its capacity: a reused Block reads every block into the same buffer.
  HYREC_ASSIGN_OR_RETURN(const size_t got, file_->Read(out->data(), n));
  if (got < n) return Corrupt(offset_ + got, "unexpected end of file (truncated)");
  offset_ += n;
  if (expect_crc_.has_value()) crc_ = Crc32(*out, crc_);
  return absl::OkStatus();
}

absl::StatusOr<bool> BlockReader::Next(Block* block) {
  if (done_) return false;
  const uint64_t start = offset_;
  if (size_ - offset_ < kBlockHeaderBytes - 4 + 4) return Corrupt(start, "truncated before a block header");
  HYREC_RETURN_IF_ERROR(ReadExactly(16, &scratch_));
  const uint32_t type = GetU32(scratch_.data());
  const uint32_t reserved = GetU32(scratch_.data() + 4);
  const uint64_t length = GetU64(scratch_.data() + 8);
  if (reserved != 0) return Corrupt(start + 4, "reserved field is not 0");
  if (length > kMaxBlockBytes) return Corrupt(start + 8, absl::StrCat("block length ", length, " is over the cap"));
  if (length + 4 > size_ - offset_) {
    return Corrupt(start + 8, absl::StrCat("block length ", length, " runs past the end of the file (truncated?)"));
  }
  uint32_t crc = Crc32(scratch_);
  HYREC_RETURN_IF_ERROR(ReadExactly(static_cast<size_t>(length), &block->payload));
  crc = Crc32(block->payload, crc);
  HYREC_RETURN_IF_ERROR(ReadExactly(4, &scratch_));
  if (GetU32(scratch_.data()) != crc) return Corrupt(start, absl::StrCat("block checksum mismatch (type ", type, ")"));
  block->type = type;
  block->offset = start;
  if (type == kEndBlock) {
    if (length != 8 || GetU64(block->payload.data()) != blocks_)
      return Corrupt(start, "end block does not count the blocks");
    if (offset_ != size_) return Corrupt(offset_, "bytes after the end block");
    if (expect_crc_.has_value() && crc_ != *expect_crc_) {
      return absl::DataLossError(absl::StrCat(path_, ": crc32 ", crc_, " differs from the manifest's ", *expect_crc_));
    }
    done_ = true;
    return false;
  }
  ++blocks_;
  return true;
}

struct BlockPrefetcher::State {
  std::unique_ptr<BlockReader> reader;
  std::vector<Block> slots;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> free;                                    // Guarded by mu.
  std::deque<std::pair<int, absl::StatusOr<bool>>> ready;  // Guarded by mu.
  bool stop = false;                                       // Guarded by mu.
  int current = -1;                                        // The caller's block.
  std::optional<absl::StatusOr<bool>> last;                // The end or the error, once seen.
  std::thread thread;

  void Run() {
    for (;;) {
      int slot;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !free.empty(); });
        if (stop) return;
        slot = free.front();
        free.pop_front();
      }
      absl::StatusOr<bool> more = reader->Next(&slots[slot]);
      const bool end = !more.ok() || !*more;
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace_back(slot, std::move(more));
      }
      cv.notify_all();
      if (end) return;
    }
  }
};

BlockPrefetcher::BlockPrefetcher(std::unique_ptr<BlockReader> reader, int depth) : state_(std::make_unique<State>()) {
  state_->reader = std::move(reader);
  state_->slots.resize(static_cast<size_t>(std::max(depth, 1)) + 1);
  for (size_t i = 0; i < state_->slots.size(); ++i) state_->free.push_back(static_cast<int>(i));
  state_->thread = std::thread([s = state_.get()] { s->Run(); });
}

BlockPrefetcher::~BlockPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
}

absl::StatusOr<bool> BlockPrefetcher::Next(const Block** block) {
  State& s = *state_;
  if (s.last.has_value()) return *s.last;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.current >= 0) {
    s.free.push_back(s.current);
    s.current = -1;
    s.cv.notify_all();
  }
  s.cv.wait(lock, [&] { return !s.ready.empty(); });
  auto [slot, more] = std::move(s.ready.front());
  s.ready.pop_front();
  if (!more.ok() || !*more) {
    s.last = more;
    return more;
  }
  s.current = slot;
  *block = &s.slots[slot];
  return true;
}

absl::Status VerifyFileEntry(Env* env, const std::string& dir, const FileEntry& entry) {
  const std::string path = JoinPath(dir, entry.name);
  HYREC_ASSIGN_OR_RETURN(const uint64_t size, env->GetFileSize(path));
  if (size != entry.length) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes, the manifest says ", entry.length, " (truncated or replaced)"));
  }
  HYREC_ASSIGN_OR_RETURN(auto file, env->NewSequentialFile(path));
  std::string buffer(4 << 20, '\0');
  uint32_t crc = 0;
  uint64_t read = 0;
  for (;;) {
    HYREC_ASSIGN_OR_RETURN(const size_t got, file->Read(buffer.data(), buffer.size()));
    if (got == 0) break;
    crc = Crc32(absl::string_view(buffer.data(), got), crc);
    read += got;
  }
  if (read != entry.length) return absl::DataLossError(absl::StrCat(path, ": changed while it was read"));
  if (crc != entry.crc32) {
    return absl::DataLossError(absl::StrCat(path, ": crc32 ", crc, " differs from the manifest's ", entry.crc32));
  }
  return absl::OkStatus();
}

}  // namespace hyrec
