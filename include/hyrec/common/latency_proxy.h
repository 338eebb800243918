// LatencyProxy: a TCP proxy on loopback that delays every byte by a fixed one-way delay in each
// direction, to measure how training behaves when PS round trips are slow (this machine's kernel
// has no netem qdisc). Put one in front of each PS and give the workers its port.
//
//   const int ps_port = 7000;
//   HYREC_ASSIGN_OR_RETURN(auto proxy, LatencyProxy::Start("127.0.0.1", ps_port, absl::Microseconds(2500)));
//   std::string address = absl::StrCat("127.0.0.1:", proxy->port());   // round trips: twice the delay longer
//
// Each accepted connection gets a connection to the target and, per direction, a reader thread
// that timestamps what arrives and a sender thread that forwards it once the delay has passed,
// preserving order. Stopping (the destructor) closes every socket and joins every thread.
#ifndef HYREC_COMMON_LATENCY_PROXY_H_
#define HYREC_COMMON_LATENCY_PROXY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hyrec {

class LatencyProxy {
 public:
  static absl::StatusOr<std::unique_ptr<LatencyProxy>> Start(const std::string& target_host, int target_port,
                                                             absl::Duration one_way_delay);
  ~LatencyProxy();
  LatencyProxy(const LatencyProxy&) = delete;
  LatencyProxy& operator=(const LatencyProxy&) = delete;

  int port() const;

 private:
  struct Impl;
  explicit LatencyProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyrec

#endif  // HYREC_COMMON_LATENCY_PROXY_H_
