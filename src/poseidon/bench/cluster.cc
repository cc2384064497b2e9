#include "poseidon/bench/cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/launch/process.h"

namespace poseidon::bench {

std::string run(const std::vector<std::string>& argv) {
  CommandResult r = runCommand(argv);
  if (!r.ok()) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    int code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1;
    throw Error(strCat("command failed (", code, "): ", cmd, ": ", r.output));
  }
  return r.output;
}

namespace {
constexpr const char* kNsPrefix = "psd";

// Where runCommand's execvp looks (PATH; a machine without the package may carry iproute2 in a
// folder of its own, ../shared/gpu), and the system folders a root shell's PATH may lack.
bool commandExists(const char* cmd) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream s(path);
    for (std::string d; std::getline(s, d, ':');)
      if (!d.empty()) dirs.push_back(d + "/");
  }
  for (const char* d : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) dirs.emplace_back(d);
  for (const auto& dir : dirs) {
    if (access((dir + cmd).c_str(), X_OK) == 0) return true;
  }
  return false;
}
}  // namespace

bool EmulatedCluster::available(std::string* why) {
  if (geteuid() != 0) {
    *why = "the emulated cluster needs root (network namespaces and tc): run it as root";
    return false;
  }
  for (const char* cmd : {"ip", "tc"}) {
    if (!commandExists(cmd)) {
      *why = strCat("'", cmd, "' not found: install iproute2 (apt-get install iproute2)");
      return false;
    }
  }
  try {
    std::string probe = strCat(kNsPrefix, getpid(), "probe");
    run({"ip", "netns", "add", probe});
    run({"ip", "netns", "del", probe});
  } catch (const Error& e) {
    *why = strCat("cannot create network namespaces here: ", e.what());
    return false;
  }
  return true;
}

std::vector<std::string> EmulatedCluster::listOurNamespaces() {
  std::vector<std::string> out;
  std::istringstream in(run({"ip", "netns", "list"}));
  std::string line;
  while (std::getline(in, line)) {
    std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kNsPrefix, 0) == 0 && name.size() > 3 && std::isdigit(static_cast<unsigned char>(name[3]))) {
      out.push_back(name);
    }
  }
  return out;
}

int EmulatedCluster::sweepLeftovers() {
  int removed = 0;
  for (const auto& ns : listOurNamespaces()) {
    pid_t owner = static_cast<pid_t>(std::atol(ns.c_str() + 3));
    if (owner > 0 && owner != getpid() && (kill(owner, 0) == 0 || errno != ESRCH)) continue;  // still alive
    if (owner == getpid()) continue;
    try {
      run({"ip", "netns", "del", ns});
      ++removed;
    } catch (const Error&) {
    }
  }
  return removed;
}

std::string EmulatedCluster::nodeAddress(int i) const { return strCat("10.77.0.", i + 1); }

EmulatedCluster::EmulatedCluster(int nodes, const LinkSpec& link, const std::string& tcpCongestion, HostQueue hostQueue,
                                 HostQueue switchQueue)
    : link_(link), tcpCongestion_(tcpCongestion), hostQueue_(hostQueue), switchQueue_(switchQueue) {
  std::string why;
  if (!available(&why)) throw Error(why);
  if (nodes < 1 || nodes > 200) throw InvalidArgument(strCat("cluster size must be 1..200, got ", nodes));
  if (!(link.mbit > 0)) throw InvalidArgument(strCat("link rate must be positive, got ", link.mbit, " Mbit/s"));
  allowTcpCongestion();
  sweepLeftovers();
  prefix_ = strCat(kNsPrefix, getpid());
  switchNs_ = prefix_ + "sw";
  try {
    run({"ip", "netns", "add", switchNs_});
    run({"ip", "-n", switchNs_, "link", "add", "br0", "type", "bridge"});
    run({"ip", "-n", switchNs_, "link", "set", "br0", "up"});
    for (int i = 0; i < nodes; ++i) {
      std::string ns = strCat(prefix_, "n", i), port = strCat("p", getpid() % 100000, "v", i);
      namespaces_.push_back(ns);
      run({"ip", "netns", "add", ns});
      run({"ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns});
      run({"ip", "link", "set", port, "netns", switchNs_});
      switchPorts_.push_back(port);
      run({"ip", "-n", switchNs_, "link", "set", port, "master", "br0"});
      run({"ip", "-n", switchNs_, "link", "set", port, "up"});
      run({"ip", "-n", ns, "addr", "add", nodeAddress(i) + "/24", "dev", "eth0"});
      run({"ip", "-n", ns, "link", "set", "eth0", "up"});
      run({"ip", "-n", ns, "link", "set", "lo", "up"});
      shape(ns, "eth0", link, hostQueue_);
      run({"ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control=" + tcpCongestion_});
      shape(switchNs_, port, LinkSpec{link.mbit, 0, link.queueMs, link.bucketMbit}, switchQueue_);
    }
  } catch (...) {
    destroy();
    throw;
  }
}

EmulatedCluster::~EmulatedCluster() { destroy(); }

namespace {

std::vector<std::string> readWords(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

bool contains(const std::vector<std::string>& words, const std::string& w) {
  return std::find(words.begin(), words.end(), w) != words.end();
}

std::string spaced(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

void EmulatedCluster::allowTcpCongestion() const {
  const std::string dir = "/proc/sys/net/ipv4/";
  const std::vector<std::string> available = readWords(dir + "tcp_available_congestion_control");
  if (!contains(available, tcpCongestion_)) {
    throw InvalidArgument(
        strCat("TCP congestion control '", tcpCongestion_, "' is not available on this kernel (", dir,
               "tcp_available_congestion_control: ", available.empty() ? "unreadable" : spaced(available), ")"));
  }
  std::vector<std::string> allowed = readWords(dir + "tcp_allowed_congestion_control");
  if (contains(allowed, tcpCongestion_)) return;
  // Only an allowed algorithm may be a namespace's default; adding one changes no socket's.
  allowed.push_back(tcpCongestion_);
  const std::string list = spaced(allowed);
  run({"sysctl", "-q", "-w", "net.ipv4.tcp_allowed_congestion_control=" + list});
  POSEIDON_LOG(kInfo) << "allowed TCP congestion control " << tcpCongestion_ << " for the emulated nodes ("
                      << "net.ipv4.tcp_allowed_congestion_control = " << list << ")";
}

void EmulatedCluster::clearRoot(const std::string& ns, const std::string& dev) {
  try {
    run({"ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"});
  } catch (const Error&) {
    // Nothing to delete.
  }
}

void EmulatedCluster::shape(const std::string& ns, const std::string& dev, const LinkSpec& link, HostQueue queueKind) {
  // tbf needs a bucket of at least rate/HZ to reach its rate; link.queueMs of queue.
  double bytesPerSec = link.mbit * 1e6 / 8;
  const double bucketBytesPerSec = (link.bucketMbit > 0 ? link.bucketMbit : link.mbit) * 1e6 / 8;
  long burst = std::max<long>(16 * 1024, std::lround(bucketBytesPerSec / 250));
  std::string rate = strCat(link.mbit, "mbit"), burstText = strCat(burst, "b");
  const std::string queue = strCat(link.queueMs, "ms");
  auto tc = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"ip", "netns", "exec", ns, "tc"};
    argv.insert(argv.end(), args.begin(), args.end());
    run(argv);
  };
  std::string parent = "root";
  if (link.latencyMs > 0) {
    try {
      tc({"qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", strCat(link.latencyMs, "ms")});
    } catch (const Error& e) {
      throw Error(strCat("--latency-ms needs the kernel's netem qdisc (sch_netem), which this machine lacks: ",
                         e.what()));
    }
    parent = "1:";
  }
  if (queueKind != HostQueue::kTos) {
    std::vector<std::string> args{"qdisc", "add", "dev", dev};
    if (parent == "root") {
      args.push_back("root");
      if (queueKind == HostQueue::kPfifoFast) args.insert(args.end(), {"handle", "2:"});
    } else {
      args.insert(args.end(), {"parent", parent, "handle", "2:"});
    }
    args.insert(args.end(), {"tbf", "rate", rate, "burst", burstText, "latency", queue});
    tc(args);
    if (queueKind == HostQueue::kPfifoFast) {
      // Linux's default qdisc in place of the tbf's own byte FIFO. Its limit is the device's
      // txqueuelen in packets, per band, read when it is made (so set first): the same queueMs at the
      // rate, in full-size frames.
      const long frames = std::max<long>(16, std::lround(bytesPerSec * link.queueMs / 1000 / 1514));
      run({"ip", "-n", ns, "link", "set", "dev", dev, "txqueuelen", strCat(frames)});
      tc({"qdisc", "add", "dev", dev, "parent", "2:1", "handle", "20:", "pfifo_fast"});
    }
    return;
  }
  // Two bands under one rate, the low-delay one first (HostQueue::kTos): HTB, since this kernel has
  // no prio qdisc. Band 0 (class :10) is guaranteed 99% of the rate, band 1 (:20) 1%, and each may
  // borrow up to the whole rate; a class within its guarantee goes before one that borrows, so band 0
  // goes first unless it has sent above 99% of the rate for longer than its bucket lasts (the urgent
  // traffic is a few percent). Each band drops past the tbf's queue (queueMs at the rate, plus the
  // bucket).
  const std::string h = parent == "root" ? "2" : "3";
  const std::string limit = strCat(std::lround(bytesPerSec * link.queueMs / 1000) + burst);
  std::vector<std::string> root{"qdisc", "add", "dev", dev};
  if (parent == "root") {
    root.push_back("root");
  } else {
    root.insert(root.end(), {"parent", parent});
  }
  root.insert(root.end(), {"handle", h + ":", "htb", "default", "20"});
  tc(root);
  tc({"class", "add", "dev", dev, "parent", h + ":", "classid", h + ":1", "htb", "rate", rate, "ceil", rate, "burst",
      burstText, "cburst", burstText});
  tc({"class", "add", "dev", dev, "parent", h + ":1", "classid", h + ":10", "htb", "rate",
      strCat(link.mbit * 0.99, "mbit"), "ceil", rate, "burst", burstText, "cburst", burstText, "prio", "0"});
  tc({"class", "add", "dev", dev, "parent", h + ":1", "classid", h + ":20", "htb", "rate",
      strCat(link.mbit * 0.01, "mbit"), "ceil", rate, "burst", burstText, "cburst", burstText, "prio", "1"});
  tc({"qdisc", "add", "dev", dev, "parent", h + ":10", "bfifo", "limit", limit});
  tc({"qdisc", "add", "dev", dev, "parent", h + ":20", "bfifo", "limit", limit});
  // TOS low-delay (Van::kUrgentTos), as Linux's pfifo_fast puts it in band 0; the ECN bits (0x03) may
  // be anything.
  tc({"filter", "add", "dev", dev, "parent", h + ":", "protocol", "ip", "prio", "1", "u32", "match", "ip", "tos",
      "0x10", "0x1c", "flowid", h + ":10"});
}

namespace {
// Bytes the low-delay band (class h:10) of dev's two-band queue sent.
uint64_t lowDelayBand(const std::string& ns, const std::string& dev, const std::string& h) {
  // "class htb 2:10 parent 2:1 leaf ...: prio 0 rate ...\n Sent 1234 bytes 5 pkt ..."
  std::istringstream in(
      run({"ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", dev, "classid", h + ":10"}));
  for (std::string w, prev; in >> w; prev = w)
    if (w == "bytes" && !prev.empty() && std::all_of(prev.begin(), prev.end(), ::isdigit)) return std::stoull(prev);
  return 0;
}
}  // namespace

uint64_t EmulatedCluster::lowDelayBytesSent() const {
  if (hostQueue_ != HostQueue::kTos) return 0;
  const std::string h = link_.latencyMs > 0 ? "3" : "2";  // under netem's 1: (shape())
  uint64_t total = 0;
  for (const auto& ns : namespaces_) total += lowDelayBand(ns, "eth0", h);
  return total;
}

uint64_t EmulatedCluster::lowDelayBytesReceived() const {
  if (switchQueue_ != HostQueue::kTos) return 0;
  uint64_t total = 0;
  for (const auto& port : switchPorts_) total += lowDelayBand(switchNs_, port, "2");  // no netem on the ports
  return total;
}

uint64_t leafQueueDrops(const std::string& tcStatistics) {
  std::istringstream in(tcStatistics);
  uint64_t total = 0;
  bool leaf = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("qdisc ", 0) == 0) {
      leaf = line.rfind("qdisc tbf", 0) == 0 || line.rfind("qdisc bfifo", 0) == 0;
      continue;
    }
    const size_t at = line.find("(dropped ");
    if (leaf && at != std::string::npos) total += std::stoull(line.substr(at + 9));
  }
  return total;
}

namespace {
uint64_t droppedPackets(const std::string& ns, const std::string& dev) {
  return leafQueueDrops(run({"ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev}));
}
}  // namespace

EmulatedCluster::QueueDrops EmulatedCluster::queueDrops() const {
  QueueDrops d;
  for (size_t i = 0; i < namespaces_.size(); ++i) {
    d.uplink += droppedPackets(namespaces_[i], "eth0");
    d.downlink += droppedPackets(switchNs_, switchPorts_[i]);
  }
  return d;
}

void EmulatedCluster::setLink(const LinkSpec& link) {
  if (!(link.mbit > 0)) throw InvalidArgument(strCat("link rate must be positive, got ", link.mbit, " Mbit/s"));
  // Drop the old qdiscs (a netem parent included) and shape afresh.
  for (size_t i = 0; i < namespaces_.size(); ++i) {
    clearRoot(namespaces_[i], "eth0");
    shape(namespaces_[i], "eth0", link, hostQueue_);
    clearRoot(switchNs_, switchPorts_[i]);
    shape(switchNs_, switchPorts_[i], LinkSpec{link.mbit, 0, link.queueMs, link.bucketMbit}, switchQueue_);
  }
  link_ = link;
}

void EmulatedCluster::setRouteTimers(double minRtoMs, bool quickAck) {
  if (!(minRtoMs > 0)) throw InvalidArgument(strCat("minimum RTO must be positive, got ", minRtoMs, " ms"));
  // The connected route `ip addr add` made, replaced with the metrics (its subnet is nodeAddress's /24).
  for (int i = 0; i < nodes(); ++i) {
    std::vector<std::string> cmd({"ip", "-n", namespaces_[static_cast<size_t>(i)], "route", "replace", "10.77.0.0/24",
                                  "dev", "eth0", "proto", "kernel", "scope", "link", "src", nodeAddress(i), "rto_min",
                                  strCat(std::lround(minRtoMs), "ms")});
    if (quickAck) cmd.insert(cmd.end(), {"quickack", "1"});
    run(cmd);
  }
}

void EmulatedCluster::destroy() {
  if (destroyed_) return;
  destroyed_ = true;
  for (const auto& ns : namespaces_) {
    try {
      run({"ip", "netns", "del", ns});
    } catch (const Error& e) {
      POSEIDON_LOG(kWarning) << "could not remove namespace " << ns << ": " << e.what();
    }
  }
  if (!switchNs_.empty()) {
    try {
      run({"ip", "netns", "del", switchNs_});
    } catch (const Error& e) {
      POSEIDON_LOG(kWarning) << "could not remove namespace " << switchNs_ << ": " << e.what();
    }
  }
}

}  // namespace poseidon::bench
