// Syncer: the per-layer synchronization unit of the client library (paper
// section 4.1, Table 2: Send, Receive, Move).
//
// One Syncer per layer on every worker; one round per iteration.
//   PS  : Send pushes every KV pair of the layer's gradient to the shard that
//         owns it; Receive writes each shard's aggregate, divided by the number
//         of contributions, into the output buffer as it arrives.
//   SFB : Send broadcasts the factors U (K x M), V (K x N) to every worker
//         (itself included, through the loopback); Receive waits for the
//         factors and rebuilds sum_p U_p^T V_p / P1 (and the bias).
//   Adam: the benchmark's baseline: factors up to the layer's keeper server,
//         the full matrix back as KV pairs.
// Move is fused into Send: the van copies straight from the framework's
// memory into the outgoing message, so there is no staging copy (with a
// 16-bit wire, JobSettings::wire, the rounding to 16 bits is the one copy).
//
// A round's life, written down (advanceLocked() is the one place that moves a
// round on once this worker has submitted):
//
//            submit / skip                 every pair in, none being sent
//   kOpen ─────────────────> kAwaiting ─────────────────────────────────────> kFinished
//                               │  (aggregates: PS, Adam)                          ^
//                               │                                                  │
//                               └── factor set complete ──> kRebuilding ──GEMM─────┘
//                                   (factors: SFB)          (on the pool)
//
//   kOpen       this worker has neither contributed nor skipped; peers'
//               messages may already be here (SFB factors of faster workers;
//               in straggler mode, results of rounds that finish without us).
//   kAwaiting   this worker contributed (or, straggler mode, skipped: it only
//               takes the result); results are written into its buffer.
//   kRebuilding the factor set is complete: the round has left rounds_ and the
//               reconstruction GEMM runs on the pool.
//   kFinished   the result is in the buffer; the round is gone and finished_
//               remembers who contributed (a late message for it is stale).
//
// Orthogonal to the phase, a round's kind is fixed by its first event:
// Aggregates (PS and Adam: the result comes back in KV pairs) or Factors
// (SFB: every worker's U and V). An event of the other kind means the workers
// disagree on the scheme; the job fails with that reason.
//
// Rounds are keyed by iteration: a peer may already send factors for t + 1
// while this worker still waits for t's last messages.
//
// Straggler mode (JobSettings::dropStragglers > 0): a round may complete
// without this worker (it was late). Results that arrive before this worker
// submitted are held; its late submit then applies them at once without
// sending anything, and completeWithoutMe()/submitSkipped() let a worker
// that fell behind skip computing iterations the others already finished.
// SFB rounds use exactly the contributor set the layer's keeper decided
// (sfb/keeper.h), so every replica rebuilds the same gradient. While a pair of
// this worker's push is being read by the sender, a result for that pair is
// held too and written once the send is done, so no lock is held across a send.
//
// Threads: submit*() on the caller's thread, sends and reconstruction on the
// pool, on*() on the receive loop. mutex_ guards rounds_, finished_ and
// dropped_. Lock order: mutex_ is a leaf: the Syncer calls its host (send,
// schedule, layerDone, fail) only with no lock of its own held.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/common/trace.h"
#include "poseidon/common/work_charger.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/sfb/sufficient_factors.h"
#include "poseidon/transport/van.h"
#include "poseidon/wire/precision.h"

namespace poseidon {

// What a Syncer needs from its node. Tests implement it without sockets.
class SyncHost {
 public:
  virtual ~SyncHost() = default;
  virtual const InformationBook& book() const = 0;
  virtual int rank() const = 0;
  // Sends one message built with wire/messages.h (thread-safe; throws IoError).
  virtual void send(int dest, const FrameHeader& header, const std::vector<Van::Part>& parts) = 0;
  virtual void schedule(std::function<void()> task) = 0;
  // An SFB round's reconstruction (NodeOptions::deferReconstruction may hold it until the caller
  // has handed over the iteration's backward).
  virtual void scheduleRebuild(int64_t /*iteration*/, std::function<void()> task) { schedule(std::move(task)); }
  // The layer's synchronized result for `iteration` is in its output buffer.
  virtual void layerDone(int layer, int64_t iteration) = 0;
  // Fails the whole job (sticky); the error names what went wrong.
  virtual void fail(std::exception_ptr error) = 0;
  virtual int64_t currentIteration() const = 0;
  // Optional span recorder (null when not tracing).
  virtual Tracer* tracer() const = 0;
  // The bench's charge for the reconstruction GEMM (common/work_charger.h); null: none.
  virtual WorkCharger* charger() const { return nullptr; }
  // Compute groups: a layer's pair i of round r is pushed once the pull of round r + 1 has its pair
  // i - groupPushWindow() (0: no wait; NodeOptions::groupPushWindow). Throws the job's error.
  virtual int groupPushWindow() const { return 0; }
  virtual void waitGroupPull(int /*layer*/, int /*pair*/, int64_t /*round*/) {}
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
  // row-major; the mean gradient (weight, then bias if any) goes to `out`, or, for SFB with
  // `rebuild`, wherever rebuild puts it (a device; `out` is then not written).
  void submitFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows, LayerBuffer out,
                     std::shared_ptr<void> keepAlive, FactorRebuild rebuild = nullptr);
  // Compute-group mode: this worker's gradient for its group's `round` goes to
  // the shards, which hold the model (kvstore/model_shard.h) and apply the
  // group's mean with learning rate `lr`. The layer is done once the pushes
  // are out: nothing comes back to this buffer (the next pull brings the model).
  void submitGroupPush(int64_t round, LayerBuffer grad, float lr, std::shared_ptr<void> keepAlive);
  // Straggler mode: the round already completed without this worker (see
  // completeWithoutMe); writes its result into `out` without contributing.
  void submitSkipped(int64_t iteration, LayerBuffer out);
  bool completeWithoutMe(int64_t iteration) const;

  // Receive loop. Throw ProtocolError for messages that do not fit; nothing
  // changes then.
  void onAggregate(Message& msg);  // PS aggregates and Adam's full-matrix pairs
  void onFactors(Message& msg);
  void onDecision(Message& msg);   // straggler mode: an SFB round's contributors

  // After the job failed: drops every round and makes every later call a
  // no-op, so that no buffer of the caller's is read or written any more
  // (except by a pool task already running; the node waits for those).
  void close();

  // Human-readable state of an unfinished round (for timeout errors).
  std::string pending(int64_t iteration) const;
  // Contributors of a recently finished round: one mask per KV pair (PS,
  // Adam) or a single mask (SFB), by worker index; empty if unknown.
  std::vector<std::vector<bool>> contributors(int64_t iteration) const;
  // Rounds this worker submitted to whose result it did not contribute.
  int64_t droppedContributions() const;

 private:
  enum class Phase : uint8_t { kOpen, kAwaiting, kRebuilding, kFinished };
  struct PairSlot {
    bool in = false;          // its result arrived
    bool sending = false;     // our push is reading this pair's memory
    std::vector<float> held;  // a result (already divided) waiting to be written into `out`
    std::vector<bool> contributors;
  };
  struct Aggregates {  // PS, Adam
    Scheme scheme = Scheme::kPS;
    std::vector<PairSlot> pairs;
    size_t left = 0;     // pairs whose result has not arrived
    size_t sending = 0;  // pairs marked `sending`
  };
  struct Factors {  // SFB: one message per worker index, U then V
    std::vector<zmq::message_t> payload;
    std::vector<int64_t> rows;
    std::vector<bool> seen;
    int count = 0;
    std::optional<std::vector<bool>> decision;  // straggler mode: the keeper's contributor set
  };
  struct Round {
    Phase phase = Phase::kOpen;
    bool contributed = false;  // this worker's data is in the round (false when it skipped)
    // SFB, Adam: our factors are being sent (the pool reads the caller's U and V). The round does not
    // finish before the send is done, so the caller may free them once the layer is done; the mutex
    // also shows that order to ThreadSanitizer, which cannot see it through the network.
    bool factorsSending = false;
    std::variant<std::monostate, Aggregates, Factors> kind;
    LayerBuffer out;
    std::shared_ptr<void> keepAlive;
    FactorRebuild rebuild;  // SFB: the caller's rebuild instead of reconstructGradient into `out`
    int64_t sentAtUs = 0;  // for the receive span of the trace
  };
  // What to do once mutex_ is released.
  struct Effects {
    std::exception_ptr failure;
    std::function<void()> rebuild;  // to schedule on the pool
    bool layerDone = false;
  };

  // The round this worker submits to; throws InvalidArgument if it already submitted it.
  Round& submitRoundLocked(int64_t iteration);
  // The round of an inbound message: null when the round finished; created when
  // `create` and the iteration is in the open window, else ProtocolError.
  Round* findRoundLocked(int64_t iteration, bool create, const char* what);
  // Fix the round's kind at its first event; null when it already has the other kind.
  Aggregates* aggregatesLocked(Round& r, Scheme scheme);
  Factors* factorsLocked(Round& r);
  // The one place that moves a round out of kAwaiting (see the diagram).
  void advanceLocked(int64_t iteration, Round& r, Effects& fx);
  template <typename Action>
  static bool attemptTransition(Round& r, Phase from, Phase to, bool cond, Action&& action) {
    if (r.phase != from || !cond) return false;
    r.phase = to;
    action();
    return true;
  }
  void finishAggregatesLocked(int64_t iteration, Round& r, Aggregates& a, Effects& fx);
  void startRebuildLocked(int64_t iteration, Round& r, std::vector<bool> set, Effects& fx);
  // The factor set to rebuild from, once complete.
  std::optional<std::vector<bool>> factorSetLocked(const Factors& f) const;
  void writeHeldLocked(const Round& r, PairSlot& slot, int pair) const;
  void apply(int64_t iteration, Effects& fx);

  void sendDense(int64_t iteration, int64_t gap, const LayerBuffer& grad, const std::vector<int>& pairs);
  void sendFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows);
  void traceRebuilt(int64_t iteration, int64_t startUs);  // the rebuild's span in the trace
  void sendFactorsOnce(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows);
  void sendGroupPush(int64_t round, const LayerBuffer& grad, float lr);
  void reconstruct(int64_t iteration, Round round, std::vector<bool> set);
  void traceSent(int64_t iteration, int64_t startUs, const char* scheme);
  std::exception_ptr mismatch(int64_t iteration, const std::string& what) const;
  int me() const { return host_.book().workerIndex(host_.rank()); }

  SyncHost& host_;
  const int layer_;
  const LayerSpec& spec_;
  const std::vector<KvPair>& pairs_;
  const bool straggler_;
  const WirePrecision wire_;    // what PS pairs and SFB factors travel as (wire/precision.h)
  const size_t elementBytes_;  // bytes per float on the wire
  mutable std::mutex mutex_;
  std::map<int64_t, Round> rounds_;  // guarded by mutex_
  // The last kFinishedHistory finished rounds: who contributed to each pair. Its keys are the
  // recently finished iterations (a late message for one is stale). Guarded by mutex_.
  std::map<int64_t, std::vector<std::vector<bool>>> finished_;
  int64_t dropped_ = 0;    // guarded by mutex_
  bool closed_ = false;    // guarded by mutex_
  // The last iteration whose round of this layer was PS (what wire::psPush's gap
  // counts from); the same sequence on every worker. Guarded by mutex_.
  int64_t lastPsRound_;
  int64_t lastGroupRound_ = INT64_MIN;  // group mode: the last round pushed; guarded by mutex_
  FactorScratch scratch_;  // used by one reconstruction at a time
  std::mutex scratchMutex_;  // a leaf: held only around the GEMM
};

}  // namespace poseidon
