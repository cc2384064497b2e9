// --drop-stragglers D --straggler-timeout MS: each KV pair or SFB round proceeds without up to D
// late workers; a rank that finds an iteration already finished without it skips that step.
#include <cstdio>

#include "poseidon/torch/train/modes.h"

namespace poseidon::pt {

void StragglerMode::connect() {
  DistributedOptions d = c_.jobOptions();
  d.node.settings.dropStragglers = c_.o.dropStragglers;
  d.node.settings.stragglerTimeoutMs = c_.o.stragglerTimeoutMs;
  c_.dist = std::make_unique<DistributedModel>(c_.net.module, c_.net.name, std::move(d), c_.net.forward);
}

bool StragglerMode::skipStep() {
  // A straggler: the others finished this iteration without us (the mean gradient is applied here).
  return c_.dist->skipIfBehind(*c_.optimizer);
}

void StragglerMode::report() {
  const int world = c_.world;
  std::vector<double> mine(2 * world, 0.0);
  mine[c_.rank] = static_cast<double>(c_.dist->node().droppedContributions());
  mine[world + c_.rank] = static_cast<double>(c_.dist->node().skippedIterations());
  auto all = c_.allSum(mine);
  dropped_.assign(all.begin(), all.begin() + world);
  skipped_.assign(all.begin() + world, all.end());
  if (c_.lead) {
    std::printf("straggler dropping: dropped layer contributions per rank [");
    for (int r = 0; r < world; ++r) std::printf("%s%.0f", r ? ", " : "", dropped_[r]);
    std::printf("], skipped iterations per rank [");
    for (int r = 0; r < world; ++r) std::printf("%s%.0f", r ? ", " : "", skipped_[r]);
    std::printf("]\n");
  }
}

void StragglerMode::addSummary(nlohmann::json& summary) const {
  summary["dropped_contributions_per_rank"] = dropped_;
  summary["skipped_iterations_per_rank"] = skipped_;
}

}  // namespace poseidon::pt
