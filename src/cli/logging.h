// Logging of the role processes: spdlog to stderr (stdout carries only what a launcher reads:
// the "listening on" line and worker events), at the level of --log_level.
//
// The logger is asynchronous: a line is queued (8192 at most; the oldest are dropped when the
// queue is full) and one thread writes them, so a request thread never waits on a slow or
// blocked stderr. Queued lines are written before the process exits normally.
#ifndef HYREC_SRC_CLI_LOGGING_H_
#define HYREC_SRC_CLI_LOGGING_H_

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "hyrec/common/metrics.h"
#include "spdlog/async.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "src/common/rpc.h"

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

// The servers' logging (PS, loader, worker, train): SetUpLogging, and gRPC's own lines through
// it, rate-limited (rpc::RouteGrpcLogs), so no log line can block a server thread.
inline void SetUpServerLogging(const std::string& role, const std::string& level) {
  SetUpLogging(role, level);
  rpc::RouteGrpcLogs();
}

// The log's own figures, for a role's /metrics.
inline void PublishLogMetrics(MetricsRegistry* m) {
  m->Describe("hyrec_grpc_log_lines_held_back_total", MetricType::kCounter,
              "gRPC log lines held back by the rate limit (a flood of failed TLS handshakes, say).");
  m->Set("hyrec_grpc_log_lines_held_back_total", {}, static_cast<double>(rpc::SuppressedGrpcLogLines()));
}

// Writes the queued log lines and returns `code`; when stderr does not take them within `grace`
// (a pipe nobody reads), exits with `code` at once rather than wait: a role's log never holds
// its exit.
inline int FinishLogging(int code, absl::Duration grace = absl::Seconds(2)) {
  std::cout.flush();
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread flusher([done] {
    spdlog::shutdown();
    *done = true;
  });
  for (const absl::Time until = absl::Now() + grace; !*done && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (*done) {
    flusher.join();
    return code;
  }
  flusher.detach();
  std::_Exit(code);
}

// Stops a role that must not go on (it lost what it held to another process): logs `message` as
// critical, writes "hyrec <role>: <message>" to stderr in one write, which no log line written
// beside it can split, and exits with `code` at once, without unwinding.
[[noreturn]] inline void StopAtOnce(const std::string& role, const std::string& message, int code) {
  spdlog::critical("{}", message);
  const std::string line = absl::StrCat("hyrec ", role, ": ", message, "\n");
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  std::_Exit(code);
}

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_LOGGING_H_
