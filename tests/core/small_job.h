// The job the server-role and Syncer tests share: three ranks (each a worker and a server) over a
// small model, conv (6 floats: KV pairs of 4 and 2) and fc 4x3 + bias (16 floats: 4 pairs of 4).
#pragma once

#include "poseidon/coordinator/book.h"

namespace poseidon::testing {

constexpr int kSmallConv = 0;
constexpr int kSmallFc = 1;

inline InformationBook smallJob(SchemePolicy policy = SchemePolicy::kAuto, int dropStragglers = 0,
                                WirePrecision wire = WirePrecision::kFp32) {
  ModelDesc m;
  m.name = "small-job";
  m.layers.push_back(LayerSpec::other("conv", {{"w", {6}}}));
  m.layers.push_back(LayerSpec::fc("fc", 4, 3));
  std::vector<NodeInfo> nodes;
  for (int r = 0; r < 3; ++r) nodes.push_back({r, Role::kBoth, "tcp://x:1"});
  JobSettings s;
  s.pairBytes = 4 * 4;
  s.batch = 1;
  s.policy = policy;
  s.dropStragglers = dropStragglers;
  s.stragglerTimeoutMs = dropStragglers ? 100 : 0;
  s.wire = wire;
  return InformationBook(42, nodes, m, s);
}

}  // namespace poseidon::testing
