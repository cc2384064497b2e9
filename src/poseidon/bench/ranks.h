// One job on the emulated cluster: one process per node, each in its node's
// namespace with its output in a log file; the harness waits for all of them.
// Shared by the throughput bench and the time-to-accuracy bench.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "poseidon/bench/cluster.h"
#include "poseidon/launch/process.h"

namespace poseidon::bench {

// Every rank's timer slack (SpawnOptions::timerSlackNs). A rank emulates its GPU and charges the
// runtime's own work at full width by sleeping (common/work_charger.h); with the kernel's default
// slack of 50 us each such sleep woke 70-75 us late on the development VM, 14-23 us at 1 ns. The
// sums and decryptions charged one message at a time added that to every message: resnet-152 on one
// H200 node ran at 0.065 s against its 0.048 s of compute, 0.048 s at 1 ns. DDP's ranks get the same.
constexpr unsigned long kRankTimerSlackNs = 1;

// How one rank of a job of `worldSize` ranks on `cluster` is started (argv left to the caller): in
// its node's namespace (node rank / localRanks: each node runs localRanks ranks, its GPUs), with
// torchrun's variables (the master is node 0 at `port`), Gloo on the node's interface, one OpenMP
// thread, the job secret, a timer slack of kRankTimerSlackNs, and stdout and stderr into `logFile`.
SpawnOptions rankSpawn(const EmulatedCluster& cluster, int rank, int worldSize, int port, const std::string& secret,
                       const std::string& logFile, int localRanks = 1);

// Starts every rank (each in its own process group, so that a kill also reaches what it started)
// and waits. The first rank to fail, the deadline (timeoutS from the start) or a nonzero `stop`
// (a signal's number) kills them all. Returns "" when every rank exited 0, else why not: "rank R
// failed: <its log's last line>", "timed out after S s" or "interrupted".
std::string runRanks(std::vector<SpawnOptions> ranks, int timeoutS, const std::atomic<int>& stop);

// The last nonempty line of a file ("" if unreadable).
std::string lastLine(const std::string& path);

}  // namespace poseidon::bench
