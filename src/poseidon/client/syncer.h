// Syncer: the per-layer synchronization unit of the client library (paper
// section 4.1, Table 2: Send, Receive, Move).
//
// One Syncer per layer on every worker. For iteration t its round goes:
//
//   submitted ──(pool: Move+Send)──> sent ──(receive loop: all pairs or all
//   factors in)──> [SFB: pool reconstructs with one GEMM] ──> done
//
//   PS  : Send pushes every KV pair of the layer's gradient to the shard that
//         owns it; Receive writes each shard's aggregate, divided by P1, into
//         the output buffer as it arrives.
//   SFB : Send broadcasts the factors U (K x M), V (K x N) to every worker
//         (itself included, through the loopback); Receive waits for all P1
//         workers' factors and rebuilds sum_p U_p^T V_p / P1 (and the bias).
//
// Move is fused into Send: the van copies straight from the framework's
// memory into the outgoing message, so there is no staging copy.
//
// Rounds are keyed by iteration: a peer may already send factors for t + 1
// while this worker still waits for t's last messages.
//
// Threads: submit*() on the caller's thread, send steps and reconstruction
// on the pool, on*() on the receive loop. mutex_ guards rounds_.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/common/trace.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/sfb/sufficient_factors.h"
#include "poseidon/transport/van.h"

namespace poseidon {

// What a Syncer needs from its node.
class SyncHost {
 public:
  virtual ~SyncHost() = default;
  virtual const InformationBook& book() const = 0;
  virtual Van& van() = 0;
  virtual int rank() const = 0;
  virtual void schedule(std::function<void()> task) = 0;
  // The layer's synchronized result for `iteration` is in its output buffer.
  virtual void layerDone(int layer, int64_t iteration) = 0;
  // Fails the whole job (sticky); `why` names what went wrong.
  virtual void fail(const std::string& why) = 0;
  virtual int64_t currentIteration() const = 0;
  // Optional span recorder (null when not tracing).
  virtual Tracer* tracer() const = 0;
};

class Syncer {
 public:
  // Upper bound on factor rows per worker accepted from the wire.
  static constexpr int64_t kMaxFactorRows = int64_t{1} << 24;

  Syncer(SyncHost& host, int layer);

  int layer() const { return layer_; }
  const LayerSpec& spec() const { return spec_; }

  // PS: `grad` holds this worker's gradient; the mean over all workers is
  // written back into it in place.
  void submitDense(int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive);
  // SFB or Adam (FC layers only): u is rows x M, v is rows x N, both
  // row-major; the mean gradient (weight, then bias if any) goes to `out`.
  void submitFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows, LayerBuffer out,
                     std::shared_ptr<void> keepAlive);

  // Receive loop. Throw ProtocolError for messages that do not fit.
  // PS aggregates and Adam's full-matrix pairs.
  void onAggregate(Message& msg);
  void onFactors(Message& msg);

  // Human-readable state of an unfinished round (for timeout errors).
  std::string pending(int64_t iteration) const;
  // The scheme this layer used (or is using) in `iteration`, if submitted.
  bool schemeOf(int64_t iteration, Scheme* out) const;

 private:
  struct Round {
    bool submitted = false;
    Scheme scheme = Scheme::kPS;
    LayerBuffer out;
    std::shared_ptr<void> keepAlive;
    // PS
    std::vector<bool> pairSeen;
    size_t pairsLeft = 0;
    // SFB: one message per worker index, U then V.
    std::vector<zmq::message_t> factors;
    std::vector<int64_t> rows;
    std::vector<bool> factorSeen;
    int factorsLeft = 0;
    bool reconstructing = false;
    int64_t sentAtUs = 0;  // for the receive span of the trace
  };
  Round& roundLocked(int64_t iteration);
  void sendDense(int64_t iteration, const LayerBuffer& grad);
  void sendFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows);
  // Called with mutex_ held; schedules reconstruction once every worker's
  // factors are in and the round is submitted.
  void maybeReconstructLocked(int64_t iteration, Round& round);
  void reconstruct(int64_t iteration, Round round);
  void traceSent(int64_t iteration, int64_t startUs, const char* scheme);

  SyncHost& host_;
  const int layer_;
  const LayerSpec& spec_;
  const std::vector<KvPair>& pairs_;
  mutable std::mutex mutex_;
  std::map<int64_t, Round> rounds_;  // guarded by mutex_
  FactorScratch scratch_;            // used by one reconstruction at a time (rounds finish in order)
  std::mutex scratchMutex_;
};

}  // namespace poseidon
