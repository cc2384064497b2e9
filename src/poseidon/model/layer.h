// The model half of the coordinator's information book: per layer its name,
// type (FC / CONV / OTHER), parameter shapes and, for FC layers, the M x N
// matrix shape that the cost model (paper Table 1) and BestScheme use.
//
// Layers are listed bottom-up (forward order); backward order is the reverse.
// A layer's parameters are synchronized together as one flat buffer: the
// concatenation of its parameters in order (weight, then bias).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace poseidon {

enum class LayerType : uint8_t { kFC = 0, kConv = 1, kOther = 2 };

const char* layerTypeName(LayerType type);  // "fc", "conv", "other"
LayerType parseLayerType(const std::string& text);  // throws InvalidArgument

struct ParamSpec {
  std::string name;            // "weight", "bias", ...
  std::vector<int64_t> shape;  // e.g. {M, N} for an FC weight
  int64_t numel() const;
  bool operator==(const ParamSpec& o) const { return name == o.name && shape == o.shape; }
};

struct LayerSpec {
  std::string name;
  LayerType type = LayerType::kOther;
  std::vector<ParamSpec> params;
  // FC only: weight is m x n (out x in), y = x W^T + b. Zero otherwise.
  int64_t m = 0;
  int64_t n = 0;
  // Forward multiply-accumulates per sample; used only by the trace-driven
  // emulation to split a model's published iteration time over its layers.
  // Not part of the model identity (hash).
  int64_t macsPerSample = 0;

  int64_t numel() const;
  bool hasBias() const;
  std::string shapeString() const;  // "4096x25088" for FC, "64x3x3x3" for conv weight

  // Builders for the common layer kinds.
  static LayerSpec fc(std::string name, int64_t out, int64_t in, bool bias = true);
  static LayerSpec conv(std::string name, int64_t outC, int64_t inC, int64_t kh, int64_t kw,
                        bool bias = true);
  static LayerSpec other(std::string name, std::vector<ParamSpec> params);

  // Identity: name, type, parameter names and shapes (not macsPerSample).
  bool sameStructure(const LayerSpec& o) const;
};

struct ModelDesc {
  std::string name;
  std::vector<LayerSpec> layers;

  int64_t numel() const;
  // FNV-1a over the canonical encoding of every layer's identity. Every node
  // hashes its own description at rendezvous; the coordinator compares them.
  uint64_t hash() const;
  // Human-readable description of the first difference between two models,
  // or nullopt when they are the same ("layer 3 'fc6': fc 4096x25088 vs fc 4096x25000").
  static std::optional<std::string> firstDifference(const ModelDesc& a, const ModelDesc& b);
  // Layer index by name, or -1.
  int find(const std::string& layerName) const;
  // The layers below the model's FC stack - the index of its first FC layer - when its FC layers
  // hold at least half of its parameters (vgg19: 16, alexnet: 5); else 0 (resnet-152, inception-v3:
  // their bytes are in the conv layers). What the urgent connection carries where the
  // host's queue serves it first (Van::urgentLayerCount): the next forward's layers, ahead of bulk.
  int layersBelowFcBulk() const;
  std::string layerSummary(size_t index) const;  // "fc 4096x25088 (102764544 params)"
};

}  // namespace poseidon
