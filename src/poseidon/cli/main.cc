// poseidon: the command-line entry point. Configuration is read here (flags
// and environment) and passed down as options structs.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "poseidon/cli/commands.h"
#include "poseidon/common/crash.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"

namespace {

const char* kUsage =
    "usage: poseidon <command> [flags]\n"
    "\n"
    "Poseidon: data-parallel training over plain Ethernet with wait-free backpropagation and\n"
    "hybrid communication (sharded parameter server + sufficient-factor broadcasting).\n"
    "\n"
    "commands:\n"
    "  plan     per-layer communication costs and BestScheme choices for a model and cluster\n"
    "  train    train a CNN on Fashion-MNIST with N local workers (the main job)\n"
    "  launch   start N ranks of a command on this machine (torchrun-style environment)\n"
    "  bench    emulated-cluster benchmark: Poseidon against PyTorch DDP (needs root)\n"
    "  experiment  measurements of the algorithms (implicit-momentum: Omnivore's Fig. 6 fit)\n"
    "  tune     Omnivore's optimizer: picks compute groups, momentum and learning rate by probes (needs root)\n"
    "  version  print the version\n"
    "\n"
    "Run 'poseidon <command> --help' for a command's flags.\n"
    "Environment: POSEIDON_LOG=debug|info|warning|error|off sets the log level (default warning).\n";

// The one line a failed command prints. A rank (RANK and friends set) puts
// its rank in front, like its log lines, and drops the "rank R: " that the
// core's messages often start with, so the line names the rank once; a
// launcher that prefixes every line replaces that prefix (launch/launcher.h).
std::string errorLine(const std::string& cmd, const std::string& what) {
  using namespace poseidon;
  const std::string head = "poseidon " + cmd + ": error: ";
  try {
    RankEnv env = rankFromEnvironment();
    if (env.present) return rankPrefix(env.rank) + head + withoutRankMarker(what, env.rank) + "\n";
  } catch (const Error&) {
    // A malformed rank environment is the error being reported, or will be.
  }
  return head + what + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace poseidon;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    // No command is a usage error: the usage goes to stderr, as every other usage error's line does.
    (args.empty() ? std::cerr : std::cout) << kUsage;
    return args.empty() ? 2 : 0;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  // The line that heads a crash report: lives as long as the process.
  static const std::string crashName = "poseidon " + cmd;
  installCrashReport(crashName.c_str());
  try {
    // POSEIDON_LOG: empty is unset, as for every other variable; a bad value names the variable.
    setLogLevelFromEnvironment();
    if (cmd == "plan") return cli::planCommand(args);
    if (cmd == "launch") return cli::launchCommand(args);
    if (cmd == "train") return cli::trainCommand(args);
    if (cmd == "bench") return cli::benchCommand(args);
    if (cmd == "experiment") return cli::experimentCommand(args);
    if (cmd == "tune") return cli::tuneCommand(args);
    if (cmd == "bench-worker") return cli::benchWorkerCommand(args);
    if (cmd == "version" || cmd == "--version") {
      if (!args.empty()) throw InvalidArgument("unexpected argument '" + args[0] + "': 'poseidon version' takes none");
      std::cout << "poseidon 0.1.0\n";
      return 0;
    }
    std::cerr << "poseidon: unknown command '" << cmd << "'\n\n" << kUsage;
    return 2;
  } catch (const InterruptedError& e) {
    std::cerr << errorLine(cmd, e.what());
    return 128 + e.signal();
  } catch (const InvalidArgument& e) {
    std::cerr << errorLine(cmd, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::cerr << errorLine(cmd, e.what());
    return 1;
  }
}
