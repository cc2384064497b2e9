// What a node's egress queue does with the urgent connections' mark (transport/egress_queue.h): the
// rule over a qdisc tree, and the probe against the kernel's own qdiscs - the loopback's here, and
// (as root) a network namespace's veth under the trees a host may have.
#include "poseidon/transport/egress_queue.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "expect_error.h"
#include "poseidon/common/error.h"

namespace poseidon {
namespace {

constexpr uint32_t kRoot = 0xFFFFFFFFu;  // TC_H_ROOT

TEST(EgressQueue, TheRuleReadsTheTreeFromItsRoot) {
  // Linux's default and prio: TOS low-delay in band 0, served strictly first.
  EXPECT_TRUE(servesLowDelayFirst({{0, kRoot, "pfifo_fast"}}));
  EXPECT_TRUE(servesLowDelayFirst({{0x10000, kRoot, "prio"}}));
  // A shaper passes the choice to its one inner qdisc; its own inner FIFO is not dumped.
  EXPECT_TRUE(servesLowDelayFirst({{0x10000, kRoot, "tbf"}, {0x80010000, 0x10001, "pfifo_fast"}}));
  EXPECT_TRUE(
      servesLowDelayFirst({{0x10000, kRoot, "netem"}, {0x20000, 0x10001, "tbf"}, {0x30000, 0x20001, "pfifo_fast"}}));
  EXPECT_FALSE(servesLowDelayFirst({{0x10000, kRoot, "tbf"}}));
  EXPECT_FALSE(servesLowDelayFirst({{0x10000, kRoot, "netem"}, {0x20000, 0x10001, "tbf"}}));
  // A multiqueue NIC: mq over one qdisc per queue, each of which must serve it first.
  EXPECT_TRUE(servesLowDelayFirst({{0, kRoot, "mq"}, {0, 1, "pfifo_fast"}, {0, 2, "pfifo_fast"}}));
  EXPECT_FALSE(servesLowDelayFirst({{0, kRoot, "mq"}, {0, 1, "pfifo_fast"}, {0, 2, "fq_codel"}}));
  EXPECT_FALSE(servesLowDelayFirst({{0, kRoot, "mq"}}));
  // Fair turns, a classful tree without the probe's knowledge of its filters, nothing queued, nothing.
  EXPECT_FALSE(servesLowDelayFirst({{0, kRoot, "fq_codel"}}));
  EXPECT_FALSE(servesLowDelayFirst({{0x20000, kRoot, "htb"}, {0x30000, 0x20010, "bfifo"}}));
  EXPECT_FALSE(servesLowDelayFirst({{0, kRoot, "noqueue"}}));
  EXPECT_FALSE(servesLowDelayFirst({}));
  // The ingress qdisc is no egress root.
  EXPECT_FALSE(servesLowDelayFirst({{0xFFFF0000u, 0xFFFFFFF1u, "ingress"}}));
}

TEST(EgressQueue, NamesParseAndBadOnesAreRefusedByTheirFlag) {
  for (EgressQueue q : {EgressQueue::kAuto, EgressQueue::kFifo, EgressQueue::kTos})
    EXPECT_EQ(parseEgressQueue(egressQueueName(q)), q);
  EXPECT_ERROR_CONTAINS(parseEgressQueue("pfifo_fast"), InvalidArgument,
                        "--host-queue must be auto, fifo or tos, got 'pfifo_fast'");
  EXPECT_ERROR_CONTAINS(parseEgressQueue("", "host_queue"), InvalidArgument,
                        "host_queue must be auto, fifo or tos, got ''");
}

// Toward 127.0.0.1 the kernel routes through the loopback, whose root is noqueue: nothing queues at
// the host, so nothing is served first.
TEST(EgressQueue, TheLoopbackQueuesNothing) {
  const EgressProbe p = probeEgressQueue("127.0.0.1");
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.device, "lo");
  EXPECT_EQ(p.qdisc, "noqueue");
  EXPECT_FALSE(p.lowDelayFirst);
}

TEST(EgressQueue, AnUnknownPeerIsAnErrorNotAGuess) {
  const EgressProbe p = probeEgressQueue("no-such-host.invalid");
  EXPECT_THAT(p.error, ::testing::HasSubstr("cannot resolve 'no-such-host.invalid'"));
  EXPECT_EQ(p.device, "");
  EXPECT_FALSE(p.lowDelayFirst);
}

int sh(const std::string& command) { return std::system(("{ " + command + "; } >/dev/null 2>&1").c_str()); }

// The probe run inside network namespace `ns` (a forked child enters it), as "device|qdisc|0 or 1|error".
std::string probeIn(const std::string& ns, const std::string& peer) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    const int nsFd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    std::string out = "setns failed";
    if (nsFd >= 0 && setns(nsFd, CLONE_NEWNET) == 0) {
      const EgressProbe p = probeEgressQueue(peer);
      out = p.device + "|" + p.qdisc + "|" + (p.lowDelayFirst ? "1" : "0") + "|" + p.error;
    }
    if (write(fds[1], out.data(), out.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buffer[512];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;) out.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return out;
}

// On a veth in a namespace of its own, under the trees a host may have: the kernel's default, a
// shaper over its own FIFO (the bench's default node), a shaper over the kernel's default, nothing.
TEST(EgressQueue, TheProbeReadsTheKernelsQdiscs) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace)";
  if (sh("command -v ip && command -v tc") != 0) GTEST_SKIP() << "needs iproute2";
  const std::string ns = "poseidon-eq-" + std::to_string(getpid());
  const std::string port = "peq" + std::to_string(getpid() % 100000);
  if (sh("ip netns add " + ns) != 0) GTEST_SKIP() << "cannot create a network namespace here";
  struct Cleanup {
    std::string ns, port;
    ~Cleanup() {
      sh("ip link del " + port);
      sh("ip netns del " + ns);
    }
  } cleanup{ns, port};
  const std::string in = "ip netns exec " + ns + " ";
  ASSERT_EQ(sh("ip link add " + port + " type veth peer name eth0 netns " + ns), 0);
  ASSERT_EQ(sh(in + "ip addr add 10.213.0.1/24 dev eth0"), 0);
  ASSERT_EQ(sh(in + "ip link set eth0 up"), 0);
  const std::string peer = "10.213.0.2";

  EXPECT_EQ(probeIn(ns, peer), "eth0|noqueue|0|");  // a veth's own default
  ASSERT_EQ(sh(in + "tc qdisc replace dev eth0 root pfifo_fast"), 0);
  EXPECT_EQ(probeIn(ns, peer), "eth0|pfifo_fast|1|");
  ASSERT_EQ(sh(in + "tc qdisc replace dev eth0 root handle 1: tbf rate 30mbit burst 16k latency 100ms"), 0);
  EXPECT_EQ(probeIn(ns, peer), "eth0|tbf|0|");
  ASSERT_EQ(sh(in + "tc qdisc add dev eth0 parent 1:1 pfifo_fast"), 0);
  EXPECT_EQ(probeIn(ns, peer), "eth0|tbf > pfifo_fast|1|");
  // No route at all: said, not guessed.
  EXPECT_EQ(probeIn(ns, "10.214.0.2"), "||0|no route to '10.214.0.2': Network is unreachable");
}

}  // namespace
}  // namespace poseidon
