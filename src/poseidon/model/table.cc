#include "poseidon/model/table.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"

namespace poseidon {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Reads one layer table. Every message names the file and, inside a layer,
// the layer's index (and name once known) and the offending field, so the
// user can go straight to the entry to fix.
class TableReader {
 public:
  explicit TableReader(std::string path) : path_(std::move(path)) {}

  ModelDesc read(const Json& root) {
    if (!root.is_object()) fail("", "the top level must be a JSON object with 'name' and 'layers'");
    ModelDesc model;
    model.name = modelName(root);
    auto it = root.find("layers");
    if (it == root.end()) fail("", "missing field 'layers'");
    if (!it->is_array()) fail("", strCat("field 'layers' must be an array (got ", it->type_name(), ")"));
    if (it->empty()) fail("", "field 'layers' is empty; a model needs at least one layer");
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < it->size(); ++i) {
      LayerSpec layer = readLayer((*it)[i], i);
      auto [prev, inserted] = seen.emplace(layer.name, i);
      if (!inserted)
        fail(where_, strCat("duplicate layer name (also layer ", prev->second,
                            "); layer names must be unique"));
      model.layers.push_back(std::move(layer));
    }
    return model;
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw InvalidArgument(strCat("model table '", path_, "': ", where, what));
  }

  std::string modelName(const Json& root) const {
    auto it = root.find("name");
    if (it == root.end()) {
      // The name is only a label; default to the file's stem.
      std::string stem = path_.substr(path_.find_last_of('/') + 1);
      return stem.substr(0, stem.rfind(".json"));
    }
    if (!it->is_string()) fail("", strCat("field 'name' must be a string (got ", it->type_name(), ")"));
    return it->get<std::string>();
  }

  // Unknown keys are rejected rather than ignored: a misspelled "bias" or
  // "macs" would otherwise silently change the model.
  void checkKeys(const Json& obj, std::initializer_list<const char*> allowed, const std::string& where) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool known = false;
      std::string list;
      for (const char* a : allowed) {
        known = known || it.key() == a;
        list += (list.empty() ? "" : ", ") + std::string(a);
      }
      if (!known) fail(where, strCat("unknown field '", it.key(), "' (allowed here: ", list, ")"));
    }
  }

  const Json& require(const Json& obj, const char* field, const std::string& where) const {
    auto it = obj.find(field);
    if (it == obj.end()) fail(where, strCat("missing field '", field, "'"));
    return *it;
  }

  int64_t positiveInt(const Json& v, const std::string& field, const std::string& where) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > kMaxInt64) ||
        v.get<int64_t>() <= 0)
      fail(where, strCat("field '", field, "' must be a positive integer (got ", v.dump(), ")"));
    return v.get<int64_t>();
  }

  std::vector<int64_t> shape(const Json& v, const std::string& field, const std::string& where) const {
    if (!v.is_array() || v.empty())
      fail(where, strCat("field '", field, "' must be a non-empty array of positive integers (got ",
                         v.dump(), ")"));
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (size_t d = 0; d < v.size(); ++d) {
      dims.push_back(positiveInt(v[d], strCat(field, "[", d, "]"), where));
      if (__builtin_mul_overflow(numel, dims.back(), &numel))
        fail(where, strCat("field '", field, "' ", v.dump(), " has more elements than fit in 64 bits"));
    }
    return dims;
  }

  bool boolField(const Json& layer, const char* field, bool dflt, const std::string& where) const {
    auto it = layer.find(field);
    if (it == layer.end()) return dflt;
    if (!it->is_boolean()) fail(where, strCat("field '", field, "' must be true or false (got ", it->dump(), ")"));
    return it->get<bool>();
  }

  std::vector<ParamSpec> params(const Json& v, const std::string& where) const {
    if (!v.is_array() || v.empty())
      fail(where, strCat("field 'params' must be a non-empty array of {\"name\", \"shape\"} (got ",
                         v.dump(), ")"));
    std::vector<ParamSpec> out;
    std::set<std::string> names;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string field = strCat("params[", i, "]");
      if (!v[i].is_object()) fail(where, strCat("field '", field, "' must be an object {\"name\", \"shape\"}"));
      checkKeys(v[i], {"name", "shape"}, strCat(where, field, ": "));
      const Json& name = require(v[i], "name", strCat(where, field, ": "));
      if (!name.is_string() || name.get<std::string>().empty())
        fail(where, strCat("field '", field, ".name' must be a non-empty string (got ", name.dump(), ")"));
      ParamSpec p{name.get<std::string>(), shape(require(v[i], "shape", strCat(where, field, ": ")),
                                                 field + ".shape", where)};
      if (!names.insert(p.name).second)
        fail(where, strCat("field '", field, ".name': duplicate parameter name '", p.name, "'"));
      out.push_back(std::move(p));
    }
    return out;
  }

  LayerSpec readLayer(const Json& v, size_t index) {
    where_ = strCat("layer ", index, ": ");
    if (!v.is_object()) fail(where_, strCat("must be an object (got ", v.dump(), ")"));
    const Json& name = require(v, "name", where_);
    if (!name.is_string() || name.get<std::string>().empty())
      fail(where_, strCat("field 'name' must be a non-empty string (got ", name.dump(), ")"));
    where_ = strCat("layer ", index, " '", name.get<std::string>(), "': ");
    const Json& typeField = require(v, "type", where_);
    if (!typeField.is_string()) fail(where_, strCat("field 'type' must be a string (got ", typeField.dump(), ")"));
    LayerType type;
    try {
      type = parseLayerType(typeField.get<std::string>());
    } catch (const InvalidArgument& e) {
      fail(where_, strCat("field 'type': ", e.what()));
    }

    LayerSpec layer;
    switch (type) {
      case LayerType::kFC: layer = readFc(v, name.get<std::string>()); break;
      case LayerType::kConv: layer = readConv(v, name.get<std::string>()); break;
      case LayerType::kOther:
        checkKeys(v, {"name", "type", "params", "macs"}, where_);
        layer = LayerSpec::other(name.get<std::string>(), params(require(v, "params", where_), where_));
        break;
    }
    if (auto it = v.find("macs"); it != v.end()) {
      if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > kMaxInt64) ||
          it->get<int64_t>() < 0)
        fail(where_, strCat("field 'macs' must be a non-negative integer (got ", it->dump(), ")"));
      layer.macsPerSample = it->get<int64_t>();
    }
    return layer;
  }

  LayerSpec readFc(const Json& v, const std::string& name) const {
    checkKeys(v, {"name", "type", "m", "n", "bias", "params", "macs"}, where_);
    const int64_t m = positiveInt(require(v, "m", where_), "m", where_);
    const int64_t n = positiveInt(require(v, "n", where_), "n", where_);
    int64_t numel;
    if (__builtin_mul_overflow(m, n, &numel))
      fail(where_, strCat("fields 'm' x 'n' (", m, " x ", n, ") have more elements than fit in 64 bits"));
    if (v.find("params") == v.end()) return LayerSpec::fc(name, m, n, boolField(v, "bias", true, where_));
    // Explicit parameter list (written for layers that are not plain
    // weight+bias). The cost model still treats the layer as an m x n matrix,
    // so its weight must say so.
    if (v.find("bias") != v.end()) fail(where_, "give either 'params' or 'bias', not both");
    LayerSpec l = LayerSpec::fc(name, m, n, false);
    l.params = params(v["params"], where_);
    auto weight = std::find_if(l.params.begin(), l.params.end(), [](const ParamSpec& p) { return p.name == "weight"; });
    if (weight == l.params.end() || weight->shape != std::vector<int64_t>{m, n})
      fail(where_, strCat("field 'params' must include a 'weight' of shape [", m, ", ", n, "] to match 'm' and 'n'"));
    return l;
  }

  LayerSpec readConv(const Json& v, const std::string& name) const {
    checkKeys(v, {"name", "type", "shape", "bias", "params", "macs"}, where_);
    LayerSpec l;
    l.name = name;
    l.type = LayerType::kConv;
    const bool hasShape = v.find("shape") != v.end();
    const bool hasParams = v.find("params") != v.end();
    if (hasShape == hasParams) fail(where_, "a conv layer needs exactly one of 'shape' (weight shape) or 'params'");
    if (hasParams) {
      if (v.find("bias") != v.end()) fail(where_, "give either 'params' or 'bias', not both");
      l.params = params(v["params"], where_);
      return l;
    }
    std::vector<int64_t> weight = shape(v["shape"], "shape", where_);
    l.params.push_back({"weight", weight});
    if (boolField(v, "bias", true, where_)) l.params.push_back({"bias", {weight.front()}});
    return l;
  }

  std::string path_;
  std::string where_;  // "layer 3 'fc6': " while reading a layer
};

// The writer uses the short forms ("m"/"n"/"bias", "shape"/"bias") whenever
// they describe the layer exactly, and the explicit "params" list otherwise,
// so that loadModelTable(modelTableJson(m)) always gives back m.
bool isPlainBias(const LayerSpec& l, int64_t out) {
  return l.params.size() == 1 || (l.params.size() == 2 && l.params[1] == ParamSpec{"bias", {out}});
}

nlohmann::ordered_json paramsJson(const std::vector<ParamSpec>& params) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& p : params) out.push_back({{"name", p.name}, {"shape", p.shape}});
  return out;
}

nlohmann::ordered_json layerJson(const LayerSpec& l) {
  nlohmann::ordered_json j;
  j["name"] = l.name;
  j["type"] = layerTypeName(l.type);
  switch (l.type) {
    case LayerType::kFC:
      j["m"] = l.m;
      j["n"] = l.n;
      if (!l.params.empty() && l.params[0] == ParamSpec{"weight", {l.m, l.n}} && isPlainBias(l, l.m))
        j["bias"] = l.params.size() == 2;
      else
        j["params"] = paramsJson(l.params);
      break;
    case LayerType::kConv:
      if (!l.params.empty() && l.params[0].name == "weight" && !l.params[0].shape.empty() &&
          isPlainBias(l, l.params[0].shape[0])) {
        j["shape"] = l.params[0].shape;
        j["bias"] = l.params.size() == 2;
      } else {
        j["params"] = paramsJson(l.params);
      }
      break;
    case LayerType::kOther: j["params"] = paramsJson(l.params); break;
  }
  j["macs"] = l.macsPerSample;  // always written: the fc default (m*n) may not be what the model says
  return j;
}

}  // namespace

ModelDesc loadModelTable(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw InvalidArgument(strCat("model table '", path, "' is a directory"));
  std::ifstream in(path);
  if (!in) throw InvalidArgument(strCat("cannot open model table '", path, "'"));
  Json root;
  try {
    root = Json::parse(in);
  } catch (const Json::exception& e) {
    throw InvalidArgument(strCat("model table '", path, "' is not valid JSON: ", jsonErrorText(e)));
  }
  return TableReader(path).read(root);
}

std::string modelTableJson(const ModelDesc& model) {
  // One layer per line: compact, yet diffs and greps stay readable.
  std::string out = "{\n  \"name\": " + Json(model.name).dump() + ",\n  \"layers\": [\n";
  for (size_t i = 0; i < model.layers.size(); ++i)
    out += "    " + layerJson(model.layers[i]).dump() + (i + 1 < model.layers.size() ? ",\n" : "\n");
  out += "  ]\n}\n";
  return out;
}

}  // namespace poseidon
