// Node: one Poseidon process (rank). A worker, a server shard, or both.
//
// It owns, for its lifetime: the ZeroMQ context and van, the receive loop
// thread, the KV shard (servers), one Syncer per layer plus the thread pool
// and the BSP barrier (workers), and on rank 0 the coordinator. Nothing is
// global: several nodes can live in one process (tests do that).
//
// Worker iteration protocol (paper Algorithm 2):
//   node.beginIteration(t);
//   forward; during backward, for l = L..1 as each gradient is final:
//     node.submitDense(l, grad)          // PS, or
//     node.submitFactors(l, U, V, K, out) // SFB (or Adam), when schemeFor(l, K) says so
//   node.waitIteration();   // BSP barrier: every layer's sync is done
//   the optimizer applies the synchronized mean gradients.
// submit*() only queue the layer's sync on the thread pool and return at once
// (wait-free backpropagation); sends of upper layers overlap the backward
// of lower ones.
//
// Failure is sticky (gloo-style): once anything fails (a timeout, an abort
// from a peer, a transport error, a lost peer) every later call throws the
// same error, and the reason is sent to every peer.
//
// Liveness: the receive loop sends a heartbeat to every peer each period and
// declares a peer lost when nothing (heartbeat or data) has come from it for
// `timeout`, naming it and its last-known iteration. A node leaving cleanly
// (finish) says bye first, so it is not mistaken for a lost one.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/client/syncer.h"
#include "poseidon/common/thread_pool.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/coordinator/coordinator.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/kvstore/adam_server.h"
#include "poseidon/kvstore/kv_shard.h"
#include "poseidon/sfb/keeper.h"
#include "poseidon/transport/van.h"

namespace poseidon {

struct NodeOptions {
  int rank = 0;
  int worldSize = 1;
  Role role = Role::kBoth;
  std::string masterAddr = "127.0.0.1";  // coordinator host (rank 0 binds it)
  int masterPort = 29500;
  std::string bindHost = "127.0.0.1";    // interface for this node's data endpoint
  int dataPort = 0;                      // 0 picks a free port
  // Every wait (rendezvous, barrier, collectives) and the liveness check: a
  // peer not heard from for this long is declared lost.
  std::chrono::milliseconds timeout{30000};
  // Heartbeat period; 0 picks min(1 s, timeout / 6).
  std::chrono::milliseconds heartbeat{0};
  int threads = 2;                           // syncer thread pool
  JobSettings settings;                      // must agree across nodes
  uint64_t maxPayloadBytes = kDefaultMaxPayloadBytes;
  Tracer* tracer = nullptr;  // optional, not owned; must outlive the node
  // Job secret (see transport/security.h); every rank must have the same.
  // Empty: no authentication (a warning unless every address is loopback).
  std::string secret;
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

  // ---- worker API -------------------------------------------------------------
  // Starts iteration t; t must follow the previous one (or be the book's start).
  void beginIteration(int64_t iteration);
  int64_t iteration() const { return iteration_.load(); }
  // BestScheme for this iteration given the rows of factors K (the same on
  // every worker, e.g. the per-worker batch).
  Scheme schemeFor(int layer, int64_t rows) const;
  void submitDense(int layer, LayerBuffer grad, std::shared_ptr<void> keepAlive = nullptr);
  void submitFactors(int layer, const float* u, const float* v, int64_t rows, LayerBuffer out,
                     std::shared_ptr<void> keepAlive = nullptr);
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

  // ---- collectives (every node calls them in the same order) ------------------
  // Copies root's buffer into every other node's buffer (same size on all).
  void broadcast(int root, LayerBuffer buffer);
  void barrier();
  // Final barrier, then stops the receive loop and closes the transport.
  // Servers stay up until every node has reached finish().
  void finish();

  // Fails the job: tells every peer (best effort) and makes every later call
  // throw AbortedError(why).
  void abort(const std::string& why);
  // Throws the sticky error, if any.
  void checkError() const;

  // ---- introspection -------------------------------------------------------------
  TrafficCounters& counters() { return van_->counters(); }
  uint64_t rejectedFrames() const { return van_->rejectedFrames(); }
  // Connections refused for not being members of the job (CURVE/ZAP).
  uint64_t refusedConnections() const;
  const KvShard* shard() const { return shard_.get(); }
  const std::string& endpoint() const { return van_->endpoint(); }

 private:
  Node(const NodeOptions& options);
  // SyncHost
  Van& van() override { return *van_; }
  void schedule(std::function<void()> task) override;
  void layerDone(int layer, int64_t iteration) override;
  void fail(const std::string& why) override;
  // One header-only-or-small message to every other rank, best effort (errors ignored).
  // skipDeparted reads departed_, so only the receive loop may pass true.
  void sendToPeers(MsgType type, const void* data, size_t size, bool skipDeparted);
  // How long a wait on peers may last: the liveness timeout plus two heartbeats, so that a
  // lost peer is reported by the heartbeat check (naming it) before a wait gives up.
  std::chrono::milliseconds waitTimeout() const { return options_.timeout + 2 * heartbeat_; }
  int64_t currentIteration() const override { return iteration_.load(); }
  Tracer* tracer() const override { return options_.tracer; }

  void receiveLoop();
  void heartbeatAndCheckPeers();
  void dispatch(Message& msg);
  void onPush(Message& msg);
  void onAdamFactors(Message& msg);
  void sendAggregate(const KvShard::Completed& done);
  void sendDecision(const SfbKeeper::Decision& d);
  void expireStragglerRounds();
  std::vector<Message> takeMail(MsgType type, uint32_t seq, size_t count, const char* what);
  [[noreturn]] void throwError() const;

  NodeOptions options_;
  zmq::context_t ctx_;
  CurveKeys keys_;
  std::unique_ptr<ZapAuthenticator> zap_;     // when there is a secret; outlives the sockets below
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<Van> van_;
  InformationBook book_;
  std::unique_ptr<KvShard> shard_;                // servers
  std::unique_ptr<AdamServer> adam_;              // servers, Adam baseline only
  std::unique_ptr<SfbKeeper> keeper_;             // servers, straggler mode only
  std::vector<std::unique_ptr<Syncer>> syncers_;  // workers
  std::unique_ptr<ThreadPool> pool_;
  std::thread loop_;
  std::atomic<bool> stopLoop_{false};
  std::atomic<int64_t> iteration_{0};
  bool begun_ = false;  // user thread only
  int64_t skipped_ = 0;  // user thread only

  // Control state; one mutex, one condition variable.
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::string error_;                 // sticky; empty while healthy
  bool aborted_ = false;              // error_ came from an abort
  std::vector<bool> layerDone_;       // BSP bits of the current iteration
  int layersLeft_ = 0;
  std::map<std::pair<uint16_t, uint32_t>, std::vector<Message>> mail_;  // broadcast / barrier messages
  uint32_t collectiveSeq_ = 0;  // user thread only
  // Liveness, receive loop only.
  std::vector<std::chrono::steady_clock::time_point> lastHeard_;
  std::vector<int64_t> lastIteration_;
  std::vector<bool> departed_;
  std::chrono::steady_clock::time_point nextHeartbeat_;
  std::chrono::milliseconds heartbeat_{1000};
  bool finished_ = false;
};

}  // namespace poseidon
