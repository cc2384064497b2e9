// The virtual clock's race (torch/virtual_race.h) draws its batches and its step times from separate
// streams: a run's batchSeed alone decides its data, so the tuner's probes from one checkpoint can
// read the same batches (tune --regret, as poseidon train resumed at a step does) while their step
// times stay their own.
#include "poseidon/torch/virtual_race.h"

#include <gtest/gtest.h>

#include <cmath>

namespace poseidon::pt {
namespace {

VirtualRace::Result synchronous(const VirtualRace& race, uint64_t seed, uint64_t batchSeed) {
  VirtualRace::Run r;
  r.groups = 1;  // one group: updates in a fixed order, so the batches alone decide the model
  r.lr = 0.1;
  r.momentum = 0.5;
  r.steps = 20;
  r.seed = seed;
  r.batchSeed = batchSeed;
  r.evalAtUpdates = {20};
  return race.run(r);
}

TEST(VirtualRace, TheBatchSeedAloneDecidesTheData) {
  VirtualRaceOptions o;
  o.commSeconds = {{1, 0.1}};
  const VirtualRace race(o);
  const auto a = synchronous(race, 1, 7), b = synchronous(race, 2, 7), c = synchronous(race, 1, 8);
  ASSERT_FALSE(a.points.empty());
  ASSERT_FALSE(b.points.empty());
  ASSERT_FALSE(c.points.empty());
  const double la = a.points.back().loss, lb = b.points.back().loss, lc = c.points.back().loss;
  ASSERT_TRUE(std::isfinite(la));
  EXPECT_EQ(la, lb);  // other step times, the same batches: the same model, bit for bit
  EXPECT_NE(a.seconds, b.seconds);
  EXPECT_NE(la, lc);  // other batches
  // batchSeed 0: the batches come from `seed`, as before the field existed.
  EXPECT_EQ(synchronous(race, 7, 0).points.back().loss, synchronous(race, 9, 7).points.back().loss);
}

}  // namespace
}  // namespace poseidon::pt
