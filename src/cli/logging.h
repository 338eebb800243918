// Logging of the role processes: spdlog to stderr (stdout carries only what a launcher reads:
// the "listening on" line and worker events), at the level of --log_level.
#ifndef HYREC_SRC_CLI_LOGGING_H_
#define HYREC_SRC_CLI_LOGGING_H_

#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace hyrec::cli {

// `level` is one that CommonFlags accepts (FlagSet checks it).
inline void SetUpLogging(const std::string& role, const std::string& level) {
  auto logger = spdlog::get(role);
  if (logger == nullptr) logger = spdlog::stderr_color_mt(role);
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + role + "] [%l] %v");
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_LOGGING_H_
