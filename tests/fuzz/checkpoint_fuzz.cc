// libFuzzer target for checkpoint files, which are untrusted input: the first byte picks the
// reader, the rest is the file. 0: a MANIFEST; 1: a PS shard file restored as it was cut; 2: the
// same file as both shards of a 2-shard checkpoint, resharded to shard 1 of 3; 3: a loader
// position file; 4: exported rows; 5: delta rows. Every input must be read or refused with an
// error Status (never a crash, an over-read or an allocation the file's size does not bound).
// Built with clang's -fsanitize=fuzzer,address when clang is installed; replay_main.cc runs the
// checked-in corpus (tests/fuzz/corpus/checkpoint) through it under ctest with any compiler.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "hyrec/common/block_file.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/data_loader/positions.h"
#include "hyrec/embedding_ps/embedding_store.h"
#include "hyrec/embedding_ps/shard_checkpoint.h"

namespace {

using hyrec::CheckpointManifest;
using hyrec::Env;
using hyrec::FileEntry;

void Check(const absl::Status& s) {
  using absl::StatusCode;
  const StatusCode c = s.code();
  if (c != StatusCode::kOk && c != StatusCode::kDataLoss && c != StatusCode::kInvalidArgument &&
      c != StatusCode::kResourceExhausted && c != StatusCode::kFailedPrecondition) {
    std::abort();
  }
}

const std::string& Dir() {
  static const std::string dir = [] {
    const std::string d =
        std::filesystem::temp_directory_path().string() + "/hyrec_checkpoint_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `bytes` as `name` in the fuzz directory (not synced: nothing here must survive a crash)
// and returns its manifest entry.
FileEntry Put(const std::string& name, const std::string& bytes) {
  std::ofstream(hyrec::JoinPath(Dir(), name), std::ios::binary | std::ios::trunc) << bytes;
  return FileEntry{name, bytes.size(), hyrec::Crc32(bytes)};
}

std::unique_ptr<hyrec::embedding_ps::EmbeddingShardStore> Store() {
  hyrec::embedding_ps::TableConfig user;
  user.name = "user";
  user.dim = 8;
  user.optimizer.kind = hyrec::embedding_ps::OptimizerKind::kAdagrad;
  hyrec::embedding_ps::TableConfig item;
  item.name = "item";
  item.dim = 4;
  item.optimizer.kind = hyrec::embedding_ps::OptimizerKind::kAdam;
  hyrec::embedding_ps::StoreOptions o;
  o.tables = {user, item};
  o.num_stripes = 8;
  o.capacity_rows = 4096;
  return *hyrec::embedding_ps::EmbeddingShardStore::Create(o);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int which = data[0] % 6;
  const std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  Env* env = Env::Default();
  CheckpointManifest m;
  m.num_workers = 1;
  switch (which) {
    case 0:
      Check(hyrec::DecodeManifest("MANIFEST", file).status());
      break;
    case 1:
    case 2: {
      const bool reshard = which == 2;
      m.num_shards = reshard ? 2 : 1;
      for (uint32_t k = 0; k < m.num_shards; ++k) {
        m.files.push_back(
            Put(hyrec::embedding_ps::ShardFileName(hyrec::embedding_ps::CutKind::kCheckpoint, k, m.num_shards), file));
      }
      auto store = Store();
      Check(hyrec::embedding_ps::RestoreShard(env, Dir(), m, reshard ? 1 : 0, reshard ? 3 : 1, store.get()));
      break;
    }
    case 3:
      m.files.push_back(Put(hyrec::data_loader::PositionFileName(0), file));
      Check(hyrec::data_loader::ReadPositionFiles(env, Dir(), m, 2).status());
      break;
    case 4:
    case 5: {
      const FileEntry e = Put("rows.blk", file);
      Check(hyrec::embedding_ps::ReadRowsFile(env, hyrec::JoinPath(Dir(), e.name),
                                              which == 4 ? hyrec::FileKind::kExportRows : hyrec::FileKind::kDeltaRows,
                                              &e, [](hyrec::embedding_ps::ExportedTable& t) {
                                                if (t.weights.size() != t.ids.size() * static_cast<size_t>(t.dim))
                                                  std::abort();
                                                return absl::OkStatus();
                                              }));
      break;
    }
  }
  return 0;
}
