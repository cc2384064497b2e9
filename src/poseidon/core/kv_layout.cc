#include "poseidon/core/kv_layout.h"

#include <algorithm>
#include <cmath>

#include "poseidon/common/error.h"

namespace poseidon {

int64_t scaledPairBytes(int64_t fullWidthBytes, double scale) {
  return std::max<int64_t>(4096, std::llround(static_cast<double>(fullWidthBytes) * scale * scale));
}

int64_t balancedPairBytes(const ModelDesc& model, int shards, int64_t pairBytes) {
  if (shards <= 1) return pairBytes;
  int64_t psBytes = 0, allBytes = 0;
  for (const auto& l : model.layers) {
    const int64_t b = l.numel() * static_cast<int64_t>(sizeof(float));
    allBytes += b;
    if (l.type != LayerType::kFC) psBytes += b;
  }
  if (psBytes == 0) psBytes = allBytes;
  if (psBytes < pairBytes) return pairBytes;  // less than one pair in all: nothing to spread
  const int64_t fit = psBytes / (int64_t{kMinPairsPerShard} * shards);
  if (fit >= pairBytes) return pairBytes;
  const int64_t floor = std::max(pairBytes / kMaxPairShrink, kMinBalancedPairBytes);
  if (floor >= pairBytes) return pairBytes;
  // At least kMinBalancedPairBytes, whole floats.
  return std::max(fit, floor) / static_cast<int64_t>(sizeof(float)) * static_cast<int64_t>(sizeof(float));
}

KvLayout::KvLayout(const ModelDesc& model, int shards, int64_t pairBytes) : shards_(shards) {
  if (shards < 1) throw InvalidArgument(strCat("the KV store needs at least one shard, got ", shards));
  if (pairBytes < static_cast<int64_t>(sizeof(float))) {
    throw InvalidArgument(strCat("KV pair size must be at least 4 bytes, got ", pairBytes));
  }
  pairFloats_ = pairBytes / static_cast<int64_t>(sizeof(float));
  // Bound the work before doing it: a model description from the wire must
  // not be able to make us build billions of pairs.
  int64_t pairs = 0;
  for (const auto& l : model.layers) {
    pairs += (l.numel() + pairFloats_ - 1) / pairFloats_;
    if (pairs > kMaxPairs) {
      throw InvalidArgument(strCat("the model needs more than ", kMaxPairs, " KV pairs of ", pairBytes,
                                   " bytes; use a larger pair size"));
    }
  }
  shardBytes_.assign(shards, 0);
  byLayer_.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    int64_t total = model.layers[l].numel();
    int index = 0;
    for (int64_t off = 0; off < total; off += pairFloats_, ++index) {
      KvPair p;
      p.layer = static_cast<int>(l);
      p.index = index;
      p.offset = off;
      p.length = std::min(pairFloats_, total - off);
      p.shard = static_cast<int>(std::min_element(shardBytes_.begin(), shardBytes_.end()) - shardBytes_.begin());
      shardBytes_[p.shard] += p.length * static_cast<int64_t>(sizeof(float));
      byLayer_[l].push_back(p);
    }
  }
}

int64_t KvLayout::totalPairs() const {
  int64_t n = 0;
  for (const auto& v : byLayer_) n += static_cast<int64_t>(v.size());
  return n;
}

}  // namespace poseidon
