#include "src/data_loader/line_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hyrec::data_loader {
namespace {

// zlib's message for the stream, without the "<fd:N>: " it names a descriptor's stream by.
std::string GzMessage(gzFile file) {
  int code = 0;
  std::string message = gzerror(file, &code);
  if (message.rfind("<fd:", 0) == 0) {
    const size_t colon = message.find(": ");
    if (colon != std::string::npos) message.erase(0, colon + 2);
  }
  return message;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path, uint64_t byte_offset,
                                                             uint64_t line_number) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("cannot open '", path, "': ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(why) : absl::DataLossError(why);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file"));
  }
  gzFile file = gzdopen(fd, "rb");
  if (file == nullptr) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  }
  gzbuffer(file, 1 << 18);
  if (byte_offset > 0 && gzseek(file, static_cast<z_off_t>(byte_offset), SEEK_SET) < 0) {
    const std::string message = GzMessage(file);
    gzclose(file);
    return absl::DataLossError(absl::StrCat("cannot seek '", path, "' to byte ", byte_offset, ": ", message));
  }
  return std::unique_ptr<LineReader>(
      new LineReader(path, file, fd, static_cast<uint64_t>(st.st_size), byte_offset, line_number));
}

uint64_t LineReader::raw_offset() const {
  const z_off_t at = gzoffset(file_);
  return at < 0 ? 0 : static_cast<uint64_t>(at);
}

absl::Status LineReader::CheckWhole() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0 || st.st_nlink == 0) {
    return absl::DataLossError(
        absl::StrCat(path_, ": the file was removed while it was read (", line_number_ - 1, " lines read)"));
  }
  if (static_cast<uint64_t>(st.st_size) < file_bytes_) {
    return absl::DataLossError(absl::StrCat(path_, ": the file shrank from ", file_bytes_, " to ", st.st_size,
                                            " bytes while it was read (", line_number_ - 1, " lines read)"));
  }
  return absl::OkStatus();
}

LineReader::~LineReader() { gzclose(file_); }

bool LineReader::Fill(absl::Status* error) {
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
  const int n = gzread(file_, buffer_.data() + end_, static_cast<unsigned>(buffer_.size() - end_));
  if (n < 0) {
    *error = absl::DataLossError(absl::StrCat(path_, ":", line_number_, ": ", GzMessage(file_)));
    return false;
  }
  if (n == 0) {
    int code = 0;
    gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      *error = absl::DataLossError(
          absl::StrCat(path_, ":", line_number_, ": ", GzMessage(file_), " (truncated gzip stream?)"));
      return false;
    }
    eof_ = true;
  }
  end_ += static_cast<size_t>(n);
  return true;
}

LineReader::Result LineReader::Next(size_t max_bytes, std::string* line, uint64_t* number, absl::Status* error) {
  bool cut = false;
  line->clear();
  for (;;) {
    const char* start = buffer_.data() + begin_;
    const char* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
    const size_t available = newline != nullptr ? static_cast<size_t>(newline - start) : end_ - begin_;
    if (!cut) {
      const size_t keep = std::min(available, max_bytes + 1 - line->size());
      line->append(start, keep);
      if (line->size() > max_bytes) cut = true;
    }
    if (newline != nullptr) {
      begin_ += available + 1;
      offset_ += available + 1;
      *number = line_number_++;
      return Result::kLine;
    }
    begin_ += available;
    offset_ += available;
    if (eof_) {
      if (line->empty() && !cut) {
        *error = CheckWhole();
        return error->ok() ? Result::kEnd : Result::kError;
      }
      *number = line_number_++;  // Last line without a final newline.
      return Result::kLine;
    }
    if (!Fill(error)) return Result::kError;
    if (eof_ && begin_ == end_ && line->empty() && !cut) {
      *error = CheckWhole();
      return error->ok() ? Result::kEnd : Result::kError;
    }
  }
}

}  // namespace hyrec::data_loader
