#include "poseidon/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <queue>

#include "poseidon/bench/emulation.h"
#include "poseidon/common/device_model.h"
#include "poseidon/common/error.h"
#include "poseidon/core/best_scheme.h"

namespace poseidon::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// How much of one connection's bytes TCP sends before another's get a turn on a shared link, at
// full width (scaled by s^2 like the messages); finer only costs events.
constexpr double kTcpQuantumBytes = 256 * 1024;
// Fragments a priority link's connection holds past the scheduler: ZeroMQ's pipe, its encoder,
// and the kernel's send buffer (the window, doubled by Linux).
constexpr size_t kConnectionDepth = 4;

const std::vector<std::pair<System, const char*>>& systemNames() {
  static const std::vector<std::pair<System, const char*>> names{{System::kPoseidon, "poseidon"},
                                                                 {System::kPoseidonOverlap, "poseidon-overlap"},
                                                                 {System::kPsWfbp, "ps-wfbp"},
                                                                 {System::kPsNaive, "ps-naive"},
                                                                 {System::kDdp, "ddp"}};
  return names;
}

// ---- the event loop --------------------------------------------------------

class Sim {
 public:
  using Fn = std::function<void()>;
  double now() const { return now_; }
  void at(double t, Fn fn) {
    heap_.push_back(Event{t, seq_++, std::move(fn)});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<Event>());
  }
  void run() {
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<Event>());
      Event e = std::move(heap_.back());
      heap_.pop_back();
      now_ = e.t;
      e.fn();
    }
  }

 private:
  struct Event {
    double t;
    uint64_t seq;
    Fn fn;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::vector<Event> heap_;  // a min-heap by (time, order of scheduling)
  double now_ = 0;
  uint64_t seq_ = 0;
};

// Queued work goes by (priority, arrival): a lower priority value first, FIFO among equals.
struct Order {
  int64_t priority;
  uint64_t seq;
  bool operator>(const Order& o) const { return priority != o.priority ? priority > o.priority : seq > o.seq; }
};

// One thing that serves one job at a time at `rate` units per second (a link direction, a thread):
// the job with the lowest (priority, arrival) goes next, served in chunks of at most `chunk` units
// so that a more urgent job waits for one chunk at most (the priority links' fragments). A job
// may instead learn its length when it starts (a thread that waits for another's timeline).
class Server {
 public:
  // Called as each chunk starts, with its end; `last` for a job's final chunk.
  using ChunkFn = std::function<void(double start, double end, double units, bool last)>;
  Server(Sim* sim, double rate, double chunk = kInf) : sim_(sim), rate_(rate), chunk_(chunk) {}
  void submit(double units, int64_t priority, ChunkFn fn) {
    queue_.push(Job{{priority, seq_++}, units, nullptr, std::move(fn)});
    if (!busy_) startNext();
  }
  // A job of `seconds()` (asked when it starts), then `then` when it ends.
  void submitTimed(std::function<double()> seconds, int64_t priority, Sim::Fn then) {
    queue_.push(Job{
        {priority, seq_++},
        0,
        std::move(seconds),
        [this, then = std::move(then)](double, double end, double, bool) mutable { sim_->at(end, std::move(then)); }});
    if (!busy_) startNext();
  }

 private:
  struct Job : Order {
    double left;
    std::function<double()> seconds;
    ChunkFn fn;
  };
  void startNext() {
    if (queue_.empty()) {
      busy_ = false;
      return;
    }
    busy_ = true;
    Job job = queue_.top();
    queue_.pop();
    const double start = sim_->now();
    double units, end;
    if (job.seconds) {
      units = job.left = 0;
      end = start + std::max(0.0, job.seconds());
    } else {
      units = std::min(job.left, chunk_);
      end = start + (rate_ > 0 ? units / rate_ : 0.0);
      job.left -= units;
    }
    const bool last = job.left <= 0;
    job.fn(start, end, units, last);
    sim_->at(end, [this, job = std::move(job), last]() mutable {
      if (!last) queue_.push(std::move(job));
      startNext();
    });
  }
  Sim* sim_;
  double rate_, chunk_;
  bool busy_ = false;
  uint64_t seq_ = 0;
  std::priority_queue<Job, std::vector<Job>, std::greater<Job>> queue_;
};

// A node's egress: one connection per peer, the link shared between the connections that have
// bytes to send, `chunk` at a time in turn (as TCP shares it between its flows). Each connection
// sends what was committed to it in order; the rest waits in a queue by (priority, arrival) and is
// committed a chunk at a time while the connection holds fewer than `depth` chunks (0: no limit,
// everything is committed as it comes: a FIFO connection). With priority links the depth is what
// ZeroMQ's pipe, its encoder and the kernel's send window hold (transport/van.h), so an urgent
// message waits behind a few fragments on its connection, not behind everything queued for it.
class Egress {
 public:
  Egress(Sim* sim, double rate, double chunk, size_t depth) : sim_(sim), rate_(rate), chunk_(chunk), depth_(depth) {}
  void submit(int peer, double units, int64_t priority, Server::ChunkFn fn) {
    Flow& f = flows_[peer];
    f.pending.push(Job{{priority, seq_++}, units, std::make_shared<Server::ChunkFn>(std::move(fn))});
    commit(peer, f);
    if (!busy_) startNext();
  }

 private:
  struct Job : Order {
    double left;
    std::shared_ptr<Server::ChunkFn> fn;
  };
  struct Chunk {
    double units;
    bool last;
    std::shared_ptr<Server::ChunkFn> fn;
  };
  struct Flow {
    std::priority_queue<Job, std::vector<Job>, std::greater<Job>> pending;
    std::deque<Chunk> committed;
    bool inRing = false;
  };
  void commit(int peer, Flow& f) {
    while (!f.pending.empty() && (depth_ == 0 || f.committed.size() < depth_)) {
      Job job = f.pending.top();
      f.pending.pop();
      const double units = std::min(job.left, chunk_);
      job.left -= units;
      f.committed.push_back(Chunk{units, job.left <= 0, job.fn});
      if (job.left > 0) f.pending.push(std::move(job));
    }
    if (!f.committed.empty() && !f.inRing) {
      f.inRing = true;
      ring_.push_back(peer);
    }
  }
  void startNext() {
    if (ring_.empty()) {
      busy_ = false;
      return;
    }
    busy_ = true;
    const int peer = ring_.front();
    ring_.pop_front();
    Flow& f = flows_[peer];
    f.inRing = false;
    Chunk chunk = std::move(f.committed.front());
    f.committed.pop_front();
    const double start = sim_->now(), end = start + (rate_ > 0 ? chunk.units / rate_ : 0.0);
    (*chunk.fn)(start, end, chunk.units, chunk.last);
    sim_->at(end, [this, peer] {
      Flow& flow = flows_[peer];
      commit(peer, flow);  // the connection took this chunk: room for one more
      startNext();
    });
  }
  Sim* sim_;
  double rate_, chunk_;
  size_t depth_;
  bool busy_ = false;
  uint64_t seq_ = 0;
  std::map<int, Flow> flows_;
  std::deque<int> ring_;  // connections with committed chunks, in turn
};

// The nodes' links and threads, as the runtime uses them:
//  - a worker's send is encrypted (CURVE) on the I/O thread of its connection, then takes its turn
//    on the sender's egress and streams into the receiver's ingress (both ends at the link rate:
//    the ingress serves it from when the egress starts it, in arrival order; with priority links,
//    by priority: their small send windows keep the less urgent bytes queued at the senders, so
//    an urgent fragment waits for little at the receiver);
//  - the receiver's I/O thread decrypts it (after the messages before it on that thread); its one
//    receive loop (client/node.cc) then takes it, and for a push to the shard also adds it and, with
//    the last worker's push, sends the sum to each worker (Node::sendAll; each is encrypted by an
//    I/O thread, not on the loop): that work runs next on the loop, before the next message;
//  - the transport charges encryption per connection, 2 p out to peer p and 2 p + 1 in from it, on
//    I/O thread (connection mod lanes), one message after another (bench/device.h): with
//    two, every send is encrypted on one and every receive on the other.
class Network {
 public:
  Network(Sim* sim, const Cluster& c, bool prioritized, int firstMeasured, int endMeasured)
      : sim_(sim),
        c_(c),
        crypto_(c.cryptoBytes * c.scale * c.scale),
        first_(firstMeasured),
        end_(endMeasured),
        tx_(static_cast<size_t>(c.workers), 0.0),
        laneFree_(static_cast<size_t>(c.workers),
                  std::vector<double>(static_cast<size_t>(std::max(1, c.cryptoLanes)), 0.0)) {
    // The runtime's smallest window is 4096 bytes (the bench's floor at width s).
    fragmentBytes_ = prioritized ? std::max(4096.0, c.sendWindowBytes * c.scale * c.scale) : kInf;
    const double chunk = prioritized ? fragmentBytes_ : std::max(1.0, kTcpQuantumBytes * c.scale * c.scale);
    for (int n = 0; n < c.workers; ++n) {
      egress_.emplace_back(sim, c.linkBytes, chunk, prioritized ? kConnectionDepth : 0);
      ingress_.emplace_back(sim, c.linkBytes);
      loop_.emplace_back(sim, 1.0);
    }
  }
  // Lower priority values go first on a prioritized egress; FIFO otherwise. The caller goes on: the
  // message reaches the egress once its I/O thread has encrypted it.
  void send(int iteration, int src, int dst, double payload, int64_t priority, Sim::Fn deliver) {
    if (src == dst) {  // our own copy costs no network time, but the receive loop handles it like any other
      loop_[static_cast<size_t>(dst)].submitTimed([this] { return c_.messageSeconds; }, 0, std::move(deliver));
      return;
    }
    const double headered = this->headered(payload);
    const double fragments = std::isinf(fragmentBytes_) ? 1.0 : std::ceil(headered / fragmentBytes_);
    const double onLink = payload * c_.linkOverhead + c_.messageBytes * fragments;
    if (iteration >= first_ && iteration < end_) tx_[static_cast<size_t>(src)] += onLink;
    const int64_t order = fragmentBytes_ < kInf ? priority : 0;
    auto onWire = [this, src, dst, onLink, headered, order, deliver = std::move(deliver)]() mutable {
      Server::ChunkFn chunk = [this, src, dst, headered, order, deliver = std::move(deliver)](
                                  double, double, double units, bool last) mutable {
        Sim::Fn arrived;
        if (last)
          arrived = [this, src, dst, headered, deliver = std::move(deliver)]() mutable {
            // Decrypted by the I/O thread of the connection (after the ones before it), then handled
            // by the receive loop, which takes other messages meanwhile (transport/van.cc).
            auto handle = [this, dst, deliver = std::move(deliver)]() mutable {
              loop_[static_cast<size_t>(dst)].submitTimed([this] { return c_.messageSeconds; }, 0, std::move(deliver));
            };
            const double decrypt = encryption(dst, 2 * src + 1, headered);
            if (decrypt > 0)
              sim_->at(sim_->now() + decrypt, std::move(handle));
            else
              handle();
          };
        ingress_[static_cast<size_t>(dst)].submit(
            units, 0, [this, arrived = std::move(arrived)](double, double end, double, bool) mutable {
              if (arrived) sim_->at(end, std::move(arrived));
            });
      };
      egress_[static_cast<size_t>(src)].submit(dst, onLink, order, std::move(chunk));
    };
    if (crypto_ > 0) {
      sim_->at(sim_->now() + encryption(src, 2 * dst, headered), std::move(onWire));
    } else {
      onWire();
    }
  }
  // Work on `node`'s receive loop right after the message it handles: `seconds()` asked when it starts.
  void onLoop(int node, std::function<double()> seconds, Sim::Fn then) {
    loop_[static_cast<size_t>(node)].submitTimed(std::move(seconds), -1, std::move(then));
  }
  // Seconds from now until a message of `bytes` on `connection` is encrypted (or decrypted) by
  // its I/O thread, after the ones before it; 0 without encryption.
  double encryption(int node, int connection, double bytes) {
    if (crypto_ <= 0) return 0;
    auto& lanes = laneFree_[static_cast<size_t>(node)];
    double& free = lanes[static_cast<size_t>(connection) % lanes.size()];
    free = std::max(free, sim_->now()) + bytes / crypto_;
    return free - sim_->now();
  }
  double headered(double payload) const { return payload + c_.messageBytes; }
  // Link bytes each node sent in the measured iterations.
  const std::vector<double>& txBytes() const { return tx_; }

 private:
  Sim* sim_;
  const Cluster& c_;
  double crypto_;  // bytes/s at the workload's scale
  int first_, end_;
  double fragmentBytes_ = kInf;
  std::vector<double> tx_;
  std::vector<Egress> egress_;
  std::vector<Server> ingress_, loop_;
  std::vector<std::vector<double>> laneFree_;  // [node][I/O thread]: busy until
};

// Poseidon's systems: every node a worker and a shard, BSP, each layer's sync by its scheme.
class PoseidonModel {
 public:
  PoseidonModel(const Workload& w, const Cluster& c, System system)
      : w_(w),
        c_(c),
        system_(system),
        P_(c.workers),
        L_(static_cast<int>(w.model.layers.size())),
        overlap_(system == System::kPoseidonOverlap),
        wfbp_(system != System::kPsNaive),
        iterations_(overlap_ ? 6 : 4),
        warm_(2),
        layout_(w.model, c.workers,
                std::max<int64_t>(4096, std::llround(static_cast<double>(c.pairBytes) * c.scale * c.scale))),
        net_(&sim_, c, overlap_, warm_, iterations_),
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
      schemes_.push_back(
          bestScheme(l, w.batch, P_, P_, policy, c.timedSchemes ? &device : nullptr, wireElementBytes(c.wire)));
      sfbLayers_ += schemes_.back() == Scheme::kSFB;
    }
    for (int n = 0; n < P_; ++n) gemm_.emplace_back(&sim_, c.gemmFlops / w.flopScale);
    sumRate_ = c.sumBytes * c.scale * c.scale;
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
    forwardStart_.assign(static_cast<size_t>(P_), std::vector<double>(I + 1, 0.0));
  }

  Prediction run() {
    for (int n = 0; n < P_; ++n) startForward(n, 0);
    sim_.run();
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
  int64_t priority(int it, int layer) const { return static_cast<int64_t>(it) * L_ + layer; }

  void startForward(int n, int it) {
    forwardStart_[static_cast<size_t>(n)][static_cast<size_t>(it)] = sim_.now();
    if (it == iterations_) return;
    if (overlap_ && it > 0) {
      forwardLayer(n, it, 0);
      return;
    }
    double f = 0;
    for (double s : w_.forwardSeconds) f += s;
    sim_.at(sim_.now() + f, [this, n, it] { backward(n, it, L_ - 1); });
  }
  // poseidon-overlap: layer l's forward waits for layer l's sync of the iteration before.
  void forwardLayer(int n, int it, int l) {
    if (l == L_) {
      backward(n, it, L_ - 1);
      return;
    }
    auto go = [this, n, it, l] {
      sim_.at(sim_.now() + w_.forwardSeconds[static_cast<size_t>(l)], [this, n, it, l] { forwardLayer(n, it, l + 1); });
    };
    if (doneThrough_[at(n, l)] >= it - 1) {
      go();
    } else {
      waiting_[at(n, l)] = go;
    }
  }
  void backward(int n, int it, int l) {
    sim_.at(sim_.now() + w_.backwardSeconds[static_cast<size_t>(l)], [this, n, it, l] {
      if (wfbp_) submit(n, it, l);
      if (l > 0) {
        backward(n, it, l - 1);
        return;
      }
      if (!wfbp_)
        for (int k = L_ - 1; k >= 0; --k) submit(n, it, k);
      if (overlap_) startForward(n, it + 1);
    });
  }
  void submit(int n, int it, int l) {
    const LayerSpec& spec = w_.model.layers[static_cast<size_t>(l)];
    if (schemes_[static_cast<size_t>(l)] == Scheme::kSFB) {
      const double bytes = static_cast<double>(w_.batch) * static_cast<double>(spec.m + spec.n) * elementBytes_;
      for (int v = 0; v < P_; ++v) {
        if (v != n) net_.send(it, n, v, bytes, priority(it, l), [this, v, it, l] { factorsIn(v, it, l); });
      }
      net_.send(it, n, n, bytes, priority(it, l), [this, n, it, l] { factorsIn(n, it, l); });  // peers first
      return;
    }
    const auto& pairs = layout_.pairsOf(l);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const KvPair& p = pairs[i];
      const int64_t id = firstPair_[static_cast<size_t>(l)] + static_cast<int64_t>(i);
      net_.send(it, n, p.shard, static_cast<double>(p.length) * elementBytes_, priority(it, l),
                [this, p, id, it, l] { pushIn(p, id, it, l); });
    }
  }
  void pushIn(const KvPair& p, int64_t id, int it, int l) {
    // The shard's receive loop widens and adds each push in fp32, and with the last worker's push
    // encrypts the sum for each worker in turn and sends it.
    const int shard = p.shard;
    const double bytes = static_cast<double>(p.length) * elementBytes_;
    net_.onLoop(
        shard, [this, p] { return sumRate_ > 0 ? static_cast<double>(p.length) * sizeof(float) / sumRate_ : 0.0; },
        [this, shard, bytes, id, it, l] {
          if (++pushes_[static_cast<size_t>(it)][static_cast<size_t>(id)] < P_) return;
          for (int v = 0; v < P_; ++v) {
            Sim::Fn deliver = [this, v, it, l] { aggregateIn(v, it, l); };
            // Encrypted by the I/O thread of the connection, not on the loop (transport/van.cc).
            net_.send(it, shard, v, bytes, priority(it, l), std::move(deliver));
          }
        });
  }
  void aggregateIn(int n, int it, int l) {
    if (++arrived_[static_cast<size_t>(it)][at(n, l)] == static_cast<int>(layout_.pairsOf(l).size()))
      layerDone(n, it, l);
  }
  void factorsIn(int n, int it, int l) {
    if (++arrived_[static_cast<size_t>(it)][at(n, l)] < P_) return;
    const LayerSpec& spec = w_.model.layers[static_cast<size_t>(l)];
    const double flops =
        2.0 * static_cast<double>(w_.batch) * P_ * static_cast<double>(spec.m) * static_cast<double>(spec.n);
    gemm_[static_cast<size_t>(n)].submit(flops, 0, [this, n, it, l](double, double end, double, bool) {
      sim_.at(end, [this, n, it, l] { layerDone(n, it, l); });
    });
  }
  void layerDone(int n, int it, int l) {
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
  int P_, L_;
  bool overlap_, wfbp_;
  int iterations_, warm_;
  Sim sim_;
  KvLayout layout_;
  Network net_;
  double elementBytes_;
  std::vector<Scheme> schemes_;
  int sfbLayers_ = 0;
  std::vector<Server> gemm_;
  double sumRate_ = 0;  // the shards' sums, bytes/s at the workload's scale
  std::vector<int64_t> firstPair_;
  std::vector<std::vector<int>> pushes_, arrived_,
      left_;                                       // [iteration][pair], [iteration][node, layer], [iteration][node]
  std::vector<int> doneThrough_;                   // [node, layer]: the last iteration synchronized
  std::vector<Sim::Fn> waiting_;                   // [node, layer]: a forward waiting for it
  std::vector<std::vector<double>> forwardStart_;  // [node][iteration]
};

// Omnivore's compute groups (kvstore/model_shard.h): g groups of k = P / g workers, every node a
// worker and a shard that holds its pairs' parameters and runs SGD. A round of a member: it asks
// every pair's shard for the parameters (a header-only pull), the shard answers the k members
// once all k asked and the group's previous update of the pair is applied (encrypting a reply for
// each member on its receive loop, as Node::sendAll), the member computes once the whole model is
// in (the eager pull), pushes each layer's dense gradient as its backward ends (WFBP), and asks for
// the next round's parameters as soon as the backward is done. A shard sums each push on its loop
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
        layout_(w.model, c.workers,
                std::max<int64_t>(4096, std::llround(static_cast<double>(c.pairBytes) * c.scale * c.scale))),
        net_(&sim_, c, /*prioritized=*/false, kWarmRounds, kRounds) {
    for (int l = 0; l < L_; ++l)
      for (const KvPair& p : layout_.pairsOf(l)) pairs_.push_back(p);
    const size_t G = static_cast<size_t>(g_), R = static_cast<size_t>(kRounds) + 1, N = pairs_.size();
    asked_.assign(G, std::vector<std::vector<int>>(R, std::vector<int>(N, 0)));
    pushed_ = asked_;
    applied_.assign(G, std::vector<int>(N, -1));
    answered_.assign(G, std::vector<int>(N, -1));
    got_.assign(static_cast<size_t>(P_), 0);
    roundStart_.assign(static_cast<size_t>(P_), std::vector<double>(R, 0.0));
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

  void startRound(int n, int r) {
    roundStart_[static_cast<size_t>(n)][static_cast<size_t>(r)] = sim_.now();
    if (r == kRounds) return;
    got_[static_cast<size_t>(n)] = 0;
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
    if (++got_[static_cast<size_t>(n)] < static_cast<int>(pairs_.size())) return;
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
  std::vector<int> got_;                                       // [node]: replies in for its current round
  std::vector<std::vector<double>> roundStart_;                // [node][round]
  std::vector<std::vector<int>> fcArrived_;                    // [group][round]: activations at the FC server
  double fcFree_ = 0;                                          // when the FC server is next free
  double sumRate_ = 0;
};

// DDP: buckets in backward order, each ring-allreduced once its last gradient is ready, one at a time.
Prediction predictDdp(const Workload& w, const Cluster& c) {
  const int P = c.workers;
  const double s2 = c.scale * c.scale;
  const size_t L = w.model.layers.size();
  double forward = 0;
  for (double f : w.forwardSeconds) forward += f;
  std::vector<double> backwardEnd(L);
  double t = forward;
  for (size_t l = L; l-- > 0;) backwardEnd[l] = (t += w.backwardSeconds[l]);
  // torch's bucketing: parameters in reverse order; a bucket closes once it reaches its cap.
  struct Bucket {
    double bytes = 0, ready = 0;
  };
  std::vector<Bucket> buckets(1);
  for (size_t l = L; l-- > 0;) {
    const auto& params = w.model.layers[l].params;
    for (size_t k = params.size(); k-- > 0;) {
      const double cap = (buckets.size() == 1 ? c.ddpFirstBucketBytes : c.ddpBucketBytes) * s2;
      if (buckets.back().bytes >= cap) buckets.emplace_back();
      buckets.back().bytes += static_cast<double>(params[k].numel()) * sizeof(float);
      buckets.back().ready = backwardEnd[l];
    }
  }
  Prediction p;
  double end = t, tx = 0;
  if (P > 1) {
    double free = 0;
    for (const auto& b : buckets) {
      const double onLink = 2.0 * (P - 1) / P * b.bytes * c.linkOverhead + 2.0 * (P - 1) * c.messageBytes;
      const double start = std::max(b.ready, free);
      free = start + onLink / c.linkBytes + 2.0 * (P - 1) * c.ddpStepSeconds;
      tx += onLink;
    }
    end = std::max(end, free);
  }
  p.iterationSeconds = end;
  p.maxNodeTxBytes = tx;
  return p;
}

}  // namespace

const char* systemName(System s) {
  for (const auto& [sys, name] : systemNames())
    if (sys == s) return name;
  return "?";
}

System parseSystem(const std::string& text) {
  std::string known;
  for (const auto& [sys, name] : systemNames()) {
    if (text == name) return sys;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw InvalidArgument("unknown system '" + text + "' (the planner models " + known + ")");
}

const std::vector<System>& allSystems() {
  static const std::vector<System> all = [] {
    std::vector<System> v;
    for (const auto& [sys, name] : systemNames()) v.push_back(sys);
    return v;
  }();
  return all;
}

double Workload::computeSeconds() const {
  double t = 0;
  for (size_t i = 0; i < forwardSeconds.size(); ++i) t += forwardSeconds[i] + backwardSeconds[i];
  return t;
}

Workload zooWorkload(const std::string& name, double scale) {
  bench::EmulatedModel m = bench::emulatedModel(name, scale);
  Workload w;
  w.model = std::move(m.desc);
  w.batch = m.batch;
  w.forwardSeconds = std::move(m.forwardSeconds);
  w.backwardSeconds = std::move(m.backwardSeconds);
  w.flopScale = static_cast<double>(m.fullBatch) / static_cast<double>(m.batch) / (scale * scale);
  return w;
}

Workload workloadFor(ModelDesc model, int64_t batch, double iterationSeconds) {
  if (model.layers.empty()) throw InvalidArgument("model '" + model.name + "' has no layers");
  if (batch < 1) throw InvalidArgument("the batch must be at least 1");
  if (!(iterationSeconds > 0)) throw InvalidArgument("the single-worker iteration time must be > 0");
  double total = 0;
  for (const auto& l : model.layers) total += static_cast<double>(l.macsPerSample);
  Workload w;
  for (const auto& l : model.layers) {
    const double share = total > 0 ? static_cast<double>(l.macsPerSample) / total : 1.0 / model.layers.size();
    w.forwardSeconds.push_back(iterationSeconds * share / 3.0);
    w.backwardSeconds.push_back(iterationSeconds * share * 2.0 / 3.0);
  }
  w.model = std::move(model);
  w.batch = batch;
  return w;
}

Workload paddedWorkload(ModelDesc model, int64_t batch, double seconds) {
  Workload w = workloadFor(std::move(model), batch, seconds);
  for (size_t l = 0; l < w.forwardSeconds.size(); ++l) {
    w.forwardSeconds[l] += w.backwardSeconds[l];
    w.backwardSeconds[l] = 0;
  }
  return w;
}

// What every model needs of its inputs (InvalidArgument otherwise).
Cluster emulatedCluster(const Cluster& calibration, int workers, double mbit, int hostCores) {
  Cluster c = calibration;
  c.workers = workers;
  c.linkBytes = mbit * 1e6 / 8 * kEmulatedLinkEfficiency;
  c.messageSeconds = calibration.messageSeconds * std::max(1.0, static_cast<double>(workers) / std::max(1, hostCores));
  return c;
}

static void checkInputs(const Workload& workload, const Cluster& cluster) {
  if (cluster.workers < 1) throw InvalidArgument("the planner needs at least one worker");
  if (workload.forwardSeconds.size() != workload.model.layers.size() ||
      workload.backwardSeconds.size() != workload.model.layers.size()) {
    throw InvalidArgument("the workload's compute times do not match its layers");
  }
  if (cluster.workers > 1 && !(cluster.linkBytes > 0)) throw InvalidArgument("the planner needs a link rate > 0");
  if (!(cluster.scale > 0 && cluster.scale <= 1)) throw InvalidArgument("the width scale must be in (0, 1]");
}

Prediction predict(const Workload& workload, const Cluster& cluster, System system) {
  checkInputs(workload, cluster);
  Prediction p;
  if (system == System::kDdp) {
    p = predictDdp(workload, cluster);
  } else if (cluster.workers == 1) {
    p.iterationSeconds = workload.computeSeconds();
  } else {
    p = PoseidonModel(workload, cluster, system).run();
  }
  p.system = system;
  p.workers = cluster.workers;
  p.computeSeconds = workload.computeSeconds();
  p.iterationSeconds = std::max(p.iterationSeconds, p.computeSeconds);
  p.speedup = cluster.workers * p.computeSeconds / p.iterationSeconds;
  p.efficiency = p.speedup / cluster.workers;
  p.boundSeconds = std::max(p.computeSeconds, cluster.workers > 1 ? p.maxNodeTxBytes / cluster.linkBytes : 0.0);
  return p;
}

std::pair<Workload, MergedFc> splitMergedFc(const Workload& w) {
  const size_t L = w.model.layers.size();
  size_t first = L;
  while (first > 0 && w.model.layers[first - 1].type == LayerType::kFC) --first;
  if (first == L) throw InvalidArgument(strCat("model ", w.model.name, " has no FC layers at its top to merge"));
  if (first == 0) throw InvalidArgument(strCat("model ", w.model.name, " is all FC: nothing is left on the workers"));
  Workload rest = w;
  rest.model.layers.resize(first);
  rest.forwardSeconds.resize(first);
  rest.backwardSeconds.resize(first);
  MergedFc fc;
  fc.activationFloats = static_cast<double>(w.model.layers[first].n);  // weight m x n: n is the input width
  double seconds = 0;
  for (size_t l = first; l < L; ++l) seconds += w.forwardSeconds[l] + w.backwardSeconds[l];
  fc.serverSecondsPerSample = seconds / static_cast<double>(std::max<int64_t>(1, w.batch));
  return {std::move(rest), fc};
}

std::pair<Workload, MergedFc> paddedMergedFc(const ModelDesc& model, int64_t batch, double seconds,
                                             double serverSecondsPerSample) {
  auto [workers, fc] = splitMergedFc(workloadFor(model, batch, 1.0));
  fc.serverSecondsPerSample = serverSecondsPerSample;
  return {paddedWorkload(workers.model, batch, seconds), fc};
}

GroupPrediction predictGroups(const Workload& workload, const Cluster& cluster, int groups, const MergedFc* mergedFc) {
  checkInputs(workload, cluster);
  if (groups < 1 || cluster.workers % groups != 0)
    throw InvalidArgument(strCat(groups, " compute groups do not divide ", cluster.workers, " workers"));
  GroupPrediction p;
  if (cluster.workers == 1 && !mergedFc) {
    p.groups = p.groupSize = 1;
    p.stepSeconds = p.updateSeconds = workload.computeSeconds();
    p.samplesPerSecond = static_cast<double>(workload.batch) / p.stepSeconds;
  } else {
    p = GroupModel(workload, cluster, groups, mergedFc).run();
  }
  p.computeSeconds = workload.computeSeconds();
  return p;
}

double minLinkBytesFor(const Workload& workload, Cluster cluster, System system, double efficiency) {
  if (cluster.workers == 1) return 0;
  auto reaches = [&](double rate) {
    cluster.linkBytes = rate;
    return predict(workload, cluster, system).efficiency >= efficiency;
  };
  double hi = 1e6;
  while (!reaches(hi)) {
    hi *= 4;
    if (hi > 1e15) return kInf;
  }
  double lo = hi / 4;
  bool loReaches = reaches(lo);
  while (lo > 1 && loReaches) {
    lo /= 4;
    loReaches = reaches(lo);
  }
  if (loReaches) return lo;
  while (hi / lo > 1.005) {
    const double mid = std::sqrt(lo * hi);
    (reaches(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace poseidon::planner
