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

// Per-layer times measured on an H200 (bench/data/gen_measured_compute.py).
struct MeasuredLayer {
  double forwardMs, backwardMs;
  int64_t params;
};
struct MeasuredModel {
  const char* model;
  const char* precision;
  int64_t batch;
  double forwardMs, backwardMs, noHooksMs, optimizerMs;
  std::vector<MeasuredLayer> layers;  // empty: totals only (googlenet)
};
#include "poseidon/bench/measured_compute.inc"

const MeasuredModel& measured(const std::string& model, const std::string& precision) {
  for (const auto& m : kMeasuredModels)
    if (model == m.model && precision == m.precision) return m;
  throw InvalidArgument("no measured H200 times for model '" + model + "' in " + precision);
}

// Titan X: the published iteration time split 1/3 : 2/3 and by MACs.
void titanXTimes(const Timing& t, const ModelDesc& full, EmulatedModel& m) {
  m.iterationSeconds = t.seconds;
  m.timeSource = t.source;
  double total = 0;
  for (const auto& l : full.layers) total += static_cast<double>(l.macsPerSample);
  for (const auto& l : full.layers) {
    double share = total > 0 ? static_cast<double>(l.macsPerSample) / total : 1.0 / full.layers.size();
    m.forwardSeconds.push_back(m.iterationSeconds * share / 3.0);
    m.backwardSeconds.push_back(m.iterationSeconds * share * 2.0 / 3.0);
  }
}

// H200: layer for layer where the measured layers are the zoo's (their parameter counts must
// agree), else the measured totals split by MACs.
void h200Times(const std::string& precision, const ModelDesc& full, EmulatedModel& m) {
  const MeasuredModel& t = measured(m.name, precision);
  if (t.batch != m.fullBatch) {
    throw Error(strCat("measured H200 times for ", m.name, " are at batch ", t.batch, ", the zoo's is ", m.fullBatch));
  }
  // The shares were taken with timing hooks in: scaled so that they add up to the step measured
  // without them.
  double shares = t.forwardMs + t.backwardMs;
  if (!t.layers.empty()) {
    shares = 0;
    for (const auto& l : t.layers) shares += l.forwardMs + l.backwardMs;
  }
  const double toSeconds = 1e-3 * t.noHooksMs / shares;
  m.iterationSeconds = 1e-3 * t.noHooksMs;
  if (t.layers.empty()) {
    double total = 0;
    for (const auto& l : full.layers) total += static_cast<double>(l.macsPerSample);
    for (const auto& l : full.layers) {
      double share = total > 0 ? static_cast<double>(l.macsPerSample) / total : 1.0 / full.layers.size();
      m.forwardSeconds.push_back(t.forwardMs * toSeconds * share);
      m.backwardSeconds.push_back(t.backwardMs * toSeconds * share);
    }
    m.timeSource = strCat("measured: H200 ", precision, " (torch 2.11), forward and backward totals split by MACs");
    return;
  }
  if (t.layers.size() != full.layers.size()) {
    throw Error(strCat("measured H200 times for ", m.name, " have ", t.layers.size(), " layers, the zoo's model ",
                       full.layers.size()));
  }
  for (size_t i = 0; i < full.layers.size(); ++i) {
    if (t.layers[i].params != full.layers[i].numel()) {
      throw Error(strCat("measured H200 layer ", i, " of ", m.name, " has ", t.layers[i].params,
                         " parameters, the zoo's '", full.layers[i].name, "' ", full.layers[i].numel()));
    }
    m.forwardSeconds.push_back(t.layers[i].forwardMs * toSeconds);
    m.backwardSeconds.push_back(t.layers[i].backwardMs * toSeconds);
  }
  m.timeSource = strCat("measured: H200 ", precision, " (torch 2.11), layer by layer");
}

}  // namespace

double h200SfbGemmFlops() { return kH200SfbGemmFlops; }

const std::vector<std::string>& computeNames() {
  static const std::vector<std::string> names{"titanx", "h200", "h200-bf16"};
  return names;
}

bool isComputeName(const std::string& name) {
  const auto& n = computeNames();
  return std::find(n.begin(), n.end(), name) != n.end();
}

void dilate(EmulatedModel& m, double f) {
  m.iterationSeconds *= f;
  for (double& s : m.forwardSeconds) s *= f;
  for (double& s : m.backwardSeconds) s *= f;
}

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

namespace {

const Timing& timingOf(const std::string& name) {
  for (const auto& t : kTimings)
    if (name == t.name) return t;
  std::string known;
  for (const auto& n : emulatedModelNames()) known += (known.empty() ? "" : ", ") + n;
  throw InvalidArgument("no emulated timing for model '" + name + "' (bench models: " + known + ")");
}

void checkScale(const std::string& name, double scale) {
  if (!(scale > 0 && scale <= 1))
    throw InvalidArgument(strCat("width scale for model '", name, "' must be in (0, 1], got ", scale));
}

}  // namespace

double wholeBatchScale(const std::string& name, double scale) {
  checkScale(name, scale);
  const double k = static_cast<double>(timingOf(name).batch);
  return std::max(1.0, std::round(k * scale)) / k;
}

double emulatedMbit(double width, double mbit, double scale) {
  const double r = width / scale;
  return mbit * r * r;
}

EmulatedModel emulatedModel(const std::string& name, double requestedScale, const std::string& compute,
                            bool wholeBatch) {
  if (!isComputeName(compute)) throw InvalidArgument("unknown compute '" + compute + "' (titanx, h200, h200-bf16)");
  const Timing* timing = &timingOf(name);
  checkScale(name, requestedScale);
  const double scale = wholeBatch ? wholeBatchScale(name, requestedScale) : requestedScale;
  EmulatedModel m;
  m.name = name;
  m.scale = scale;
  m.desc = zooModel(name, scale);
  m.batch = std::max<int64_t>(1, std::llround(static_cast<double>(timing->batch) * scale));
  m.fullBatch = timing->batch;
  // The full-width model's layers: compute time does not scale.
  const ModelDesc full = zooModel(name, 1.0);
  if (compute == "titanx")
    titanXTimes(*timing, full, m);
  else
    h200Times(compute == "h200" ? "fp32" : "bf16", full, m);
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
