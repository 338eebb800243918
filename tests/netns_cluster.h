// NetnsCluster: hosts on one machine for tests of a job across a network. Each host is a network
// namespace with its own loopback and one link (a veth pair) to a bridge in a hub namespace, an
// address of its own on 10.213.<cluster>.0/24, and a rate it may be limited to (tc tbf). Taking
// a host's link down in the hub partitions it silently: its peers see no reset, only silence, as
// a cut cable or a dead switch port gives them. Processes run on a host through `ip netns exec`,
// with the host's name as their host name and an /etc/hosts that names every host (so that
// LibTorch's Gloo, which binds the address its host name resolves to, binds the host's); the file
// system is otherwise shared, as the test's volumes are.
//
// Needs root (CAP_NET_ADMIN) and iproute2; Create says why when it cannot make the namespaces,
// for the test to skip. The destructor removes every namespace it made (their links go with
// them).
#ifndef HYREC_TESTS_NETNS_CLUSTER_H_
#define HYREC_TESTS_NETNS_CLUSTER_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "run_command.h"

namespace hyrec::testing {

class NetnsCluster {
 public:
  // Hosts named `hosts` (letters, digits and '-'), in namespaces "hyrec-<tag>-<host>" (a tag
  // unique to the process, so that two runs never share a namespace); `number` (0 to 255) picks
  // the cluster's subnet.
  static absl::StatusOr<std::unique_ptr<NetnsCluster>> Create(const std::string& tag, int number,
                                                              const std::vector<std::string>& hosts) {
    if (geteuid() != 0) return absl::FailedPreconditionError("network namespaces need root");
    std::unique_ptr<NetnsCluster> c(new NetnsCluster(tag, number));
    c->Run({"ip", "netns", "del", c->hub_}).code;  // A namespace a killed run left.
    if (absl::Status s = c->Must({"ip", "netns", "add", c->hub_}); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot make a network namespace: ", s.message()));
    }
    c->made_.push_back(c->hub_);
    for (const auto& argv :
         std::vector<std::vector<std::string>>{{"ip", "-n", c->hub_, "link", "set", "lo", "up"},
                                               {"ip", "-n", c->hub_, "link", "add", "br0", "type", "bridge"},
                                               {"ip", "-n", c->hub_, "link", "set", "br0", "up"}}) {
      if (absl::Status s = c->Must(argv); !s.ok()) return s;
    }
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string ns = c->Namespace(hosts[i]);
      const std::string port = absl::StrCat("hp", i);
      const std::string address = absl::StrCat("10.213.", number, ".", i + 2);
      c->Run({"ip", "netns", "del", ns});
      if (absl::Status s = c->Must({"ip", "netns", "add", ns}); !s.ok()) return s;
      c->made_.push_back(ns);
      for (const auto& argv : std::vector<std::vector<std::string>>{
               {"ip", "-n", ns, "link", "set", "lo", "up"},
               {"ip", "link", "add", port, "netns", c->hub_, "type", "veth", "peer", "name", "eth0", "netns", ns},
               {"ip", "-n", c->hub_, "link", "set", port, "master", "br0"},
               {"ip", "-n", c->hub_, "link", "set", port, "up"},
               {"ip", "-n", ns, "addr", "add", address + "/24", "dev", "eth0"},
               {"ip", "-n", ns, "link", "set", "eth0", "up"}}) {
        if (absl::Status s = c->Must(argv); !s.ok()) return s;
      }
      c->hosts_[hosts[i]] = Host{ns, port, address};
      c->names_[hosts[i]] = address;
    }
    if (absl::Status s = c->WriteHostsFiles(); !s.ok()) return s;
    return c;
  }

  ~NetnsCluster() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      Run({"ip", "netns", "del", *it});
      std::error_code error;
      std::filesystem::remove_all("/etc/netns/" + *it, error);
    }
  }
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  const std::string& address(const std::string& host) const { return hosts_.at(host).address; }

  // `argv` run on `host` (an argv for execv), with the host's name as its host name (in a UTS
  // namespace of its own) and the host's /etc/hosts, so that the name resolves to its address.
  std::vector<std::string> On(const std::string& host, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {IpPath(), "netns", "exec", hosts_.at(host).ns, "unshare", "--uts", "--", "/bin/sh", "-c",
                               "hostname \"$0\" && exec \"$@\"", host});
    return argv;
  }

  // Takes `host`'s link down (a partition of it from every other host) or brings it back.
  absl::Status SetLink(const std::string& host, bool up) {
    return Must({"ip", "-n", hub_, "link", "set", hosts_.at(host).port, up ? "up" : "down"});
  }

  // Points `name` at `host`'s address in every other host's /etc/hosts (as a cluster's DNS names
  // a pod recreated on another node): a process resolving it from then on reaches `host`. The
  // files are rewritten in place, so that the processes already running on each host see it.
  absl::Status MoveName(const std::string& name, const std::string& host) {
    names_.at(name) = hosts_.at(host).address;
    return WriteHostsFiles();
  }

  // What `host` has sent on its link since it was made: its end's byte counter (Ethernet frames,
  // so every header and acknowledgement is counted).
  absl::StatusOr<uint64_t> SentBytes(const std::string& host) const {
    const CommandResult r =
        RunCommand({"ip", "netns", "exec", hosts_.at(host).ns, "cat", "/sys/class/net/eth0/statistics/tx_bytes"});
    uint64_t bytes = 0;
    if (r.code != 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(r.out), &bytes)) {
      return absl::InternalError(absl::StrCat("cannot read ", host, "'s sent bytes: ", r.err));
    }
    return bytes;
  }

  // Limits what `host` sends to `mbit` Mbit/s (a token bucket on its end of the link); 0 lifts it.
  absl::Status Limit(const std::string& host, int mbit) {
    const Host& h = hosts_.at(host);
    if (mbit == 0) return Must({"ip", "netns", "exec", h.ns, "tc", "qdisc", "del", "dev", "eth0", "root"});
    return Must({"ip", "netns", "exec", h.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                 absl::StrCat(mbit, "mbit"), "burst", "64kb", "latency", "50ms"});
  }

 private:
  struct Host {
    std::string ns;
    std::string port;  // Its end of the link in the hub.
    std::string address;
  };

  NetnsCluster(const std::string& tag, int number) : tag_(tag), hub_(absl::StrCat("hyrec-", tag, "-hub")) {}

  static std::string IpPath() {
    for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
      if (access(path, X_OK) == 0) return path;
    }
    return "ip";
  }

  // Each host's /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts over it, by inode: the
  // file is rewritten, never replaced): its own name first, with its own address, then every
  // other name with the address names_ gives it.
  absl::Status WriteHostsFiles() const {
    for (const auto& [name, host] : hosts_) {
      const std::string dir = "/etc/netns/" + host.ns;
      std::error_code error;
      std::filesystem::create_directories(dir, error);
      std::ofstream out(dir + "/hosts", std::ios::trunc);
      out << "127.0.0.1 localhost\n" << host.address << " " << name << "\n";
      for (const auto& [other, address] : names_) {
        if (other != name) out << address << " " << other << "\n";
      }
      if (!out.flush()) return absl::InternalError("cannot write " + dir + "/hosts");
    }
    return absl::OkStatus();
  }

  std::string Namespace(const std::string& host) const { return absl::StrCat("hyrec-", tag_, "-", host); }

  static CommandResult Run(const std::vector<std::string>& argv) { return RunCommand(argv); }
  static absl::Status Must(const std::vector<std::string>& argv) {
    const CommandResult r = RunCommand(argv);
    if (r.code == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("`", absl::StrJoin(argv, " "), "` exited ", r.code, ": ", r.err));
  }

  std::string tag_;
  std::string hub_;
  std::vector<std::string> made_;  // Namespaces, in the order made.
  std::map<std::string, Host> hosts_;
  std::map<std::string, std::string> names_;  // Each host name's address in the hosts files.
};

}  // namespace hyrec::testing

#endif  // HYREC_TESTS_NETNS_CLUSTER_H_
