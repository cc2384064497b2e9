// The model zoo: layer tables of the networks the paper evaluates, built from
// their published architectures. Layer tables from JSON files: model/table.h.
//
// A zoo model can be built at a width scale s (bench's emulated cluster:
// channel and FC widths x s, image channels kept): parameter counts then
// shrink by about s^2 while the layer structure stays the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "poseidon/model/layer.h"

namespace poseidon {

struct ZooEntry {
  std::string name;            // "vgg19"
  std::string description;     // which variant, and the source
  int64_t publishedParams = 0; // the count the literature gives
  int64_t defaultBatch = 0;    // per-worker batch K used in the paper
};

const std::vector<ZooEntry>& zooEntries();
// Throws InvalidArgument naming the known models when `name` is unknown.
const ZooEntry& zooEntry(const std::string& name);
ModelDesc zooModel(const std::string& name, double widthScale = 1.0);

// A zoo name or a path to a JSON layer table (anything containing '/' or
// ending in .json is a path).
ModelDesc resolveModel(const std::string& nameOrPath, double widthScale = 1.0);

}  // namespace poseidon
