// LineReader: lines of a plain or gzip file (zlib reads both), with the uncompressed byte offset
// and 1-based number of every line, so a reader position can point into the file. It notices data
// that goes missing under it: a corrupt or truncated gzip stream, and a file that shrinks or
// disappears while it is read, are errors naming the file, never a quiet early end.
#ifndef HYREC_DATA_LOADER_LINE_READER_H_
#define HYREC_DATA_LOADER_LINE_READER_H_

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hyrec::data_loader {

class LineReader {
 public:
  // Opens `path` and positions it at `byte_offset` (uncompressed; for gzip files zlib decompresses
  // up to it), whose line is numbered `line_number`. NotFound for a missing file,
  // FailedPrecondition for one that is not a regular file, DataLoss for one that cannot be read
  // or sought.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path, uint64_t byte_offset,
                                                          uint64_t line_number);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  enum class Result { kLine, kEnd, kError };

  // kLine: *line holds the next line without '\n' (at most max_bytes + 1 bytes: a longer line is
  // cut and the rest skipped, so the parser reports it as overlong), *number its line number.
  // kEnd: the file is done (a last line without '\n' is still returned first).
  // kError: *error (DataLoss) says why: a truncated or corrupt gzip stream, or a file that became
  // shorter than when it was opened or was removed before its end was read; the file cannot go on.
  Result Next(size_t max_bytes, std::string* line, uint64_t* number, absl::Status* error);

  uint64_t offset() const { return offset_; }            // Of the next line.
  uint64_t line_number() const { return line_number_; }  // Of the next line.
  const std::string& path() const { return path_; }
  // Bytes of the file on disk (compressed, for gzip) when it was opened, and how far into them
  // the reader has read (zlib reads ahead, so this leads the lines returned by up to its buffer).
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t raw_offset() const;

 private:
  LineReader(std::string path, gzFile file, int fd, uint64_t file_bytes, uint64_t offset, uint64_t line_number)
      : path_(std::move(path)),
        file_(file),
        fd_(fd),
        file_bytes_(file_bytes),
        offset_(offset),
        line_number_(line_number) {}
  bool Fill(absl::Status* error);
  // At the end of the data: DataLoss when the file was removed or shrank since Open.
  absl::Status CheckWhole() const;

  std::string path_;
  gzFile file_;
  int fd_;  // Owned by file_; kept to check the file at its end.
  uint64_t file_bytes_;
  std::vector<char> buffer_ = std::vector<char>(1 << 20);
  size_t begin_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
  uint64_t offset_;
  uint64_t line_number_;
};

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_LINE_READER_H_
