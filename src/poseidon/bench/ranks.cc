#include "poseidon/bench/ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "poseidon/common/error.h"
#include "poseidon/launch/launcher.h"

namespace poseidon::bench {

std::string lastLine(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return last;
}

SpawnOptions rankSpawn(const EmulatedCluster& cluster, int rank, int worldSize, int port, const std::string& secret,
                       const std::string& logFile, int localRanks) {
  SpawnOptions so;
  so.netns = cluster.nodeNamespace(rank / localRanks);
  so.env = {{"RANK", std::to_string(rank)},
            {"WORLD_SIZE", std::to_string(worldSize)},
            {"LOCAL_RANK", std::to_string(rank % localRanks)},
            {"MASTER_ADDR", cluster.nodeAddress(0)},
            {"MASTER_PORT", std::to_string(port)},
            {"GLOO_SOCKET_IFNAME", EmulatedCluster::nodeInterface()},
            {"OMP_NUM_THREADS", "1"},
            {"POSEIDON_SECRET", secret}};
  so.stdoutTo = Output::kFile;
  so.stderrTo = Output::kLikeStdout;
  so.file = logFile;
  so.timerSlackNs = kRankTimerSlackNs;
  return so;
}

std::string runRanks(std::vector<SpawnOptions> ranks, int timeoutS, const std::atomic<int>& stop) {
  std::vector<ChildProcess> children;
  for (auto& so : ranks) {
    so.ownProcessGroup = true;
    children.push_back(ChildProcess::spawn(so));
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutS);
  size_t left = children.size();
  std::string failure;
  while (left > 0) {
    for (size_t i = 0; i < children.size(); ++i) {
      ChildProcess& c = children[i];
      if (c.exited() || !c.poll()) continue;
      --left;
      if ((!WIFEXITED(c.status()) || WEXITSTATUS(c.status()) != 0) && failure.empty()) {
        failure = strCat("rank ", i, " failed: ", withoutRankMarker(lastLine(ranks[i].file), static_cast<int>(i)));
      }
    }
    bool stopped = stop.load() != 0, late = std::chrono::steady_clock::now() > deadline;
    if (left > 0 && (stopped || late || !failure.empty())) {
      if (failure.empty()) failure = stopped ? "interrupted" : strCat("timed out after ", timeoutS, " s");
      for (auto& c : children) c.kill(SIGKILL);
      for (auto& c : children) c.wait();
      break;
    }
    usleep(50000);  // polling the children's exit; not a wait for an event we could block on
  }
  return failure;
}

}  // namespace poseidon::bench
