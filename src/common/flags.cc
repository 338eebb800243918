#include "hyrec/common/flags.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/exit_codes.h"
#include "hyrec/common/yaml_config.h"

#ifndef HYREC_VERSION
#define HYREC_VERSION "unknown"
#endif
#ifndef HYREC_BUILD_TYPE
#define HYREC_BUILD_TYPE "unknown"
#endif

namespace hyrec {
namespace {

absl::Status BadValue(const std::string& name, const std::string& value, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", what));
}

// Folds `text` into lines of at most `width` characters, each after `indent` spaces.
std::string Wrap(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
  return out;
}

}  // namespace

std::string VersionString() { return absl::StrCat(HYREC_VERSION, " (", HYREC_BUILD_TYPE, ")"); }

FlagSet::FlagSet(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagSet::Add(Flag flag) { flags_.push_back(std::move(flag)); }

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

void FlagSet::String(const std::string& name, std::string* out, const std::string& placeholder,
                     const std::string& help) {
  Add({name, placeholder, help, out->empty() ? "\"\"" : *out, false, false, [out](const std::string& v) {
         *out = v;
         return absl::OkStatus();
       }});
}

void FlagSet::StringList(const std::string& name, std::vector<std::string>* out, const std::string& placeholder,
                         const std::string& help) {
  Add({name, placeholder, help, "none (repeatable)", false, false, [out](const std::string& v) {
         out->push_back(v);
         return absl::OkStatus();
       }});
}

void FlagSet::Choice(const std::string& name, std::string* out, std::vector<std::string> choices,
                     const std::string& help) {
  ChoiceOf(name, *out, std::move(choices), help, [out](const std::string& v) { *out = v; });
}

void FlagSet::ChoiceOf(const std::string& name, const std::string& default_text, std::vector<std::string> choices,
                       const std::string& help, std::function<void(const std::string&)> set) {
  const std::string placeholder = absl::StrJoin(choices, "|");
  Add({name, placeholder, help, default_text, false, false, [name, set, choices](const std::string& v) {
         for (const std::string& c : choices) {
           if (c == v) {
             set(v);
             return absl::OkStatus();
           }
         }
         std::string what = absl::StrCat("not one of ", absl::StrJoin(choices, ", "));
         const std::string close = ClosestWord(v, choices);
         if (!close.empty()) absl::StrAppend(&what, "; did you mean '", close, "'?");
         return BadValue(name, v, what);
       }});
}

void FlagSet::Int(const std::string& name, int* out, const std::string& help, int64_t min, int64_t max) {
  Add({name, "N", help, std::to_string(*out), false, false, [=](const std::string& v) {
         int64_t x = 0;
         if (!absl::SimpleAtoi(v, &x)) return BadValue(name, v, "not an integer");
         if (x < min || x > max) return BadValue(name, v, absl::StrCat("not in [", min, ", ", max, "]"));
         *out = static_cast<int>(x);
         return absl::OkStatus();
       }});
}

void FlagSet::Uint64(const std::string& name, uint64_t* out, const std::string& help) {
  Add({name, "N", help, std::to_string(*out), false, false, [=](const std::string& v) {
         if (absl::StartsWith(v, "-") || !absl::SimpleAtoi(v, out)) {
           return BadValue(name, v, "not a non-negative integer");
         }
         return absl::OkStatus();
       }});
}

void FlagSet::Double(const std::string& name, double* out, const std::string& help, double min, double max) {
  Add({name, "X", help, absl::StrCat(*out), false, false, [=](const std::string& v) {
         double x = 0;
         if (!absl::SimpleAtod(v, &x) || !std::isfinite(x)) return BadValue(name, v, "not a number");
         if (x < min || x > max) return BadValue(name, v, absl::StrCat("not in [", min, ", ", max, "]"));
         *out = x;
         return absl::OkStatus();
       }});
}

void FlagSet::Bool(const std::string& name, bool* out, const std::string& help) {
  Add({name, "", help, *out ? "true" : "false", true, false, [=](const std::string& v) {
         if (v == "true" || v == "1" || v == "yes") {
           *out = true;
         } else if (v == "false" || v == "0" || v == "no") {
           *out = false;
         } else {
           return BadValue(name, v, "not true or false");
         }
         return absl::OkStatus();
       }});
}

void FlagSet::AddLogLevel(std::string* log_level) {
  Choice("log_level", log_level, {"trace", "debug", "info", "warn", "error", "critical", "off"},
         "Least severe log messages shown (on stderr).");
}

void FlagSet::AddCommon(CommonFlags* common) {
  AddLogLevel(&common->log_level);
  String("metrics_host", &common->metrics_host, "HOST", "Address the Prometheus metrics endpoint binds.");
  Int("metrics_port", &common->metrics_port,
      "Serve Prometheus metrics at http://<metrics_host>:<port>/metrics (0: any free port, printed; -1: off).", -1,
      65535);
}

std::string FlagSet::Suggestion(const std::string& name) const {
  std::vector<std::string> names;
  for (const Flag& f : flags_) names.push_back(f.name);
  names.push_back("help");
  names.push_back("version");
  const std::string close = ClosestWord(name, names);
  return close.empty() ? "" : absl::StrCat("; did you mean --", close, "?");
}

absl::Status FlagSet::Parse(int argc, char** argv, bool* help, bool* version) {
  *help = false;
  *version = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help" || arg == "--helpfull") {
      *help = true;
      return absl::OkStatus();
    }
    if (arg == "--version") {
      *version = true;
      return absl::OkStatus();
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!absl::StartsWith(arg, "-") || arg == "-" || arg == "--") {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "' (flags are --name=value)"));
    }
    std::string body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    std::string value;
    const size_t eq = body.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = body.substr(eq + 1);
      body.resize(eq);
    }
    Flag* flag = Find(body);
    if (flag == nullptr && !has_value && absl::StartsWith(body, "no")) {
      Flag* negated = Find(body.substr(2));
      if (negated != nullptr && negated->is_bool) {
        negated->set = true;
        (void)negated->assign("false");
        continue;
      }
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", body, Suggestion(body)));
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc && !absl::StartsWith(argv[i + 1], "--")) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", body, " needs a value (--", body, "=",
                                                       flag->placeholder.empty() ? "VALUE" : flag->placeholder, ")"));
      }
    }
    absl::Status s = flag->assign(value);
    if (!s.ok()) return s;
    flag->set = true;
  }
  return absl::OkStatus();
}

std::optional<int> FlagSet::ParseOrExit(int argc, char** argv) {
  bool help = false, version = false;
  absl::Status s = Parse(argc, argv, &help, &version);
  if (help) {
    std::cout << Help() << std::flush;
    return kExitOk;
  }
  if (version) {
    std::cout << program_ << " " << VersionString() << "\n" << std::flush;
    return kExitOk;
  }
  if (!s.ok()) {
    std::cerr << program_ << ": " << s.message() << "\n(" << program_ << " --help lists the flags)\n";
    return kExitInvalidInput;
  }
  return std::nullopt;
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("usage: ", program_, " [flags]\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, f.is_bool ? "" : absl::StrCat("=", f.placeholder), "\n");
    absl::StrAppend(&out, Wrap(absl::StrCat(f.help, " (default: ", f.default_text, ")"), 6, 94));
  }
  absl::StrAppend(&out, "  --help\n      Print this and exit.\n  --version\n      Print the version and exit.\n");
  absl::StrAppend(&out, "\n",
                  Wrap("exit codes: 0 success; 1 unexpected failure; 2 invalid configuration, flags or "
                       "input (do not retry); 3 transient failure (a peer lost, a deadline passed: "
                       "retry); 130 interrupted.",
                       0, 100));
  return out;
}

}  // namespace hyrec
