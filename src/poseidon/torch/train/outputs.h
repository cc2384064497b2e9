// What a rank writes besides its model: the checks of its output paths before the first step, and
// the progress file a supervising launcher reads.
#pragma once

#include <cstdint>
#include <string>

#include "poseidon/torch/trainer.h"

namespace poseidon::pt {

// Output paths are checked before the first step, by the rank that will write there: a typo in
// --summary should cost seconds, not the whole run. InvalidArgument names the flag and the cause.
// An earlier run's --summary file is removed (a failed run leaves none, not the last success's).
void checkOutputPaths(const TrainOptions& o, int rank);

// Progress for a supervising launcher (POSEIDON_PROGRESS_FILE; nothing when `path` is empty): where
// the job is and where its newest checkpoint is, so a restart can say what was lost. Best effort.
void writeProgress(const std::string& path, int64_t iteration, int64_t checkpointIteration);

}  // namespace poseidon::pt
