// Layer tables as JSON files: what `poseidon plan --model FILE.json` reads
// and what the bench hands to its DDP workers (bench/emulation.h).
#pragma once

#include <string>

#include "poseidon/model/layer.h"

namespace poseidon {

// JSON layer table: {"name": "...", "layers": [
//   {"name": "fc6", "type": "fc", "m": 4096, "n": 25088, "bias": true},
//   {"name": "conv1", "type": "conv", "shape": [64, 3, 3, 3], "bias": true},
//   {"name": "bn1", "type": "other", "params": [{"name": "weight", "shape": [64]}]}]}
// Optional per layer: "macs" (forward multiply-accumulates per sample).
// Throws InvalidArgument naming the file and the offending field.
ModelDesc loadModelTable(const std::string& path);
std::string modelTableJson(const ModelDesc& model);

}  // namespace poseidon
