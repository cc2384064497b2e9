// ModelShard: a KV shard that holds the model (group mode, docs/omnivore.md).
//
// In Omnivore's compute-group mode the shards own the parameters W of their
// KV pairs and the SGD state, apply each group's summed gradient as it
// arrives, and serve the fresh parameters with a version clock. The update is
// PyTorch's SGD with momentum and weight decay,
//
//   buf <- mu buf + (grad + lambda W),   W <- W - eta buf
//
// which is the paper's V <- mu V - eta (grad + lambda W), W <- W + V (eq. 4)
// with V = -eta buf while eta is constant, computed as LibTorch computes it,
// so that one group gives the BSP path's parameters bit for bit.
//
// grad is the mean of the group's k = P1 / g member gradients, summed in
// member order (bit-identical from run to run, as KvShard's sums); eta comes
// with each update (the worker's learning-rate schedule), mu and lambda are
// the job's settings.
//
// A round of group G is its clock c_G (updates G has applied so far). Per
// pair and group:
//   pull(t)  from each of the k members. Answered once all k asked, G's
//            previous update is applied (c_G = t), the pair is initialized,
//            and SSP allows it: t - min over groups of c <= staleness. All
//            members get the same W and version, so the group computes one
//            gradient on one model.
//   push(t)  each member's gradient; when all k are in, the update is applied,
//            c_G becomes t + 1, and the staleness of the update, the number of
//            other updates applied between G's pull and this one, is counted.
// With g = 1 this is BSP: the pull of round t waits for update t - 1, and
// staleness is 0.
//
// I/O-free like KvShard: every call returns the pull replies that became
// answerable, which the node sends. Protocol violations are ProtocolError and
// change nothing.
//
// Threads: owned by the node's receive loop; not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "poseidon/coordinator/book.h"

namespace poseidon {

class ModelShard {
 public:
  ModelShard(const InformationBook& book, int shard);

  // A pull answered: the pair's parameters for one member's round.
  struct Reply {
    int toRank = 0;
    int layer = 0;
    int pair = 0;
    int64_t iteration = 0;  // the group's round
    int64_t version = 0;    // updates applied to the pair when the parameters were taken
    std::shared_ptr<const std::vector<float>> params;  // shared by the group's members
  };

  // The pair's starting state (from rank 0: its initial parameters, or a checkpoint's W, V,
  // version and group clocks). Pulls wait until it came.
  std::vector<Reply> init(int senderRank, int layer, int pair, const float* w, const float* v, int64_t version,
                          const std::vector<int64_t>& clocks);
  std::vector<Reply> pull(int senderRank, int layer, int pair, int64_t iteration);
  std::vector<Reply> push(int senderRank, int layer, int pair, int64_t iteration, const float* grad, size_t floats,
                          float lr);

  // How many updates had landed between each update's pull and its own
  // application: count by staleness.
  const std::map<int64_t, int64_t>& stalenessHistogram() const { return staleness_; }
  // The largest lead of a group over the slowest one when a pull was answered (SSP's bound holds
  // when it is at most the staleness setting).
  int64_t maxLead() const { return maxLead_; }
  // Pulls that came before their group's previous update of the pair was applied (a member asks the
  // next round with its first push, GroupSync::layerReady): answered as soon as it is.
  int64_t earlyPulls() const { return earlyPulls_; }

  // A pair's whole state, for checkpoints (v: the momentum buffer buf).
  struct PairState {
    int layer = 0, pair = 0;
    std::vector<float> w, v;
    int64_t version = 0;
    std::vector<int64_t> clocks;  // by group
  };
  std::vector<PairState> snapshot() const;

  // Experiments (poseidon experiment implicit-momentum): keep the pair's parameters after its
  // initialization and after every update, in order (W(0), W(1), ...). ProtocolError if the
  // shard does not hold the pair.
  void recordPair(int layer, int pair);
  const std::vector<std::vector<float>>& recorded() const { return recorded_; }
  int64_t pairsOwned() const { return static_cast<int64_t>(pairs_.size()); }

 private:
  struct GroupRound {
    std::vector<bool> pulled;  // by member
    int pulls = 0;
    int64_t servedVersion = -1;  // set when the pull was answered
    std::vector<bool> pushed;
    int pushes = 0;
    int next = 0;  // the next member to add, in member order
    std::vector<float> sum;
    bool started = false;
    std::map<int, std::vector<float>> early;  // members that arrived before their predecessors
  };
  struct PairState_ {
    const KvPair* pair = nullptr;
    bool initialized = false;
    std::vector<float> w, v;
    int64_t version = 0;
    std::vector<int64_t> clock;                       // by group: updates applied
    std::map<std::pair<int, int64_t>, GroupRound> rounds;  // (group, round)
  };
  static uint64_t key(int layer, int pair) { return (static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(pair); }
  PairState_& stateOf(int layer, int pair, const char* what);
  int memberOf(int senderRank, int* group) const;
  // Answers every pull of this pair that the rules now allow.
  void answer(PairState_& st, std::vector<Reply>* out);
  void apply(PairState_& st, int group, GroupRound& r, float lr);

  const InformationBook& book_;
  const int shard_, groups_, k_;
  const int64_t stalenessBound_;
  const float mu_, lambda_;
  std::map<uint64_t, PairState_> pairs_;
  std::map<int64_t, int64_t> staleness_;
  int64_t maxLead_ = 0;
  int64_t earlyPulls_ = 0;
  const PairState_* recordedPair_ = nullptr;
  std::vector<std::vector<float>> recorded_;
};

}  // namespace poseidon
