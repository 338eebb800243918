#include "hyrec/common/process_info.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hyrec {
namespace {

// The fields of a /proc stat line after the command name (which is in parentheses and may hold
// spaces), the first being field 3 (the state); false when there is no such line.
bool StatFields(const std::string& path, std::string* name, std::vector<std::string>* fields) {
  std::ifstream in(path);
  std::string text;
  if (!std::getline(in, text)) return false;
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 2 > text.size()) return false;
  if (name != nullptr) *name = text.substr(open + 1, close - open - 1);
  std::istringstream rest(text.substr(close + 2));
  fields->assign(std::istream_iterator<std::string>(rest), std::istream_iterator<std::string>());
  return true;
}

}  // namespace

std::vector<ChildProcess> ChildProcesses(pid_t parent) {
  std::vector<ChildProcess> out;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    ChildProcess child;
    std::vector<std::string> fields;
    int ppid = 0;
    if (!StatFields((entry.path() / "stat").string(), &child.name, &fields) || fields.size() < 2 ||
        !absl::SimpleAtoi(fields[1], &ppid) || ppid != parent) {
      continue;
    }
    child.pid = pid;
    std::ifstream cmdline(entry.path() / "cmdline");
    child.command.assign(std::istreambuf_iterator<char>(cmdline), std::istreambuf_iterator<char>());
    std::replace(child.command.begin(), child.command.end(), '\0', ' ');
    out.push_back(std::move(child));
  }
  std::sort(out.begin(), out.end(), [](const ChildProcess& a, const ChildProcess& b) { return a.pid < b.pid; });
  return out;
}

absl::StatusOr<double> CpuMilliseconds(pid_t pid, pid_t tid) {
  const std::string path =
      tid > 0 ? absl::StrCat("/proc/", pid, "/task/", tid, "/stat") : absl::StrCat("/proc/", pid, "/stat");
  std::vector<std::string> fields;
  if (!StatFields(path, nullptr, &fields)) return absl::NotFoundError(absl::StrCat(path, ": gone"));
  // utime and stime are fields 14 and 15: here 11 and 12, counted from field 3.
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime)) {
    return absl::InternalError(absl::StrCat(path, ": unreadable"));
  }
  return (utime + stime) * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

absl::StatusOr<std::string> ProcessStatusField(pid_t pid, absl::string_view field) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": gone"));
  const std::string prefix = absl::StrCat(field, ":");
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, prefix)) return std::string(absl::StripAsciiWhitespace(line.substr(prefix.size())));
  }
  return absl::NotFoundError(absl::StrCat(path, ": no ", field));
}

absl::StatusOr<uint64_t> ProcessStatusBytes(pid_t pid, absl::string_view field) {
  absl::StatusOr<std::string> value = ProcessStatusField(pid, field);
  if (!value.ok()) return value.status();
  uint64_t kib = 0;
  absl::string_view text = *value;
  if (!absl::ConsumeSuffix(&text, " kB") || !absl::SimpleAtoi(text, &kib)) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/status: ", field, " is not in kB"));
  }
  return kib * 1024;
}

}  // namespace hyrec
