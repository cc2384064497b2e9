// Local launcher: starts N ranks of a command as child processes with the
// torchrun environment set, forwards their output line by line with a rank
// prefix, and on the first failure stops the others and reports it.
//
// Used by `poseidon launch -n N -- CMD...` and by `poseidon train`, which
// launches itself once per worker.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace poseidon {

struct LaunchOptions {
  int ranks = 1;
  std::vector<std::string> command;  // argv; command[0] is looked up on PATH
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;  // 0 picks a free port
  std::map<std::string, std::string> env;  // extra environment for every rank
  bool prefixRank0 = true;                 // false: rank 0's lines pass as it wrote them
  std::chrono::milliseconds killGrace{3000};  // SIGTERM, then SIGKILL after this
  // After a failure, restart the whole job up to this many times. Ranks see
  // POSEIDON_RESTART_COUNT and report progress to POSEIDON_PROGRESS_FILE
  // ({"iteration": i, "checkpoint_iteration": c}), which the launcher reads
  // to say how many iterations the failure cost.
  int maxRestarts = 0;
  // Exit codes that end a rank's run as a whole, though not as a success (poseidon train's 3: the
  // training diverged, which every rank finds at the same step): the other ranks are left to finish
  // (each has its own timeouts), and the job is not restarted (it would diverge again). The job's
  // exit code is the first such code.
  std::vector<int> finishedCodes;
  std::string name = "poseidon launch";  // prefix of the launcher's own messages
};

struct LaunchResult {
  int exitCode = 0;         // 0 when every rank succeeded
  int failedRank = -1;      // first rank that failed
  std::string failure;      // "rank 2 exited with code 1: <its last error line>"
  bool interrupted = false; // stopped by SIGINT / SIGTERM (never restarted)
  bool finished = false;    // the first failure's code is one of LaunchOptions::finishedCodes (not restarted)
};

LaunchResult launchLocal(const LaunchOptions& options);

// A stop signal as a message names it: "SIGINT", "SIGTERM", "SIGHUP", else "signal N".
std::string stopSignalName(int sig);

// Every line carries its rank once. The launcher puts rankPrefix(R) before
// each line of rank R; a rank's own lines may already start with its rank:
// its log prefix ("[rank R] warning: ...", common/log.h), its error line
// ("[rank R] poseidon train: error: ...", cli/main.cc) or a message that
// names it ("rank R: fault injection ..."). withoutRankMarker(line, R) drops
// such a leading marker of rank R (and only of R: "[rank 0] ..." printed by
// rank 1 is about rank 0 and stays), so the launcher replaces it rather than
// adding a second one.
std::string rankPrefix(int rank);  // "[rank R] "
std::string withoutRankMarker(const std::string& line, int rank);

}  // namespace poseidon
