// FlagSet: the command-line flags of one hyrec role, with help, version, suggestions and the
// documented exit codes (exit_codes.h).
//
//   int main(int argc, char** argv) {
//     std::string config;
//     int port = 0;
//     FlagSet flags("hyrec ps", "one embedding parameter-server shard");
//     flags.String("config", &config, "FILE", "The job's YAML file.");
//     flags.Int("port", &port, "Port to listen on; 0 picks a free one.", 0, 65535);
//     CommonFlags common;
//     flags.AddCommon(&common);               // --log_level, --metrics_host, --metrics_port
//     if (std::optional<int> code = flags.ParseOrExit(argc, argv)) return *code;
//     return kExitOk;
//   }
//
// Accepted forms: --name=value, --name value, and for booleans --name, --noname and
// --name=true|false. `--help` (or -h) prints the role's flags with their defaults to stdout and
// exits 0; `--version` prints the version and build type and exits 0. An unknown flag (with the
// closest known one as a suggestion), a value that does not parse or is out of range, a missing
// value or an unexpected argument is an error on stderr and exit code kExitInvalidInput. Each
// flag's default is the value its variable holds when it is registered. Not thread-safe.
#ifndef HYREC_COMMON_FLAGS_H_
#define HYREC_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "hyrec/common/enum_names.h"

namespace hyrec {

// The version of hyrec and the build type this binary was compiled with ("0.1.0 (RelWithDebInfo)").
std::string VersionString();

// Flags every role has.
struct CommonFlags {
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;  // -1: no metrics endpoint; 0: any free port.
};

class FlagSet {
 public:
  FlagSet(std::string program, std::string summary);

  // Registers a flag; `out` holds the default and receives the parsed value. `placeholder` names
  // the value in the help text (e.g. FILE).
  void String(const std::string& name, std::string* out, const std::string& placeholder, const std::string& help);
  // A flag that may be given many times; each value is appended to `out`, in order.
  void StringList(const std::string& name, std::vector<std::string>* out, const std::string& placeholder,
                  const std::string& help);
  // A string restricted to `choices`.
  void Choice(const std::string& name, std::string* out, std::vector<std::string> choices, const std::string& help);
  // A value of an enum named by its EnumName table (hyrec/common/enum_names.h), which `names`
  // must outlive the FlagSet's Parse (a constant table does).
  template <typename E, size_t N>
  void Enum(const std::string& name, E* out, const EnumName<E> (&names)[N], const std::string& help) {
    std::vector<std::string> choices;
    for (const EnumName<E>& entry : names) choices.push_back(entry.name);
    ChoiceOf(name, NameOf(names, *out), std::move(choices), help,
             [out, &names](const std::string& v) { FindName(names, v, out); });
  }
  void Int(const std::string& name, int* out, const std::string& help, int64_t min = INT32_MIN,
           int64_t max = INT32_MAX);
  void Uint64(const std::string& name, uint64_t* out, const std::string& help);
  void Double(const std::string& name, double* out, const std::string& help, double min = -1e300, double max = 1e300);
  void Bool(const std::string& name, bool* out, const std::string& help);
  // Registers --log_level, --metrics_host and --metrics_port into `common`.
  void AddCommon(CommonFlags* common);
  // --log_level alone, for one-shot tools that serve no metrics.
  void AddLogLevel(std::string* log_level);

  // Parses argv[1..argc). OK, or InvalidArgument saying what was wrong; `help` / `version` are
  // set when those were asked for (and nothing else is checked).
  absl::Status Parse(int argc, char** argv, bool* help, bool* version);
  // Parse, then: prints help or the version to stdout and returns 0, or prints the error to
  // stderr and returns kExitInvalidInput; nullopt when the program should go on.
  std::optional<int> ParseOrExit(int argc, char** argv);

  // Whether flag `name` was given on the command line (after Parse).
  bool WasSet(const std::string& name) const;
  // The help text: usage line, summary, every flag with its default.
  std::string Help() const;
  const std::string& program() const { return program_; }

 private:
  struct Flag {
    std::string name;
    std::string placeholder;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    bool set = false;
    std::function<absl::Status(const std::string&)> assign;
  };
  void Add(Flag flag);
  // A flag taking one of `choices`, each handed to `set`.
  void ChoiceOf(const std::string& name, const std::string& default_text, std::vector<std::string> choices,
                const std::string& help, std::function<void(const std::string&)> set);
  Flag* Find(const std::string& name);
  std::string Suggestion(const std::string& name) const;

  std::string program_;
  std::string summary_;
  std::vector<Flag> flags_;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_FLAGS_H_
