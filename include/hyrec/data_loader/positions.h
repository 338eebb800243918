// Loader positions in checkpoints: one small block file per worker ("pos-<rank>.blk"), and how
// the positions of W workers become those of W' workers.
//
//   HYREC_ASSIGN_OR_RETURN(FileEntry e, WritePositionFile(env, dir, rank, stream->Position()));
//   HYREC_ASSIGN_OR_RETURN(auto positions, ReadPositionFiles(env, dir, manifest, /*workers=*/1));
//   HYREC_ASSIGN_OR_RETURN(auto loader, Loader::Start(options, positions));
#ifndef HYREC_DATA_LOADER_POSITIONS_H_
#define HYREC_DATA_LOADER_POSITIONS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/data_loader/sample.h"

namespace hyrec::data_loader {

std::string PositionFileName(int rank);

// Writes worker `rank`'s position, renamed into place; synced unless `sync` is false (the
// checkpoint's commit then syncs it with Env::SyncFile, off the training path). The manifest's
// commit syncs the directory.
absl::StatusOr<FileEntry> WritePositionFile(Env* env, const std::string& dir, int rank, const ReaderPosition& p,
                                            bool sync = true);

// The positions of a checkpoint's manifest.num_workers workers, each file checked against the
// manifest, remapped to `workers` workers (RemapPositions).
absl::StatusOr<std::vector<ReaderPosition>> ReadPositionFiles(Env* env, const std::string& dir,
                                                              const CheckpointManifest& manifest, int workers);

// Positions of a consistent cut (every worker trained the same number of batches) for another
// number of workers: the next global batch is the smallest next_batch of any worker, reading
// resumes at the earliest window any of them needs, and worker r' of `workers` takes the global
// batches from there with id % workers == r'. InvalidArgument when the positions are not of one
// cut (their next batches are not consecutive).
absl::StatusOr<std::vector<ReaderPosition>> RemapPositions(const std::vector<ReaderPosition>& positions, int workers);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_POSITIONS_H_
