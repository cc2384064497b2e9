// LocalGroup: several ranks (GPUs) of one machine synchronize as one Poseidon node, as the paper's
// nodes do (JobSettings::localRanks = L; docs/gpu.md, "Several GPUs in one node").
//
// Ranks r .. r+L-1 with r % L == 0 share a machine; rank r is their leader, the only one of them that
// is a worker and a server on the network (InformationBook: P1 and P2 count leaders). Each layer's
// round, in WFBP order as each rank's backward reaches it:
//   member  sends its gradient (PS) or its factors U, V (SFB) to the leader in chunks of the job's
//           pair size (local-push, over the loopback), and waits for the layer's mean gradient
//           (local-result), which it writes into its buffer: then its layer is done.
//   leader  holds its own contribution until every member's is in; then
//             PS:  writes (own + member 1 + ... + member L-1) / L, summed in rank order, into its
//                  buffer and submits that to its Syncer: the machine's update leaves it once, and
//                  the shards' mean over the M leaders is the mean over all M x L ranks;
//             SFB: stacks the L factor sets into one of the L rows counts added up (U scaled by 1/L,
//                  V as it is) and submits that: one broadcast per machine, and the rebuild
//                  sum U^T V / M over the leaders' stacks is the mean over all ranks.
//           PS: once its Syncer has the layer's mean, it sends it to every member, then counts the
//           layer as done (the user's step may overwrite the buffer only after the sends copied it).
//           SFB: once its Syncer has every leader's stack, it sends them on to its members
//           (local-factors, far fewer bytes than the mean of a large layer) and rebuilds its own mean;
//           each member rebuilds the same bits from the same stack with the same GEMM.
//
// Threads: submit*() on the user's thread; onPush()/onResult() on the receive loop; the leader's
// combine and every send on the pool (a layer can be hundreds of MB). mutex_ is a leaf: nothing is
// called with it held.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/sfb/sufficient_factors.h"
#include "poseidon/transport/van.h"

namespace poseidon {

class LocalGroup {
 public:
  // What the group needs from its node.
  struct Host {
    std::function<void(int dest, const FrameHeader&, const std::vector<Van::Part>&)> send;
    std::function<void(std::function<void()>)> schedule;  // on the node's pool
    std::function<void(std::exception_ptr)> fail;
    std::function<int64_t()> iteration;  // the node's current iteration
    // Leader: the machine's combined contribution goes to the layer's Syncer.
    std::function<void(int layer, int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keep)> submitDense;
    std::function<void(int layer, int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows,
                       LayerBuffer out, std::shared_ptr<void> keep, FactorRebuild rebuild)>
        submitFactors;
    // The layer's mean is in this rank's buffer (the barrier's layerDone).
    std::function<void(int layer, int64_t iteration)> done;
  };

  LocalGroup(const InformationBook& book, int rank, Host host);

  bool leader() const { return rank_ == leader_; }

  // This rank's contribution to the layer's round of `iteration`; the mean goes into `grad` (dense)
  // or `out` (factors: weight then bias).
  void submitDense(int layer, int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive);
  void submitFactors(int layer, int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows,
                     LayerBuffer out, std::shared_ptr<void> keepAlive);
  // Leader: its Syncer finished the layer; the result goes to the members, then done().
  void layerSynced(int layer, int64_t iteration);

  // Receive loop. Throw ProtocolError for a message that does not fit (wrong sender, layer,
  // iteration, chunk or size), before anything is stored.
  void onPush(const Message& msg);    // leader
  void onResult(const Message& msg);  // member
  void onFactors(const Message& msg);  // member (SFB)

  // After the job failed: nothing touches the caller's buffers any more once this returns (the pool's
  // tasks still running are the node's to wait for; they find the group closed).
  void close();

  // What the layer's round still waits for, for a timeout's message ("" when nothing here).
  std::string pending(int layer, int64_t iteration) const;

 private:
  // A contribution arriving in chunks: a member's push (leader) or the mean (member).
  struct Chunks {
    int64_t rows = -1;  // push: factor rows (0: dense); -1 before the first chunk
    std::vector<float> data;
    std::vector<bool> seen;
    int64_t missing = 0;
  };
  // One layer's round of one iteration on this rank.
  struct Round {
    bool own = false;  // this rank submitted
    // Member: its push is being read by the sends (pool). The leader's mean cannot come before the
    // last chunk left, but the order runs through the network, which neither the mutex nor
    // ThreadSanitizer sees: a mean complete meanwhile is held and written by the pool once its sends
    // are done, as the Syncer holds a pair's result while its push is read.
    bool pushing = false;
    bool factors = false;
    Scheme scheme = Scheme::kPS;
    const float* u = nullptr;
    const float* v = nullptr;
    int64_t rows = 0;
    LayerBuffer result;  // where the mean goes: the gradient (dense) or `out` (factors)
    std::shared_ptr<void> keepAlive;
    std::vector<Chunks> members;  // leader: one per member, in rank order
    int membersIn = 0;
    Chunks mean;      // member: the leader's reply (PS), or the mean it rebuilt (SFB)
    Chunks gathered;  // member, SFB: every worker's factors, stacked, as the leader forwards them
  };
  // Leader: where a layer's mean is while its Syncer works on it, and whether the members get the
  // factors (SFB) rather than the mean.
  struct Syncing {
    LayerBuffer result;
    bool factors = false;
  };
  using Key = std::pair<int64_t, int>;  // (iteration, layer)

  int64_t chunkFloats() const { return chunkFloats_; }
  int64_t chunks(int64_t floats) const { return (floats + chunkFloats_ - 1) / chunkFloats_; }
  int64_t numel(int layer) const { return book_.model().layers.at(static_cast<size_t>(layer)).numel(); }
  void checkLayer(int layer, const char* what) const;
  // Member: a local-result or local-factors must come from this rank's leader (ProtocolError).
  void checkFromLeader(const FrameHeader& h) const;
  // Takes one chunk into `c` (sized on its first chunk); true when it completed c.
  static bool take(Chunks& c, int64_t total, int64_t chunkFloats, const Message& msg, const std::string& what);
  // Leader: the round's members and own contribution are all in (called with the round taken out).
  void combine(int layer, int64_t iteration, Round round);
  // Member: this rank's contribution to the leader, chunk by chunk (on the pool).
  void sendPush(int layer, int64_t iteration, const Round& round) const;
  // Member: writes the complete mean into the caller's buffer (with mutex_ held); false when closed.
  bool writeMean(Round& round) const;
  // Member: the mean is complete in round `key`'s `mean` (the caller holds no lock): writes it and
  // counts the layer done, unless the push's sends still read the buffer (they write it when done).
  void meanComplete(const Key& key);
  // Leader, SFB: the Syncer's rebuild: forwards the gathered factors, then rebuilds into `out`.
  void forwardFactors(int layer, int64_t iteration, const std::vector<FactorView>& workers, float scale,
                      const LayerBuffer& out);
  // Submits under the lock's protection, then runs what became ready, outside it.
  void ownSubmit(int layer, int64_t iteration, Round round);

  const InformationBook& book_;
  const int rank_;
  const int leader_;
  const int L_;
  const int64_t chunkFloats_;
  Host host_;
  mutable std::mutex mutex_;
  bool closed_ = false;
  std::map<Key, Round> rounds_;
  // Leader: the result buffer of each layer whose combined contribution is with its Syncer.
  std::map<Key, Syncing> syncing_;
};

}  // namespace poseidon
