// Pieces shared by the two modes of poseidon bench (throughput: bench_cmd.cc,
// time to accuracy: bench_accuracy.cc).
#pragma once

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "poseidon/bench/cluster.h"
#include "poseidon/bench/device.h"
#include "poseidon/cli/flags.h"

namespace poseidon::cli {

// The signal (SIGINT, SIGTERM, SIGHUP, SIGPIPE) that asked the harness to stop, 0 until one did; the
// handlers are installed by installStopHandlers(). The harness then kills its runs and cleans up.
extern std::atomic<int> gStop;
void installStopHandlers();

// The send window (bytes) a poseidon-overlap rank of a `nodes`-node cluster runs at model width `scale`
// when --send-window is not given: the runtime's default (Van::defaultSendWindow; `twoBand`: the ranks
// are told --host-queue tos) x scale^2, at least Van::kMinSendWindow.
int benchDefaultSendWindow(int nodes, bool twoBand, double scale);
// Where `systems` has a poseidon-overlap one, says for each node count whose default window falls under
// that floor at `scale` what the ranks run instead (a larger window at full width) and which --scale holds it.
void printSendWindowFloor(const std::vector<std::string>& systems, const std::vector<int>& nodes, bool twoBand,
                          double scale);
// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> splitList(const std::string& s);
// --rates: comma-separated link rates in Mbit/s, each > 0 (InvalidArgument naming the bad one).
std::vector<double> parseRates(const std::string& flag);
// bench/<name> next to the binary's source tree or under the current directory, or `flag` when
// given; throws InvalidArgument naming it when none exists.
std::string findBenchScript(const std::string& flag, const std::string& name);
// Debian's python3 with python3-torch: the DDP baselines' interpreter unless --ddp-python names another
// (a machine whose torch is a pip install, e.g. the GPU machine of ../shared/gpu/).
constexpr const char* kDefaultDdpPython = "/usr/bin/python3";
// findBenchScript for a DDP baseline, once `python` imports torch.distributed; else Error saying so,
// with what the interpreter said.
std::string findDdpScript(const std::string& flag, const std::string& name, const std::string& python);
// A fresh directory $TMPDIR/<prefix>-XXXXXX (TMPDIR unset or empty: /tmp) for a run's logs and results
// (IoError if it cannot be made).
std::string makeWorkDir(const std::string& prefix);
// Error saying why the emulated cluster cannot be made here (not root, no ip or tc): the first check
// of every command that runs on it.
void requireEmulatedCluster();
// The results a command writes at its end (--json FILE, --markdown FILE, --plots DIR; empty: not asked
// for), checked before its first run (common/file.h): a typo costs a second, not the hours of runs
// whose results it would lose.
void checkResultOutputs(const std::string& jsonPath, const std::string& mdPath, const std::string& plotDir = "");
// --json FILE at a command's end: the results written whole (writeFileAtomically: a failed write is an
// error) and "results: FILE" printed; nothing when `path` is empty.
void writeResultsJson(const std::string& path, const nlohmann::json& result);
// Throws InterruptedError when a stop signal arrived (gStop): "interrupted by SIGINT".
void throwIfStopped();
// A command's last lines flushed, then throwIfStopped: a reader that went away during them (SIGPIPE)
// ends the command as one gone earlier does, 141 and one line, not 0 with its output cut short.
void finishOutput();
// A command's work directory for its runs' logs and results (makeWorkDir), made with the stop
// handlers installed (before the first run). Removed when it goes out of scope - after the last run,
// on a failure and on Ctrl-C alike, as the commands' --help promise - unless kept (--keep): then its
// path is printed, after `label` ("logs").
class WorkDir {
 public:
  WorkDir(const std::string& prefix, bool keep, std::string label);
  ~WorkDir();
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_, label_;
  bool keep_;
};
// The command line a results file records: `command` and its arguments as given.
std::string commandLine(const std::string& command, const std::vector<std::string>& args);
// --queue-ms: each shaped link's queue (bench and bench --accuracy).
void addQueueFlag(FlagSet& flags, double* queueMs);
// --host-queue fifo|tos|pfifo_fast or --switch-queue fifo|tos (bench/cluster.h, HostQueue); throws
// InvalidArgument on anything else.
bench::HostQueue parseHostQueue(const std::string& name, const char* flag = "--host-queue");
// --tcp-cc: the emulated nodes' TCP congestion control (bench and bench --accuracy).
void addTcpCongestionFlag(FlagSet& flags, std::string* name);
// --tcp-quickack: the delayed ACK off on every emulated node's route (EmulatedCluster::setRouteTimers).
void addTcpQuickAckFlag(FlagSet& flags, bool* on);
// InvalidArgument unless name looks like a kernel congestion-control name (the cluster checks it is there).
void checkTcpCongestionName(const std::string& name);
// poseidon bench --accuracy.
int benchAccuracyCommand(const std::vector<std::string>& args);
// poseidon bench --report-from FILE: the tables (mdPath) and plots (plotDir) of an earlier run's results
// file, either mode's; InvalidArgument when FILE is not one.
int reportFromFile(const std::string& file, const std::string& mdPath, const std::string& plotDir);
// --machine-rates G,S,C: GEMM GFLOP/s, server sums GB/s, CURVE GB/s, each > 0.
bench::MachineRates parseMachineRates(const std::string& flag);
// A `bench --accuracy` results file's tables (mdPath) and curves (plotDir), either may be empty
// (poseidon bench --report-from).
void writeAccuracyReport(const nlohmann::json& result, const std::string& mdPath, const std::string& plotDir);

}  // namespace poseidon::cli
