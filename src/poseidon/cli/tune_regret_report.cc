#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "poseidon/cli/tune_regret.h"
#include "poseidon/common/error.h"

namespace poseidon::cli {

void writeRegretMarkdown(const std::string& path, const nlohmann::json& result) {
  const auto& b = result["grid_best"];
  std::ofstream md(path);
  md << "# The optimizer's regret on a virtual clock (`poseidon tune --regret`)\n\n`"
     << result["command"].get<std::string>() << "`\n\nTarget loss "
     << fmtFinite(result["target_loss"].get<double>(), "%.4f") << " (the best median at "
     << 100 * result["config"]["target_at"].get<double>()
     << "% of T = " << fmtFinite(result["horizon_s"].get<double>(), "%.0f") << " virtual s). Grid best "
     << strCat("g=", b["groups"].get<int>(), " mu=", b["momentum"].get<double>(), " lr=", b["lr"].get<double>()) << ": "
     << fmtFinite(result["grid_best_s"].get<double>(), "%.0f")
     << " s. The choice: what the tuner trained with when its model reached the target (its "
     << "final configuration where it never did); from scratch: that configuration's median time over the grid's "
     << "seeds; path: the tuner's own time to the target, tuning included.\n\n"
     << "| ratio | seed | choice | from scratch s | regret | rank | final choice | regret | tuning share | path / "
        "best |\n"
     << "|---|---|---|---|---|---|---|---|---|---|\n";
  auto cell = [](const nlohmann::json& v, const char* f) {
    return v.is_number() ? fmtFinite(v.get<double>(), f) : "-";
  };
  for (const auto& c : result["chosen"]) {
    const auto& fin = c["final"];
    md << "| " << c["ratio"] << ":1 | " << c["seed"] << " | g=" << c["groups"] << " mu=" << c["momentum"]
       << " lr=" << c["lr"] << (c["at_target"].get<bool>() ? "" : " (final)") << " | "
       << cell(c["from_scratch_s"], "%.0f") << " | " << cell(c["regret"], "%.3f") << " | " << c["rank"]
       << " | g=" << fin["groups"] << " mu=" << fin["momentum"] << " lr=" << fin["lr"] << " | "
       << cell(fin["regret"], "%.3f") << " | " << fmtFinite(100 * c["tuning_share"].get<double>(), "%.0f%%") << " | "
       << cell(c["path_regret"], "%.3f") << " |\n";
  }
  md << "\n| g | momentum | lr | time s (median) | per seed | median loss at target time "
        "|\n|---|---|---|---|---|---|\n";
  for (const auto& g : result["grid"]) {
    md << "| " << g["groups"] << " | " << g["momentum"] << " | " << g["lr"] << " | "
       << (g["time_s"].is_number() ? fmtFinite(g["time_s"].get<double>(), "%.0f") : "-") << " | ";
    for (const auto& t : g["time_s_per_seed"]) md << (t.is_number() ? fmtFinite(t.get<double>(), "%.0f") : "-") << " ";
    md << "| "
       << (g["median_loss_at_target_time"].is_number()
               ? fmtFinite(g["median_loss_at_target_time"].get<double>(), "%.4f")
               : "diverged")
       << " |\n";
  }
}

}  // namespace poseidon::cli
