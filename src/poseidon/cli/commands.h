// Subcommands of the poseidon CLI. Each returns the process exit code:
// 0 success, 1 runtime failure, 2 usage error (bad flag or value).
#pragma once

#include <string>
#include <vector>

namespace poseidon::cli {

int planCommand(const std::vector<std::string>& args);
int launchCommand(const std::vector<std::string>& args);
int trainCommand(const std::vector<std::string>& args);
int benchCommand(const std::vector<std::string>& args);
int benchWorkerCommand(const std::vector<std::string>& args);
int experimentCommand(const std::vector<std::string>& args);
int tuneCommand(const std::vector<std::string>& args);
// poseidon tune --regret: the optimizer's regret on a virtual clock (cli/tune_regret.cc).
int tuneRegretCommand(const std::vector<std::string>& args);

}  // namespace poseidon::cli
