// poseidon tune --regret (cli/tune_regret.cc): its Markdown report. Internal to the CLI.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace poseidon::cli {

// The tuner runs' table (choice, regret, rank, final choice, tuning share, path) and the grid's, from
// the results JSON that `poseidon tune --regret --json` writes.
void writeRegretMarkdown(const std::string& path, const nlohmann::json& result);

// `v` printed with the printf format `f`, or "-" when it is not finite (a target never reached).
std::string fmtFinite(double v, const char* f);

}  // namespace poseidon::cli
