// Omnivore's compute groups on the planner's simulated cluster (`poseidon plan --predict --groups`).
#include "poseidon/planner/sim.h"

namespace poseidon::planner::detail {

namespace {

// Omnivore's compute groups (kvstore/model_shard.h): g groups of k = P / g workers, every node a
// worker and (nodes 0..servers-1 with Cluster::servers) a shard that holds its pairs' parameters and
// runs SGD. A round of a member: it asks
// every pair's shard for the parameters (a header-only pull), the shard answers the k members
// once all k asked and the group's previous update of the pair is applied (encrypting a reply for
// each member on its receive loop, as Node::sendAll), the member computes once the whole model is
// in (the eager pull) and its previous backward is done, and pushes each layer's dense gradient as
// its backward ends (WFBP). It asks for the next round's parameters with its first push
// (GroupSync::layerReady), so a pair's reply leaves as soon as its update is applied, while the
// later pairs' pushes still arrive. A shard sums each push on its loop
// and, with the k-th, applies the update (SGD with momentum: a few passes over the pair) and
// answers the next round's pulls. Groups are asynchronous: nothing waits for another group.
class GroupModel {
 public:
  GroupModel(const Workload& w, const Cluster& c, int groups, const MergedFc* fc)
      : w_(w),
        fc_(fc),
        P_(c.workers),
        g_(groups),
        k_(c.workers / groups),
        L_(static_cast<int>(w.model.layers.size())),
        layout_(
            KvLayout::balanced(w.model, c.servers > 0 ? c.servers : c.workers, scaledPairBytes(c.pairBytes, c.scale))),
        net_(&sim_, c, /*prioritized=*/false, kWarmRounds, kRounds) {
    for (int l = 0; l < L_; ++l)
      for (const KvPair& p : layout_.pairsOf(l)) pairs_.push_back(p);
    const size_t G = static_cast<size_t>(g_), R = static_cast<size_t>(kRounds) + 1, N = pairs_.size();
    asked_.assign(G, std::vector<std::vector<int>>(R, std::vector<int>(N, 0)));
    pushed_ = asked_;
    applied_.assign(G, std::vector<int>(N, -1));
    answered_.assign(G, std::vector<int>(N, -1));
    got_.assign(static_cast<size_t>(P_), std::vector<int>(R, 0));
    ready_ = got_;
    roundStart_.assign(static_cast<size_t>(P_), std::vector<double>(R, kUnreached));
    fcArrived_.assign(G, std::vector<int>(R, 0));
    sumRate_ = c.sumBytes * c.scale * c.scale;
  }

  GroupPrediction run() {
    // The groups drift apart in a real run (nothing holds them together); start each 1/g of a
    // compute later than the one before, as they settle, rather than all at once.
    const double compute = w_.computeSeconds();
    for (int n = 0; n < P_; ++n) {
      const int group = n / k_;
      sim_.at(compute * group / g_, [this, n] { startRound(n, 0); });
    }
    sim_.run();
    requireEveryNodeFinished(roundStart_, "compute groups");
    GroupPrediction p;
    p.groups = g_;
    p.groupSize = k_;
    // Groups may step at different rates (one may never wait for the link): the model is updated at
    // the sum of their rates, and samples go through at the sum of the workers'.
    double updatesPerSecond = 0;
    for (int n = 0; n < P_; ++n) {
      const auto& rs = roundStart_[static_cast<size_t>(n)];
      const double step = (rs[kRounds] - rs[kWarmRounds]) / (kRounds - kWarmRounds);
      p.stepSeconds += step / P_;
      p.samplesPerSecond += static_cast<double>(w_.batch) / step;
      updatesPerSecond += 1.0 / step / k_;
    }
    p.updateSeconds = 1.0 / updatesPerSecond;
    for (double b : net_.txBytes()) p.maxNodeTxBytes = std::max(p.maxNodeTxBytes, b / (kRounds - kWarmRounds));
    if (fc_) {
      // The server's work per group round over the time between updates: its load in the steady state.
      p.fcServerBusy = std::min(1.0, serverSeconds() / p.updateSeconds);
    }
    return p;
  }

 private:
  static constexpr int kRounds = 8, kWarmRounds = 3;
  int groupOf(int n) const { return n / k_; }
  double pairBytes(size_t i) const { return static_cast<double>(pairs_[i].length) * sizeof(float); }

  // Round r - 1's backward is done (r = 0: the start). The forward also waits for round r's
  // replies, asked with round r - 1's first push.
  void startRound(int n, int r) {
    roundStart_[static_cast<size_t>(n)][static_cast<size_t>(r)] = sim_.now();
    if (r == kRounds) return;
    if (r == 0) ask(n, 0);
    ready(n, r);
  }
  void ask(int n, int r) {
    const int G = groupOf(n);
    for (size_t i = 0; i < pairs_.size(); ++i)
      net_.send(r, n, pairs_[i].shard, 0, 0, [this, G, r, i] {
        ++asked_[static_cast<size_t>(G)][static_cast<size_t>(r)][i];
        answer(G, r, i);
      });
  }
  // The shard answers round r's pulls of pair i once all k members asked and update r - 1 is in.
  void answer(int G, int r, size_t i) {
    const size_t g = static_cast<size_t>(G);
    if (asked_[g][static_cast<size_t>(r)][i] < k_ || applied_[g][i] < r - 1 || answered_[g][i] >= r) return;
    answered_[g][i] = r;
    const int shard = pairs_[i].shard;
    const double bytes = pairBytes(i);
    for (int m = 0; m < k_; ++m) {
      const int v = G * k_ + m;
      Sim::Fn deliver = [this, v, r] { replyIn(v, r); };
      net_.send(r, shard, v, bytes, 0, std::move(deliver));  // encrypted by its I/O thread
    }
  }
  void replyIn(int n, int r) {
    if (++got_[static_cast<size_t>(n)][static_cast<size_t>(r)] == static_cast<int>(pairs_.size())) ready(n, r);
  }
  // The forward of round r starts with the second of: the round's last reply, the previous backward's end.
  void ready(int n, int r) {
    if (++ready_[static_cast<size_t>(n)][static_cast<size_t>(r)] < 2) return;
    double forward = 0;
    for (double f : w_.forwardSeconds) forward += f;
    if (!fc_) {
      sim_.at(sim_.now() + forward, [this, n, r] { backward(n, r, L_ - 1); });
      return;
    }
    // Merged FC: the activations to the FC server (node 0), the backward once its gradient is back.
    sim_.at(sim_.now() + forward,
            [this, n, r] { net_.send(r, n, kFcServer, activationBytes(), 0, [this, n, r] { fcIn(groupOf(n), r); }); });
  }
  // The FC server takes a group's round once all k members' activations are in, one round at a time.
  void fcIn(int G, int r) {
    if (++fcArrived_[static_cast<size_t>(G)][static_cast<size_t>(r)] < k_) return;
    const double start = std::max(sim_.now(), fcFree_);
    fcFree_ = start + serverSeconds();
    sim_.at(fcFree_, [this, G, r] {
      for (int m = 0; m < k_; ++m) {
        const int v = G * k_ + m;
        net_.send(r, kFcServer, v, activationBytes(), 0, [this, v, r] { backward(v, r, L_ - 1); });
      }
    });
  }
  double activationBytes() const { return static_cast<double>(w_.batch) * fc_->activationFloats * sizeof(float); }
  double serverSeconds() const { return static_cast<double>(k_ * w_.batch) * fc_->serverSecondsPerSample; }
  void backward(int n, int r, int l) {
    sim_.at(sim_.now() + w_.backwardSeconds[static_cast<size_t>(l)], [this, n, r, l] {
      const int G = groupOf(n);
      if (l == L_ - 1 && r + 1 < kRounds) ask(n, r + 1);  // with the first push, ahead of it
      for (size_t i = 0; i < pairs_.size(); ++i) {
        if (pairs_[i].layer != l) continue;
        net_.send(r, n, pairs_[i].shard, pairBytes(i), 0, [this, G, r, i] { pushIn(G, r, i); });
      }
      if (l > 0) {
        backward(n, r, l - 1);
      } else {
        startRound(n, r + 1);
      }
    });
  }
  void pushIn(int G, int r, size_t i) {
    // Summed into the group's round on the loop; the k-th applies SGD: the update reads the
    // sum, the momentum buffer and the parameters and writes the last two (about three sums' work).
    const int shard = pairs_[i].shard;
    const double bytes = pairBytes(i);
    net_.onLoop(
        shard, [this, bytes] { return sumRate_ > 0 ? bytes / sumRate_ : 0.0; },
        [this, G, r, i, shard, bytes] {
          if (++pushed_[static_cast<size_t>(G)][static_cast<size_t>(r)][i] < k_) return;
          net_.onLoop(
              shard, [this, bytes] { return sumRate_ > 0 ? 3 * bytes / sumRate_ : 0.0; },
              [this, G, r, i] {
                applied_[static_cast<size_t>(G)][i] = r;
                if (r + 1 <= kRounds) answer(G, r + 1, i);
              });
        });
  }

  static constexpr int kFcServer = 0;
  const Workload& w_;
  const MergedFc* fc_;  // null: every layer on the shards
  int P_, g_, k_, L_;
  Sim sim_;
  KvLayout layout_;
  Network net_;
  std::vector<KvPair> pairs_;                                  // every pair of the model, in layer order
  std::vector<std::vector<std::vector<int>>> asked_, pushed_;  // [group][round][pair]
  std::vector<std::vector<int>> applied_, answered_;           // [group][pair]: the last round applied / answered
  std::vector<std::vector<int>> got_;                          // [node][round]: replies in
  std::vector<std::vector<int>> ready_;                        // [node][round]: of replies in, backward done
  std::vector<std::vector<double>> roundStart_;                // [node][round]
  std::vector<std::vector<int>> fcArrived_;                    // [group][round]: activations at the FC server
  double fcFree_ = 0;                                          // when the FC server is next free
  double sumRate_ = 0;
};

}  // namespace

GroupPrediction runGroupModel(const Workload& workload, const Cluster& cluster, int groups, const MergedFc* mergedFc) {
  return GroupModel(workload, cluster, groups, mergedFc).run();
}

}  // namespace poseidon::planner::detail
