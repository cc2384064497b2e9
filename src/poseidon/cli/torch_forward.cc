// The commands that need LibTorch, as the poseidon command runs them: by exec'ing poseidon-torch, which
// holds them (CMakeLists.txt, "CLI"). poseidon itself links the core alone, so its other commands start
// without LibTorch's second of loading; exec keeps the process (its PID, signals, standard streams and
// environment), so to a launcher, a shell or a test `poseidon train` is one process as before.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "poseidon/cli/commands.h"
#include "poseidon/common/error.h"
#include "poseidon/launch/env.h"

namespace poseidon::cli {
namespace {

// Replaces this process with poseidon-torch <command...> <args...>; returns only by throwing.
[[noreturn]] void runInTorchHalf(const std::vector<std::string>& command, const std::vector<std::string>& args) {
  const std::string exe = (std::filesystem::path(selfExecutable()).parent_path() / "poseidon-torch").string();
  const std::string what = "poseidon " + command.front();
  if (access(exe.c_str(), X_OK) != 0) {
    throw Error(strCat(what, " runs in poseidon-torch, the LibTorch half of the poseidon command, which should be at ",
                       exe, " (", std::strerror(errno), "); build it (cmake --build) or install both"));
  }
  std::vector<std::string> all{exe};
  all.insert(all.end(), command.begin(), command.end());
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execv(exe.c_str(), argv.data());
  throw IoError(strCat("cannot run ", exe, " for ", what, ": ", std::strerror(errno)));
}

}  // namespace

int trainCommand(const std::vector<std::string>& args) { runInTorchHalf({"train"}, args); }

int experimentCommand(const std::vector<std::string>& args) { runInTorchHalf({"experiment"}, args); }

// tune took --regret off before calling here; poseidon-torch's tune takes it off again.
int tuneRegretCommand(const std::vector<std::string>& args) { runInTorchHalf({"tune", "--regret"}, args); }

}  // namespace poseidon::cli
