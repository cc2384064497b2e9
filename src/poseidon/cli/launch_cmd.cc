// poseidon launch -n N -- CMD...: a local cluster of N ranks.
#include <iostream>

#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/common/error.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"

namespace poseidon::cli {

int launchCommand(const std::vector<std::string>& args) {
  int n = 2;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  // "-n" is the conventional spelling; accept it as --n.
  std::vector<std::string> normalized;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      normalized.insert(normalized.end(), args.begin() + static_cast<long>(i), args.end());
      break;
    }
    normalized.push_back(args[i] == "-n" ? "--n" : args[i]);
  }
  FlagSet flags("launch", "poseidon launch -n N [--master-addr A] [--master-port P] -- CMD [ARGS...]",
                "Starts N ranks of CMD on this machine with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and\n"
                "MASTER_PORT set (torchrun's convention), forwards their output prefixed with the rank, and\n"
                "if any rank fails, stops the others and exits non-zero with that rank's error.");
  flags.addInt("n", &n, "number of ranks (also -n)", "N", IntRange::closed(1, kMaxRanks));
  flags.addString("master-addr", &masterAddr, "address of rank 0's coordinator", "ADDR");
  flags.addInt("master-port", &masterPort, "coordinator port (0: pick a free one)", "PORT", IntRange::closed(0, 65535));
  int maxRestarts = 0;
  flags.addInt("max-restarts", &maxRestarts,
               "after a failure, restart the whole job up to R times (it resumes from its newest checkpoint)", "R",
               IntRange::atLeast(0));
  std::string security;
  flags.addString("transport-security", &security,
                  "curve (the default: every connection authenticated with the job secret and encrypted) or none "
                  "(neither, as Gloo and NCCL; only inside a trusted network): POSEIDON_TRANSPORT_SECURITY for the "
                  "ranks",
                  "MODE");
  flags.parse(normalized);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  if (flags.rest().empty()) throw InvalidArgument("no command given: poseidon launch -n N -- CMD [ARGS...]");
  LaunchOptions opts;
  opts.ranks = n;
  opts.command = flags.rest();
  opts.masterAddr = masterAddr;
  opts.masterPort = masterPort;
  opts.maxRestarts = maxRestarts;
  if (flags.wasSet("transport-security")) {
    parseTransportSecurity(security, "--transport-security");  // checked here, not by every rank
    opts.env["POSEIDON_TRANSPORT_SECURITY"] = security;
  }
  LaunchResult r = launchLocal(opts);
  if (r.exitCode != 0) {
    std::cerr << "poseidon launch: " << r.failure << "; stopped the other ranks\n";
    return r.exitCode;
  }
  return 0;
}

}  // namespace poseidon::cli
