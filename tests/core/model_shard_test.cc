// The server-held model of compute-group mode, without sockets: pulls answered per group once
// every member asked and the group's last update is in, the paper's SGD update, staleness
// counted, SSP's bound, and what does not fit.
#include "poseidon/kvstore/model_shard.h"

#include <gtest/gtest.h>

#include <cmath>

#include "expect_error.h"

namespace poseidon {
namespace {

// Four workers (ranks 0-3, each also a server) and one 3-float layer on shard 0.
InformationBook job(int groups, int64_t staleness = -1, float momentum = 0, float weightDecay = 0) {
  ModelDesc m;
  m.name = "model-shard-test";
  m.layers.push_back(LayerSpec::other("w", {{"w", {3}}}));
  std::vector<NodeInfo> nodes;
  for (int r = 0; r < 4; ++r) nodes.push_back({r, Role::kBoth, "tcp://x:1"});
  JobSettings s;
  s.pairBytes = 1024;
  s.groups = groups;
  s.staleness = staleness;
  s.momentum = momentum;
  s.weightDecay = weightDecay;
  return InformationBook(3, nodes, m, s);
}

struct Fixture {
  InformationBook book;
  ModelShard shard;
  explicit Fixture(InformationBook b) : book(std::move(b)), shard(book, book.layout().pairsOf(0)[0].shard) {}
  std::vector<ModelShard::Reply> init(std::vector<float> w) {
    return shard.init(0, 0, 0, w.data(), nullptr, 0, std::vector<int64_t>(std::max(1, book.settings().groups), 0));
  }
  std::vector<ModelShard::Reply> pull(int rank, int64_t t) { return shard.pull(rank, 0, 0, t); }
  std::vector<ModelShard::Reply> push(int rank, int64_t t, std::vector<float> g, float lr = 0.5f) {
    return shard.push(rank, 0, 0, t, g.data(), g.size(), lr);
  }
};

TEST(ModelShard, OneGroupIsBspAndAppliesThePapersUpdate) {
  Fixture f(job(1, -1, /*momentum=*/0.5f, /*weightDecay=*/0.1f));
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(f.pull(r, 0).empty());  // waits: not initialized, not all asked
  EXPECT_TRUE(f.pull(3, 0).empty());                             // all asked, still not initialized
  auto replies = f.init({1, 2, 3});
  ASSERT_EQ(replies.size(), 4u);  // every member, the same parameters and version
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(replies[r].toRank, r);
    EXPECT_EQ(replies[r].version, 0);
    EXPECT_EQ(*replies[r].params, (std::vector<float>{1, 2, 3}));
  }
  EXPECT_TRUE(f.push(0, 0, {4, 0, 0}).empty());
  EXPECT_TRUE(f.pull(0, 1).empty());  // a member ahead asks for round 1: held until the update
  EXPECT_TRUE(f.push(3, 0, {4, 4, 0}).empty());
  EXPECT_TRUE(f.push(2, 0, {4, 4, 4}).empty());
  EXPECT_TRUE(f.push(1, 0, {0, 0, 0}).empty());  // applied now; round 1's pull needs all four
  for (int r = 1; r < 3; ++r) EXPECT_TRUE(f.pull(r, 1).empty());
  replies = f.pull(3, 1);
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[0].version, 1);
  // grad = (12, 8, 4) / 4 = (3, 2, 1); d = grad + 0.1 W; buf = 0.5 * 0 + d; W -= 0.5 buf (fused, as LibTorch).
  std::vector<float> expect(3), w{1, 2, 3}, grad{3, 2, 1};
  for (int i = 0; i < 3; ++i) expect[i] = std::fma(std::fma(w[i], 0.1f, grad[i]), -0.5f, w[i]);
  EXPECT_EQ(*replies[0].params, expect);
  EXPECT_EQ(f.shard.stalenessHistogram(), (std::map<int64_t, int64_t>{{0, 1}}));
}

TEST(ModelShard, GroupsUpdateAsynchronouslyAndStalenessIsCounted) {
  Fixture f(job(2));  // groups {0, 1} and {2, 3}
  f.init({0, 0, 0});
  EXPECT_TRUE(f.pull(0, 0).empty());
  EXPECT_EQ(f.pull(1, 0).size(), 2u);  // group 0 goes on without group 1
  EXPECT_TRUE(f.pull(2, 0).empty());
  EXPECT_EQ(f.pull(3, 0).size(), 2u);  // group 1 pulled version 0 too
  f.push(0, 0, {2, 2, 2});
  f.push(1, 0, {2, 2, 2});  // group 0's update: version 1, staleness 0
  f.pull(0, 1);
  auto r = f.pull(1, 1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].version, 1);
  EXPECT_EQ(*r[0].params, (std::vector<float>{-1, -1, -1}));
  f.push(2, 0, {1, 1, 1});
  f.push(3, 0, {1, 1, 1});  // group 1's update, computed on version 0, applied at version 1: staleness 1
  EXPECT_EQ(f.shard.stalenessHistogram(), (std::map<int64_t, int64_t>{{0, 1}, {1, 1}}));
  f.pull(2, 1);
  r = f.pull(3, 1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].version, 2);
  EXPECT_EQ(*r[0].params, (std::vector<float>{-1.5f, -1.5f, -1.5f}));
}

TEST(ModelShard, SspHoldsAGroupThatRunsTooFarAhead) {
  Fixture f(job(2, /*staleness=*/1));
  f.init({0, 0, 0});
  // Group 1 never moves; group 0 may finish rounds 0 and 1, but its pull of round 2 would put it
  // two updates ahead of group 1.
  for (int64_t t = 0; t < 2; ++t) {
    f.pull(0, t);
    EXPECT_EQ(f.pull(1, t).size(), 2u) << t;
    f.push(0, t, {1, 1, 1});
    f.push(1, t, {1, 1, 1});
  }
  f.pull(0, 2);
  EXPECT_TRUE(f.pull(1, 2).empty());  // held
  EXPECT_EQ(f.shard.maxLead(), 1);
  f.pull(2, 0);
  EXPECT_EQ(f.pull(3, 0).size(), 2u);  // group 1 is answered at once
  f.push(2, 0, {0, 0, 0});
  auto released = f.push(3, 0, {0, 0, 0});  // group 1's update lifts the slowest clock: group 0 goes on
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(released[0].iteration, 2);
  EXPECT_EQ(released[0].toRank, 0);
  EXPECT_LE(f.shard.maxLead(), 1);
}

TEST(ModelShard, WhatDoesNotFitIsAProtocolErrorAndChangesNothing) {
  Fixture f(job(2));
  std::vector<float> w{0, 0, 0};
  EXPECT_ERROR_CONTAINS(f.shard.init(1, 0, 0, w.data(), nullptr, 0, {0, 0}), ProtocolError,
                        "only the first worker initializes");
  f.init(w);
  EXPECT_ERROR_CONTAINS(f.shard.init(0, 0, 0, w.data(), nullptr, 0, {0, 0}), ProtocolError, "twice");
  EXPECT_ERROR_CONTAINS(f.pull(0, 5), ProtocolError, "round 5 of group 0, which is at round 0");
  EXPECT_ERROR_CONTAINS(f.push(0, 0, {1, 1, 1}), ProtocolError, "which has not pulled it");
  f.pull(0, 0);
  EXPECT_ERROR_CONTAINS(f.pull(0, 0), ProtocolError, "duplicate pull");
  f.pull(1, 0);
  EXPECT_ERROR_CONTAINS(f.push(0, 0, {1, 1}), ProtocolError, "has 2 floats, expected 3");
  EXPECT_ERROR_CONTAINS(f.shard.pull(0, 0, 9, 0), ProtocolError, "which shard");
  f.push(0, 0, {1, 1, 1});
  EXPECT_ERROR_CONTAINS(f.push(0, 0, {1, 1, 1}), ProtocolError, "duplicate push");
  f.push(1, 0, {1, 1, 1});
  EXPECT_EQ(f.shard.stalenessHistogram(), (std::map<int64_t, int64_t>{{0, 1}}));
}

}  // namespace
}  // namespace poseidon
