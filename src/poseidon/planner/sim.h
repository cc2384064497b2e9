// The planner's internals: a discrete-event loop and the network model every prediction runs on
// (poseidon_model.cc's PoseidonModel and group_model.cc's GroupModel build on them). Not installed API.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <vector>

#include "poseidon/bench/emulation.h"
#include "poseidon/common/device_model.h"
#include "poseidon/common/error.h"
#include "poseidon/planner/planner.h"

namespace poseidon::planner::detail {

constexpr double kInf = std::numeric_limits<double>::infinity();
// How much of one connection's bytes TCP sends before another's get a turn on a shared link, at
// full width (scaled by s^2 like the messages); finer only costs events.
constexpr double kTcpQuantumBytes = 256 * 1024;
// Fragments a priority link's connection holds past the scheduler: ZeroMQ's pipe, its encoder,
// and the kernel's send buffer (the window, doubled by Linux).
constexpr size_t kConnectionDepth = 4;

// A node's mark (the time it began an iteration or round) before it gets there.
constexpr double kUnreached = -1;
// A model's marks, [node][iteration or round], after its Sim ran out of events. A node that never
// began the last is a deadlock in the model (its protocol or its links), which must not pass for a
// prediction: the iteration time would be read off the marks the node did reach.
inline void requireEveryNodeFinished(const std::vector<std::vector<double>>& marks, const char* model) {
  for (size_t n = 0; n < marks.size(); ++n) {
    if (marks[n].empty() || marks[n].back() != kUnreached) continue;
    size_t reached = 0;  // marks set: the starts of iterations 0..reached-1
    while (reached < marks[n].size() && marks[n][reached] != kUnreached) ++reached;
    throw Error(strCat("the planner's model of ", model, " stalled: node ", n, " finished ",
                       reached > 0 ? reached - 1 : 0, " of its ", marks[n].size() - 1,
                       " iterations and then nothing was left to run (a bug in the planner, not a prediction; "
                       "please report it with the command line)"));
  }
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

// A thread that works one job after another, busy until `free`: `seconds` more of work queued
// behind what it has; returns the seconds from `now` to that work's end.
inline double occupy(double& free, double now, double seconds) {
  free = std::max(free, now) + seconds;
  return free - now;
}

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

// A node's egress: one connection per peer (keyed by the peer; urgentFlow(peer) for its urgent
// connection, Network::send), the link shared between the connections that have
// bytes to send, `chunk` at a time in turn (as TCP shares it between its flows). Each connection
// sends what was committed to it in order; the rest waits in a queue by (priority, arrival) and is
// committed a chunk at a time while the connection holds fewer than `depth` chunks (0: no limit,
// everything is committed as it comes: a FIFO connection). With priority links the depth is what
// ZeroMQ's pipe, its encoder and the kernel's send window hold (transport/van.h), so an urgent
// message waits behind a few fragments on its connection, not behind everything queued for it.
// `lowDelayFirst`: the urgent connections' chunks go before any other (a two-band queue, as Linux's
// pfifo_fast serves packets marked TOS low-delay; Cluster::lowDelayFirst), in turn among themselves.
class Egress {
 public:
  Egress(Sim* sim, double rate, double chunk, size_t depth, bool lowDelayFirst = false)
      : sim_(sim), rate_(rate), chunk_(chunk), depth_(depth), lowDelayFirst_(lowDelayFirst) {}
  // The key of `peer`'s urgent connection (peers are >= 0, so urgent keys are the negative ones).
  static int urgentFlow(int peer) { return -1 - peer; }
  static bool isUrgentFlow(int key) { return key < 0; }
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
      (lowDelayFirst_ && isUrgentFlow(peer) ? lowDelay_ : ring_).push_back(peer);
    }
  }
  void startNext() {
    std::deque<int>& band = lowDelay_.empty() ? ring_ : lowDelay_;
    if (band.empty()) {
      busy_ = false;
      return;
    }
    busy_ = true;
    const int peer = band.front();
    band.pop_front();
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
  bool lowDelayFirst_;
  bool busy_ = false;
  uint64_t seq_ = 0;
  std::map<int, Flow> flows_;
  std::deque<int> ring_;      // connections with committed chunks, in turn
  std::deque<int> lowDelay_;  // with lowDelayFirst_: the urgent ones among them, served first
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
    fragmentBytes_ = prioritized ? std::max(4096.0, sendWindowFor(c) * c.scale * c.scale) : kInf;
    const double chunk = prioritized ? fragmentBytes_ : std::max(1.0, kTcpQuantumBytes * c.scale * c.scale);
    if (prioritized) links_ = c.links;
    if (links_ == Cluster::Links::kCredits) {
      creditWindow_ = c.creditWindowBytes * c.scale * c.scale;
      grantSeconds_ = c.linkBytes > 0 ? fragmentBytes_ / c.linkBytes : 0;
      receivers_.resize(static_cast<size_t>(c.workers));
    }
    // Outside as-built links one queue holds all of a node's connections, one fragment committed.
    const size_t depth = !prioritized ? 0 : links_ == Cluster::Links::kAsBuilt ? kConnectionDepth : 1;
    for (int n = 0; n < c.workers; ++n) {
      egress_.emplace_back(sim, c.linkBytes, chunk, depth, c.lowDelayFirst);
      ingress_.emplace_back(sim, c.linkBytes);
      loop_.emplace_back(sim, 1.0);
    }
  }
  // Lower priority values go first on a prioritized egress; FIFO otherwise. The caller goes on: the
  // message reaches the egress once its I/O thread has encrypted it. `urgent`: on the peer's second
  // connection (Cluster::urgentLayers), a flow of its own on the egress; its encryption shares the
  // bulk connection's I/O thread, as the bench charges it (transport/charged_crypto.h).
  void send(int iteration, int src, int dst, double payload, int64_t priority, Sim::Fn deliver, bool urgent = false) {
    if (src == dst) {  // our own copy costs no network time, but the receive loop handles it like any other
      loop_[static_cast<size_t>(dst)].submitTimed([this] { return c_.messageSeconds; }, 0, std::move(deliver));
      return;
    }
    const double headered = this->headered(payload);
    const double fragments = std::isinf(fragmentBytes_) ? 1.0 : std::ceil(headered / fragmentBytes_);
    const double onLink = payload * c_.linkOverhead + c_.messageBytes * fragments;
    if (iteration >= first_ && iteration < end_) tx_[static_cast<size_t>(src)] += onLink;
    const int64_t order = fragmentBytes_ < kInf ? priority : 0;
    // With its last byte in: decrypted by the I/O thread of the connection (after the ones before it),
    // then handled by the receive loop, which takes other messages meanwhile (transport/van.cc).
    auto arrived = std::make_shared<Sim::Fn>([this, src, dst, headered, deliver = std::move(deliver)]() mutable {
      auto handle = [this, dst, deliver = std::move(deliver)]() mutable {
        loop_[static_cast<size_t>(dst)].submitTimed([this] { return c_.messageSeconds; }, 0, std::move(deliver));
      };
      const double decrypt = encryption(dst, 2 * src + 1, headered);
      if (decrypt > 0)
        sim_->at(sim_->now() + decrypt, std::move(handle));
      else
        handle();
    });
    auto onWire = [this, src, dst, onLink, order, urgent, arrived] {
      if (links_ == Cluster::Links::kCredits) {
        request(src, dst, onLink, order, arrived);
        return;
      }
      // Ideal links take the most urgent chunk first at the receiver too; as built, in arrival order,
      // the urgent connections' first where the switch ports honour their mark.
      const int64_t inOrder = links_ == Cluster::Links::kIdeal ? order : urgent && c_.switchLowDelayFirst ? -1 : 0;
      Server::ChunkFn chunk = [this, dst, inOrder, arrived](double, double, double units, bool last) {
        ingress_[static_cast<size_t>(dst)].submit(units, inOrder,
                                                  [this, last, arrived](double, double end, double, bool) {
                                                    if (last) sim_->at(end, [arrived] { (*arrived)(); });
                                                  });
      };
      // Outside as-built links a node's messages share one queue: its most urgent fragment goes next.
      const int flow = links_ != Cluster::Links::kAsBuilt ? 0 : urgent ? Egress::urgentFlow(dst) : dst;
      egress_[static_cast<size_t>(src)].submit(flow, onLink, order, std::move(chunk));
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
    return occupy(lanes[static_cast<size_t>(connection) % lanes.size()], sim_->now(), bytes / crypto_);
  }
  double headered(double payload) const { return payload + c_.messageBytes; }
  // Link bytes each node sent in the measured iterations.
  const std::vector<double>& txBytes() const { return tx_; }

 private:
  // Credit links (Cluster::Links::kCredits): a fragment the receiver has not yet granted.
  struct Request : Order {
    int src;
    double units;
    std::shared_ptr<Sim::Fn> arrived;  // on the message's last fragment
  };
  struct Receiver {
    std::priority_queue<Request, std::vector<Request>, std::greater<Request>> pending;
    double granted = 0;  // granted bytes not yet in
    int grants = 0;      // granted fragments not yet in: "none in flight" is this, not granted <= 0,
                         // since adding and removing fragment sizes leaves a rounding residue
  };
  // The sender asks `dst` for room for each fragment of the message.
  void request(int src, int dst, double units, int64_t order, const std::shared_ptr<Sim::Fn>& arrived) {
    Receiver& r = receivers_[static_cast<size_t>(dst)];
    for (double left = units; left > 0;) {
      const double u = std::min(left, fragmentBytes_);
      left -= u;
      r.pending.push(Request{{order, seq_++}, src, u, left <= 0 ? arrived : nullptr});
    }
    grant(dst);
  }
  // `dst` grants its most urgent requests while its window has room (one at least); each grant
  // reaches its sender grantSeconds_ later and joins the sender's one queue; the fragment's arrival
  // frees its room.
  void grant(int dst) {
    Receiver& r = receivers_[static_cast<size_t>(dst)];
    while (!r.pending.empty() && (r.grants == 0 || r.granted + r.pending.top().units <= creditWindow_)) {
      Request q = r.pending.top();
      r.pending.pop();
      r.granted += q.units;
      ++r.grants;
      sim_->at(sim_->now() + grantSeconds_, [this, dst, q] {
        egress_[static_cast<size_t>(q.src)].submit(
            0, q.units, q.priority, [this, dst, q](double, double, double units, bool) {
              ingress_[static_cast<size_t>(dst)].submit(units, 0, [this, dst, q](double, double end, double, bool) {
                sim_->at(end, [this, dst, q] {
                  Receiver& in = receivers_[static_cast<size_t>(dst)];
                  in.granted -= q.units;
                  --in.grants;
                  if (q.arrived) (*q.arrived)();
                  grant(dst);
                });
              });
            });
      });
    }
  }

  Sim* sim_;
  const Cluster& c_;
  double crypto_;  // bytes/s at the workload's scale
  int first_, end_;
  double fragmentBytes_ = kInf;
  Cluster::Links links_ = Cluster::Links::kAsBuilt;  // as built unless the links are prioritized
  double creditWindow_ = 0, grantSeconds_ = 0;       // kCredits, at the workload's scale
  uint64_t seq_ = 0;                                 // kCredits: requests' arrival order
  std::vector<Receiver> receivers_;                  // kCredits: [node]
  std::vector<double> tx_;
  std::vector<Egress> egress_;
  std::vector<Server> ingress_, loop_;
  std::vector<std::vector<double>> laneFree_;  // [node][I/O thread]: busy until
};

// Poseidon's systems on the simulated cluster (poseidon_model.cc), for P > 1 or several GPUs a node.
Prediction runPoseidonModel(const Workload& workload, const Cluster& cluster, System system);

// Omnivore's compute groups on the simulated cluster (group_model.cc).
GroupPrediction runGroupModel(const Workload& workload, const Cluster& cluster, int groups, const MergedFc* mergedFc);

}  // namespace poseidon::planner::detail
