// Node: one Poseidon process (rank). A worker, a server shard, or both.
//
// The node keeps the lifecycle and the routing; each role lives in its own
// component:
//   rendezvous + CURVE    Node::start (coordinator/, transport/security.h)
//   worker                one Syncer per layer (client/syncer.h) on a thread
//                         pool, and the BSP IterationBarrier
//   server                KvServer (kvstore/server.h): KV shard, Adam's
//                         server, SFB keeper; I/O-free, the node sends what
//                         it returns
//   collectives           Collectives (client/collectives.h)
//   compute groups        GroupClient (client/group_client.h): pulls of the
//                         server-held model (Omnivore)
//   merged FC             FcLink (client/fc_link.h): the FC server's link
//   liveness              Liveness (client/liveness.h), driven by the
//                         receive loop, which also routes every inbound frame
// Nothing is global: several nodes can live in one process (tests do that).
//
// Worker iteration protocol (paper Algorithm 2):
//   node.beginIteration(t);
//   forward; during backward, for l = L..1 as each gradient is final:
//     node.submitDense(l, grad)           // PS, or
//     node.submitFactors(l, U, V, K, out) // SFB (or Adam), when schemeFor(l) says so
//   node.waitIteration();   // BSP barrier: every layer's sync is done
//   the optimizer applies the synchronized mean gradients.
// or, overlapping the sync's tail with the next forward pass:
//   for l = 0..L-1: node.waitLayer(l); update layer l; its forward of t + 1
//   node.beginIteration(t + 1); backward as above
// submit*() only queue the layer's sync on the thread pool and return at once
// (wait-free backpropagation); sends of upper layers overlap the backward
// of lower ones.
//
// Failure is sticky (gloo-style): the first failure (a timeout, an abort
// from a peer, a transport error, a lost peer, a misuse) is kept with its type
// (StickyError) by Node::fail, the one place that records it; every later call
// rethrows it, and the reason is sent to every peer so they stop at once.
//
// Liveness: the receive loop sends a heartbeat to every peer each period and
// declares a peer lost when nothing (heartbeat or data) has come from it for
// `timeout`, naming it and its last-known iteration. A node leaving cleanly
// (finish) says bye first, so it is not mistaken for a lost one; one leaving
// without finish (destroyed, or its program exits: common/at_exit.h) sends
// its peers an abort that says so.
//
// Buffers: the caller's gradient and output buffers are read and written by
// the pool and the receive loop until the layer is done. Once a call on the
// user's thread throws the job's error, nothing touches them any more: the
// node first closes every Syncer and waits for running pool tasks, so the
// caller may free them as the exception unwinds.
//
// Threads and lock order (checked by the ThreadSanitizer build in CI):
//   user thread    beginIteration, submit*, waitIteration, collectives
//   receive loop   Van::poll, Liveness, KvServer, Syncer::on*
//   pool           Syncer sends and SFB reconstruction
// Every lock is a leaf except a Syncer's, which is never held while calling
// out: Syncer::mutex_, IterationBarrier, Collectives and StickyError mutexes
// are each released before their owner calls anything else, and a Van peer's
// mutex is innermost. fail() takes no lock of its caller's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "poseidon/client/collectives.h"
#include "poseidon/client/fc_link.h"
#include "poseidon/client/group_client.h"
#include "poseidon/client/iteration_barrier.h"
#include "poseidon/client/layer_buffer.h"
#include "poseidon/client/liveness.h"
#include "poseidon/client/local_group.h"
#include "poseidon/client/syncer.h"
#include "poseidon/common/sticky_error.h"
#include "poseidon/common/thread_pool.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/coordinator/coordinator.h"
#include "poseidon/kvstore/server.h"
#include "poseidon/transport/van.h"

namespace poseidon {

// ZeroMQ I/O threads when NodeOptions::ioThreads is 0: half this host's cores over the ranks that
// share it (LOCAL_WORLD_SIZE, when set; InvalidArgument when malformed), at least 2 and at most 16. The planner (docs/planner.md,
// --limits) shows CURVE on two threads binding an H200 node from ~12 Gbit/s (vgg19, 8 nodes).
int defaultIoThreads();

struct NodeOptions {
  int rank = 0;
  int worldSize = 1;
  Role role = Role::kBoth;
  std::string masterAddr = "127.0.0.1";  // coordinator host (rank 0 binds it)
  int masterPort = 29500;
  // The user chose masterPort (MASTER_PORT, --master-port): a port in use is then
  // not a missing setting, and the error says so.
  bool masterPortChosen = false;
  // Every wait (rendezvous, barrier, collectives) and the liveness check: a
  // peer not heard from for this long is declared lost.
  std::chrono::milliseconds timeout{30000};
  // Heartbeat period; 0 picks min(1 s, timeout / 6).
  std::chrono::milliseconds heartbeat{0};
  int threads = 2;                           // syncer thread pool
  // Whether the node logs the job's failure as it records it ("[poseidon] error: ..."). A program
  // that reports the error it gets itself (poseidon train's error line) turns it off: once is enough.
  bool logFailure = true;
  // ZeroMQ I/O threads: they move (and with a secret, encrypt) every byte, each connection on one
  // of them. libzmq's rule of thumb is one per GB/s in or out; CURVE at ~1.75 GB/s per core needs
  // two for a 10 GbE link's two directions and ~16 for 100 GbE. 0: defaultIoThreads().
  int ioThreads = 0;
  // The shard's sums of the pushes it receives (a server node), on this many threads beside the receive
  // loop, each KV pair always on the same one: the loop goes on taking messages while pairs are
  // summed, several at once. 0: on the receive loop itself, as before 2026-11-30. Straggler mode sums
  // on the loop whatever this says (its deadlines visit every pair). A server of a large model's
  // pairs at 100 GbE needs a few (docs/planner.md: --limits); local to the node: ranks may differ.
  int sumThreads = kDefaultSumThreads;
  JobSettings settings;                      // must agree across nodes
  // This node's data endpoint and links (transport/van.h): the interface to bind (van.bindHost;
  // never 0.0.0.0 by default), its port (0: a free one), the payload limit, the TCP receive buffer,
  // and the send window (> 0: priority scheduling, lower layers' data first; docs/scheduling.md;
  // BSP jobs only). Its curve and charger are the node's: the node derives the one from `secret`
  // and passes `charger` below, whatever they hold here.
  VanOptions van;
  Tracer* tracer = nullptr;  // optional, not owned; must outlive the node
  // The bench's charge for the runtime's own work at full width (common/work_charger.h,
  // bench/device.h). Null, as in production: nothing charged. Not owned; must outlive the node.
  WorkCharger* charger = nullptr;
  // Job secret (see transport/security.h); every rank must have the same.
  // Empty: no authentication (a warning unless every address is loopback).
  std::string secret;
  // kNone: no CURVE even with a secret: neither authentication nor encryption (one loud warning
  // from rank 0). Every rank must have the same (transport/security_mode.h).
  TransportSecurity security = TransportSecurity::kCurve;
  // Compute groups: a layer's pairs go out at most this many ahead of the replies to the group's
  // updates of them (0: all at once, the default). The replies pace each member's pushes to its
  // group's slowest, where TCP, sharing one server's link among many pushers, starves some of them
  // (docs/omnivore.md: with 4, one group on one server steps as the planner says; several groups'
  // staleness grows, so it is not the default). Local to the node: ranks may differ.
  int groupPushWindow = 0;
  // SFB: an iteration's reconstructions wait until this worker has handed over that iteration's whole
  // backward (its last layer submitted) or waits for a sync, whichever comes first. For a GEMM that
  // shares the device with the layers (a CUDA model; the bench's GPU node): run during the backward,
  // it delays every layer below it and so their syncs, which the next forward waits for; after it,
  // it runs while the device waits for the lowest layer's sync (docs/scheduling.md, "The
  // reconstruction after the backward"). Off: each runs as its factors are in (a GEMM on the host's
  // cores, beside the backward). Local to the node.
  bool deferReconstruction = false;
};

class Node : private SyncHost {
 public:
  // Rendezvous with the other nodes (blocks until the book arrives or fails).
  static std::unique_ptr<Node> start(const NodeOptions& options, const ModelDesc& model);
  ~Node() override;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const InformationBook& book() const override { return book_; }
  int rank() const override { return options_.rank; }
  bool isWorker() const { return poseidon::isWorker(options_.role); }
  bool isServer() const { return poseidon::isServer(options_.role); }
  // Local aggregation (JobSettings::localRanks > 1): a machine's member hands its layers to its
  // leader (client/local_group.h); on the network it is neither worker nor server.
  bool isLocalMember() const { return book_.localRanks() > 1 && book_.isLocalMember(rank()); }

  // ---- worker API -------------------------------------------------------------
  // Starts iteration t; t must follow the previous one (or be the book's start).
  void beginIteration(int64_t iteration);
  int64_t iteration() const { return iteration_.load(); }
  // finish() has run: the job is over for this rank (user thread).
  bool finished() const { return finished_; }
  // BestScheme for the layer: Algorithm 1 with the job's per-worker batch K
  // (JobSettings::batch), P1 and P2, so every worker decides the same way,
  // including one whose layer got no gradient this step (it contributes zero
  // by the same scheme). Factors with fewer or more rows than K (a partial last
  // batch, accumulated micro-batches) still go the way the job's K decided.
  Scheme schemeFor(int layer) const;
  void submitDense(int layer, LayerBuffer grad, std::shared_ptr<void> keepAlive = nullptr);
  // `rebuild` (SFB only): the caller rebuilds the mean gradient from the gathered factors itself (a
  // CUDA model: a GEMM on the device) instead of the host's GEMM into `out`.
  void submitFactors(int layer, const float* u, const float* v, int64_t rows, LayerBuffer out,
                     std::shared_ptr<void> keepAlive = nullptr, FactorRebuild rebuild = nullptr);
  // Straggler mode: true when every layer of the current iteration already
  // completed without this worker (it fell behind). Then skipIteration()
  // writes those results into the given buffers (one per layer) instead of
  // computing and submitting, and waitIteration() returns at once.
  bool alreadyComplete() const;
  void skipIteration(const std::vector<LayerBuffer>& outputs);
  // Straggler mode counters: layer rounds this worker submitted to whose result
  // it did not contribute, and iterations it skipped.
  int64_t droppedContributions() const;
  int64_t skippedIterations() const { return skipped_; }
  // Contributors of a layer's recently completed round (see Syncer::contributors).
  std::vector<std::vector<bool>> contributors(int layer, int64_t iteration) const;

  // BSP barrier of the current iteration. Throws TimeoutError naming every
  // layer still waiting and on whom, or the job's sticky error.
  void waitIteration();
  void waitIteration(std::chrono::milliseconds timeout);
  // One layer of the barrier: returns once that layer's synchronized result of
  // the current iteration is in (same errors as waitIteration). With priority
  // scheduling, the next forward pass can run layer l as soon as waitLayer(l)
  // returns, overlapping the rest of the sync (docs/scheduling.md); call
  // beginIteration(t + 1) once every layer is in.
  void waitLayer(int layer);
  // Whether waitLayer(layer) would return at once.
  bool layerReady(int layer) const;
  // SFB reconstructions held until this worker hands over the iteration's backward
  // (NodeOptions::deferReconstruction).
  int heldReconstructions() const;

  // ---- compute-group mode (JobSettings::groups > 0; docs/omnivore.md) ----------
  // The pulls of the server-held model (client/group_client.h). InvalidArgument when this job has
  // no compute groups or this rank is not a worker.
  GroupClient& groups();
  int group() const { return book_.groupOf(book_.workerIndex(rank())); }
  // The gradient of the worker's round goes to the shards, which apply the group's mean with `lr`.
  void submitGroupPush(int layer, LayerBuffer grad, float lr, std::shared_ptr<void> keepAlive = nullptr);
  // This node's shard: how many other updates landed between each update's pull and its
  // application (count by staleness), the largest lead of a group over the slowest one, and the
  // pulls that came before their group's previous update was applied (ModelShard::earlyPulls).
  std::map<int64_t, int64_t> stalenessHistogram() const;
  int64_t maxGroupLead() const;
  int64_t groupEarlyPulls() const;
  // This worker's pair pushes that waited for a reply (NodeOptions::groupPushWindow); 0 without groups.
  int64_t groupPacedPushes() const;
  // Experiments: when this node's shard holds the pair, keep its parameters after every update
  // (true), so recordedModel() returns W(0), W(1), ... in the order they were applied.
  bool recordModelUpdates(int layer, int pair);
  std::vector<std::vector<float>> recordedModel() const;

  // ---- merged FC (Omnivore section V-A; client/fc_link.h, docs/omnivore.md) --------
  // The FC server's and the workers' link (every rank has one).
  FcLink& fc() { return *fc_; }

  // ---- collectives (every node calls them in the same order) ------------------
  // Copies root's buffer into every other node's buffer (same size on all).
  void broadcast(int root, LayerBuffer buffer);
  void barrier();
  // Compute groups: a barrier after which every shard has applied every push that any rank sent
  // before entering it. A plain barrier is not enough: rank R leaves it once every other rank has
  // entered, and shard S may not yet have read the push X sent it just before X entered. But S's
  // receive loop applies a push before it hands on the barrier message X sent after it (one
  // connection, or for X = S the loopback, in order), so S leaves a first barrier that also goes
  // through its own loop only with every push applied, and enters the second only after that;
  // leaving the second, every shard is past the first.
  void settleBarrier();
  // Sums a few numbers over all ranks (Collectives::allSum).
  std::vector<double> allSum(const std::vector<double>& mine);
  // Final barrier, then stops the receive loop and closes the transport.
  // Servers stay up until every node has reached finish(). A BSP worker's final barrier says how
  // many iterations it took part in; a worker that waits on one past that (or finishes with another count)
  // fails the job at once naming both, instead of waiting out the timeout on a round that never comes.
  void finish();

  // Fails the job: tells every peer (best effort) and makes every later call
  // throw AbortedError(why).
  void abort(const std::string& why);
  // Records `error` as the job's failure (the first one wins), tells every peer
  // at once, and returns; the caller throws. For a misuse found above the node
  // (DistributedModel), so that every rank stops with this rank's reason.
  void failJob(std::exception_ptr error) { fail(std::move(error)); }
  // Throws the sticky error, if any (see "Buffers" above).
  void checkError();

  // ---- introspection -------------------------------------------------------------
  TrafficCounters& counters() { return van_->counters(); }
  // Bytes this node handed to its urgent connections (VanOptions::urgentLayers).
  uint64_t urgentBytesSent() const { return van_->urgentBytesSent(); }
  uint64_t rejectedFrames() const { return van_->rejectedFrames(); }
  // The TCP receive buffer its data endpoint bound with (-1: the OS's; VanOptions::receiveBufferBytes).
  int receiveBufferBytes() { return van_->receiveBufferBytes(); }
  // Connections refused for not being members of the job (CURVE/ZAP).
  uint64_t refusedConnections() const;
  // The shard, for its ownership counts (pairsOwned, bytesOwned); its rounds belong to the receive loop
  // and the sum lanes while the job runs.
  const KvShard* shard() const { return server_ ? &server_->shard() : nullptr; }
  // Ps-pushes this node's sum lanes have summed so far (0 when it sums on the receive loop).
  int64_t pushesSummedOnLanes() const { return lanePushes_.load(); }
  const std::string& endpoint() const { return van_->endpoint(); }

 private:
  Node(const NodeOptions& options);
  // start(): security, the coordinator (rank 0), the data endpoint and the rendezvous, which
  // gives the book; then each role's parts, built from the book.
  void join(const ModelDesc& model);
  void assemble();
  // SyncHost
  void send(int dest, const FrameHeader& header, const std::vector<Van::Part>& parts) override;
  void schedule(std::function<void()> task) override;
  void scheduleRebuild(int64_t iteration, std::function<void()> task) override;
  void layerDone(int layer, int64_t iteration) override;
  // NodeOptions::deferReconstruction: the user thread's hand-over. A submit counts toward the
  // iteration's last; the last, or any wait, releases the held reconstructions through `through`.
  void submitted();
  void releaseRebuilds(int64_t through);
  void dropHeldRebuilds();
  // The layer's mean is in this rank's buffer: the barrier's bit (a leader's Syncer reaches it through
  // its LocalGroup, once the members have their copy).
  void barrierDone(int layer, int64_t iteration);
  int64_t currentIteration() const override { return iteration_.load(); }
  Tracer* tracer() const override { return options_.tracer; }
  WorkCharger* charger() const override { return options_.charger; }
  int groupPushWindow() const override { return groups_ ? options_.groupPushWindow : 0; }
  void waitGroupPull(int layer, int pair, int64_t round) override;
  // The one place that records the job's failure: keeps the first error with
  // its type, logs it, wakes every waiter, and (unless it came from a peer's
  // abort) tells every peer. Call it with no lock held.
  void fail(std::exception_ptr error) override;
  // log: whether this rank prints the reason (not while it unwinds its program's own exception).
  void fail(std::exception_ptr error, bool tellPeers, bool log = true);
  // One small message to every other rank, best effort (errors ignored).
  // skipDeparted reads liveness_, so only the receive loop may pass true.
  void sendToPeers(const FrameHeader& header, const std::string& payload, bool skipDeparted);
  // How long a wait on peers may last: the liveness timeout plus two heartbeats, so that a
  // lost peer is reported by the heartbeat check (naming it) before a wait gives up.
  std::chrono::milliseconds waitTimeout() const { return options_.timeout + 2 * liveness_->heartbeat(); }

  // User thread: once the job failed, stop every use of the caller's buffers
  // (see "Buffers"), then rethrow the error.
  void throwIfFailed();
  void quiesce();

  // Ends this rank's part once (~Node, or at exit for a node its program never destroyed: that also
  // closes the context, so the peers get the abort): an unfinished rank tells its peers why it left.
  void leave(bool atExit);
  void closeAtExit();  // leave()'s part at exit, which must not pull anything from under other threads
  void stopReceiveLoop();
  void receiveLoop();
  void checkPeers();
  void tookPart();  // syncedThrough_ covers the current iteration
  // InvalidArgument naming `call` once finish() has run: the pool and the transport are gone.
  void checkNotFinished(const char* call) const;
  // Fails the job if a peer finished with fewer iterations than this rank synchronizes, or, once this
  // rank is finishing, with another count; the loop (on a finish barrier) and the user thread.
  void checkIterationCounts();
  bool countsIterations() const;
  void route(Message& msg);
  void sendAll(const std::vector<KvServer::Outgoing>& out);
  // A sum lane: one ps-push summed (and with the round's last, its result sent); failures as route()'s.
  void sumOnLane(Message& msg);
  // Runs work(msg): a ProtocolError rejects the message, any other error fails the job (node.cc only).
  template <typename Work>
  void handleReporting(Message& msg, Work&& work);
  int layerCount() const { return static_cast<int>(book_.model().layers.size()); }
  // What a layer of the iteration still waits for, for a timeout's message.
  std::string pendingWhat(int layer, int64_t iteration) const;

  NodeOptions options_;
  zmq::context_t ctx_;
  CurveKeys keys_;
  std::unique_ptr<ZapAuthenticator> zap_;     // when there is a secret; outlives the sockets below
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<Van> van_;
  InformationBook book_;
  StickyError error_;
  // Servers; used by the receive loop under serverMutex_, and its ps-pushes by the sum lanes without it.
  std::unique_ptr<KvServer> server_;
  // NodeOptions::sumThreads lanes, each one thread: ps-pushes of pair (layer, pair) go to lane
  // (layer + pair) mod lanes, which calls server_->handle without serverMutex_ (KvServer: pushes of
  // different pairs may be summed at once; nothing else touches the shard outside straggler mode).
  std::vector<std::unique_ptr<ThreadPool>> sumLanes_;
  std::atomic<int64_t> lanePushes_{0};            // ps-pushes summed on the lanes (pushesSummedOnLanes())
  mutable std::mutex serverMutex_;                // a leaf: also lets the user's thread read the statistics
  // With a tracer: when each of this shard's pairs got its first and its last push, and from whom,
  // so that the trace shows a sum's wait for its last worker (lane 4, "shard"; layer 0's pushes each
  // as well). Guarded by traceMutex_.
  struct ShardPushes {
    int64_t firstUs = 0, lastUs = 0;
    uint32_t lastSender = 0;
  };
  std::map<std::tuple<int64_t, uint32_t, uint32_t>, ShardPushes> shardPushes_;
  std::mutex traceMutex_;  // a leaf
  void tracePush(const FrameHeader& h);
  void traceAggregates(const std::vector<KvServer::Outgoing>& out);
  std::unique_ptr<GroupClient> groups_;           // workers in compute-group mode
  std::vector<std::unique_ptr<Syncer>> syncers_;  // workers (not a machine's members)
  std::unique_ptr<LocalGroup> local_;             // local aggregation (JobSettings::localRanks > 1)
  std::unique_ptr<IterationBarrier> barrier_;     // workers
  std::unique_ptr<Collectives> collectives_;
  std::unique_ptr<FcLink> fc_;          // merged FC: requests on the FC server, a worker's reply
  std::unique_ptr<Liveness> liveness_;  // receive loop only (after start)
  std::unique_ptr<ThreadPool> pool_;
  std::thread loop_;
  std::atomic<bool> stopLoop_{false};
  std::atomic<int64_t> iteration_{0};
  bool begun_ = false;   // user thread only
  // BSP workers: the iterations this rank has taken part in (submitted to or skipped: one past the
  // last), and each peer's count from its finish barrier (-1: still training). An iteration only
  // begun (a forward without a step) waits on nobody and is not counted. checkIterationCounts
  // compares them.
  std::atomic<int64_t> syncedThrough_{0};
  std::atomic<bool> finishing_{false};
  std::unique_ptr<std::atomic<int64_t>[]> peerFinishedAt_;
  std::atomic<int> submitted_{0};  // this iteration's submits (deferReconstruction)
  // deferReconstruction: reconstructions of iterations after rebuildsReleased_, held until the user
  // thread releases them (submitted(), the waits). Guarded by rebuildMutex_, a leaf.
  mutable std::mutex rebuildMutex_;
  int64_t rebuildsReleased_ = -1;
  std::vector<std::pair<int64_t, std::function<void()>>> heldRebuilds_;
  int64_t skipped_ = 0;  // user thread only
  std::atomic<bool> finished_{false};  // the staging thread's submits read it
  std::atomic<bool> left_{false};      // leave() has told the peers, or had nothing to tell
  std::atomic<bool> inFinish_{false};  // finish() has begun (on the user's thread): it closes the van
  bool claimedPort_ = false;  // options_.masterPort is this process's claim (released by finish or ~Node)
  void releasePortClaim();
  // finish(): which peers said bye (the receive loop records them; finish() waits for them, then
  // closes without lingering on messages to peers that read nothing more).
  std::mutex byeMutex_;
  std::condition_variable byeCv_;
  std::vector<bool> saidBye_;
};

}  // namespace poseidon
