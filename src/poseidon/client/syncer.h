// Syncer: the per-layer synchronization unit of the client library (paper
// section 4.1, Table 2: Send, Receive, Move).
//
// One Syncer per layer on every worker. For iteration t its round goes:
//
//   submitted ──(pool: Move+Send)──> sent ──(receive loop: all pairs or all
//   factors in)──> [SFB: pool reconstructs with one GEMM] ──> done
//
//   PS  : Send pushes every KV pair of the layer's gradient to the shard that
//         owns it; Receive writes each shard's aggregate, divided by the number
//         of contributions, into the output buffer as it arrives.
//   SFB : Send broadcasts the factors U (K x M), V (K x N) to every worker
//         (itself included, through the loopback); Receive waits for the
//         factors and rebuilds sum_p U_p^T V_p / P1 (and the bias).
//   Adam: the benchmark's baseline: factors up to the layer's one server,
//         the full matrix back as KV pairs.
//
// Move is fused into Send: the van copies straight from the framework's
// memory into the outgoing message, so there is no staging copy.
//
// Rounds are keyed by iteration: a peer may already send factors for t + 1
// while this worker still waits for t's last messages.
//
// Straggler mode (JobSettings::dropStragglers > 0): a round may complete
// without this worker (it was late). Results that arrive before this worker
// submitted are kept; its late submit then applies them at once without
// sending anything, and completeWithoutMe()/submitSkipped() let a worker
// that fell behind skip computing iterations the others already finished.
// SFB rounds use exactly the contributor set the layer's keeper decided
// (sfb/keeper.h), so every replica rebuilds the same gradient.
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
  // Straggler mode: how far ahead of this worker results may be kept.
  static constexpr int64_t kMaxAheadStraggler = 64;

  Syncer(SyncHost& host, int layer);

  int layer() const { return layer_; }
  const LayerSpec& spec() const { return spec_; }

  // PS: `grad` holds this worker's gradient; the mean over the contributors
  // is written back into it in place.
  void submitDense(int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive);
  // SFB or Adam (FC layers only): u is rows x M, v is rows x N, both
  // row-major; the mean gradient (weight, then bias if any) goes to `out`.
  void submitFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows, LayerBuffer out,
                     std::shared_ptr<void> keepAlive);
  // Straggler mode: the round already completed without this worker (see
  // completeWithoutMe); writes its result into `out` without contributing.
  void submitSkipped(int64_t iteration, LayerBuffer out);
  bool completeWithoutMe(int64_t iteration) const;

  // Receive loop. Throw ProtocolError for messages that do not fit.
  void onAggregate(Message& msg);  // PS aggregates and Adam's full-matrix pairs
  void onFactors(Message& msg);
  void onDecision(Message& msg);   // straggler mode: an SFB round's contributors

  // Human-readable state of an unfinished round (for timeout errors).
  std::string pending(int64_t iteration) const;
  // The scheme this layer used (or is using) in `iteration`, if submitted.
  bool schemeOf(int64_t iteration, Scheme* out) const;
  // Contributors of a recently completed round: one mask per KV pair (PS,
  // Adam) or a single mask (SFB), by worker index; empty if unknown.
  std::vector<std::vector<bool>> contributors(int64_t iteration) const;
  // Rounds this worker submitted to whose result it did not contribute.
  int64_t droppedContributions() const;

 private:
  struct Round {
    bool submitted = false;  // this worker contributed (or tried to)
    bool skipped = false;    // this worker only takes the result
    Scheme scheme = Scheme::kPS;
    LayerBuffer out;
    std::shared_ptr<void> keepAlive;
    // PS / Adam: aggregates by pair; early ones (straggler mode) wait scaled.
    std::vector<bool> pairSeen;
    size_t pairsLeft = 0;
    std::vector<std::vector<float>> early;
    std::vector<std::vector<bool>> pairContributors;
    bool aggregatesArrived = false;
    // SFB: one message per worker index, U then V.
    std::vector<zmq::message_t> factors;
    std::vector<int64_t> rows;
    std::vector<bool> factorSeen;
    int factorsSeen = 0;
    bool decided = false;
    std::vector<bool> decision;
    bool reconstructing = false;
    int64_t sentAtUs = 0;  // for the receive span of the trace
  };
  Round& roundLocked(int64_t iteration);
  // The round this worker submits to; throws if it already submitted it.
  Round& submitRoundLocked(int64_t iteration);
  Round* findRoundLocked(int64_t iteration, bool create, const char* what);
  void sendDense(int64_t iteration, const LayerBuffer& grad, const std::vector<int>& pairs);
  void sendFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows);
  // With mutex_ held: finishes a PS/Adam round whose pairs are all in (returns
  // true: call layerDone after unlocking), or schedules an SFB reconstruction.
  bool maybeFinishLocked(int64_t iteration, Round& round);
  // Writes the results that arrived before this rank submitted (straggler mode) into `out`;
  // the indices of the pairs still open go to `open` when given.
  void applyEarlyLocked(Round& round, const LayerBuffer& out, std::vector<int>* open);
  void reconstruct(int64_t iteration, Round round, std::vector<bool> set);
  void traceSent(int64_t iteration, int64_t startUs, const char* scheme);
  bool factorSetReadyLocked(const Round& r, std::vector<bool>* set) const;
  int me() const { return host_.book().workerIndex(host_.rank()); }

  SyncHost& host_;
  const int layer_;
  const LayerSpec& spec_;
  const std::vector<KvPair>& pairs_;
  const bool straggler_;
  mutable std::mutex mutex_;
  std::map<int64_t, Round> rounds_;        // guarded by mutex_
  // The last kFinishedHistory finished rounds: who contributed to each pair. Its keys are the
  // recently finished iterations (a late message for one is stale). Guarded by mutex_.
  std::map<int64_t, std::vector<std::vector<bool>>> contributors_;
  int64_t dropped_ = 0;                    // guarded by mutex_
  FactorScratch scratch_;                  // used by one reconstruction at a time
  std::mutex scratchMutex_;
};

}  // namespace poseidon
