#include "src/data_loader/line_reader.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace hyrec::data_loader {

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path, uint64_t byte_offset,
                                                             uint64_t line_number) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  gzbuffer(file, 1 << 18);
  if (byte_offset > 0 && gzseek(file, static_cast<z_off_t>(byte_offset), SEEK_SET) < 0) {
    int code = 0;
    const std::string message = gzerror(file, &code);
    gzclose(file);
    return absl::DataLossError(absl::StrCat("cannot seek '", path, "' to byte ", byte_offset, ": ", message));
  }
  return std::unique_ptr<LineReader>(new LineReader(path, file, byte_offset, line_number));
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
    int code = 0;
    *error = absl::DataLossError(absl::StrCat(path_, ":", line_number_, ": ", gzerror(file_, &code)));
    return false;
  }
  if (n == 0) {
    int code = 0;
    gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      *error = absl::DataLossError(
          absl::StrCat(path_, ":", line_number_, ": ", gzerror(file_, &code), " (truncated gzip stream?)"));
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
      if (line->empty() && !cut) return Result::kEnd;
      *number = line_number_++;  // Last line without a final newline.
      return Result::kLine;
    }
    if (!Fill(error)) return Result::kError;
    if (eof_ && begin_ == end_ && line->empty() && !cut) return Result::kEnd;
  }
}

}  // namespace hyrec::data_loader
