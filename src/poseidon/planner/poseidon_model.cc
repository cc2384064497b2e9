// Poseidon's systems on the planner's simulated cluster (`poseidon plan --predict`): BSP, WFBP,
// each layer's sync by its scheme, priority links with the overlapped forward, host copies on GPU
// nodes and several GPUs a node.
#include <memory>
#include <utility>
#include <vector>

#include "poseidon/core/best_scheme.h"
#include "poseidon/core/kv_layout.h"
#include "poseidon/planner/sim.h"
#include "poseidon/transport/van.h"
#include "poseidon/wire/precision.h"

namespace poseidon::planner::detail {

namespace {

// Poseidon's systems: every node a worker and a shard (nodes 0..servers-1 with Cluster::servers), BSP,
// each layer's sync by its scheme.
class PoseidonModel {
 public:
  PoseidonModel(const Workload& w, const Cluster& c, System system)
      : w_(w),
        c_(c),
        system_(system),
        P_(c.workers),
        G_(std::max(1, c.localRanks)),
        rows_(w.batch * G_),
        L_(static_cast<int>(w.model.layers.size())),
        overlap_(system == System::kPoseidonOverlap),
        wfbp_(system != System::kPsNaive),
        iterations_(overlap_ ? 6 : 4),
        warm_(2),
        layout_(
            KvLayout::balanced(w.model, c.servers > 0 ? c.servers : c.workers, scaledPairBytes(c.pairBytes, c.scale))),
        net_(&sim_, c, overlap_, warm_, iterations_),
        urgentLayers_(overlap_ ? urgentLayerCount(w, c) : 0),
        elementBytes_(static_cast<double>(wireElementBytes(c.wire))) {
    DeviceModel device;
    device.flopScale = w.flopScale;
    device.byteScale = 1.0 / (c.scale * c.scale);
    device.gemmFlops = c.gemmFlops;
    device.sumBytes = c.sumBytes;
    device.cryptoBytes = c.cryptoBytes;
    device.linkBytes = c.linkBytes * device.byteScale;
    device.cryptoLanes = c.cryptoLanes;
    const SchemePolicy policy =
        system == System::kPoseidon || system == System::kPoseidonOverlap ? SchemePolicy::kAuto : SchemePolicy::kPS;
    for (const auto& l : w.model.layers) {
      schemes_.push_back(bestScheme(l, rows_, P_, c.servers > 0 ? c.servers : P_, policy,
                                    c.timedSchemes ? &device : nullptr, wireElementBytes(c.wire)));
      sfbLayers_ += schemes_.back() == Scheme::kSFB;
    }
    backwardDoneThrough_.assign(static_cast<size_t>(P_), -1);
    heldRebuilds_.resize(static_cast<size_t>(P_));
    for (int n = 0; n < P_; ++n) {
      gemm_.emplace_back(&sim_, c.gemmFlops / w.flopScale);
      toHost_.emplace_back(&sim_, c.copyBytes * c.scale * c.scale);
      for (int s = 0; s < c.sumLanes; ++s) sumLanes_.emplace_back(&sim_, kInf);
    }
    copyRate_ = c.copyBytes * c.scale * c.scale;
    sumRate_ = c.sumBytes * c.scale * c.scale;
    cryptoRate_ = c.cryptoBytes * c.scale * c.scale;
    chunkBytes_ = static_cast<double>(layout_.pairFloats()) * sizeof(float);  // balancedPairBytes
    memberOut_.assign(static_cast<size_t>(P_ * G_), 0.0);
    memberIn_.assign(static_cast<size_t>(P_ * G_), 0.0);
    int64_t pairs = 0;
    for (int l = 0; l < L_; ++l) {
      firstPair_.push_back(pairs);
      pairs += static_cast<int64_t>(layout_.pairsOf(l).size());
    }
    const size_t I = static_cast<size_t>(iterations_), PL = static_cast<size_t>(P_) * static_cast<size_t>(L_);
    pushes_.assign(I, std::vector<int>(static_cast<size_t>(pairs), 0));
    arrived_.assign(I, std::vector<int>(PL, 0));
    left_.assign(I, std::vector<int>(static_cast<size_t>(P_), L_));
    doneThrough_.assign(PL, -1);
    waiting_.assign(PL, Sim::Fn());
    forwardStart_.assign(static_cast<size_t>(P_), std::vector<double>(I + 1, kUnreached));
  }

  Prediction run() {
    for (int n = 0; n < P_; ++n) startForward(n, 0);
    sim_.run();
    requireEveryNodeFinished(forwardStart_, systemName(system_));
    Prediction p;
    p.sfbLayers = sfbLayers_;
    for (int n = 0; n < P_; ++n) {
      const auto& fs = forwardStart_[static_cast<size_t>(n)];
      p.iterationSeconds =
          std::max(p.iterationSeconds,
                   (fs[static_cast<size_t>(iterations_)] - fs[static_cast<size_t>(warm_)]) / (iterations_ - warm_));
    }
    for (double b : net_.txBytes()) p.maxNodeTxBytes = std::max(p.maxNodeTxBytes, b / (iterations_ - warm_));
    return p;
  }

 private:
  size_t at(int node, int layer) const {
    return static_cast<size_t>(node) * static_cast<size_t>(L_) + static_cast<size_t>(layer);
  }
  // A round message's rank on prioritized links (lower first): by iteration, then layer, then in a
  // rotation of the peers that moves with the sender and the layer (from `src` to peer
  // src + layer + 1 first, then src + layer + 2, ...), so that no rank is always served last. Only
  // Cluster::Links other than as-built compare messages to different peers, so only they see the
  // rotation: a node serving the sum of a layer to each rank strictly one after another makes the
  // same rank wait longest for every layer, and the next iteration's sync of the first layer then
  // waits for that rank (vgg19 at 32 nodes on ideal links: 1.10 s an iteration without the rotation,
  // 1.00 with it).
  int64_t priority(int it, int layer, int src, int dst) const {
    return (static_cast<int64_t>(it) * L_ + layer) * P_ + ((dst - src - layer) % P_ + P_) % P_;
  }
  static_assert(VanOptions::kAutoUrgentRule == 4, "Cluster::urgentRule's default is the runtime's rule");
  static_assert(Van::kSendWindowRule == 2, "Cluster::sendWindowRule's default is the runtime's rule");
  // The runtime's count of urgent layers (Van::urgentLayerCount) for this cluster's peers and queue.
  static int urgentLayerCount(const Workload& w, const Cluster& c) {
    VanOptions van;
    van.sendWindowBytes = 1;  // poseidon-overlap runs priority links
    van.urgentLayers = c.urgentLayers;
    const size_t peers = static_cast<size_t>(std::max(0, c.workers - 1));
    const int belowFc = w.model.layersBelowFcBulk();
    if (c.urgentRule == 2 && c.urgentLayers == VanOptions::kAutoUrgentLayers && c.lowDelayFirst && belowFc > 0 &&
        peers > static_cast<size_t>(VanOptions::kAutoUrgentPeers))
      return belowFc;
    const bool twoBand = c.urgentRule >= 4 ? c.lowDelayFirst && c.hostQueueTold : c.lowDelayFirst;
    return Van::urgentLayerCount(van, peers, c.urgentRule >= 2 && twoBand, belowFc);
  }
  bool urgent(int layer) const { return layer < urgentLayers_; }

  void startForward(int n, int it) {
    forwardStart_[static_cast<size_t>(n)][static_cast<size_t>(it)] = sim_.now();
    if (it == iterations_) return;
    if (overlap_ && it > 0) {
      forwardLayer(n, it, 0);
      return;
    }
    double f = 0;
    for (double s : w_.forwardSeconds) f += s;
    compute(n, f, [this, n, it] { backward(n, it, L_ - 1); });
  }
  // poseidon-overlap: layer l's forward waits for layer l's sync of the iteration before.
  void forwardLayer(int n, int it, int l) {
    if (l == L_) {
      backward(n, it, L_ - 1);
      return;
    }
    auto go = [this, n, it, l] {
      compute(n, w_.forwardSeconds[static_cast<size_t>(l)], [this, n, it, l] { forwardLayer(n, it, l + 1); });
    };
    if (doneThrough_[at(n, l)] >= it - 1) {
      go();
    } else {
      waiting_[at(n, l)] = go;
    }
  }
  // Node n's GPU computing for `seconds`, then `then`: in one stream with the reconstruction where
  // that runs on the GPU (first come, first served), else at once.
  void compute(int n, double seconds, Sim::Fn then) {
    if (c_.gemmOnGpu) {
      gemm_[static_cast<size_t>(n)].submitTimed([seconds] { return seconds; }, 0, std::move(then));
    } else {
      sim_.at(sim_.now() + seconds, std::move(then));
    }
  }
  void backward(int n, int it, int l) {
    compute(n, w_.backwardSeconds[static_cast<size_t>(l)], [this, n, it, l] {
      if (wfbp_) toHost(n, it, l);
      if (l > 0) {
        backward(n, it, l - 1);
        return;
      }
      backwardDone(n, it);
      if (!wfbp_)
        for (int k = L_ - 1; k >= 0; --k) toHost(n, it, k);
      if (overlap_) startForward(n, it + 1);
    });
  }
  // fp32 bytes a layer's sync moves between the GPU and the host each way: its gradient (PS), or
  // one worker's factors (SFB; the reconstruction takes all P workers' back).
  double stagedBytes(int l) const {
    const LayerSpec& spec = w_.model.layers[static_cast<size_t>(l)];
    if (schemes_[static_cast<size_t>(l)] == Scheme::kSFB)
      return static_cast<double>(w_.batch) * static_cast<double>(spec.m + spec.n) * sizeof(float);
    return static_cast<double>(spec.numel()) * sizeof(float);
  }
  // The layer's gradient to host memory on the node's copy engine (the runtime's copy stream), which
  // runs beside the backward; then its sync.
  void toHost(int n, int it, int l) {
    if (copyRate_ <= 0) {
      submit(n, it, l);
      return;
    }
    toHost_[static_cast<size_t>(n)].submit(stagedBytes(l), 0, [this, n, it, l](double, double end, double, bool last) {
      if (last) sim_.at(end, [this, n, it, l] { submit(n, it, l); });
    });
  }
  // A host-to-GPU copy of `bytes` in the GPU's one stream (the runtime queues it there, before the
  // step that reads it), then `then`.
  void toDevice(int n, double bytes, Sim::Fn then) {
    if (copyRate_ <= 0) {
      then();
      return;
    }
    compute(n, bytes / copyRate_, std::move(then));
  }
  // fp32 bytes one local message of layer l carries: a member's gradient or factors to its leader,
  // or (back) the node's mean (PS) or every node's factor stack (SFB) to each member.
  double localBytes(int l, bool back) const {
    const LayerSpec& spec = w_.model.layers[static_cast<size_t>(l)];
    if (schemes_[static_cast<size_t>(l)] != Scheme::kSFB) return static_cast<double>(spec.numel()) * sizeof(float);
    const double rows = back ? static_cast<double>(rows_) * P_ : static_cast<double>(w_.batch);
    return rows * static_cast<double>(spec.m + spec.n) * sizeof(float);
  }
  // A member's I/O thread encrypting (or decrypting) `bytes` after what it already has: seconds from now.
  double lane(double& free, double bytes) {
    return cryptoRate_ > 0 ? occupy(free, sim_.now(), bytes / cryptoRate_) : 0;
  }
  // Local aggregation (Cluster::localRanks): the node's members' pushes of layer l reach the leader,
  // each encrypted by its member's I/O thread, decrypted by the leader's and added on its receive
  // loop (one message per pair-sized chunk); then `then`.
  void gatherLocal(int n, int it, int l, Sim::Fn then) {
    const double bytes = localBytes(l, false);
    const double chunks = std::max(1.0, std::ceil(bytes / chunkBytes_));
    const bool sums = schemes_[static_cast<size_t>(l)] != Scheme::kSFB;
    auto left = std::make_shared<int>(G_ - 1);
    auto done = std::make_shared<Sim::Fn>(std::move(then));
    for (int j = 1; j < G_; ++j) {
      const double encrypted = lane(memberOut_[static_cast<size_t>(n * G_ + j)], bytes);
      sim_.at(sim_.now() + encrypted, [this, n, j, bytes, chunks, sums, left, done] {
        const double decrypted = net_.encryption(n, 2 * (P_ + j) + 1, bytes);
        sim_.at(sim_.now() + decrypted, [this, n, bytes, chunks, sums, left, done] {
          net_.onLoop(
              n,
              [this, bytes, chunks, sums] {
                return chunks * c_.messageSeconds + (sums && sumRate_ > 0 ? bytes / sumRate_ : 0.0);
              },
              [left, done] {
                if (--*left == 0) (*done)();
              });
        });
      });
    }
  }
  // The leader's result of layer l to each member (encrypted on the leader's I/O threads, decrypted on
  // the member's); `then` once the last member has it: the node is paced by its slowest rank.
  void scatterLocal(int n, int l, Sim::Fn then) {
    const double bytes = localBytes(l, true);
    double last = 0;
    for (int j = 1; j < G_; ++j) {
      const double encrypted = net_.encryption(n, 2 * (P_ + j), bytes);
      double& in = memberIn_[static_cast<size_t>(n * G_ + j)];
      in = std::max(in, sim_.now() + encrypted);
      last = std::max(last, lane(in, bytes));
    }
    sim_.at(sim_.now() + last, std::move(then));
  }
  void submit(int n, int it, int l) {
    if (G_ > 1) {
      gatherLocal(n, it, l, [this, n, it, l] { submitNode(n, it, l); });
      return;
    }
    submitNode(n, it, l);
  }
  // The node's contribution of layer l to the network (its leader's, with local ranks).
  void submitNode(int n, int it, int l) {
    const LayerSpec& spec = w_.model.layers[static_cast<size_t>(l)];
    if (schemes_[static_cast<size_t>(l)] == Scheme::kSFB) {
      const double bytes = static_cast<double>(rows_) * static_cast<double>(spec.m + spec.n) * elementBytes_;
      for (int v = 0; v < P_; ++v) {
        if (v != n)
          net_.send(
              it, n, v, bytes, priority(it, l, n, v), [this, v, it, l] { factorsIn(v, it, l); }, urgent(l));
      }
      net_.send(it, n, n, bytes, priority(it, l, n, n), [this, n, it, l] { factorsIn(n, it, l); });  // peers first
      return;
    }
    const auto& pairs = layout_.pairsOf(l);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const KvPair& p = pairs[i];
      const int64_t id = firstPair_[static_cast<size_t>(l)] + static_cast<int64_t>(i);
      net_.send(
          it, n, p.shard, static_cast<double>(p.length) * elementBytes_, priority(it, l, n, p.shard),
          [this, p, id, it, l] { pushIn(p, id, it, l); }, urgent(l));
    }
  }
  void pushIn(const KvPair& p, int64_t id, int it, int l) {
    // The shard widens and adds each push in fp32, on the pair's sum thread (Cluster::sumLanes; none:
    // on the receive loop), and with the last worker's push sends the sum to each worker.
    const int shard = p.shard;
    const double bytes = static_cast<double>(p.length) * elementBytes_;
    auto seconds = [this, p] { return sumRate_ > 0 ? static_cast<double>(p.length) * sizeof(float) / sumRate_ : 0.0; };
    Sim::Fn summed = [this, shard, bytes, id, it, l] {
      if (++pushes_[static_cast<size_t>(it)][static_cast<size_t>(id)] < P_) return;
      for (int v = 0; v < P_; ++v) {
        Sim::Fn deliver = [this, v, it, l] { aggregateIn(v, it, l); };
        // Encrypted by the I/O thread of the connection, not on the loop (transport/van.cc).
        net_.send(it, shard, v, bytes, priority(it, l, shard, v), std::move(deliver), urgent(l));
      }
    };
    if (c_.sumLanes > 0) {
      const size_t lane = static_cast<size_t>(shard) * static_cast<size_t>(c_.sumLanes) +
                          sumLaneOf(p.layer, p.index, static_cast<size_t>(c_.sumLanes));
      sumLanes_[lane].submitTimed(std::move(seconds), 0, std::move(summed));
    } else {
      net_.onLoop(shard, std::move(seconds), std::move(summed));
    }
  }
  void aggregateIn(int n, int it, int l) {
    if (++arrived_[static_cast<size_t>(it)][at(n, l)] == static_cast<int>(layout_.pairsOf(l).size()))
      toDevice(n, stagedBytes(l), [this, n, it, l] { layerDone(n, it, l); });
  }
  void factorsIn(int n, int it, int l) {
    if (++arrived_[static_cast<size_t>(it)][at(n, l)] < P_) return;
    toDevice(n, stagedBytes(l) * P_ * G_, [this, n, it, l] { reconstruct(n, it, l); });
  }
  // Node n handed over iteration it's backward: the reconstructions it held start (deferReconstruction).
  void backwardDone(int n, int it) {
    backwardDoneThrough_[static_cast<size_t>(n)] = it;
    auto& held = heldRebuilds_[static_cast<size_t>(n)];
    std::vector<std::pair<int, int>> go;
    for (auto h = held.begin(); h != held.end();) {
      if (h->first <= it) {
        go.push_back(*h);
        h = held.erase(h);
      } else {
        ++h;
      }
    }
    for (const auto& [i, l] : go) reconstruct(n, i, l);
  }
  void reconstruct(int n, int it, int l) {
    const LayerSpec& spec = w_.model.layers[static_cast<size_t>(l)];
    if (c_.gemmOnGpu && c_.deferReconstruction && c_.gemmFlops > 0 && backwardDoneThrough_[static_cast<size_t>(n)] < it) {
      heldRebuilds_[static_cast<size_t>(n)].emplace_back(it, l);
      return;
    }
    if (c_.gemmFlops <= 0) {  // not charged: done at once, as the bench's charger returns at once
      layerDone(n, it, l);
      return;
    }
    const double flops =
        2.0 * static_cast<double>(rows_) * P_ * static_cast<double>(spec.m) * static_cast<double>(spec.n);
    gemm_[static_cast<size_t>(n)].submit(flops, 0, [this, n, it, l](double, double end, double, bool) {
      sim_.at(end, [this, n, it, l] { layerDone(n, it, l); });
    });
  }
  void layerDone(int n, int it, int l) {
    if (G_ > 1) {
      scatterLocal(n, l, [this, n, it, l] { nodeDone(n, it, l); });
      return;
    }
    nodeDone(n, it, l);
  }
  void nodeDone(int n, int it, int l) {
    doneThrough_[at(n, l)] = it;
    if (Sim::Fn go = std::move(waiting_[at(n, l)])) {
      waiting_[at(n, l)] = nullptr;
      go();
    }
    if (--left_[static_cast<size_t>(it)][static_cast<size_t>(n)] == 0 && !overlap_) startForward(n, it + 1);
  }

  const Workload& w_;
  const Cluster& c_;
  System system_;
  int P_;
  int G_;         // ranks per node (Cluster::localRanks)
  int64_t rows_;  // the node's factor rows, G_ x K
  int L_;
  bool overlap_, wfbp_;
  int iterations_, warm_;
  Sim sim_;
  KvLayout layout_;
  Network net_;
  int urgentLayers_;  // layers [0, urgentLayers_) on the urgent connections (Cluster::urgentLayers)
  double elementBytes_;
  std::vector<Scheme> schemes_;
  int sfbLayers_ = 0;
  std::vector<Server> gemm_;
  std::vector<int> backwardDoneThrough_;                       // [node]: the last iteration whose backward ended
  std::vector<std::vector<std::pair<int, int>>> heldRebuilds_;  // [node]: (iteration, layer) held until then
  std::vector<Server> toHost_;                // [node]: the GPU's copy engine, device to host
  std::vector<Server> sumLanes_;              // [node, lane]: the shard's sum threads
  double copyRate_ = 0;                       // host <-> GPU, bytes/s at the workload's scale (0: no copies)
  double sumRate_ = 0;                        // the shards' sums, bytes/s at the workload's scale
  double cryptoRate_ = 0;                     // CURVE per I/O thread, bytes/s at the workload's scale
  double chunkBytes_ = 0;                     // a local message's most bytes: the pair size
  std::vector<double> memberOut_, memberIn_;  // [node, rank]: a member's I/O threads, busy until
  std::vector<int64_t> firstPair_;
  std::vector<std::vector<int>> pushes_, arrived_,
      left_;                                       // [iteration][pair], [iteration][node, layer], [iteration][node]
  std::vector<int> doneThrough_;                   // [node, layer]: the last iteration synchronized
  std::vector<Sim::Fn> waiting_;                   // [node, layer]: a forward waiting for it
  std::vector<std::vector<double>> forwardStart_;  // [node][iteration]
};

}  // namespace

Prediction runPoseidonModel(const Workload& workload, const Cluster& cluster, System system) {
  return PoseidonModel(workload, cluster, system).run();
}

}  // namespace poseidon::planner::detail
