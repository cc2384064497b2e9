// What a node's egress queue does with the urgent connections' IP TOS mark (VanOptions::urgentLayers).
//
// The urgent connection pays most when the host's queue sends its marked packets before the bulk
// connections' (docs/scheduling.md, "The urgent connection"). Whether it does is the kernel's
// queueing discipline on the device that routes to the peers. Linux's pfifo_fast (the kernel's
// default qdisc, and Debian's) and prio map TOS low-delay to their first band and serve it strictly
// first; a FIFO, a shaper's own FIFO, fq_codel's fair turns and HTB without filters do not.
// probeEgressQueue reads the device's qdisc tree over rtnetlink. The runtime logs what it found; it
// takes every layer below the FC stack only when told the queue is two-band (kTos): on pfifo_fast
// under the bench's shaper those layers measured slower than 3, which is pfifo_fast as a child qdisc,
// and a NIC's own cannot be measured here (VanOptions::urgentLayers, bench/results/pfifo-fast/leaf/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace poseidon {

// VanOptions::egressQueue (train --host-queue): what the node's egress queue does with the mark.
enum class EgressQueue : uint8_t {
  kAuto = 0,  // read it from the kernel (probeEgressQueue), for the log: the rule takes it as kFifo
  kFifo,      // the connections take turns: the mark buys nothing there
  kTos,       // two bands, TOS low-delay first, as the bench's HTB (unmeasured on a NIC's pfifo_fast)
};

const char* egressQueueName(EgressQueue queue);  // "auto", "fifo", "tos"
// Throws InvalidArgument naming `flag` and the accepted values.
EgressQueue parseEgressQueue(const std::string& name, const std::string& flag = "--host-queue");

// One qdisc of a device's tree, as rtnetlink reports it (struct tcmsg and TCA_KIND).
struct QdiscEntry {
  uint32_t handle = 0;
  uint32_t parent = 0;  // TC_H_ROOT for the root
  std::string kind;     // "pfifo_fast", "tbf", "htb", "mq", ...
};

// Whether the tree serves TOS low-delay first: its root is pfifo_fast or prio, or a single-child
// shaper (tbf, netem) over such a tree, or a multiqueue root (mq, mqprio, multiq) whose every child
// is. Anything else - noqueue (nothing queues at the host), a FIFO, fq_codel, htb, a shaper over its
// own FIFO - does not.
bool servesLowDelayFirst(const std::vector<QdiscEntry>& tree);

struct EgressProbe {
  std::string device;          // the interface that routes to the peer ("eth0"); empty if unknown
  std::string qdisc;           // its root qdisc's kind, with the child that decided ("tbf > pfifo_fast")
  bool lowDelayFirst = false;  // servesLowDelayFirst
  std::string error;           // why the probe could not tell (then lowDelayFirst is false)
};

// The egress queue toward `peerHost` (an address or host name): the local interface the kernel routes
// it through and that interface's qdisc tree. Never throws; sends nothing to the peer.
EgressProbe probeEgressQueue(const std::string& peerHost);

}  // namespace poseidon
