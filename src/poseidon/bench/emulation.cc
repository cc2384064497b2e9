#include "poseidon/bench/emulation.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"

namespace poseidon::bench {
namespace {

struct Timing {
  const char* name;
  int64_t batch;
  double seconds;
  const char* source;
};

// Single Titan X. Measured figures are the paper's own single-node numbers
// (ATC'17 section 5.1: Caffe 35.5 / 34.6 / 257 images/s; TensorFlow 43.2 for
// Inception-V3). ResNet-152 and AlexNet have no published figure there; they
// are derived from VGG19's measured rate scaled by forward MACs per image.
constexpr double kVggMacs = 19.63e9, kVggSecondsPerImage = 1.0 / 35.5;
const Timing kTimings[] = {
    {"vgg19", 32, 32 / 35.5, "ATC'17 5.1: Caffe on Titan X, 35.5 images/s"},
    {"vgg19-22k", 32, 32 / 34.6, "ATC'17 5.1: Caffe on Titan X, 34.6 images/s"},
    {"googlenet", 128, 128 / 257.0, "ATC'17 5.1: Caffe on Titan X, 257 images/s"},
    {"inception-v3", 32, 32 / 43.2, "ATC'17 5.1: TensorFlow on Titan X, 43.2 images/s"},
    {"resnet-152", 32, 32 * kVggSecondsPerImage * 11.56e9 / kVggMacs,
     "derived: VGG19's 35.5 images/s on Titan X scaled by MACs (11.56G vs 19.63G per image)"},
    {"alexnet", 256, 256 * kVggSecondsPerImage * 0.724e9 / kVggMacs,
     "derived: VGG19's 35.5 images/s on Titan X scaled by MACs (0.724G vs 19.63G per image)"},
};

}  // namespace

double EmulatedModel::computeSeconds() const {
  double t = 0;
  for (size_t i = 0; i < forwardSeconds.size(); ++i) t += forwardSeconds[i] + backwardSeconds[i];
  return t;
}

const std::vector<std::string>& emulatedModelNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& t : kTimings) n.push_back(t.name);
    return n;
  }();
  return names;
}

EmulatedModel emulatedModel(const std::string& name, double scale) {
  const Timing* timing = nullptr;
  for (const auto& t : kTimings)
    if (name == t.name) timing = &t;
  if (!timing) {
    std::string known;
    for (const auto& n : emulatedModelNames()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("no emulated timing for model '" + name + "' (bench models: " + known + ")");
  }
  EmulatedModel m;
  m.name = name;
  m.scale = scale;
  m.desc = zooModel(name, scale);
  m.batch = std::max<int64_t>(1, std::llround(static_cast<double>(timing->batch) * scale));
  m.fullBatch = timing->batch;
  m.iterationSeconds = timing->seconds;
  m.timeSource = timing->source;
  // Split by the full-width model's MACs: compute time does not scale.
  ModelDesc full = zooModel(name, 1.0);
  double total = 0;
  for (const auto& l : full.layers) total += static_cast<double>(l.macsPerSample);
  for (const auto& l : full.layers) {
    double share = total > 0 ? static_cast<double>(l.macsPerSample) / total : 1.0 / full.layers.size();
    m.forwardSeconds.push_back(m.iterationSeconds * share / 3.0);
    m.backwardSeconds.push_back(m.iterationSeconds * share * 2.0 / 3.0);
  }
  return m;
}

std::string emulatedModelJson(const EmulatedModel& m) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < m.desc.layers.size(); ++i) {
    const auto& l = m.desc.layers[i];
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : l.params) params.push_back(p.shape);
    layers.push_back({{"name", l.name}, {"type", layerTypeName(l.type)}, {"params", params},
                      {"forward_s", m.forwardSeconds[i]}, {"backward_s", m.backwardSeconds[i]}});
  }
  return nlohmann::json{{"name", m.name}, {"scale", m.scale}, {"batch", m.batch}, {"layers", layers}}.dump();
}

}  // namespace poseidon::bench
