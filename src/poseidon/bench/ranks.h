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

// How one rank of a job of `worldSize` ranks on `cluster` is started (argv left to the caller): in
// its node's namespace (node rank / localRanks: each node runs localRanks ranks, its GPUs), with
// torchrun's variables (the master is node 0 at `port`), Gloo on the node's interface, one OpenMP
// thread, the job secret, and stdout and stderr into `logFile`.
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
