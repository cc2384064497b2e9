// How the KV store splits parameters into fixed-size pairs and places them.
//
// Each layer's flat buffer (its params concatenated) is cut into pairs of at
// most `pairBytes` (default 2 MB, paper section 4); the last pair of a layer
// may be shorter. Pairs are placed one by one, in layer order, on the shard
// that holds the fewest bytes so far (lowest index on ties), so no shard holds
// a whole large tensor and loads differ by at most one pair. So that one pair
// is a small part of a shard's load, a job's pairs shrink on many shards: the
// information book lays them out with balancedPairBytes (as does the planner).
// The layout is a pure function of the model, the shard count and the pair
// size, so every node computes the same one from the information book.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "poseidon/model/layer.h"

namespace poseidon {

constexpr int64_t kDefaultPairBytes = 2 * 1024 * 1024;
constexpr int64_t kMaxPairs = int64_t{1} << 22;
// How many threads beside the receive loop sum a shard's pushes by default (NodeOptions::sumThreads,
// the planner's Cluster::sumLanes), each pair on one of them.
constexpr int kDefaultSumThreads = 2;
// The sum thread of pair `pair` of layer `layer` among `lanes` (> 0): consecutive pairs of a layer on
// consecutive threads. The runtime (Node::route) and the planner share it.
inline size_t sumLaneOf(int layer, int pair, size_t lanes) {
  return (static_cast<size_t>(layer) + static_cast<size_t>(pair)) % lanes;
}

// The pair size a model built at width scale s uses for `fullWidthBytes` at full width: x s^2, so each
// layer keeps its number of pairs (the bench's scaling rule), and at least 4096 bytes.
int64_t scaledPairBytes(int64_t fullWidthBytes, double scale);

// The pair size a layout over `shards` uses for `pairBytes` (KvLayout::pairFloats x 4): smaller where the
// layers that always go through the parameter server (all but the FC layers, which may go by SFB; every
// layer of a model of FC layers only) would give a shard fewer than kMinPairsPerShard pairs, but not
// below pairBytes / kMaxPairShrink or kMinBalancedPairBytes; a multiple of 4 bytes. Unchanged where
// those layers hold less than one pair in all. Why: a shard's load differs from another's by
// up to one pair, and each shard sends its pairs' aggregates to every worker. With vgg19's 2 MB pairs on
// 32 shards, a shard held 1 or 2 conv pairs, and the busiest nodes sent 3.47 MB an iteration where most
// sent 2.9 (the emulated cluster at s = 0.1, docs/bench.md). One shard: pairBytes.
int64_t balancedPairBytes(const ModelDesc& model, int shards, int64_t pairBytes);
constexpr int kMinPairsPerShard = 4;
constexpr int kMaxPairShrink = 8;
constexpr int64_t kMinBalancedPairBytes = 4096;  // nor below this (scaledPairBytes' floor too)

struct KvPair {
  int layer = 0;
  int index = 0;        // pair index within the layer
  int64_t offset = 0;   // first float within the layer's flat buffer
  int64_t length = 0;   // floats
  int shard = 0;        // server shard (0..P2-1)
};

class KvLayout {
 public:
  KvLayout() = default;
  KvLayout(const ModelDesc& model, int shards, int64_t pairBytes = kDefaultPairBytes);
  // A job's layout: pairs of balancedPairBytes(model, shards, pairBytes), as the information book and
  // the planner lay them out.
  static KvLayout balanced(const ModelDesc& model, int shards, int64_t pairBytes) {
    return KvLayout(model, shards, balancedPairBytes(model, shards, pairBytes));
  }

  int shards() const { return shards_; }
  int64_t pairFloats() const { return pairFloats_; }
  const std::vector<KvPair>& pairsOf(int layer) const { return byLayer_.at(layer); }
  int numLayers() const { return static_cast<int>(byLayer_.size()); }
  int64_t totalPairs() const;
  // Bytes held by each shard.
  const std::vector<int64_t>& shardBytes() const { return shardBytes_; }

 private:
  int shards_ = 0;
  int64_t pairFloats_ = 0;
  std::vector<std::vector<KvPair>> byLayer_;
  std::vector<int64_t> shardBytes_;
};

}  // namespace poseidon
