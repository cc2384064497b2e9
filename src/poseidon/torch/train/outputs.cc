#include "poseidon/torch/train/outputs.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"

namespace poseidon::pt {

void checkOutputPaths(const TrainOptions& o, int rank) {
  // saveCheckpoint would create the directory anyway.
  if (rank == 0 && !o.checkpointDir.empty()) checkOutputDirectory("--checkpoint", o.checkpointDir);
  if (rank == 0 && !o.summaryPath.empty()) {
    checkOutputFile("--summary", o.summaryPath);
    // An earlier run's summary would read as this run's if this one failed: a summary there is this run's.
    std::error_code ec;
    std::filesystem::remove(o.summaryPath, ec);
  }
  if (rank == 0 && !o.saveParamsPath.empty()) checkOutputFile("--save-params", o.saveParamsPath);
  // Every rank writes <trace>.rank<R> next to --trace (merged into it at the end).
  if (!o.tracePath.empty()) checkOutputFile("--trace", o.tracePath);
}

void writeProgress(const std::string& path, int64_t iteration, int64_t checkpointIteration) {
  if (path.empty()) return;
  try {
    writeFileAtomically(
        path, nlohmann::json{{"iteration", iteration}, {"checkpoint_iteration", checkpointIteration}}.dump() + "\n",
        "progress file");
  } catch (const IoError&) {
    // Best effort: without it a restart only says less about what was lost.
  }
}

}  // namespace poseidon::pt
