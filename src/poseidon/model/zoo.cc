#include "poseidon/model/zoo.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "poseidon/common/error.h"
#include "poseidon/model/table.h"

namespace poseidon {
namespace {

// ---- building blocks ------------------------------------------------------------

// Channel and feature widths at a width scale. Every width goes through here
// so that a layer's input width is always computed from the (scaled) width of
// the layer that produces it, never scaled twice.
class Width {
 public:
  explicit Width(double scale) : scale_(scale) {}

  int64_t operator()(int64_t c) const {
    return std::max<int64_t>(1, std::llround(static_cast<double>(c) * scale_));
  }
  // Like operator(), but a multiple of `groups`: a grouped convolution splits
  // both its input and output channels evenly over the groups.
  int64_t grouped(int64_t c, int64_t groups) const {
    int64_t perGroup = std::max<int64_t>(1, std::llround(static_cast<double>(c) * scale_ / groups));
    return perGroup * groups;
  }

 private:
  double scale_;
};

struct Kernel {
  Kernel(int64_t k) : h(k), w(k) {}  // NOLINT: square kernels read best as plain numbers
  Kernel(int64_t kh, int64_t kw) : h(kh), w(kw) {}
  int64_t h;
  int64_t w;
};

// Appends layers in forward order and fills in their forward MACs. All the
// zoo networks have square feature maps, so a spatial size is one number.
class NetBuilder {
 public:
  // `inC` is the full input channel count; the weight sees inC / groups.
  void conv(const std::string& name, int64_t outC, int64_t inC, Kernel k, int64_t outHW,
            bool bias = true, int64_t groups = 1) {
    LayerSpec l = LayerSpec::conv(name, outC, inC / groups, k.h, k.w, bias);
    l.macsPerSample = outHW * outHW * outC * (inC / groups) * k.h * k.w;
    layers_.push_back(std::move(l));
  }

  void fc(const std::string& name, int64_t out, int64_t in) {
    layers_.push_back(LayerSpec::fc(name, out, in));  // the builder sets macs = out * in
  }

  // Batch norm's trainable parameters (running statistics are buffers, not
  // synchronized parameters). Forward cost: a scale and a shift per element.
  void batchNorm(const std::string& name, int64_t c, int64_t hw) {
    LayerSpec l = LayerSpec::other(name, {{"weight", {c}}, {"bias", {c}}});
    l.macsPerSample = 2 * c * hw * hw;
    layers_.push_back(std::move(l));
  }

  ModelDesc finish() { return ModelDesc{"", std::move(layers_)}; }

 private:
  std::vector<LayerSpec> layers_;
};

// ---- LeNet / CIFAR-10 quick (Caffe examples) --------------------------------------

ModelDesc buildLeNet(const Width& w) {
  // 28 -conv5-> 24 -pool2-> 12 -conv5-> 8 -pool2-> 4
  NetBuilder b;
  b.conv("conv1", w(20), 1, 5, 24);
  b.conv("conv2", w(50), w(20), 5, 8);
  b.fc("ip1", w(500), w(50) * 4 * 4);
  b.fc("ip2", w(10), w(500));
  return b.finish();
}

ModelDesc buildCifar10Quick(const Width& w) {
  // 5x5 convs with pad 2 keep the size; each 3x3/2 pool (Caffe rounds up)
  // halves it: 32 -> 16 -> 8 -> 4.
  NetBuilder b;
  b.conv("conv1", w(32), 3, 5, 32);
  b.conv("conv2", w(32), w(32), 5, 16);
  b.conv("conv3", w(64), w(32), 5, 8);
  b.fc("ip1", w(64), w(64) * 4 * 4);
  b.fc("ip2", w(10), w(64));
  return b.finish();
}

// ---- AlexNet (Caffe bvlc_alexnet) -------------------------------------------------

ModelDesc buildAlexNet(const Width& w) {
  // conv2, conv4 and conv5 run in two groups (the original two-GPU split), so
  // every conv width must stay even: 227 -conv11/4-> 55 -pool-> 27 -pool-> 13 -pool-> 6.
  auto g = [&w](int64_t c) { return w.grouped(c, 2); };
  NetBuilder b;
  b.conv("conv1", g(96), 3, 11, 55);
  b.conv("conv2", g(256), g(96), 5, 27, true, 2);
  b.conv("conv3", g(384), g(256), 3, 13);
  b.conv("conv4", g(384), g(384), 3, 13, true, 2);
  b.conv("conv5", g(256), g(384), 3, 13, true, 2);
  b.fc("fc6", w(4096), g(256) * 6 * 6);
  b.fc("fc7", w(4096), w(4096));
  b.fc("fc8", w(1000), w(4096));
  return b.finish();
}

// ---- VGG-19 -----------------------------------------------------------------------

ModelDesc buildVgg19(const Width& w, int64_t classes) {
  struct Block {
    int64_t channels;
    int convs;
    int64_t hw;  // feature map size inside the block (3x3 pad 1 keeps it)
  };
  static const Block kBlocks[] = {{64, 2, 224}, {128, 2, 112}, {256, 4, 56}, {512, 4, 28}, {512, 4, 14}};
  NetBuilder b;
  int64_t inC = 3;
  for (int block = 0; block < 5; ++block) {
    for (int i = 0; i < kBlocks[block].convs; ++i) {
      int64_t outC = w(kBlocks[block].channels);
      b.conv(strCat("conv", block + 1, "_", i + 1), outC, inC, 3, kBlocks[block].hw);
      inC = outC;
    }
  }
  b.fc("fc6", w(4096), inC * 7 * 7);  // pool5 leaves 7x7
  b.fc("fc7", w(4096), w(4096));
  b.fc("fc8", w(classes), w(4096));
  return b.finish();
}

// ---- GoogLeNet (Caffe bvlc_googlenet) ----------------------------------------------

struct InceptionConfig {
  const char* name;
  int64_t c1x1, c3x3Reduce, c3x3, c5x5Reduce, c5x5, poolProj;
  int64_t hw;
};

// One GoogLeNet inception module in Caffe's layer order; returns the width of
// the concatenated output.
int64_t addInception(NetBuilder& b, const Width& w, const InceptionConfig& c, int64_t inC) {
  const std::string p = strCat("inception_", c.name, "/");
  b.conv(p + "1x1", w(c.c1x1), inC, 1, c.hw);
  b.conv(p + "3x3_reduce", w(c.c3x3Reduce), inC, 1, c.hw);
  b.conv(p + "3x3", w(c.c3x3), w(c.c3x3Reduce), 3, c.hw);
  b.conv(p + "5x5_reduce", w(c.c5x5Reduce), inC, 1, c.hw);
  b.conv(p + "5x5", w(c.c5x5), w(c.c5x5Reduce), 5, c.hw);
  b.conv(p + "pool_proj", w(c.poolProj), inC, 1, c.hw);
  return w(c.c1x1) + w(c.c3x3) + w(c.c5x5) + w(c.poolProj);
}

ModelDesc buildGoogLeNet(const Width& w) {
  // 224 -conv7/2-> 112 -pool-> 56 -pool-> 28 (3a,3b) -pool-> 14 (4a..4e) -pool-> 7 (5a,5b)
  static const InceptionConfig kModules[] = {
      {"3a", 64, 96, 128, 16, 32, 32, 28},      {"3b", 128, 128, 192, 32, 96, 64, 28},
      {"4a", 192, 96, 208, 16, 48, 64, 14},     {"4b", 160, 112, 224, 24, 64, 64, 14},
      {"4c", 128, 128, 256, 24, 64, 64, 14},    {"4d", 112, 144, 288, 32, 64, 64, 14},
      {"4e", 256, 160, 320, 32, 128, 128, 14},  {"5a", 256, 160, 320, 32, 128, 128, 7},
      {"5b", 384, 192, 384, 48, 128, 128, 7},
  };
  NetBuilder b;
  b.conv("conv1/7x7_s2", w(64), 3, 7, 112);
  b.conv("conv2/3x3_reduce", w(64), w(64), 1, 56);
  b.conv("conv2/3x3", w(192), w(64), 3, 56);
  int64_t c = w(192);
  for (const auto& m : kModules) c = addInception(b, w, m, c);
  b.fc("loss3/classifier", w(1000), c);
  return b.finish();
}

// ---- ResNet-152 (torchvision resnet152) --------------------------------------------

// torchvision Bottleneck (v1.5: the stride sits on the 3x3 conv). Convs have
// no bias because each is followed by batch norm.
int64_t addBottleneck(NetBuilder& b, const Width& w, const std::string& p, int64_t inC,
                      int64_t planes, int64_t inHW, int64_t outHW, bool downsample) {
  const int64_t mid = w(planes);
  const int64_t outC = w(planes * 4);
  b.conv(p + ".conv1", mid, inC, 1, inHW, false);
  b.batchNorm(p + ".bn1", mid, inHW);
  b.conv(p + ".conv2", mid, mid, 3, outHW, false);
  b.batchNorm(p + ".bn2", mid, outHW);
  b.conv(p + ".conv3", outC, mid, 1, outHW, false);
  b.batchNorm(p + ".bn3", outC, outHW);
  if (downsample) {
    b.conv(p + ".downsample.0", outC, inC, 1, outHW, false);
    b.batchNorm(p + ".downsample.1", outC, outHW);
  }
  return outC;
}

ModelDesc buildResNet152(const Width& w) {
  struct Stage {
    int64_t planes;
    int blocks;
    int64_t hw;
  };
  static const Stage kStages[] = {{64, 3, 56}, {128, 8, 28}, {256, 36, 14}, {512, 3, 7}};
  NetBuilder b;
  b.conv("conv1", w(64), 3, 7, 112, false);
  b.batchNorm("bn1", w(64), 112);
  int64_t c = w(64);
  int64_t hw = 56;  // after the 3x3/2 max pool
  for (int s = 0; s < 4; ++s) {
    for (int i = 0; i < kStages[s].blocks; ++i) {
      // Only the first block of a stage changes width/stride and needs a projection.
      c = addBottleneck(b, w, strCat("layer", s + 1, ".", i), c, kStages[s].planes, hw,
                        kStages[s].hw, i == 0);
      hw = kStages[s].hw;
    }
  }
  b.fc("fc", w(1000), c);
  return b.finish();
}

// ---- Inception-v3 (torchvision inception_v3) ---------------------------------------

// torchvision BasicConv2d: conv without bias, then batch norm.
int64_t basicConv(NetBuilder& b, const std::string& name, int64_t outC, int64_t inC, Kernel k,
                  int64_t outHW) {
  b.conv(name + ".conv", outC, inC, k, outHW, false);
  b.batchNorm(name + ".bn", outC, outHW);
  return outC;
}

int64_t inceptionA(NetBuilder& b, const Width& w, const std::string& p, int64_t inC, int64_t poolFeatures) {
  const int64_t hw = 35;
  int64_t out = basicConv(b, p + ".branch1x1", w(64), inC, 1, hw);
  basicConv(b, p + ".branch5x5_1", w(48), inC, 1, hw);
  out += basicConv(b, p + ".branch5x5_2", w(64), w(48), 5, hw);
  basicConv(b, p + ".branch3x3dbl_1", w(64), inC, 1, hw);
  basicConv(b, p + ".branch3x3dbl_2", w(96), w(64), 3, hw);
  out += basicConv(b, p + ".branch3x3dbl_3", w(96), w(96), 3, hw);
  out += basicConv(b, p + ".branch_pool", w(poolFeatures), inC, 1, hw);
  return out;
}

int64_t inceptionB(NetBuilder& b, const Width& w, const std::string& p, int64_t inC) {
  // 35 -> 17; the max-pool branch passes the input channels through.
  int64_t out = basicConv(b, p + ".branch3x3", w(384), inC, 3, 17);
  basicConv(b, p + ".branch3x3dbl_1", w(64), inC, 1, 35);
  basicConv(b, p + ".branch3x3dbl_2", w(96), w(64), 3, 35);
  out += basicConv(b, p + ".branch3x3dbl_3", w(96), w(96), 3, 17);
  return out + inC;
}

int64_t inceptionC(NetBuilder& b, const Width& w, const std::string& p, int64_t inC, int64_t c7) {
  const int64_t hw = 17;
  const int64_t m = w(c7);
  int64_t out = basicConv(b, p + ".branch1x1", w(192), inC, 1, hw);
  basicConv(b, p + ".branch7x7_1", m, inC, 1, hw);
  basicConv(b, p + ".branch7x7_2", m, m, {1, 7}, hw);
  out += basicConv(b, p + ".branch7x7_3", w(192), m, {7, 1}, hw);
  basicConv(b, p + ".branch7x7dbl_1", m, inC, 1, hw);
  basicConv(b, p + ".branch7x7dbl_2", m, m, {7, 1}, hw);
  basicConv(b, p + ".branch7x7dbl_3", m, m, {1, 7}, hw);
  basicConv(b, p + ".branch7x7dbl_4", m, m, {7, 1}, hw);
  out += basicConv(b, p + ".branch7x7dbl_5", w(192), m, {1, 7}, hw);
  out += basicConv(b, p + ".branch_pool", w(192), inC, 1, hw);
  return out;
}

int64_t inceptionD(NetBuilder& b, const Width& w, const std::string& p, int64_t inC) {
  // 17 -> 8; the max-pool branch passes the input channels through.
  basicConv(b, p + ".branch3x3_1", w(192), inC, 1, 17);
  int64_t out = basicConv(b, p + ".branch3x3_2", w(320), w(192), 3, 8);
  basicConv(b, p + ".branch7x7x3_1", w(192), inC, 1, 17);
  basicConv(b, p + ".branch7x7x3_2", w(192), w(192), {1, 7}, 17);
  basicConv(b, p + ".branch7x7x3_3", w(192), w(192), {7, 1}, 17);
  out += basicConv(b, p + ".branch7x7x3_4", w(192), w(192), 3, 8);
  return out + inC;
}

int64_t inceptionE(NetBuilder& b, const Width& w, const std::string& p, int64_t inC) {
  const int64_t hw = 8;
  int64_t out = basicConv(b, p + ".branch1x1", w(320), inC, 1, hw);
  basicConv(b, p + ".branch3x3_1", w(384), inC, 1, hw);
  out += basicConv(b, p + ".branch3x3_2a", w(384), w(384), {1, 3}, hw);
  out += basicConv(b, p + ".branch3x3_2b", w(384), w(384), {3, 1}, hw);
  basicConv(b, p + ".branch3x3dbl_1", w(448), inC, 1, hw);
  basicConv(b, p + ".branch3x3dbl_2", w(384), w(448), 3, hw);
  out += basicConv(b, p + ".branch3x3dbl_3a", w(384), w(384), {1, 3}, hw);
  out += basicConv(b, p + ".branch3x3dbl_3b", w(384), w(384), {3, 1}, hw);
  out += basicConv(b, p + ".branch_pool", w(192), inC, 1, hw);
  return out;
}

ModelDesc buildInceptionV3(const Width& w) {
  // 299 -3x3/2-> 149 -3x3-> 147 (-3x3 pad 1) -pool-> 73 -1x1, 3x3-> 71 -pool-> 35
  NetBuilder b;
  int64_t c = basicConv(b, "Conv2d_1a_3x3", w(32), 3, 3, 149);
  c = basicConv(b, "Conv2d_2a_3x3", w(32), c, 3, 147);
  c = basicConv(b, "Conv2d_2b_3x3", w(64), c, 3, 147);
  c = basicConv(b, "Conv2d_3b_1x1", w(80), c, 1, 73);
  c = basicConv(b, "Conv2d_4a_3x3", w(192), c, 3, 71);
  c = inceptionA(b, w, "Mixed_5b", c, 32);
  c = inceptionA(b, w, "Mixed_5c", c, 64);
  c = inceptionA(b, w, "Mixed_5d", c, 64);
  c = inceptionB(b, w, "Mixed_6a", c);
  c = inceptionC(b, w, "Mixed_6b", c, 128);
  c = inceptionC(b, w, "Mixed_6c", c, 160);
  c = inceptionC(b, w, "Mixed_6d", c, 160);
  c = inceptionC(b, w, "Mixed_6e", c, 192);
  // Auxiliary classifier on Mixed_6e (trained, so its gradients are
  // synchronized too): 17 -avgpool 5/3-> 5 -1x1-> 5 -5x5-> 1.
  basicConv(b, "AuxLogits.conv0", w(128), c, 1, 5);
  basicConv(b, "AuxLogits.conv1", w(768), w(128), 5, 1);
  b.fc("AuxLogits.fc", w(1000), w(768));
  c = inceptionD(b, w, "Mixed_7a", c);
  c = inceptionE(b, w, "Mixed_7b", c);
  c = inceptionE(b, w, "Mixed_7c", c);
  b.fc("fc", w(1000), c);
  return b.finish();
}

// ---- the zoo table -----------------------------------------------------------------

struct ZooModel {
  ZooEntry entry;
  ModelDesc (*build)(const Width&);
};

const std::vector<ZooModel>& zooModels() {
  static const std::vector<ZooModel> kModels = {
      {{"lenet",
        "Caffe examples/mnist LeNet (lenet_train_test.prototxt): 28x28x1 input, conv1 20@5x5, pool, "
        "conv2 50@5x5, pool, ip1 500, ip2 10. 431,080 params (exact).",
        431080, 64},
       buildLeNet},
      {{"cifar10-quick",
        "Caffe examples/cifar10 cifar10_quick_train_test.prototxt: 32x32x3 input, conv 32/32/64 @5x5 "
        "pad 2 each followed by a 3x3/2 pool, ip1 64, ip2 10. 145,578 params (exact; paper: 145.6K).",
        145578, 100},
       buildCifar10Quick},
      {{"alexnet",
        "Caffe models/bvlc_alexnet: 227x227 input, conv2/conv4/conv5 in 2 groups (the original two-GPU "
        "split), fc6 4096x9216, fc7 4096x4096, fc8 1000x4096. 60,965,224 params (exact for the Caffe "
        "prototxt; torchvision's ungrouped variant has 61.1M).",
        60965224, 256},
       buildAlexNet},
      {{"vgg19",
        "VGG-19 (Simonyan & Zisserman 2014, configuration E; same shapes as Caffe VGG_ILSVRC_19_layers "
        "and torchvision vgg19): 224x224 input, 16 conv 3x3 + fc6 4096x25088, fc7 4096x4096, "
        "fc8 1000x4096. 143,667,240 params (exact).",
        143667240, 32},
       [](const Width& w) { return buildVgg19(w, 1000); }},
      {{"vgg19-22k",
        "VGG-19 with fc8 over the 21,841 ImageNet-22K (fall 2011) classes, as in the Poseidon paper: "
        "fc8 21841x4096. 229,052,817 params (paper: 229M).",
        229000000, 32},
       [](const Width& w) { return buildVgg19(w, 21841); }},
      {{"googlenet",
        "Caffe models/bvlc_googlenet without the two auxiliary classifiers (loss1/, loss2/): 224x224 "
        "input, conv1 7x7/2, conv2 1x1+3x3, inception 3a..5b, loss3/classifier 1000x1024. "
        "6,998,552 params (the Poseidon paper rounds GoogLeNet to 5M, which the published "
        "architecture does not reproduce).",
        6998552, 128},
       buildGoogLeNet},
      {{"resnet-152",
        "torchvision resnet152 (ResNet v1.5, stride on the 3x3 conv): bottleneck blocks [3, 8, 36, 3], "
        "conv without bias, batch norm as 'other' layers with weight+bias (running statistics are "
        "buffers, not counted), fc 1000x2048. 60,192,808 params (exact).",
        60192808, 32},
       buildResNet152},
      {{"inception-v3",
        "torchvision inception_v3 with the auxiliary classifier (AuxLogits, trained so synchronized): "
        "299x299 input, BasicConv2d = conv without bias + batch norm weight+bias. 27,161,264 params "
        "(exact; paper: 27M; 23,834,568 without AuxLogits).",
        27161264, 32},
       buildInceptionV3},
  };
  return kModels;
}

std::string knownModelNames() {
  std::string names;
  for (const auto& m : zooModels()) names += (names.empty() ? "" : ", ") + m.entry.name;
  return names;
}

// Index into zooModels() (and zooEntries(), which lists the same models in
// the same order).
size_t findZooModel(const std::string& name) {
  for (size_t i = 0; i < zooModels().size(); ++i)
    if (zooModels()[i].entry.name == name) return i;
  throw InvalidArgument(strCat("unknown model '", name, "'; known models: ", knownModelNames(),
                               " (or pass a path to a JSON layer table)"));
}

std::string scaleSuffix(double widthScale) {
  std::ostringstream os;
  os << "@s=" << widthScale;
  return os.str();
}

bool looksLikePath(const std::string& s) {
  const std::string ext = ".json";
  return s.find('/') != std::string::npos ||
         (s.size() >= ext.size() && s.compare(s.size() - ext.size(), ext.size(), ext) == 0);
}

}  // namespace

const std::vector<ZooEntry>& zooEntries() {
  static const std::vector<ZooEntry> kEntries = [] {
    std::vector<ZooEntry> entries;
    for (const auto& m : zooModels()) entries.push_back(m.entry);
    return entries;
  }();
  return kEntries;
}

const ZooEntry& zooEntry(const std::string& name) { return zooEntries()[findZooModel(name)]; }

ModelDesc zooModel(const std::string& name, double widthScale) {
  const ZooModel& m = zooModels()[findZooModel(name)];
  // Written as !(in range) so that NaN is rejected too.
  if (!(widthScale > 0.0 && widthScale <= 1.0))
    throw InvalidArgument(strCat("width scale for model '", name, "' must be in (0, 1], got ", widthScale));
  ModelDesc model = m.build(Width(widthScale));
  model.name = widthScale == 1.0 ? name : name + scaleSuffix(widthScale);
  return model;
}

ModelDesc resolveModel(const std::string& nameOrPath, double widthScale) {
  // A name that is no zoo model but a file or directory here ("tables", "vgg.txt") is the path the
  // user meant: its own error ("is a directory", "is not valid JSON") says more than "unknown model".
  const bool zooName = std::any_of(zooModels().begin(), zooModels().end(),
                                   [&](const ZooModel& m) { return m.entry.name == nameOrPath; });
  std::error_code ec;
  const bool onDisk = !zooName && std::filesystem::exists(nameOrPath, ec);
  if (!looksLikePath(nameOrPath) && !onDisk) return zooModel(nameOrPath, widthScale);
  // A table's widths are what the file says; scaling them would silently
  // produce a different model than the one the user wrote down.
  if (widthScale != 1.0)
    throw InvalidArgument(strCat("width scale ", widthScale, " applies to zoo models only, not to the layer table '",
                                 nameOrPath, "'"));
  return loadModelTable(nameOrPath);
}

}  // namespace poseidon
