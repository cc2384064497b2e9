#include "poseidon/model/layer.h"

#include <numeric>
#include <sstream>

#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"

namespace poseidon {

const char* layerTypeName(LayerType type) {
  switch (type) {
    case LayerType::kFC: return "fc";
    case LayerType::kConv: return "conv";
    case LayerType::kOther: return "other";
  }
  return "?";
}

LayerType parseLayerType(const std::string& text) {
  if (text == "fc" || text == "FC" || text == "linear") return LayerType::kFC;
  if (text == "conv" || text == "CONV") return LayerType::kConv;
  if (text == "other" || text == "OTHER") return LayerType::kOther;
  throw InvalidArgument("unknown layer type '" + text + "' (expected fc, conv or other)");
}

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t LayerSpec::numel() const {
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  return total;
}

bool LayerSpec::hasBias() const {
  for (const auto& p : params)
    if (p.name == "bias") return true;
  return false;
}

std::string LayerSpec::shapeString() const {
  std::ostringstream os;
  if (type == LayerType::kFC) {
    os << m << "x" << n;
    return os.str();
  }
  if (params.empty()) return "-";
  const auto& shape = params.front().shape;
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "x" : "") << shape[i];
  if (params.size() > 1) os << "+" << (params.size() - 1);
  return os.str();
}

LayerSpec LayerSpec::fc(std::string name, int64_t out, int64_t in, bool bias) {
  if (out <= 0 || in <= 0) throw InvalidArgument(strCat("fc layer '", name, "' has empty shape ", out, "x", in));
  LayerSpec l;
  l.name = std::move(name);
  l.type = LayerType::kFC;
  l.m = out;
  l.n = in;
  l.params.push_back({"weight", {out, in}});
  if (bias) l.params.push_back({"bias", {out}});
  l.macsPerSample = out * in;
  return l;
}

LayerSpec LayerSpec::conv(std::string name, int64_t outC, int64_t inC, int64_t kh, int64_t kw, bool bias) {
  if (outC <= 0 || inC <= 0 || kh <= 0 || kw <= 0) throw InvalidArgument(strCat("conv layer '", name, "' has an empty shape"));
  LayerSpec l;
  l.name = std::move(name);
  l.type = LayerType::kConv;
  l.params.push_back({"weight", {outC, inC, kh, kw}});
  if (bias) l.params.push_back({"bias", {outC}});
  return l;
}

LayerSpec LayerSpec::other(std::string name, std::vector<ParamSpec> params) {
  LayerSpec l;
  l.name = std::move(name);
  l.type = LayerType::kOther;
  l.params = std::move(params);
  return l;
}

bool LayerSpec::sameStructure(const LayerSpec& o) const {
  return name == o.name && type == o.type && params == o.params && m == o.m && n == o.n;
}

int64_t ModelDesc::numel() const {
  int64_t total = 0;
  for (const auto& l : layers) total += l.numel();
  return total;
}

uint64_t ModelDesc::hash() const {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(layers.size()));
  for (const auto& l : layers) {
    w.str(l.name);
    w.u8(static_cast<uint8_t>(l.type));
    w.i64(l.m);
    w.i64(l.n);
    w.u32(static_cast<uint32_t>(l.params.size()));
    for (const auto& p : l.params) {
      w.str(p.name);
      w.u32(static_cast<uint32_t>(p.shape.size()));
      for (int64_t d : p.shape) w.i64(d);
    }
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (uint8_t b : w.bytes()) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

std::string ModelDesc::layerSummary(size_t index) const {
  const LayerSpec& l = layers.at(index);
  std::ostringstream os;
  os << layerTypeName(l.type) << " ";
  for (size_t i = 0; i < l.params.size(); ++i) {
    os << (i ? " + " : "") << l.params[i].name << "[";
    for (size_t j = 0; j < l.params[i].shape.size(); ++j) os << (j ? "x" : "") << l.params[i].shape[j];
    os << "]";
  }
  return os.str();
}

std::optional<std::string> ModelDesc::firstDifference(const ModelDesc& a, const ModelDesc& b) {
  size_t common = std::min(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < common; ++i) {
    if (!a.layers[i].sameStructure(b.layers[i])) {
      return strCat("layer ", i, " '", a.layers[i].name, "': ", a.layerSummary(i), " vs '",
                    b.layers[i].name, "': ", b.layerSummary(i));
    }
  }
  if (a.layers.size() != b.layers.size()) {
    const ModelDesc& longer = a.layers.size() > b.layers.size() ? a : b;
    return strCat("layer counts differ (", a.layers.size(), " vs ", b.layers.size(), "); first extra layer ",
                  common, " '", longer.layers[common].name, "'");
  }
  return std::nullopt;
}

int ModelDesc::find(const std::string& layerName) const {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].name == layerName) return static_cast<int>(i);
  return -1;
}

int ModelDesc::layersBelowFcBulk() const {
  int first = -1;
  int64_t fc = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].type != LayerType::kFC) continue;
    if (first < 0) first = static_cast<int>(i);
    fc += layers[i].numel();
  }
  return first > 0 && 2 * fc >= numel() ? first : 0;
}

}  // namespace poseidon
