#include "src/embedding_ps/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>
#ifndef HYREC_HAS_URING  // Defined by the build where liburing is found.
#define HYREC_HAS_URING 0
#endif
#if HYREC_HAS_URING
#include <liburing.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "hyrec/common/crc32c.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/status_macros.h"

namespace hyrec::embedding_ps {
namespace {

constexpr uint32_t kOpenPage = 0xffffffffu;  // A location's page while its row is in an open page.
constexpr int kCleanSamples = 64;

uint64_t Location(uint32_t page, uint32_t record) { return uint64_t{page} << 8 | record; }
uint32_t PageOf(uint64_t location) { return static_cast<uint32_t>(location >> 8); }
uint32_t RecordOf(uint64_t location) { return static_cast<uint32_t>(location & 0xff); }

absl::Status Errno(int error, absl::string_view what) {
  return absl::Status(absl::ErrnoToStatusCode(error), absl::StrCat(what, ": ", std::strerror(error)));
}

uint16_t U16At(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint64_t U64At(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

void DiskTier::PageFree::operator()(char* p) const { std::free(p); }

DiskTier::PageBuffer DiskTier::NewPages(size_t pages) {
  auto* p = static_cast<char*>(std::aligned_alloc(kPageBytes, pages * kPageBytes));
  std::memset(p, 0, pages * kPageBytes);
  return PageBuffer(p);
}

struct DiskTier::Table {
  uint32_t payload_bytes = 0;
  uint32_t record_bytes = 0;                      // 16 + payload_bytes rounded up to 8.
  uint32_t per_page = 0;                          // Records a page holds.
  absl::flat_hash_map<uint64_t, uint64_t> index;  // id -> location
  PageBuffer open;                                // The page being filled.
  uint32_t open_records = 0;                      // Records written into it.
  uint32_t open_live = 0;                         // Of those, the ones still held.

  char* OpenRecord(uint32_t record) const { return open.get() + kPageHeaderBytes + record * record_bytes; }
};

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options,
                                                         std::vector<uint32_t> payload_bytes) {
  if (options.path.empty()) return absl::InvalidArgumentError("disk tier: no path");
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier: queue_depth ", options.queue_depth, " (1 to 4096)"));
  }
  if (payload_bytes.empty() || payload_bytes.size() > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier: ", payload_bytes.size(), " tables"));
  }
  for (size_t t = 0; t < payload_bytes.size(); ++t) {
    if (payload_bytes[t] == 0 || payload_bytes[t] > kPageBytes - kPageHeaderBytes - 16) {
      return absl::InvalidArgumentError(absl::StrCat("disk tier: a row of table ", t, " holds ", payload_bytes[t],
                                                     " bytes; a page holds at most ",
                                                     kPageBytes - kPageHeaderBytes - 16));
    }
  }
  const uint64_t pages = options.capacity_bytes / kPageBytes;
  if (pages < payload_bytes.size() + 2 || pages >= kOpenPage) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier ", options.path, ": capacity_bytes ",
                                                   options.capacity_bytes, " holds ", pages, " pages of ", kPageBytes,
                                                   " bytes; it needs at least ", payload_bytes.size() + 2));
  }
  const std::filesystem::path parent = std::filesystem::path(options.path).parent_path();
  if (std::error_code error; !parent.empty() && !std::filesystem::create_directories(parent, error) && error) {
    return absl::UnavailableError(absl::StrCat("disk tier: create ", parent.string(), ": ", error.message()));
  }
  const int fd = ::open(options.path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(errno, absl::StrCat("disk tier: open ", options.path, " for direct I/O"));
  return std::unique_ptr<DiskTier>(new DiskTier(options, fd, std::move(payload_bytes)));
}

DiskTier::DiskTier(DiskTierOptions options, int fd, std::vector<uint32_t> payload_bytes)
    : options_(std::move(options)),
      fd_(fd),
      num_pages_(static_cast<uint32_t>(options_.capacity_bytes / kPageBytes)),
      tables_(payload_bytes.size()),
      live_(num_pages_),
      page_table_(num_pages_),
      page_write_(num_pages_) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    Table& table = tables_[t];
    table.payload_bytes = payload_bytes[t];
    table.record_bytes = RecordBytes(payload_bytes[t]);
    table.per_page = RecordsPerPage(payload_bytes[t]);
    table.open = NewPages(1);
  }
}

DiskTier::~DiskTier() {
  ::close(fd_);
  ::unlink(options_.path.c_str());
}

uint64_t DiskTier::IndexBytes(uint64_t rows) {
  if (rows == 0) return 0;
  uint64_t capacity = 15;
  while (capacity - capacity / 8 < rows) capacity = capacity * 2 + 1;
  return capacity * (sizeof(std::pair<uint64_t, uint64_t>) + 1);
}

bool DiskTier::HasRoomFor(int table, uint64_t rows) const {
  absl::MutexLock lock(&mu_);
  if (table >= 0 && table < static_cast<int>(tables_.size()) && FillLocked(table, rows) <= 1.0) return true;
  ++stats_.full_refusals;
  return false;
}

double DiskTier::FillLocked(int extra_table, uint64_t extra) const {
  double needed = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const uint64_t rows = tables_[t].index.size() + (static_cast<int>(t) == extra_table ? extra : 0);
    needed += static_cast<double>(rows) / tables_[t].per_page;
  }
  // One page a table is its open page, and one is the cleaner's.
  return needed / (kMostFill * static_cast<double>(num_pages_ - tables_.size() - 1));
}

absl::Status DiskTier::Put(int table, uint64_t id, uint64_t score, const char* payload) {
  absl::MutexLock lock(&mu_);
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier: table ", table));
  }
  if (!tables_[table].index.contains(id) && FillLocked(table, 1) > 1.0) {
    ++stats_.full_refusals;
    return absl::ResourceExhaustedError(absl::StrCat("disk tier ", options_.path, " is full: its ", LiveRowsLocked(),
                                                     " rows need ", kMostFill * 100, "% of its ", num_pages_,
                                                     " pages of ", kPageBytes, " bytes (ps.disk.capacity_bytes)"));
  }
  Table& t = tables_[table];
  if (t.open_records == t.per_page) HYREC_RETURN_IF_ERROR(FlushLocked(table));
  if (auto it = t.index.find(id); it != t.index.end()) {
    if (PageOf(it->second) == kOpenPage) {
      --t.open_live;
    } else {
      ForgetLocked(it->second);
    }
  }
  AppendLocked(table, id, score, payload);
  ++stats_.puts;
  return absl::OkStatus();
}

uint64_t DiskTier::LiveRowsLocked() const {
  uint64_t rows = 0;
  for (const Table& t : tables_) rows += t.index.size();
  return rows;
}

void DiskTier::AppendLocked(int t, uint64_t id, uint64_t score, const char* payload) {
  Table& table = tables_[t];
  const uint32_t record = table.open_records++;
  char* out = table.OpenRecord(record);
  std::memcpy(out, &id, 8);
  std::memcpy(out + 8, &score, 8);
  std::memcpy(out + 16, payload, table.payload_bytes);
  ++table.open_live;
  table.index[id] = Location(kOpenPage, record);
}

absl::Status DiskTier::FlushLocked(int t) {
  Table& table = tables_[t];
  // The full page moves aside, so that a page the cleaner frees for it may move rows of this
  // table into an empty open page.
  PageBuffer full = std::move(table.open);
  table.open = std::move(spare_);
  if (table.open == nullptr) table.open = NewPages(1);
  const uint32_t records = table.open_records;
  const uint32_t live = table.open_live;
  table.open_records = 0;
  table.open_live = 0;
  absl::StatusOr<uint32_t> page = FreePageLocked();
  if (!page.ok()) {
    if (table.open_records == 0) {  // Nothing moved in: put the full page back.
      spare_ = std::move(table.open);
      table.open = std::move(full);
      table.open_records = records;
      table.open_live = live;
    }
    return page.status();
  }
  char* buf = full.get();
  const uint16_t table16 = static_cast<uint16_t>(t);
  const uint16_t records16 = static_cast<uint16_t>(records);
  const uint64_t write = next_write_++;
  std::memcpy(buf + 4, &table16, 2);
  std::memcpy(buf + 6, &records16, 2);
  std::memcpy(buf + 8, &write, 8);
  const uint32_t used = kPageHeaderBytes + records * table.record_bytes;
  std::memset(buf + used, 0, kPageBytes - used);
  const uint32_t crc = Crc32c(absl::string_view(buf + 4, kPageBytes - 4));
  std::memcpy(buf, &crc, 4);
  const ssize_t n = ::pwrite(fd_, buf, kPageBytes, static_cast<off_t>(*page) * kPageBytes);
  if (n != static_cast<ssize_t>(kPageBytes)) {
    free_.push_back(*page);
    return absl::DataLossError(absl::StrCat("disk tier ", options_.path, ": write of page ", *page, " failed (",
                                            n < 0 ? std::strerror(errno) : "short", "); the shard must recover"));
  }
  ++stats_.page_writes;
  stats_.bytes_written += kPageBytes;
  for (uint32_t r = 0; r < records; ++r) {
    const uint64_t id = U64At(buf + kPageHeaderBytes + r * table.record_bytes);
    auto it = table.index.find(id);
    if (it != table.index.end() && it->second == Location(kOpenPage, r)) it->second = Location(*page, r);
  }
  live_[*page] = static_cast<uint16_t>(live);
  page_table_[*page] = table16;
  page_write_[*page] = write;
  if (live == 0) free_.push_back(*page);
  std::memset(full.get(), 0, kPageBytes);
  spare_ = std::move(full);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> DiskTier::FreePageLocked() {
  while (free_.empty() && never_used_ == num_pages_) {
    if (holding_) {
      ++stats_.full_refusals;
      return absl::ResourceExhaustedError(
          absl::StrCat("disk tier ", options_.path, ": no free page while a checkpoint holds its pages"));
    }
    HYREC_RETURN_IF_ERROR(CleanOneLocked());
  }
  if (!free_.empty()) {
    const uint32_t page = free_.back();
    free_.pop_back();
    return page;
  }
  return never_used_++;
}

absl::Status DiskTier::CleanOneLocked() {
  // The emptiest of a few sampled pages; every page when the samples find no hole.
  uint32_t victim = kOpenPage;
  uint32_t best_gain = 0;
  auto consider = [&](uint32_t page) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (live_[page] == 0) return;  // Free, or held free.
    const uint32_t gain = tables_[page_table_[page]].per_page - live_[page];
    if (gain > best_gain) {
      best_gain = gain;
      victim = page;
    }
  };
  for (int i = 0; i < kCleanSamples; ++i) consider(static_cast<uint32_t>(Mix64(++clean_draw_) % num_pages_));
  if (victim == kOpenPage) {
    for (uint32_t page = 0; page < num_pages_; ++page) consider(page);
  }
  if (victim == kOpenPage) {
    return absl::ResourceExhaustedError(absl::StrCat("disk tier ", options_.path, ": no page has a hole to clean"));
  }
  PageBuffer buf = NewPages(1);
  HYREC_RETURN_IF_ERROR(ReadPage(victim, buf.get()));
  const int t = U16At(buf.get() + 4);
  Table& table = tables_[t];
  const uint32_t records = U16At(buf.get() + 6);
  // The page is free from here: its live rows are in `buf` and move to the table's open page,
  // whose flush may take this very page (and then finds it free without cleaning again).
  live_[victim] = 0;
  free_.push_back(victim);
  for (uint32_t r = 0; r < records; ++r) {
    const char* rec = buf.get() + kPageHeaderBytes + r * table.record_bytes;
    const uint64_t id = U64At(rec);
    auto it = table.index.find(id);
    if (it == table.index.end() || it->second != Location(victim, r)) continue;
    if (table.open_records == table.per_page) HYREC_RETURN_IF_ERROR(FlushLocked(t));
    AppendLocked(t, id, U64At(rec + 8), rec + 16);
  }
  ++stats_.cleaned_pages;
  return absl::OkStatus();
}

void DiskTier::ForgetLocked(uint64_t location) {
  const uint32_t page = PageOf(location);
  if (page == kOpenPage) return;  // The caller's table's open page: counted by the caller.
  if (--live_[page] == 0) (holding_ ? held_free_ : free_).push_back(page);
}

bool DiskTier::Contains(int table, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return table >= 0 && table < static_cast<int>(tables_.size()) && tables_[table].index.contains(id);
}

size_t DiskTier::CountHeld(int table, absl::Span<const uint64_t> ids) const {
  absl::MutexLock lock(&mu_);
  if (table < 0 || table >= static_cast<int>(tables_.size()) || tables_[table].index.empty()) return 0;
  size_t held = 0;
  for (const uint64_t id : ids) held += tables_[table].index.contains(id) ? 1 : 0;
  return held;
}

bool DiskTier::Erase(int t, uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (t < 0 || t >= static_cast<int>(tables_.size())) return false;
  Table& table = tables_[t];
  auto it = table.index.find(id);
  if (it == table.index.end()) return false;
  if (PageOf(it->second) == kOpenPage) --table.open_live;
  ForgetLocked(it->second);
  table.index.erase(it);
  return true;
}

absl::Status DiskTier::Take(int t, absl::Span<const uint64_t> ids,
                            const std::function<void(size_t, uint64_t, const char*)>& found) {
  const TakeCall call{t, ids};
  return TakeMany(absl::MakeConstSpan(&call, 1), [&](size_t, size_t position, uint64_t score, const char* payload) {
    found(position, score, payload);
  });
}

absl::Status DiskTier::TakeMany(absl::Span<const TakeCall> calls, const ManyFoundFn& found, const PagesRead* ahead) {
  absl::MutexLock lock(&mu_);
  for (const TakeCall& call : calls) {
    if (call.table < 0 || call.table >= static_cast<int>(tables_.size())) {
      return absl::InvalidArgumentError("disk tier: bad table");
    }
  }
  // (page, record, call, position) of the rows on disk, sorted by page; open-page rows are
  // taken now.
  thread_local std::vector<std::tuple<uint32_t, uint32_t, uint32_t, size_t>> wanted;
  wanted.clear();
  for (uint32_t c = 0; c < calls.size(); ++c) {
    Table& table = tables_[calls[c].table];
    if (table.index.empty()) continue;
    const absl::Span<const uint64_t> ids = calls[c].ids;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = table.index.find(ids[i]);
      if (it == table.index.end()) continue;
      const uint32_t page = PageOf(it->second);
      const uint32_t record = RecordOf(it->second);
      if (page != kOpenPage) {
        wanted.emplace_back(page, record, c, i);
        continue;
      }
      const char* rec = table.OpenRecord(record);
      found(c, i, U64At(rec + 8), rec + 16);
      --table.open_live;
      table.index.erase(it);
      ++stats_.takes;
    }
  }
  if (wanted.empty()) return absl::OkStatus();
  std::sort(wanted.begin(), wanted.end());
  // The pages to read now, and per page its entries in `wanted` (begin, end); a page read ahead
  // and not rewritten since is taken from there.
  thread_local std::vector<uint32_t> pages;
  thread_local std::vector<std::pair<size_t, size_t>> entries;
  pages.clear();
  entries.clear();
  absl::Status failed;
  const absl::Span<const std::tuple<uint32_t, uint32_t, uint32_t, size_t>> all(wanted);
  for (size_t k = 0, end = 0; k < wanted.size(); k = end) {
    const uint32_t page = std::get<0>(wanted[k]);
    for (end = k + 1; end < wanted.size() && std::get<0>(wanted[end]) == page;) ++end;
    const char* buf = ahead != nullptr ? ahead->Find(page) : nullptr;
    if (buf != nullptr && U64At(buf + 8) == page_write_[page] && PageIntact(buf)) {
      TakeFromPageLocked(calls, found, page, buf, all.subspan(k, end - k), &failed);
    } else {
      pages.push_back(page);
      entries.emplace_back(k, end);
    }
  }
  absl::Status read = ReadPages(pages, [&](size_t p, const char* buf) ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
    if (absl::Status s = CheckPage(pages[p], buf); !s.ok()) {
      if (failed.ok()) failed = s;
      return absl::OkStatus();  // The page's rows stay held; the other pages are taken.
    }
    TakeFromPageLocked(calls, found, pages[p], buf, all.subspan(entries[p].first, entries[p].second - entries[p].first),
                       &failed);
    return absl::OkStatus();
  });
  HYREC_RETURN_IF_ERROR(read);
  return failed;
}

void DiskTier::TakeFromPageLocked(absl::Span<const TakeCall> calls, const ManyFoundFn& found, uint32_t page,
                                  const char* buf,
                                  absl::Span<const std::tuple<uint32_t, uint32_t, uint32_t, size_t>> wanted,
                                  absl::Status* failed) {
  for (size_t k = 0; k < wanted.size(); ++k) {
    const auto [unused_page, record, c, position] = wanted[k];
    // An id asked for twice: sorted by page and record, its second ask comes next.
    if (k > 0 && std::get<1>(wanted[k - 1]) == record) continue;
    Table& table = tables_[calls[c].table];
    const uint64_t id = calls[c].ids[position];
    const char* rec = buf + kPageHeaderBytes + record * table.record_bytes;
    if (U64At(rec) != id) {
      if (failed->ok()) {
        *failed = absl::DataLossError(absl::StrCat("disk tier ", options_.path, ": page ", page, " record ", record,
                                                   " holds id ", U64At(rec), ", not ", id));
      }
      continue;
    }
    found(c, position, U64At(rec + 8), rec + 16);
    table.index.erase(id);
    ForgetLocked(Location(page, record));
    ++stats_.takes;
  }
}

absl::Status DiskTier::ReadAhead(absl::Span<const TakeCall> calls, PagesRead* ahead) {
  std::vector<uint32_t>& pages = ahead->pages_;
  pages.clear();
  {
    absl::MutexLock lock(&mu_);
    for (const TakeCall& call : calls) {
      if (call.table < 0 || call.table >= static_cast<int>(tables_.size())) {
        return absl::InvalidArgumentError("disk tier: bad table");
      }
      const Table& table = tables_[call.table];
      if (table.index.empty()) continue;
      for (const uint64_t id : call.ids) {
        auto it = table.index.find(id);
        if (it != table.index.end() && PageOf(it->second) != kOpenPage) pages.push_back(PageOf(it->second));
      }
    }
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  if (pages.empty()) return absl::OkStatus();
  if (ahead->capacity_ < pages.size()) {
    ahead->capacity_ = std::max(pages.size(), 2 * ahead->capacity_);
    ahead->bufs_ = NewPages(ahead->capacity_);
  }
  uint64_t reads = 0;
  absl::Status status = ReadPagesWithReader(
      pages, ahead->bufs_.get(), [](size_t, const char*) { return absl::OkStatus(); }, /*forked_child=*/false, &reads);
  {
    absl::MutexLock lock(&mu_);
    CountPageReadsLocked(reads);
  }
  if (!status.ok()) pages.clear();
  return status;
}

const char* DiskTier::PagesRead::Find(uint32_t page) const {
  auto it = std::lower_bound(pages_.begin(), pages_.end(), page);
  if (it == pages_.end() || *it != page) return nullptr;
  return bufs_.get() + static_cast<size_t>(it - pages_.begin()) * kPageBytes;
}

absl::Status DiskTier::PreadRaw(uint32_t page, char* buf) const {
  const ssize_t n = ::pread(fd_, buf, kPageBytes, static_cast<off_t>(page) * kPageBytes);
  if (n != static_cast<ssize_t>(kPageBytes)) {
    return n < 0 ? Errno(errno, absl::StrCat("disk tier ", options_.path, ": read page ", page))
                 : absl::DataLossError(absl::StrCat("disk tier ", options_.path, ": short read of page ", page));
  }
  return absl::OkStatus();
}

void DiskTier::CountPageReadsLocked(uint64_t pages) const {
  stats_.page_reads += pages;
  stats_.bytes_read += pages * kPageBytes;
}

absl::Status DiskTier::ReadPage(uint32_t page, char* buf) const {
  HYREC_RETURN_IF_ERROR(PreadRaw(page, buf));
  CountPageReadsLocked(1);
  return CheckPage(page, buf);
}

bool DiskTier::PageIntact(const char* buf) const {
  uint32_t crc;
  std::memcpy(&crc, buf, 4);
  const uint16_t t = U16At(buf + 4);
  const uint16_t records = U16At(buf + 6);
  return crc == Crc32c(absl::string_view(buf + 4, kPageBytes - 4)) && t < tables_.size() &&
         records <= tables_[t].per_page;
}

absl::Status DiskTier::CheckPage(uint32_t page, const char* buf) const {
  if (PageIntact(buf)) return absl::OkStatus();
  ++stats_.checksum_failures;
  return absl::DataLossError(absl::StrCat("disk tier ", options_.path, ": page ", page, " (offset ",
                                          uint64_t{page} * kPageBytes, ") fails its checksum"));
}

// An io_uring of queue_depth entries and a page buffer for each, set up once: a ring's set-up
// maps memory, and unmapping it flushes every core's TLB.
struct DiskTier::Reader {
#if HYREC_HAS_URING
  io_uring ring;
#endif
  PageBuffer bufs;
  uint32_t depth = 0;
  ~Reader() {
#if HYREC_HAS_URING
    if (depth > 0) io_uring_queue_exit(&ring);
#endif
  }
};

absl::Status DiskTier::ReadPages(absl::Span<const uint32_t> pages,
                                 const std::function<absl::Status(size_t, const char*)>& done,
                                 bool forked_child) const {
  uint64_t reads = 0;
  absl::Status status = ReadPagesWithReader(pages, nullptr, done, forked_child, &reads);
  CountPageReadsLocked(reads);
  return status;
}

absl::Status DiskTier::ReadPagesWithReader(absl::Span<const uint32_t> pages, char* into,
                                           const std::function<absl::Status(size_t, const char*)>& done,
                                           bool forked_child, uint64_t* reads) const {
  if (pages.empty()) return absl::OkStatus();
  if (pages.size() == 1 || !HYREC_HAS_URING) {
    PageBuffer own = into == nullptr ? NewPages(1) : nullptr;
    for (size_t p = 0; p < pages.size(); ++p) {
      char* buf = into != nullptr ? into + p * kPageBytes : own.get();
      HYREC_RETURN_IF_ERROR(PreadRaw(pages[p], buf));
      ++*reads;
      HYREC_RETURN_IF_ERROR(done(p, buf));
    }
    return absl::OkStatus();
  }
#if HYREC_HAS_URING
  // A child forked by a checkpoint has its own ring (the parent's is shared memory it goes on
  // using) and takes no lock (a thread of the parent may have held it at the fork).
  std::unique_ptr<Reader> own;
  std::optional<absl::MutexLock> lock;
  if (!forked_child) lock.emplace(&read_mu_);
  Reader* reader = forked_child ? nullptr : reader_.get();
  if (reader == nullptr) {
    own = std::make_unique<Reader>();
    if (const int e = io_uring_queue_init(options_.queue_depth, &own->ring, 0); e < 0) {
      return Errno(-e, absl::StrCat("disk tier ", options_.path, ": io_uring"));
    }
    own->depth = options_.queue_depth;
    own->bufs = NewPages(own->depth);
    reader = own.get();
    if (!forked_child) reader_ = std::move(own);
  }
  io_uring& ring = reader->ring;
  const uint32_t depth = std::min<uint32_t>(reader->depth, static_cast<uint32_t>(pages.size()));
  // Page p goes to into's p-th page when given, else to the reader's buffer of its slot.
  auto buffer = [&](uint32_t slot, size_t p) {
    return into != nullptr ? into + p * kPageBytes : reader->bufs.get() + size_t{slot} * kPageBytes;
  };
  size_t next = 0;
  uint32_t in_flight = 0;
  auto submit = [&](uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd_, buffer(slot, next), kPageBytes, static_cast<uint64_t>(pages[next]) * kPageBytes);
    io_uring_sqe_set_data64(sqe, uint64_t{slot} << 32 | next);
    ++next;
    ++in_flight;
  };
  for (uint32_t slot = 0; slot < depth; ++slot) submit(slot);
  absl::Status status;
  while (in_flight > 0) {
    if (const int e = io_uring_submit_and_wait(&ring, 1); e < 0 && status.ok()) {
      status = Errno(-e, absl::StrCat("disk tier ", options_.path, ": io_uring wait"));
      break;
    }
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      const uint64_t data = io_uring_cqe_get_data64(cqe);
      const uint32_t slot = static_cast<uint32_t>(data >> 32);
      const size_t p = static_cast<uint32_t>(data);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
      if (res != static_cast<int>(kPageBytes)) {
        if (status.ok()) {
          status = Errno(res < 0 ? -res : EIO, absl::StrCat("disk tier ", options_.path, ": read page ", pages[p]));
        }
      } else {
        ++*reads;
        if (status.ok()) status = done(p, buffer(slot, p));
      }
      if (status.ok() && next < pages.size()) submit(slot);
    }
  }
  return status;
#else
  return absl::OkStatus();
#endif
}

absl::Status DiskTier::ForEach(int t, const RowFn& fn) const {
  absl::MutexLock lock(&mu_);
  return ForEachLocked(t, fn, /*forked_child=*/false);
}

absl::Status DiskTier::ForEachInForkedChild(int t, const RowFn& fn) const {
  return ForEachLocked(t, fn, /*forked_child=*/true);
}

absl::Status DiskTier::ForEachLocked(int t, const RowFn& fn, bool forked_child) const {
  if (t < 0 || t >= static_cast<int>(tables_.size())) return absl::InvalidArgumentError("disk tier: bad table");
  const Table& table = tables_[t];
  std::vector<uint32_t> pages;
  for (const auto& [id, location] : table.index) {
    const uint32_t page = PageOf(location);
    if (page != kOpenPage) {
      pages.push_back(page);
      continue;
    }
    const char* rec = table.OpenRecord(RecordOf(location));
    HYREC_RETURN_IF_ERROR(fn(id, U64At(rec + 8), rec + 16));
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return ReadPages(
      pages,
      [&](size_t p, const char* buf) ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
        HYREC_RETURN_IF_ERROR(CheckPage(pages[p], buf));
        const uint32_t records = U16At(buf + 6);
        for (uint32_t r = 0; r < records; ++r) {
          const char* rec = buf + kPageHeaderBytes + r * table.record_bytes;
          auto it = table.index.find(U64At(rec));
          if (it == table.index.end() || it->second != Location(pages[p], r)) continue;
          HYREC_RETURN_IF_ERROR(fn(it->first, U64At(rec + 8), rec + 16));
        }
        return absl::OkStatus();
      },
      forked_child);
}

void DiskTier::HoldPages() {
  absl::MutexLock lock(&mu_);
  holding_ = true;
}

void DiskTier::ReleasePages() {
  absl::MutexLock lock(&mu_);
  holding_ = false;
  free_.insert(free_.end(), held_free_.begin(), held_free_.end());
  held_free_.clear();
}

uint64_t DiskTier::rows(int t) const {
  absl::MutexLock lock(&mu_);
  return t >= 0 && t < static_cast<int>(tables_.size()) ? tables_[t].index.size() : 0;
}

DiskTierStats DiskTier::Stats() const {
  absl::MutexLock lock(&mu_);
  DiskTierStats s = stats_;
  s.rows = LiveRowsLocked();
  s.pages = num_pages_;
  s.used_pages = never_used_ - free_.size() - held_free_.size();
  s.fill = FillLocked(-1, 0);
  for (const Table& t : tables_) s.index_bytes += t.index.capacity() * (sizeof(std::pair<uint64_t, uint64_t>) + 1);
  // (IndexBytes plans the same: capacity() slots of a pair and a control byte.)
  s.index_bytes += uint64_t{num_pages_} * kPageStateBytes;
  return s;
}

}  // namespace hyrec::embedding_ps
