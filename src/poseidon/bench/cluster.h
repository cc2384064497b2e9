// An emulated cluster on one machine (DESIGN.md section 4): one network
// namespace per node, joined through a bridge in a switch namespace; each
// node's link shaped in both directions with tc tbf (node egress = upload,
// switch-port egress = download) and an optional netem delay; with HostQueue::kTos
// each node's egress is two bands under the same rate instead (HTB), and the switch ports' with
// a switch queue of kTos (switches set to trust the mark). Every node's
// TCP runs one named congestion control (default cubic, Linux's and Debian's),
// not whatever the host happens to use: the emulated cluster is a cluster of
// stock hosts, and the algorithm decides how pushes and replies share a link.
//
//   [psd<pid>n0] eth0 10.77.0.1 --veth-- p<pid>v0 ┐
//   [psd<pid>n1] eth0 10.77.0.2 --veth-- p<pid>v1 ├─ br0 in [psd<pid>sw]
//   ...                                           ┘
//
// Everything is named after the creating process id, so the destructor (and
// sweepLeftovers() for clusters whose creator died) removes exactly what was
// made. Deleting a namespace deletes its veth ends and their qdiscs. Needs
// root and iproute2 (`ip`, `tc`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace poseidon::bench {

struct LinkSpec {
  double mbit = 100;       // tbf rate, both directions
  double latencyMs = 0;    // added one-way delay (netem) on each node's egress
  // How much each tbf queues before it drops, in milliseconds of traffic at the rate (a switch port's
  // buffer). 100 ms, every table's so far, is deep next to a datacenter switch's few ms.
  double queueMs = kDefaultQueueMs;
  // The rate the tbf's bucket is sized for (rate / 250, at least 16 KB), 0: `mbit`. Under time
  // dilation (bench --time-dilation) the undilated rate, so that the same bytes pass in a burst.
  double bucketMbit = 0;
  static constexpr double kDefaultQueueMs = 100;
};

// What queues each node's outgoing packets (its egress qdisc; the switch ports stay FIFO, as a
// switch that does not trust the hosts' marks is):
// - kFifo: one byte FIFO, every table's so far;
// - kTos: two bands, packets marked IP TOS low-delay first (Poseidon's urgent connections,
//   VanOptions::urgentLayers), as Linux's pfifo_fast, and sch_fq's priority bands, serve them;
//   HTB with a filter on the mark, which the runtime's probe of the egress queue does not read, so
//   the bench tells its ranks (train --host-queue tos);
// - kPfifoFast (nodes only): Linux's default qdisc itself under the shaping tbf (tbf > pfifo_fast),
//   which the ranks read for themselves (probeEgressQueue): its three bands strictly by each packet's
//   priority, which the kernel derives from IP TOS. Its limit is in packets per band, the device's
//   txqueuelen, set to the queue's bytes in full-size frames (a GSO segment of up to the tbf's bucket
//   counts as one). A child qdisc is not what pfifo_fast was made for (a device's root, lockless):
//   at 32 nodes with 16 urgent layers it ran 20% slower than pfifo leaves of the same limit under the
//   same two strict bands (bench/results/pfifo-fast/leaf/), so it measures that, not a NIC's own.
enum class HostQueue { kFifo, kTos, kPfifoFast };

// Packets the leaf queues dropped, from `tc -s qdisc show dev X`'s output: each "qdisc tbf ..." or
// "qdisc bfifo ..." line's following "Sent N bytes M pkt (dropped D, overlimits ...)". HTB's own line is
// skipped: its bands' bfifos count the same drops.
uint64_t leafQueueDrops(const std::string& tcStatistics);

class EmulatedCluster {
 public:
  // Linux's default congestion control, and Debian's: what a stock cluster node runs.
  static constexpr const char* kDefaultTcpCongestion = "cubic";
  // Throws Error with a clear reason when not root, iproute2 is missing or the kernel has no
  // tcpCongestion (net.ipv4.tcp_available_congestion_control).
  EmulatedCluster(int nodes, const LinkSpec& link, const std::string& tcpCongestion = kDefaultTcpCongestion,
                  HostQueue hostQueue = HostQueue::kFifo, HostQueue switchQueue = HostQueue::kFifo);
  ~EmulatedCluster();
  EmulatedCluster(const EmulatedCluster&) = delete;
  EmulatedCluster& operator=(const EmulatedCluster&) = delete;

  int nodes() const { return static_cast<int>(namespaces_.size()); }
  const std::string& nodeNamespace(int i) const { return namespaces_.at(i); }
  std::string nodeAddress(int i) const;  // 10.77.0.(i+1)
  static const char* nodeInterface() { return "eth0"; }
  // Reshapes every link (tc qdisc replace).
  void setLink(const LinkSpec& link);
  const LinkSpec& link() const { return link_; }
  // Linux's minimum TCP retransmission timeout (TCP_RTO_MIN): what each node's route to the others
  // has unless setRouteTimers changes it.
  static constexpr double kKernelMinRtoMs = 200;
  // Sets the TCP timers of every node's route to the others: the minimum retransmission timeout (the
  // route metric rto_min), e.g. kKernelMinRtoMs x F under time dilation (bench --time-dilation), and
  // with quickAck the metric quickack 1: every segment acknowledged at once, no delayed ACK (whose
  // 40 ms floor is a kernel constant that dilation does not scale; bench --tcp-quickack). Each call
  // replaces the route, so it says both.
  void setRouteTimers(double minRtoMs, bool quickAck);
  const std::string& tcpCongestion() const { return tcpCongestion_; }
  HostQueue hostQueue() const { return hostQueue_; }
  HostQueue switchQueue() const { return switchQueue_; }
  // HostQueue::kTos: bytes all nodes sent in the low-delay band since their links were last shaped
  // (tc's class counters); 0 with kFifo.
  uint64_t lowDelayBytesSent() const;
  // The same for the switch ports (the switch queue's kTos): bytes they sent toward the nodes first.
  uint64_t lowDelayBytesReceived() const;
  // Packets the links' queues dropped since they were last shaped (tc's qdisc counters): `uplink`
  // at the nodes' egress (what they send), `downlink` at the switch ports (what they receive: incast).
  struct QueueDrops {
    uint64_t uplink = 0, downlink = 0;
  };
  QueueDrops queueDrops() const;
  // Removes everything this cluster created. Idempotent.
  void destroy();

  // Whether this process can build clusters; on false, `why` says why.
  static bool available(std::string* why);
  // Removes namespaces left by harness processes that no longer exist.
  static int sweepLeftovers();
  // Namespaces of this naming scheme currently present (tests).
  static std::vector<std::string> listOurNamespaces();

 private:
  // Adds a tbf (under a netem delay when link.latencyMs > 0) as the root qdisc of dev; with kTos
  // two bands under the same rate instead, with kPfifoFast a pfifo_fast under the tbf.
  void shape(const std::string& ns, const std::string& dev, const LinkSpec& link, HostQueue queue);
  void clearRoot(const std::string& ns, const std::string& dev);  // errors ignored
  // Makes tcpCongestion_ one a namespace may choose (the kernel lets a namespace other than the
  // host's pick only an allowed one), or throws saying the kernel lacks it.
  void allowTcpCongestion() const;
  std::string prefix_;
  std::string switchNs_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> switchPorts_;
  LinkSpec link_;
  std::string tcpCongestion_;
  HostQueue hostQueue_ = HostQueue::kFifo;
  HostQueue switchQueue_ = HostQueue::kFifo;
  bool destroyed_ = false;
};

// Runs a command line (argv, no shell); throws Error with its output on failure.
std::string run(const std::vector<std::string>& argv);

}  // namespace poseidon::bench
