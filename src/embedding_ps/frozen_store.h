// FrozenStore: the access to a store that a cut written by a forked process needs
// (ShardCheckpointer): freezing every stripe while the process forks, and reading the frozen
// store without locks in the child. Internal: no user calls it.
#ifndef HYREC_SRC_EMBEDDING_PS_FROZEN_STORE_H_
#define HYREC_SRC_EMBEDDING_PS_FROZEN_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "hyrec/embedding_ps/embedding_store.h"

namespace hyrec::embedding_ps {

class FrozenStore {
 public:
  virtual ~FrozenStore() = default;

  // Runs `fn` with the store frozen, every stripe and the deduplication state locked, so that
  // nothing in the store changes while it runs; a disk tier's pages are held until ChildDone.
  // `fn` must not call the store; a child it forks
  // holds the store as it was and reads it with FrozenHead and FrozenRows.
  virtual void RunFrozen(const std::function<void()>& fn) = 0;
  // Snapshot() in parts without taking a lock, for a child process forked in RunFrozen (where
  // the locks stay held and no other thread exists). FrozenHead: everything but the rows (each
  // table's ids, values and scores empty) and each table's row count. FrozenRows: each table's
  // rows in Snapshot()'s order, at most `piece_rows` at a time, to `rows` (the piece's ids,
  // values and scores); the first error `rows` returns ends it.
  using RowPieceFn = std::function<absl::Status(int table, const StoreSnapshot::Table& piece)>;
  virtual void FrozenHead(StoreSnapshot* head, std::vector<uint64_t>* rows_per_table) const = 0;
  virtual absl::Status FrozenRows(size_t piece_rows, const RowPieceFn& rows) const = 0;
  // Called once the child forked in RunFrozen has exited: until then the store's disk tier
  // reuses none of the pages the child may read (DiskTier::HoldPages).
  virtual void ChildDone() = 0;
};

// The frozen access of `store` when it has one (every store EmbeddingShardStore::Create makes);
// nullptr otherwise.
FrozenStore* FrozenAccess(EmbeddingShardStore* store);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_SRC_EMBEDDING_PS_FROZEN_STORE_H_
