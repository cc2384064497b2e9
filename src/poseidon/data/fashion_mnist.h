// Fashion-MNIST loading and distributed sharding, without LibTorch.
//
// The core library must build and test without LibTorch, so the dataset is
// read here straight from the IDX files (zlib for the .gz ones) into plain
// byte vectors; the torch layer turns them into tensors. The Debian package
// dataset-fashion-mnist installs the files under kDefaultFashionMnistDir.
//
// IDX format: a big-endian magic 0x00000800 | ndims (0x803 for the 3-d image
// file, 0x801 for the 1-d label file), ndims big-endian uint32 dimensions,
// then the uint8 payload in row-major order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace poseidon {
namespace data {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

constexpr uint32_t kIdxImagesMagic = 0x00000803;
constexpr uint32_t kIdxLabelsMagic = 0x00000801;
constexpr int kFashionMnistClasses = 10;

// Per-pixel mean and standard deviation of the Fashion-MNIST training set
// (pixels scaled to [0,1]); the usual constants, so results line up with
// PyTorch reference runs that use transforms.Normalize((0.2860,), (0.3530,)).
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;

struct Dataset {
  int64_t count = 0;             // number of examples
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;   // count*rows*cols, example-major, row-major
  std::vector<uint8_t> labels;   // count, each in [0, kFashionMnistClasses)
};

// Loads the training split (train-*) when `train` is true, else the test split
// (t10k-*), from `dir`. Each file is looked up as <name>.gz first and then as
// the uncompressed <name>. Throws InvalidArgument naming the path when the
// directory or a file is missing, the magic is wrong, the data is truncated or
// corrupt, a label is out of range, or the image and label counts differ.
Dataset loadFashionMnist(const std::string& dir, bool train);

// Writes rows*cols floats for example `index`: (pixel/255 - mean)/std.
// Throws InvalidArgument when `index` is out of range.
void normalizeInto(const Dataset& d, int64_t index, float* out);

// Indices of [0,count) that `rank` of `worldSize` visits in `epoch`, with the
// semantics of PyTorch's DistributedSampler (drop_last=false):
//   1. order = identity, or, when `shuffle`, a Fisher-Yates permutation driven
//      by std::mt19937_64 seeded with seed + epoch (see the .cc for the exact
//      draw, which is fixed so every rank and every platform agrees);
//   2. order is padded by wrapping around to a multiple of worldSize, so each
//      rank gets ceil(count/worldSize) indices and they step in lockstep;
//   3. rank r takes order[r], order[r + worldSize], order[r + 2*worldSize], ...
// Throws InvalidArgument for count < 0, worldSize < 1, or rank outside
// [0, worldSize).
std::vector<int64_t> shardIndices(int64_t count, int worldSize, int rank, uint64_t seed,
                                  int64_t epoch, bool shuffle = true);

}  // namespace data
}  // namespace poseidon
