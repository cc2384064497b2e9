// poseidon launch -n N -- CMD...: a local cluster of N ranks.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/common/error.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"

namespace poseidon::cli {

namespace {

// The program every rank would run, looked up as execvp does (a bare name on PATH), checked once
// here: a typo is one line and exit 2, not one "cannot run" per rank and a restart.
void checkRunnable(const std::string& program) {
  auto runnable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (runnable(program)) return;
    struct stat st {};
    const std::string why = ::stat(program.c_str(), &st) != 0 ? std::strerror(errno)
                            : S_ISDIR(st.st_mode)              ? "it is a directory"
                                                               : "it is not executable";
    throw InvalidArgument(strCat("cannot run '", program, "': ", why));
  }
  // glibc's execvp: PATH unset searches /bin:/usr/bin (confstr's _CS_PATH); an empty PATH, or an
  // empty entry in it, is the current directory.
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/bin:/usr/bin";
  size_t start = 0;
  while (true) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (runnable((dir.empty() ? std::string(".") : dir) + "/" + program)) return;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  throw InvalidArgument(strCat("cannot run '", program, "': not found on PATH"));
}

}  // namespace

int launchCommand(const std::vector<std::string>& args) {
  int n = 2;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  // "-n" is the conventional spelling; accept it (and -n=N) as --n.
  std::vector<std::string> normalized;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      normalized.insert(normalized.end(), args.begin() + static_cast<long>(i), args.end());
      break;
    }
    const std::string& a = args[i];
    normalized.push_back(a == "-n" ? "--n" : a.rfind("-n=", 0) == 0 ? "--n=" + a.substr(3) : a);
  }
  FlagSet flags("launch", "poseidon launch -n N [--master-addr A] [--master-port P] -- CMD [ARGS...]",
                "Starts N ranks of CMD on this machine with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and\n"
                "MASTER_PORT set (torchrun's convention), forwards their output prefixed with the rank, and\n"
                "if any rank fails, stops the others and exits non-zero with that rank's error.");
  flags.addInt("n", &n, "number of ranks (also -n)", "N", IntRange::closed(1, kMaxRanks));
  flags.addString("master-addr", &masterAddr, "address of rank 0's coordinator", "ADDR");
  flags.addInt("master-port", &masterPort, "coordinator port (0: pick a free one; a restart always picks a fresh one)",
               "PORT", IntRange::closed(0, 65535));
  int maxRestarts = 0;
  flags.addInt("max-restarts", &maxRestarts,
               "after a failure, restart the whole job up to R times, on a fresh port (a program given a checkpoint "
               "directory resumes from its newest checkpoint; poseidon train needs --checkpoint for that); exit "
               "codes 2 (a usage error), 126 and 127 (the program could not be run) are not restarted",
               "R", IntRange::atLeast(0));
  std::string security;
  flags.addString("transport-security", &security,
                  "curve (the default: every connection authenticated with the job secret and encrypted) or none "
                  "(neither, as Gloo and NCCL; only inside a trusted network): POSEIDON_TRANSPORT_SECURITY for the "
                  "ranks",
                  "MODE");
  try {
    flags.parse(normalized);
  } catch (const InvalidArgument& e) {
    // The flag is -n to the user (parsed as --n).
    const std::string what = e.what();
    if (what.rfind("--n ", 0) == 0) throw InvalidArgument("-n " + what.substr(4));
    if (what.rfind("flag --n ", 0) == 0) throw InvalidArgument("flag -n " + what.substr(9));
    throw;
  }
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  if (flags.rest().empty()) throw InvalidArgument("no command given: poseidon launch -n N -- CMD [ARGS...]");
  checkRunnable(flags.rest().front());
  LaunchOptions opts;
  opts.ranks = n;
  opts.command = flags.rest();
  opts.masterAddr = masterAddr;
  opts.masterPort = masterPort;
  opts.maxRestarts = maxRestarts;
  if (flags.wasSet("transport-security")) {
    parseTransportSecurity(security, "--transport-security");  // checked here, not by every rank
    opts.env["POSEIDON_TRANSPORT_SECURITY"] = security;
  } else {
    transportSecurityFromEnvironment();  // the ranks inherit it: a bad value once, here
  }
  LaunchResult r = launchLocal(opts);
  if (r.exitCode != 0) {
    // An interrupt's failure already says that every rank was stopped.
    std::cerr << "poseidon launch: " << r.failure << (r.interrupted ? "" : "; stopped the other ranks") << "\n";
    return r.exitCode;
  }
  return 0;
}

}  // namespace poseidon::cli
