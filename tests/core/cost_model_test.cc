#include "poseidon/core/best_scheme.h"
#include "poseidon/core/cost_model.h"

#include <gtest/gtest.h>

#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"

namespace poseidon {
namespace {

// Paper section 3.2 worked example: VGG19 fc7, 4096 x 4096, K = 32, P1 = P2 = 8.
TEST(CostModel, Vgg19Fc7WorkedNumbers) {
  LayerSpec fc7 = LayerSpec::fc("fc7", 4096, 4096);
  CostInputs c = costInputs(fc7, 32, 8, 8);
  EXPECT_EQ(psCostWorker(c), 33554432.0);
  EXPECT_EQ(psCostBoth(c), 58720256.0);
  EXPECT_EQ(sfbCost(c), 3670016.0);
  EXPECT_EQ(psCostServer(c), 2.0 * 8 * 4096 * 4096 / 8);
  EXPECT_EQ(bestScheme(fc7, 32, 8, 8), Scheme::kSFB);
}

// The 2015 paper's AlexNet example: M = N = 4096, P = 4, K = 256. Full
// matrices through a PS: 2 P M N = 134.2M floats; Adam-style (factors up,
// matrices down, at the server): P K (M + N) + P M N = 75.5M. For SFB the
// paper prints 18.9M, but its own formula (P - 1) 2K (M + N) gives 12.6M
// (18.9M is (P - 1)^2 K (M + N)); we follow the formula, as Table 1 does.
TEST(CostModel, AlexNetWorkedNumbers) {
  LayerSpec fc = LayerSpec::fc("fc7", 4096, 4096);
  CostInputs c = costInputs(fc, 256, 4, 4);
  EXPECT_EQ(2.0 * 4 * 4096 * 4096, 134217728.0);
  EXPECT_NEAR(psCostServer(c) * 4 / 1e6, 134.2, 0.05);  // all four shards together
  EXPECT_NEAR(adamCostServer(c) / 1e6, 75.5, 0.05);
  EXPECT_EQ(sfbCost(c), 3.0 * 2 * 256 * 8192);
  EXPECT_EQ(bestScheme(fc, 256, 4, 4), Scheme::kSFB);
}

TEST(CostModel, AdamCosts) {
  LayerSpec l = LayerSpec::fc("f", 10, 20);
  CostInputs c = costInputs(l, 3, 4, 2);
  EXPECT_EQ(adamCostWorker(c), 3 * 30 + 200);
  EXPECT_EQ(adamCostServer(c), 4 * 200 + 4 * 3 * 30);
  EXPECT_EQ(adamCostBoth(c), 3 * (200 + 3 * 10 + 3 * 20));
}

// GoogLeNet's 1000 x 1024 classifier at K = 128, P1 = P2 = 16 goes PS.
TEST(CostModel, GoogLeNetClassifierGoesPs) {
  LayerSpec l = LayerSpec::fc("loss3/classifier", 1000, 1024);
  CostInputs c = costInputs(l, 128, 16, 16);
  EXPECT_EQ(sfbCost(c), 2.0 * 128 * 15 * 2024);
  EXPECT_EQ(psCostBoth(c), 2.0 * 1000 * 1024 * 30 / 16);
  EXPECT_GT(sfbCost(c), psCostBoth(c));
  EXPECT_EQ(bestScheme(l, 128, 16, 16), Scheme::kPS);
  ModelDesc g = zooModel("googlenet");
  int fcs = 0;
  for (const auto& layer : g.layers) {
    if (layer.type != LayerType::kFC) continue;
    ++fcs;
    EXPECT_EQ(bestScheme(layer, 128, 16, 16), Scheme::kPS) << layer.name;
  }
  EXPECT_EQ(fcs, 1);
}

TEST(CostModel, ConvAlwaysPs) {
  LayerSpec conv = LayerSpec::conv("c", 512, 512, 3, 3);
  EXPECT_EQ(bestScheme(conv, 1, 64, 1), Scheme::kPS);
  EXPECT_EQ(bestScheme(conv, 1, 64, 1, SchemePolicy::kSFB), Scheme::kPS);
}

TEST(CostModel, TieGoesSfbAndPolicyForces) {
  // One worker: SFB costs nothing, PS on a single node costs nothing: <= picks SFB.
  LayerSpec l = LayerSpec::fc("f", 100, 100);
  EXPECT_EQ(bestScheme(l, 32, 1, 1), Scheme::kSFB);
  EXPECT_EQ(bestScheme(l, 32, 8, 8, SchemePolicy::kPS), Scheme::kPS);
  // A thin layer at large K and P1: SFB would cost more, but the policy forces it.
  LayerSpec thin = LayerSpec::fc("thin", 10, 10);
  EXPECT_EQ(bestScheme(thin, 256, 32, 32), Scheme::kPS);
  EXPECT_EQ(bestScheme(thin, 256, 32, 32, SchemePolicy::kSFB), Scheme::kSFB);
}

TEST(CostModel, Vgg19DecisionsAtEightNodes) {
  ModelDesc vgg = zooModel("vgg19");
  std::vector<std::string> sfb;
  for (const auto& l : vgg.layers)
    if (bestScheme(l, 32, 8, 8) == Scheme::kSFB) sfb.push_back(l.name);
  EXPECT_EQ(sfb, (std::vector<std::string>{"fc6", "fc7", "fc8"}));
}

TEST(CostModel, BadInputs) {
  LayerSpec l = LayerSpec::fc("f", 2, 2);
  EXPECT_THROW(costInputs(l, 0, 1, 1), InvalidArgument);
  EXPECT_THROW(costInputs(l, 1, 0, 1), InvalidArgument);
  EXPECT_THROW(parseSchemePolicy("fast"), InvalidArgument);
  EXPECT_EQ(parseSchemePolicy("sfb"), SchemePolicy::kSFB);
}

}  // namespace
}  // namespace poseidon
