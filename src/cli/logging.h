// Logging of the role processes: spdlog to stderr (stdout carries only what a launcher reads:
// the "listening on" line and worker events), at the level of --log_level.
//
// The logger is asynchronous: a line is queued (8192 at most; the oldest are dropped when the
// queue is full) and one thread writes them, so a request thread never waits on a slow or
// blocked stderr. Queued lines are written before the process exits normally.
#ifndef HYREC_SRC_CLI_LOGGING_H_
#define HYREC_SRC_CLI_LOGGING_H_

#include <memory>
#include <string>

#include "spdlog/async.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace hyrec::cli {

// `level` is one that CommonFlags accepts (FlagSet checks it).
inline void SetUpLogging(const std::string& role, const std::string& level) {
  auto logger = spdlog::get(role);
  if (logger == nullptr) {
    if (spdlog::thread_pool() == nullptr) spdlog::init_thread_pool(8192, 1);
    logger =
        std::make_shared<spdlog::async_logger>(role, std::make_shared<spdlog::sinks::stderr_color_sink_mt>(),
                                               spdlog::thread_pool(), spdlog::async_overflow_policy::overrun_oldest);
    spdlog::register_logger(logger);
  }
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + role + "] [%l] %v");
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_LOGGING_H_
