#include "poseidon/core/kv_layout.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"

namespace poseidon {
namespace {

TEST(KvLayout, PairsCoverEveryLayerExactly) {
  ModelDesc m;
  m.layers.push_back(LayerSpec::other("one", {{"w", {1}}}));
  m.layers.push_back(LayerSpec::fc("odd", 7, 13));  // 98 floats
  m.layers.push_back(LayerSpec::fc("big", 40, 10, false));  // 400 floats
  KvLayout layout(m, 3, 32 * 4);  // 32 floats per pair
  for (int l = 0; l < 3; ++l) {
    int64_t next = 0;
    for (const auto& p : layout.pairsOf(l)) {
      EXPECT_EQ(p.offset, next);
      EXPECT_GT(p.length, 0);
      EXPECT_LE(p.length, 32);
      next += p.length;
    }
    EXPECT_EQ(next, m.layers[l].numel());
  }
  EXPECT_EQ(layout.pairsOf(0).size(), 1u);
  EXPECT_EQ(layout.pairsOf(1).size(), 4u);   // 32+32+32+2
  EXPECT_EQ(layout.pairsOf(1).back().length, 2);
  EXPECT_EQ(layout.pairsOf(2).size(), 13u);  // 12*32 + 16
}

// The paper's load-balance claim: with 2 MB pairs no shard holds a whole big
// tensor; for VGG19 at P2 = 8 the most loaded shard holds at most 5% more
// bytes than the least loaded.
TEST(KvLayout, Vgg19BalancedOverEightShards) {
  ModelDesc vgg = zooModel("vgg19");
  KvLayout layout(vgg, 8);
  const auto& b = layout.shardBytes();
  int64_t mx = *std::max_element(b.begin(), b.end()), mn = *std::min_element(b.begin(), b.end());
  EXPECT_LE(static_cast<double>(mx), 1.05 * static_cast<double>(mn));
  int64_t total = 0;
  for (int64_t x : b) total += x;
  EXPECT_EQ(total, vgg.numel() * 4);
  // fc6 (102.8M params) is spread over every shard.
  int fc6 = vgg.find("fc6");
  std::vector<int> shards;
  for (const auto& p : layout.pairsOf(fc6)) shards.push_back(p.shard);
  std::sort(shards.begin(), shards.end());
  shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
  EXPECT_EQ(shards.size(), 8u);
}

// Many shards: pairs shrink until each shard holds kMinPairsPerShard of the layers that always go
// through the parameter server (vgg19's conv layers; its FC layers may go by SFB), so that one pair
// more or less is a small part of any shard's load.
TEST(KvLayout, PairsShrinkOnManyShardsSoThatTheConvLoadsBalance) {
  ModelDesc vgg = zooModel("vgg19");
  int64_t convBytes = 0;
  for (const auto& l : vgg.layers)
    if (l.type != LayerType::kFC) convBytes += l.numel() * 4;
  const int64_t pair = kDefaultPairBytes;
  EXPECT_EQ(balancedPairBytes(vgg, 1, pair), pair);
  EXPECT_EQ(balancedPairBytes(vgg, 8, pair), pair);  // 80 MB of conv: 4.8 pairs a shard already
  EXPECT_EQ(balancedPairBytes(vgg, 32, pair), convBytes / (4 * 32) / 4 * 4);
  EXPECT_EQ(balancedPairBytes(vgg, 1024, pair), pair / kMaxPairShrink);
  // A model of FC layers only counts them all; less than one pair of such bytes changes nothing.
  ModelDesc mlp;
  mlp.layers.push_back(LayerSpec::fc("a", 1024, 1024));  // 4 MB
  EXPECT_EQ(balancedPairBytes(mlp, 4, pair), (1024 * 1024 + 1024) * 4 / 16 / 4 * 4);
  ModelDesc tiny;
  tiny.layers.push_back(LayerSpec::other("one", {{"w", {1}}}));
  tiny.layers.push_back(LayerSpec::fc("big", 40, 10, false));
  EXPECT_EQ(balancedPairBytes(tiny, 3, 128), 128);

  // The conv bytes each of 32 shards holds: with 2 MB pairs the busiest held twice the least; now
  // within a pair of a quarter of the mean.
  auto convLoads = [&](const KvLayout& layout) {
    std::vector<int64_t> b(32, 0);
    for (int l = 0; l < layout.numLayers(); ++l) {
      if (vgg.layers[l].type == LayerType::kFC) continue;
      for (const auto& p : layout.pairsOf(l)) b[p.shard] += p.length * 4;
    }
    return b;
  };
  const auto before = convLoads(KvLayout(vgg, 32));
  EXPECT_GE(static_cast<double>(*std::max_element(before.begin(), before.end())),
            1.9 * static_cast<double>(*std::min_element(before.begin(), before.end())));
  const auto b = convLoads(KvLayout::balanced(vgg, 32, pair));
  const double mean = static_cast<double>(convBytes) / 32;
  EXPECT_LE(static_cast<double>(*std::max_element(b.begin(), b.end())), 1.3 * mean);
  EXPECT_GE(static_cast<double>(*std::min_element(b.begin(), b.end())), 0.7 * mean);
  EXPECT_EQ(KvLayout::balanced(vgg, 32, pair).pairFloats() * 4, balancedPairBytes(vgg, 32, pair));
}

TEST(KvLayout, DeterministicAndRejectsBadSizes) {
  ModelDesc vgg = zooModel("vgg19", 0.1);
  KvLayout a(vgg, 5, 20000), b(vgg, 5, 20000);
  for (int l = 0; l < a.numLayers(); ++l) {
    ASSERT_EQ(a.pairsOf(l).size(), b.pairsOf(l).size());
    for (size_t i = 0; i < a.pairsOf(l).size(); ++i) EXPECT_EQ(a.pairsOf(l)[i].shard, b.pairsOf(l)[i].shard);
  }
  EXPECT_THROW(KvLayout(vgg, 0), InvalidArgument);
  EXPECT_THROW(KvLayout(vgg, 2, 3), InvalidArgument);
}

}  // namespace
}  // namespace poseidon
