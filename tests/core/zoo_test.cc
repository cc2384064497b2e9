#include "poseidon/model/zoo.h"
#include "poseidon/model/table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>

#include "expect_error.h"
#include "poseidon/common/error.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;

int countType(const ModelDesc& m, LayerType type) {
  int n = 0;
  for (const auto& l : m.layers) n += l.type == type;
  return n;
}

int64_t totalMacs(const ModelDesc& m) {
  int64_t total = 0;
  for (const auto& l : m.layers) total += l.macsPerSample;
  return total;
}

const LayerSpec& layer(const ModelDesc& m, const std::string& name) {
  int i = m.find(name);
  if (i < 0) throw std::runtime_error("no layer " + name + " in " + m.name);
  return m.layers[i];
}

// ---- zoo entries and parameter counts ---------------------------------------------

TEST(ZooTest, EntriesAreUniqueAndDescribed) {
  std::set<std::string> names;
  for (const auto& e : zooEntries()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    EXPECT_FALSE(e.description.empty()) << e.name;
    EXPECT_GT(e.publishedParams, 0) << e.name;
    EXPECT_GT(e.defaultBatch, 0) << e.name;
    EXPECT_EQ(&zooEntry(e.name), &e);
  }
  for (const char* required :
       {"lenet", "cifar10-quick", "alexnet", "vgg19", "vgg19-22k", "googlenet", "resnet-152"})
    EXPECT_EQ(names.count(required), 1u) << required;
  EXPECT_EQ(zooEntry("vgg19").defaultBatch, 32);
  EXPECT_EQ(zooEntry("cifar10-quick").defaultBatch, 100);
  EXPECT_EQ(zooEntry("googlenet").defaultBatch, 128);
}

TEST(ZooTest, EveryModelMatchesItsPublishedCountWithin2Percent) {
  for (const auto& e : zooEntries()) {
    ModelDesc m = zooModel(e.name);
    EXPECT_EQ(m.name, e.name);
    double rel = std::abs(static_cast<double>(m.numel() - e.publishedParams)) / e.publishedParams;
    EXPECT_LT(rel, 0.02) << e.name << ": " << m.numel() << " vs published " << e.publishedParams;
  }
}

TEST(ZooTest, ExactCountsWherePublishedExactly) {
  EXPECT_EQ(zooModel("lenet").numel(), 431080);
  EXPECT_EQ(zooModel("cifar10-quick").numel(), 145578);
  EXPECT_EQ(zooModel("alexnet").numel(), 60965224);
  EXPECT_EQ(zooModel("vgg19").numel(), 143667240);
  EXPECT_EQ(zooModel("resnet-152").numel(), 60192808);
}

TEST(ZooTest, Vgg19Structure) {
  ModelDesc m = zooModel("vgg19");
  EXPECT_EQ(countType(m, LayerType::kConv), 16);
  EXPECT_EQ(countType(m, LayerType::kFC), 3);
  EXPECT_EQ(m.layers.size(), 19u);
  EXPECT_EQ(m.layers.front().name, "conv1_1");
  EXPECT_EQ(m.layers.back().name, "fc8");
  EXPECT_EQ(layer(m, "conv1_1").params[0].shape, (std::vector<int64_t>{64, 3, 3, 3}));
  EXPECT_EQ(layer(m, "conv5_4").params[0].shape, (std::vector<int64_t>{512, 512, 3, 3}));
  const LayerSpec& fc6 = layer(m, "fc6");
  EXPECT_EQ(fc6.m, 4096);
  EXPECT_EQ(fc6.n, 25088);
  const LayerSpec& fc7 = layer(m, "fc7");
  EXPECT_EQ(fc7.type, LayerType::kFC);
  EXPECT_EQ(fc7.m, 4096);
  EXPECT_EQ(fc7.n, 4096);
  EXPECT_TRUE(fc7.hasBias());
  EXPECT_EQ(fc7.shapeString(), "4096x4096");
  EXPECT_EQ(layer(m, "fc8").m, 1000);
}

TEST(ZooTest, Vgg19With22KClasses) {
  ModelDesc m = zooModel("vgg19-22k");
  EXPECT_EQ(layer(m, "fc8").m, 21841);
  EXPECT_EQ(layer(m, "fc8").n, 4096);
  EXPECT_NEAR(static_cast<double>(m.numel()), 229e6, 0.02 * 229e6);
  EXPECT_FALSE(ModelDesc::firstDifference(m, zooModel("vgg19")) == std::nullopt);
}

TEST(ZooTest, AlexNetGroupedConvolutionsHalveTheInputChannels) {
  ModelDesc m = zooModel("alexnet");
  EXPECT_EQ(layer(m, "conv1").params[0].shape, (std::vector<int64_t>{96, 3, 11, 11}));
  EXPECT_EQ(layer(m, "conv2").params[0].shape, (std::vector<int64_t>{256, 48, 5, 5}));
  EXPECT_EQ(layer(m, "conv3").params[0].shape, (std::vector<int64_t>{384, 256, 3, 3}));
  EXPECT_EQ(layer(m, "conv4").params[0].shape, (std::vector<int64_t>{384, 192, 3, 3}));
  EXPECT_EQ(layer(m, "conv5").params[0].shape, (std::vector<int64_t>{256, 192, 3, 3}));
  EXPECT_EQ(layer(m, "fc6").shapeString(), "4096x9216");
  EXPECT_EQ(countType(m, LayerType::kFC), 3);
}

TEST(ZooTest, GoogLeNetStructure) {
  ModelDesc m = zooModel("googlenet");
  const LayerSpec& cls = layer(m, "loss3/classifier");
  EXPECT_EQ(cls.type, LayerType::kFC);
  EXPECT_EQ(cls.m, 1000);
  EXPECT_EQ(cls.n, 1024);
  EXPECT_EQ(m.layers.back().name, "loss3/classifier");
  // 3 stem convs + 9 modules x 6 convs, and no auxiliary classifiers.
  EXPECT_EQ(countType(m, LayerType::kConv), 3 + 9 * 6);
  EXPECT_EQ(countType(m, LayerType::kFC), 1);
  EXPECT_EQ(layer(m, "inception_3a/3x3").params[0].shape, (std::vector<int64_t>{128, 96, 3, 3}));
  EXPECT_EQ(layer(m, "inception_5b/pool_proj").params[0].shape, (std::vector<int64_t>{128, 832, 1, 1}));
  EXPECT_EQ(m.find("loss1/classifier"), -1);
}

TEST(ZooTest, ResNet152Structure) {
  ModelDesc m = zooModel("resnet-152");
  // conv1 + 50 bottlenecks x 3 convs + 4 projection shortcuts; one BN per conv.
  EXPECT_EQ(countType(m, LayerType::kConv), 155);
  EXPECT_EQ(countType(m, LayerType::kOther), 155);
  EXPECT_EQ(countType(m, LayerType::kFC), 1);
  for (const auto& l : m.layers) {
    if (l.type == LayerType::kConv) {
      EXPECT_FALSE(l.hasBias()) << l.name;
    }
  }
  const LayerSpec& bn = layer(m, "layer3.35.bn3");
  ASSERT_EQ(bn.params.size(), 2u);
  EXPECT_EQ(bn.params[0], (ParamSpec{"weight", {1024}}));
  EXPECT_EQ(bn.params[1], (ParamSpec{"bias", {1024}}));
  EXPECT_EQ(layer(m, "layer4.0.downsample.0").params[0].shape, (std::vector<int64_t>{2048, 1024, 1, 1}));
  EXPECT_EQ(layer(m, "fc").shapeString(), "1000x2048");
}

TEST(ZooTest, LayersAreInForwardOrder) {
  ModelDesc m = zooModel("resnet-152");
  EXPECT_EQ(m.layers[0].name, "conv1");
  EXPECT_EQ(m.layers[1].name, "bn1");
  EXPECT_LT(m.find("layer1.0.conv1"), m.find("layer1.0.conv3"));
  EXPECT_LT(m.find("layer1.2.bn3"), m.find("layer2.0.conv1"));
  EXPECT_EQ(m.layers.back().name, "fc");
}

TEST(ZooTest, MacsPerSample) {
  ModelDesc vgg = zooModel("vgg19");
  EXPECT_EQ(layer(vgg, "conv1_1").macsPerSample, 224LL * 224 * 64 * 3 * 9);
  EXPECT_EQ(layer(vgg, "conv5_4").macsPerSample, 14LL * 14 * 512 * 512 * 9);
  EXPECT_EQ(layer(vgg, "fc6").macsPerSample, 4096LL * 25088);
  // VGG-19 is commonly quoted at 19.6 GMACs, ResNet-152 at 11.5 (conv + fc).
  EXPECT_NEAR(static_cast<double>(totalMacs(vgg)), 19.6e9, 0.02 * 19.6e9);
  EXPECT_NEAR(static_cast<double>(totalMacs(zooModel("resnet-152"))), 11.5e9, 0.03 * 11.5e9);
  // Grouped: each output sees half the input channels.
  EXPECT_EQ(layer(zooModel("alexnet"), "conv2").macsPerSample, 27LL * 27 * 256 * 48 * 25);
  for (const auto& e : zooEntries()) {
    for (const auto& l : zooModel(e.name).layers) EXPECT_GT(l.macsPerSample, 0) << e.name << " " << l.name;
  }
}

// ---- width scaling -----------------------------------------------------------------

TEST(ZooTest, ScaledVgg19KeepsStructure) {
  ModelDesc m = zooModel("vgg19", 0.1);
  EXPECT_EQ(m.name, "vgg19@s=0.1");
  EXPECT_GE(m.numel(), 1200000);
  EXPECT_LE(m.numel(), 1600000);
  EXPECT_EQ(countType(m, LayerType::kConv), 16);
  EXPECT_EQ(countType(m, LayerType::kFC), 3);
  // Image channels stay 3; each conv reads what the previous one writes.
  EXPECT_EQ(layer(m, "conv1_1").params[0].shape[1], 3);
  int64_t prevOut = 3;
  for (const auto& l : m.layers) {
    if (l.type != LayerType::kConv) continue;
    EXPECT_EQ(l.params[0].shape[1], prevOut) << l.name;
    prevOut = l.params[0].shape[0];
  }
  EXPECT_EQ(layer(m, "fc6").n, prevOut * 7 * 7);
  EXPECT_EQ(layer(m, "fc7").n, layer(m, "fc6").m);
  EXPECT_EQ(layer(m, "fc8").m, 100);  // the class count scales too
}

TEST(ZooTest, ScalingKeepsLayerNamesAndShrinksQuadratically) {
  for (const auto& e : zooEntries()) {
    ModelDesc full = zooModel(e.name);
    for (double s : {0.5, 0.1, 0.001}) {
      ModelDesc scaled = zooModel(e.name, s);
      ASSERT_EQ(scaled.layers.size(), full.layers.size()) << e.name << " @" << s;
      for (size_t i = 0; i < full.layers.size(); ++i) {
        EXPECT_EQ(scaled.layers[i].name, full.layers[i].name);
        EXPECT_EQ(scaled.layers[i].type, full.layers[i].type);
        EXPECT_GT(scaled.layers[i].numel(), 0) << e.name << " @" << s << " " << scaled.layers[i].name;
      }
    }
    // At half width the count is about a quarter (plus rounding and the
    // unscaled image channels).
    double ratio = static_cast<double>(zooModel(e.name, 0.5).numel()) / full.numel();
    EXPECT_GT(ratio, 0.2) << e.name;
    EXPECT_LT(ratio, 0.3) << e.name;
  }
}

TEST(ZooTest, ScaledAlexNetKeepsGroupsEven) {
  for (double s : {0.1, 0.3, 0.77, 0.001}) {
    ModelDesc m = zooModel("alexnet", s);
    for (const auto& l : m.layers) {
      if (l.type == LayerType::kConv) {
        EXPECT_EQ(l.params[0].shape[0] % 2, 0) << l.name << " @" << s;
      }
    }
    EXPECT_EQ(layer(m, "conv2").params[0].shape[1] * 2, layer(m, "conv1").params[0].shape[0]);
    EXPECT_EQ(layer(m, "conv4").params[0].shape[1] * 2, layer(m, "conv3").params[0].shape[0]);
    EXPECT_EQ(layer(m, "fc6").n, layer(m, "conv5").params[0].shape[0] * 36);
  }
}

TEST(ZooTest, RejectsBadWidthScale) {
  for (double s : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    std::string msg = invalidArgumentMessage([&] { zooModel("vgg19", s); });
    EXPECT_THAT(msg, HasSubstr("width scale")) << s;
  }
}

TEST(ZooTest, UnknownNameListsKnownModels) {
  std::string msg = invalidArgumentMessage([] { zooModel("vgg-nineteen"); });
  EXPECT_THAT(msg, HasSubstr("vgg-nineteen"));
  EXPECT_THAT(msg, HasSubstr("vgg19"));
  EXPECT_THAT(msg, HasSubstr("resnet-152"));
  EXPECT_THAT(invalidArgumentMessage([] { zooEntry("nope"); }), HasSubstr("vgg19"));
  EXPECT_THAT(invalidArgumentMessage([] { resolveModel("nope"); }), HasSubstr("vgg19"));
}

// ---- JSON layer tables ---------------------------------------------------------------

class ModelTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("poseidon_zoo_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& file, const std::string& content) {
    std::string path = (dir_ / file).string();
    std::ofstream(path) << content;
    return path;
  }

  // Writes `content` and returns the loader's error message.
  std::string loadError(const std::string& content) {
    std::string path = write("bad.json", content);
    std::string msg = invalidArgumentMessage([&] { loadModelTable(path); });
    EXPECT_THAT(msg, HasSubstr(path)) << "the message must name the file";
    return msg;
  }

  std::filesystem::path dir_;
};

void expectSameModel(const ModelDesc& a, const ModelDesc& b) {
  EXPECT_EQ(ModelDesc::firstDifference(a, b), std::nullopt) << ModelDesc::firstDifference(a, b).value_or("");
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.numel(), b.numel());
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i)
    EXPECT_EQ(a.layers[i].macsPerSample, b.layers[i].macsPerSample) << a.layers[i].name;
}

TEST_F(ModelTableTest, RoundTripsEveryZooModel) {
  for (const auto& e : zooEntries()) {
    for (double s : {1.0, 0.1}) {
      ModelDesc m = zooModel(e.name, s);
      ModelDesc back = loadModelTable(write(e.name + ".json", modelTableJson(m)));
      expectSameModel(m, back);
    }
  }
}

TEST_F(ModelTableTest, RoundTripsUnusualLayers) {
  // Layers the short forms cannot express go through the explicit params list.
  ModelDesc m;
  m.name = "odd \"model\"";
  m.layers.push_back(LayerSpec::conv("conv_nobias", 8, 3, 3, 3, false));
  LayerSpec depthwise;
  depthwise.name = "conv_extra";
  depthwise.type = LayerType::kConv;
  depthwise.params = {{"weight", {8, 1, 3, 3}}, {"scale", {8}}};
  m.layers.push_back(depthwise);
  LayerSpec fc = LayerSpec::fc("fc_extra", 10, 8);
  fc.params.push_back({"gain", {10}});
  fc.macsPerSample = 0;
  m.layers.push_back(fc);
  m.layers.push_back(LayerSpec::fc("fc_nobias", 4, 10, false));
  m.layers.push_back(LayerSpec::other("bn", {{"weight", {4}}, {"bias", {4}}}));
  expectSameModel(m, loadModelTable(write("odd.json", modelTableJson(m))));
}

TEST_F(ModelTableTest, LoadsDocumentedFormatWithDefaults) {
  ModelDesc m = loadModelTable(write("t.json", R"({"name": "tiny", "layers": [
      {"name": "conv1", "type": "conv", "shape": [64, 3, 3, 3]},
      {"name": "bn1", "type": "other", "params": [{"name": "weight", "shape": [64]},
                                                   {"name": "bias", "shape": [64]}], "macs": 7},
      {"name": "fc6", "type": "fc", "m": 4096, "n": 25088, "bias": false},
      {"name": "fc7", "type": "fc", "m": 10, "n": 4096}]})"));
  EXPECT_EQ(m.name, "tiny");
  ASSERT_EQ(m.layers.size(), 4u);
  EXPECT_EQ(m.layers[0].type, LayerType::kConv);
  EXPECT_TRUE(m.layers[0].hasBias());  // bias defaults to true
  EXPECT_EQ(m.layers[0].numel(), 64 * 27 + 64);
  EXPECT_EQ(m.layers[1].type, LayerType::kOther);
  EXPECT_EQ(m.layers[1].macsPerSample, 7);
  EXPECT_FALSE(m.layers[2].hasBias());
  EXPECT_EQ(m.layers[2].m, 4096);
  EXPECT_EQ(m.layers[2].n, 25088);
  EXPECT_EQ(m.layers[2].macsPerSample, 4096LL * 25088);  // fc default
  EXPECT_TRUE(m.layers[3].hasBias());
  expectSameModel(m, resolveModel(write("t2.json", modelTableJson(m))));
}

TEST_F(ModelTableTest, ErrorsNameTheFileAndField) {
  struct Case {
    const char* content;
    std::vector<const char*> expected;
  };
  const Case cases[] = {
      {"", {"not valid JSON"}},
      {R"({"name": "x", "layers": [)", {"not valid JSON"}},
      {R"([1, 2])", {"top level"}},
      {R"({"name": "x"})", {"'layers'"}},
      {R"({"name": "x", "layers": {}})", {"'layers'", "array"}},
      {R"({"name": "x", "layers": []})", {"'layers'", "empty"}},
      {R"({"name": 5, "layers": [{"name": "a", "type": "fc", "m": 1, "n": 1}]})", {"'name'"}},
      {R"({"layers": [42]})", {"layer 0"}},
      {R"({"layers": [{"type": "fc", "m": 1, "n": 1}]})", {"layer 0", "'name'"}},
      {R"({"layers": [{"name": "", "type": "fc", "m": 1, "n": 1}]})", {"layer 0", "'name'"}},
      {R"({"layers": [{"name": "a", "type": "fc", "m": 1, "n": 1}, {"name": "b"}]})",
       {"layer 1 'b'", "'type'"}},
      {R"({"layers": [{"name": "a", "type": "pooling"}]})", {"layer 0 'a'", "'type'", "pooling"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "n": 4}]})", {"layer 0 'fc6'", "'m'"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": -4, "n": 4}]})", {"'m'", "positive"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4, "n": "4"}]})", {"'n'"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4.5, "n": 4}]})", {"'m'"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4, "n": 4, "bias": "yes"}]})", {"'bias'"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4, "n": 4, "bais": false}]})", {"'bais'"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4, "n": 4, "macs": -1}]})", {"'macs'"}},
      {R"({"layers": [{"name": "c", "type": "conv"}]})", {"layer 0 'c'", "'shape'"}},
      {R"({"layers": [{"name": "c", "type": "conv", "shape": [8, 0, 3, 3]}]})", {"'shape[1]'"}},
      {R"({"layers": [{"name": "c", "type": "conv", "shape": []}]})", {"'shape'"}},
      {R"({"layers": [{"name": "c", "type": "conv", "shape": [4294967296, 4294967296]}]})", {"'shape'"}},
      {R"({"layers": [{"name": "bn", "type": "other"}]})", {"layer 0 'bn'", "'params'"}},
      {R"({"layers": [{"name": "bn", "type": "other", "params": []}]})", {"'params'"}},
      {R"({"layers": [{"name": "bn", "type": "other", "params": [{"name": "w"}]}]})",
       {"params[0]", "'shape'"}},
      {R"({"layers": [{"name": "bn", "type": "other", "params": [{"name": "w", "shape": [-1]}]}]})",
       {"'params[0].shape[0]'"}},
      {R"({"layers": [{"name": "bn", "type": "other", "params": [{"shape": [1]}]}]})", {"'name'"}},
      {R"({"layers": [{"name": "bn", "type": "other",
                       "params": [{"name": "w", "shape": [1]}, {"name": "w", "shape": [2]}]}]})",
       {"params[1].name", "duplicate"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4, "n": 4},
                      {"name": "fc7", "type": "fc", "m": 4, "n": 4},
                      {"name": "fc6", "type": "fc", "m": 4, "n": 4}]})",
       {"layer 2 'fc6'", "duplicate", "layer 0"}},
      {R"({"layers": [{"name": "fc6", "type": "fc", "m": 4, "n": 4,
                       "params": [{"name": "weight", "shape": [4, 5]}]}]})",
       {"'params'", "'weight'"}},
  };
  for (const auto& c : cases) {
    std::string msg = loadError(c.content);
    for (const char* expected : c.expected) EXPECT_THAT(msg, HasSubstr(expected)) << "content: " << c.content;
  }
}

TEST_F(ModelTableTest, MissingFile) {
  std::string path = (dir_ / "does_not_exist.json").string();
  EXPECT_THAT(invalidArgumentMessage([&] { loadModelTable(path); }), HasSubstr(path));
  EXPECT_THAT(invalidArgumentMessage([&] { resolveModel(path); }), HasSubstr(path));
}

TEST_F(ModelTableTest, ResolveModelTellsNamesFromPaths) {
  EXPECT_EQ(resolveModel("vgg19").numel(), 143667240);
  EXPECT_EQ(resolveModel("vgg19", 0.1).name, "vgg19@s=0.1");
  std::string path = write("lenet.json", modelTableJson(zooModel("lenet")));
  expectSameModel(resolveModel(path), zooModel("lenet"));
  // A path's widths are what the file says; scaling applies to zoo models only.
  EXPECT_THAT(invalidArgumentMessage([&] { resolveModel(path, 0.5); }), HasSubstr("width scale"));
  // A bare name ending in .json is a (relative) path, not a zoo name.
  EXPECT_THAT(invalidArgumentMessage([] { resolveModel("vgg19.json"); }), HasSubstr("vgg19.json"));
  EXPECT_THAT(invalidArgumentMessage([] { resolveModel("vgg19.json"); }), HasSubstr("cannot open"));
}

// The layers below the FC stack, where that stack holds at least half the parameters: what the
// urgent connection carries on a queue that serves it first (Van::urgentLayerCount).
TEST(ZooTest, TheLayersBelowTheFcBulk) {
  EXPECT_EQ(zooModel("vgg19").layersBelowFcBulk(), 16);
  EXPECT_EQ(zooModel("vgg19", 0.09375).layersBelowFcBulk(), 16);  // the bench's width
  EXPECT_EQ(zooModel("vgg19-22k").layersBelowFcBulk(), 16);
  EXPECT_EQ(zooModel("alexnet").layersBelowFcBulk(), 5);
  EXPECT_EQ(zooModel("resnet-152").layersBelowFcBulk(), 0);
  EXPECT_EQ(zooModel("inception-v3").layersBelowFcBulk(), 0);
  EXPECT_EQ(zooModel("googlenet").layersBelowFcBulk(), 0);
  // Exactly half counts; just under does not; the FC layers count, not the conv layers above the
  // first of them (inception-v3's auxiliary classifier sits below its last blocks).
  ModelDesc m;
  m.layers = {LayerSpec::conv("c", 10, 1, 1, 1, false), LayerSpec::fc("f", 10, 1, false)};
  EXPECT_EQ(m.layersBelowFcBulk(), 1);
  m.layers[1] = LayerSpec::fc("f", 9, 1, false);
  EXPECT_EQ(m.layersBelowFcBulk(), 0);
  m.layers = {LayerSpec::conv("c", 10, 1, 1, 1, false), LayerSpec::fc("f", 2, 1, false),
              LayerSpec::conv("d", 10, 1, 1, 1, false)};
  EXPECT_EQ(m.layersBelowFcBulk(), 0);
  m.layers.push_back(LayerSpec::fc("g", 20, 1, false));
  EXPECT_EQ(m.layersBelowFcBulk(), 1);
  EXPECT_EQ(ModelDesc{}.layersBelowFcBulk(), 0);
}

}  // namespace
}  // namespace poseidon
