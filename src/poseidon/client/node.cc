#include "poseidon/client/node.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "poseidon/common/at_exit.h"
#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/launch/env.h"
#include "poseidon/wire/message_table.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

int defaultIoThreads() {
  // The ranks on one host share its cores: poseidon launch, train --workers and torchrun say how many.
  const long local = localWorldSizeFromEnvironment();
  return static_cast<int>(std::clamp<long>(static_cast<long>(std::thread::hardware_concurrency()) / 2 / local, 2, 16));
}

namespace {
NodeOptions resolved(NodeOptions options) {
  if (options.ioThreads == 0) options.ioThreads = defaultIoThreads();
  return options;
}

// The sockets one rank's context may hold: two DEALERs per peer (bulk and urgent,
// VanOptions::urgentLayers), its ROUTER, and a few more (rendezvous, ZAP, the scheduler's wake-up
// pair). libzmq's default, 1023, would refuse the urgent connections past ~500 nodes.
int maxSockets(int worldSize) { return std::max(ZMQ_MAX_SOCKETS_DFLT, 2 * worldSize + 64); }

// The jobs this process's live nodes are in, by (coordinator address, port, rank). A second live
// node of one rank at the same MASTER_ADDR:MASTER_PORT (two DistributedModels in one program: a
// GAN's generator and discriminator, a teacher and a student) joins a job of its own at the next
// free port; every rank builds its models in the same order, so the k-th models of all ranks meet
// at MASTER_PORT + k. (The ranks of one job in one process, as the in-process tests run them,
// differ in rank and share the port.)
std::mutex gLiveJobsMutex;
std::set<std::tuple<std::string, int, int>> gLiveJobs;

int claimJobPort(const std::string& addr, int port, int rank) {
  std::lock_guard<std::mutex> lock(gLiveJobsMutex);
  int p = port;
  while (gLiveJobs.count({addr, p, rank})) ++p;
  if (p > 65535) throw InvalidArgument(strCat("no port above MASTER_PORT ", port, " for another job of this process"));
  gLiveJobs.insert({addr, p, rank});
  return p;
}
}  // namespace

void Node::releasePortClaim() {
  if (!claimedPort_) return;
  claimedPort_ = false;
  std::lock_guard<std::mutex> lock(gLiveJobsMutex);
  gLiveJobs.erase({options_.masterAddr, options_.masterPort, options_.rank});
}

Node::Node(const NodeOptions& options)
    : options_(resolved(options)), ctx_(options_.ioThreads, maxSockets(options_.worldSize)) {
  if (options_.masterPort > 0) {
    const int base = options_.masterPort;
    options_.masterPort = claimJobPort(options_.masterAddr, base, options_.rank);
    claimedPort_ = true;
    if (options_.masterPort != base) {
      POSEIDON_LOG(kInfo) << "rank " << options_.rank << ": another model of this process is in the job at "
                          << options_.masterAddr << ":" << base << "; this one joins its own at port "
                          << options_.masterPort << " (MASTER_PORT + " << options_.masterPort - base << ")";
    }
  }
}

namespace {
void checkOptions(const NodeOptions& options) {
  if (options.worldSize < 1) throw InvalidArgument(strCat("world size must be at least 1, got ", options.worldSize));
  if (options.rank < 0 || options.rank >= options.worldSize) {
    throw InvalidArgument(strCat("rank ", options.rank, " is outside the world of ", options.worldSize, " ranks"));
  }
  // Past a few thousand, std::thread's creation fails inside the pool and aborts the process (100000
  // did); 1024 is far above any core count. The CLI refuses the same bound at parse time
  // (cli/limits.h, kMaxThreadsPerWorker); this check is the one Python and C++ users meet.
  constexpr int kMaxSyncThreads = 1024;
  if (options.threads < 1 || options.threads > kMaxSyncThreads) {
    throw InvalidArgument(
        strCat("the syncer thread pool needs 1 to ", kMaxSyncThreads, " threads, got ", options.threads));
  }
  if (options.timeout.count() <= 0) throw InvalidArgument("the timeout must be positive");
  if (options.ioThreads < 0 || options.ioThreads > 64) {
    throw InvalidArgument(strCat(
        "ZeroMQ I/O threads must be in [0, 64] (0: half the host's cores per rank on it), got ", options.ioThreads));
  }
  if (options.sumThreads < 0 || options.sumThreads > 64) {
    throw InvalidArgument(
        strCat("the shard's sum threads must be in [0, 64] (0: on the receive loop), got ", options.sumThreads));
  }
  // The ranges and combinations the coordinator also checks (JobSettings), named before the rendezvous.
  if (const std::string why = options.settings.rangeError(); !why.empty()) throw InvalidArgument(why);
  if (const std::string why = options.settings.conflictError(); !why.empty()) throw InvalidArgument(why);
  if (options.heartbeat.count() < 0) {
    throw InvalidArgument(
        strCat("heartbeat must be 0 (automatic) or a positive number of ms, got ", options.heartbeat.count()));
  }
  if (options.van.sendWindowBytes != 0 && options.settings.groupMode()) {
    throw InvalidArgument(
        "priority scheduling (a send window) is for BSP jobs; compute groups order their pulls and "
        "pushes across layers, so they keep FIFO links");
  }
}
}  // namespace

std::unique_ptr<Node> Node::start(const NodeOptions& options, const ModelDesc& model) {
  checkOptions(options);
  std::unique_ptr<Node> node(new Node(options));
  node->join(model);
  node->assemble();
  Node* self = node.get();
  node->loop_ = std::thread([self] { self->receiveLoop(); });
  // exit() mid-training, or a node its program never destroys: the peers still hear why it went.
  leaveAtExit(self, [self] { self->leave(/*atExit=*/true); });  // node_end.cc
  const InformationBook& book = node->book_;
  POSEIDON_LOG(kInfo) << "rank " << options.rank << " (" << roleName(options.role) << ") joined job " << std::hex
                      << book.jobId() << std::dec << ": " << book.numWorkers() << " workers, " << book.numServers()
                      << " server shards, " << book.model().layers.size() << " layers; data endpoint "
                      << node->van_->endpoint();
  return node;
}

void Node::join(const ModelDesc& model) {
  const NodeOptions& options = options_;
  const CurveKeys* curve = nullptr;
  if (options.security == TransportSecurity::kNone) {
    if (options.rank == 0 && options.worldSize > 1) {
      POSEIDON_LOG(kWarning) << "TRANSPORT SECURITY OFF (--transport-security none): gradients travel unencrypted "
                                "and any host that can reach this job's ports can join it; use it only inside a "
                                "trusted network";
    }
  } else if (!options.secret.empty()) {
    keys_ = deriveCurveKeys(options.secret);
    zap_ = std::make_unique<ZapAuthenticator>(ctx_, keys_);
    curve = &keys_;
  } else if (options.worldSize > 1 && options.masterAddr.rfind("127.", 0) != 0) {
    POSEIDON_LOG(kWarning) << "no job secret (POSEIDON_SECRET or POSEIDON_SECRET_FILE): any host that can reach "
                              "this job's ports can join it";
  }
  if (options.rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(ctx_, options.masterAddr, options.masterPort, options.worldSize,
                                                 options.timeout, curve, options.masterPortChosen);
  }
  VanOptions vo = options.van;
  vo.worldSize = options.worldSize;
  vo.curve = curve;
  vo.charger = options.charger;
  van_ = std::make_unique<Van>(ctx_, vo);

  JoinRequest req;
  req.rank = options.rank;
  req.worldSize = options.worldSize;
  req.role = options.role;
  req.endpoint = van_->endpoint();
  req.model = model;
  req.settings = options.settings;
  RendezvousOptions ro;
  ro.masterAddr = options.masterAddr;
  ro.masterPort = options.masterPort;
  ro.timeout = options.timeout;
  ro.curve = curve;
  book_ = joinJob(ctx_, ro, req);
  if (options.charger) book_.setDeviceModel(&options.charger->model());
}

void Node::assemble() {
  const InformationBook& book = book_;
  const int rank = options_.rank;
  const int layers = static_cast<int>(book.model().layers.size());
  van_->counters().resize(layers);
  van_->counters().resizePeers(book.worldSize());
  std::vector<std::string> endpoints;
  for (const auto& n : book.nodes()) endpoints.push_back(n.endpoint);
  van_->connectPeers(rank, endpoints, book.jobId(), &book.model());
  const bool member = isLocalMember();
  if (isServer() && !member) {
    server_ = std::make_unique<KvServer>(book, book.shardIndex(rank), options_.charger);
    if (!book.settings().stragglerMode())
      for (int i = 0; i < options_.sumThreads; ++i) sumLanes_.push_back(std::make_unique<ThreadPool>(1));
  }
  if (isWorker()) {
    if (!member) {
      for (int l = 0; l < layers; ++l) syncers_.push_back(std::make_unique<Syncer>(static_cast<SyncHost&>(*this), l));
    }
    barrier_ = std::make_unique<IterationBarrier>(layers, error_);
    pool_ = std::make_unique<ThreadPool>(options_.threads);
  }
  if (isWorker() && book.localRanks() > 1) {
    LocalGroup::Host h;
    h.send = [this](int dest, const FrameHeader& header, const std::vector<Van::Part>& parts) {
      van_->send(dest, header, parts);
    };
    h.schedule = [this](std::function<void()> task) { pool_->schedule(std::move(task)); };
    h.fail = [this](std::exception_ptr e) { this->fail(std::move(e)); };
    h.iteration = [this] { return iteration_.load(); };
    h.submitDense = [this](int layer, int64_t it, LayerBuffer grad, std::shared_ptr<void> keep) {
      syncers_[layer]->submitDense(it, std::move(grad), std::move(keep));
    };
    h.submitFactors = [this](int layer, int64_t it, Scheme scheme, const float* u, const float* v, int64_t rows,
                             LayerBuffer out, std::shared_ptr<void> keep, FactorRebuild rebuild) {
      syncers_[layer]->submitFactors(it, scheme, u, v, rows, std::move(out), std::move(keep), std::move(rebuild));
    };
    h.done = [this](int layer, int64_t it) { barrierDone(layer, it); };
    local_ = std::make_unique<LocalGroup>(book, rank, std::move(h));
  }
  iteration_ = book.settings().startIteration;
  syncedThrough_ = book.settings().startIteration;
  peerFinishedAt_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(book.worldSize()));
  for (int r = 0; r < book.worldSize(); ++r) peerFinishedAt_[r] = -1;
  saidBye_.assign(static_cast<size_t>(book.worldSize()), false);
  liveness_ = std::make_unique<Liveness>(book.worldSize(), rank, options_.timeout, options_.heartbeat,
                                         book.settings().startIteration, std::chrono::steady_clock::now());
  // The node's parts record the job's failure through fail() and rethrow it through throwIfFailed().
  auto fail = [this](std::exception_ptr e) { this->fail(std::move(e)); };
  auto throwIfFailed = [this] { this->throwIfFailed(); };
  collectives_ = std::make_unique<Collectives>(*van_, book, rank, error_, fail, waitTimeout());
  if (isWorker() && book.settings().groupMode()) {
    groups_ = std::make_unique<GroupClient>(*van_, book, rank, error_, fail, throwIfFailed, waitTimeout());
  }
  fc_ = std::make_unique<FcLink>(*van_, rank, book.worldSize(), isWorker(), error_, fail, throwIfFailed, waitTimeout());
}

uint64_t Node::refusedConnections() const {
  return van_->refusedConnections() + (zap_ ? zap_->refused() : 0);
}

// ---- failure ------------------------------------------------------------------

void Node::fail(std::exception_ptr error) { fail(std::move(error), true, true); }

void Node::fail(std::exception_ptr error, bool tellPeers, bool log) {
  if (!error_.set(std::move(error))) return;
  const std::string why = error_.message();
  if (log && options_.logFailure) {
    POSEIDON_LOG(kError) << why;
  }
  if (barrier_) barrier_->wake();
  if (collectives_) collectives_->wake();
  if (groups_) groups_->wake();
  if (fc_) fc_->wake();
  // Tell the peers, so they stop at once with this reason instead of timing out.
  if (tellPeers) sendToPeers(wire::abort(iteration_.load()), why, false);
}

void Node::sendToPeers(const FrameHeader& header, const std::string& payload, bool skipDeparted) {
  for (int r = 0; r < book_.worldSize(); ++r) {
    if (r == rank() || (skipDeparted && liveness_->departed(r))) continue;
    try {
      van_->send(r, header, payload.data(), payload.size());
    } catch (const Error&) {
      // Best effort: a peer that cannot be reached is noticed by its own silence.
    }
  }
}

void Node::quiesce() {
  for (auto& s : syncers_) s->close();
  if (local_) local_->close();
  dropHeldRebuilds();
  if (pool_) pool_->waitIdle();
}

void Node::throwIfFailed() {
  if (!error_.failed()) return;
  quiesce();
  error_.check();
}

void Node::checkError() { throwIfFailed(); }

void Node::abort(const std::string& why) {
  fail(std::make_exception_ptr(AbortedError(strCat("rank ", rank(), " aborted the job: ", why))));
}

// ---- receive loop ----------------------------------------------------------------

void Node::checkPeers() {
  const auto now = std::chrono::steady_clock::now();
  if (liveness_->heartbeatDue(now)) sendToPeers(wire::heartbeat(iteration_.load()), {}, true);
  for (const Liveness::Lost& lost : liveness_->lostPeers(now)) {
    fail(std::make_exception_ptr(AbortedError(strCat(
        "rank ", rank(), ": lost rank ", lost.rank, " (nothing from it for ", lost.silent.count() / 1000.0,
        " s; last known at iteration ", lost.lastIteration, "): it died, hung or became unreachable"))));
  }
}

void Node::receiveLoop() {
  Message msg;
  int64_t pollMs = std::min<int64_t>(100, liveness_->heartbeat().count());
  if (book_.settings().stragglerMode()) {
    pollMs = std::min<int64_t>(pollMs, std::max<int64_t>(1, book_.settings().stragglerTimeoutMs / 4));
  }
  while (!stopLoop_) {
    bool got = false;
    try {
      got = van_->poll(&msg, static_cast<int>(pollMs));
    } catch (const Error& e) {
      fail(std::make_exception_ptr(IoError(strCat("rank ", rank(), ": transport failed: ", e.what()))));
      return;
    }
    checkPeers();
    if (server_ && server_->hasDeadlines()) {
      try {
        std::vector<KvServer::Outgoing> due;
        {
          std::lock_guard<std::mutex> lock(serverMutex_);
          due = server_->expire(std::chrono::steady_clock::now());
        }
        sendAll(due);
      } catch (const Error& e) {
        fail(std::make_exception_ptr(Error(strCat("rank ", rank(), ": ", e.what()))));
      }
    }
    if (!got) continue;
    liveness_->heard(msg.header, std::chrono::steady_clock::now());
    if (msg.header.type == MsgType::kBye && msg.header.sender < saidBye_.size()) {
      std::lock_guard<std::mutex> lock(byeMutex_);
      saidBye_[msg.header.sender] = true;
      byeCv_.notify_all();
    }
    handleReporting(msg, [this](Message& m) { route(m); });
  }
}

// A malformed message is rejected (logged, counted) and changes nothing; any other failure fails the job.
template <typename Work>
void Node::handleReporting(Message& msg, Work&& work) {
  try {
    work(msg);
  } catch (const ProtocolError& e) {
    van_->rejected(msg.peer, strCat(describe(msg.header), ": ", e.what()));
  } catch (const std::exception& e) {
    fail(std::make_exception_ptr(
        Error(strCat("rank ", rank(), ": handling ", describe(msg.header), " failed: ", e.what()))));
  }
}

void Node::sumOnLane(Message& msg) {
  if (error_.failed()) return;  // the job is over: nobody reads the sum (a push left queued at shutdown)
  ++lanePushes_;
  handleReporting(msg, [this](Message& m) { sendAll(server_->handle(m)); });
}

void Node::tracePush(const FrameHeader& h) {
  const int64_t now = Tracer::nowMicros();
  std::lock_guard<std::mutex> lock(traceMutex_);
  ShardPushes& p = shardPushes_[{h.iteration, h.layer, h.pair}];
  if (p.firstUs == 0) p.firstUs = now;
  p.lastUs = now;
  p.lastSender = h.sender;
  // Layer 0's pushes one by one: the next overlapped forward waits first for its round trip, and each
  // push's way in (submitted on the sender's send lane, in here) is one leg of it.
  if (h.layer == 0) options_.tracer->span(strCat("push in from rank ", h.sender), "shard", 4, now, now, h.iteration);
}

void Node::traceAggregates(const std::vector<KvServer::Outgoing>& out) {
  for (const KvServer::Outgoing& o : out) {
    if (o.header.type != MsgType::kPsAggregate) continue;
    ShardPushes p;
    {
      std::lock_guard<std::mutex> lock(traceMutex_);
      auto it = shardPushes_.find({o.header.iteration, o.header.layer, o.header.pair});
      if (it == shardPushes_.end()) continue;
      p = it->second;
      shardPushes_.erase(it);
    }
    const auto& layers = book_.model().layers;
    const std::string name =
        o.header.layer < layers.size() ? layers[o.header.layer].name : std::to_string(o.header.layer);
    // From the first push in to the sum going out; its end is when the last push (from `lastSender`) was summed.
    options_.tracer->span(strCat("shard sums ", name, " pair ", o.header.pair, " (last push from rank ", p.lastSender,
                                 ", in at +", (p.lastUs - p.firstUs) / 1000, " ms)"),
                          "shard", 4, p.firstUs, Tracer::nowMicros(), o.header.iteration);
  }
}

void Node::sendAll(const std::vector<KvServer::Outgoing>& out) {
  if (options_.tracer) traceAggregates(out);
  for (const KvServer::Outgoing& o : out) {
    const std::vector<Van::Part> parts = o.parts();
    for (int dest : o.to) van_->send(dest, o.header, parts);
  }
}

// The Van has checked the frame, its job and its sender; route it by type.
void Node::route(Message& msg) {
  const FrameHeader& h = msg.header;
  // Who handles each type is the message table's (wire/message_table.h).
  switch (wire::messageInfo(h.type).handler) {
    case wire::Handler::kServer: {
      if (!server_) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank that is not a server"));
      if (options_.tracer && h.type == MsgType::kPsPush) tracePush(h);
      if (h.type == MsgType::kPsPush && !sumLanes_.empty()) {
        // Summed on the pair's lane, in arrival order; the loop goes on.
        const size_t lane = sumLaneOf(static_cast<int>(h.layer), static_cast<int>(h.pair), sumLanes_.size());
        auto m = std::make_shared<Message>(std::move(msg));
        sumLanes_[lane]->schedule([this, m] { sumOnLane(*m); });
        return;
      }
      std::vector<KvServer::Outgoing> out;
      {
        std::lock_guard<std::mutex> lock(serverMutex_);
        out = server_->handle(msg);
      }
      sendAll(out);
      return;
    }
    case wire::Handler::kPuller:
      if (!groups_) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank that does not pull"));
      if (h.type == MsgType::kPullReply)
        groups_->onPullReply(msg);
      else
        groups_->onStateReply(msg);
      return;
    case wire::Handler::kSyncer: {
      if (syncers_.empty()) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank that is not a worker"));
      if (h.layer >= syncers_.size()) throw ProtocolError(strCat("layer ", h.layer, " does not exist"));
      Syncer& s = *syncers_[h.layer];
      if (h.type == MsgType::kSfbFactors) s.onFactors(msg);
      else if (h.type == MsgType::kSfbDecision) s.onDecision(msg);
      else s.onAggregate(msg);
      return;
    }
    case wire::Handler::kLocal:
      if (!local_) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank without local aggregation"));
      if (h.type == MsgType::kLocalPush)
        local_->onPush(msg);
      else if (h.type == MsgType::kLocalFactors)
        local_->onFactors(msg);
      else
        local_->onResult(msg);
      return;
    case wire::Handler::kCollectives:
      if (h.type == MsgType::kBarrier && wire::barrierFinishedAt(h) >= 0 && static_cast<int>(h.sender) < book_.worldSize() &&
          countsIterations()) {
        peerFinishedAt_[h.sender] = wire::barrierFinishedAt(h);
        checkIterationCounts();
      }
      collectives_->deliver(std::move(msg));
      return;
    case wire::Handler::kFcServer:
      fc_->onForward(msg);
      return;
    case wire::Handler::kFcWorker:
      fc_->onBackward(msg);
      return;
    case wire::Handler::kNode:
      if (h.type == MsgType::kAbort) {
        std::string why(reinterpret_cast<const char*>(msg.data()), std::min<size_t>(msg.size(), 4096));
        fail(std::make_exception_ptr(
                 AbortedError(strCat("rank ", h.sender, " failed (at its iteration ", h.iteration, "): ", why))),
             /*tellPeers=*/false);
      }
      return;  // heartbeats (liveness has seen them) and goodbyes
    case wire::Handler::kCoordinator:
    case wire::Handler::kJoiner:
      break;
  }
  throw ProtocolError(strCat("unexpected ", msgTypeName(h.type), " on a data endpoint"));
}

// ---- collectives -------------------------------------------------------------------

void Node::broadcast(int root, LayerBuffer buffer) {
  throwIfFailed();
  collectives_->broadcast(root, std::move(buffer));
}

void Node::barrier() {
  throwIfFailed();
  collectives_->barrier();
}

void Node::settleBarrier() {
  throwIfFailed();
  collectives_->barrier(/*throughOwnLoop=*/true);
  collectives_->barrier(/*throughOwnLoop=*/true);
}

std::vector<double> Node::allSum(const std::vector<double>& mine) {
  throwIfFailed();
  return collectives_->allSum(mine);
}

bool Node::countsIterations() const {
  // Compute groups run their own rounds (each group its own count); servers run none; with straggler
  // dropping a rank that finished early is dropped from the rounds after it, as a slow one is.
  return isWorker() && !book_.settings().groupMode() && !book_.settings().stragglerMode();
}

namespace {

std::string finishedAfter(int64_t finishedAt, int64_t start) {
  return finishedAt > start ? strCat("after its iteration ", finishedAt - 1) : "before beginning an iteration";
}

}  // namespace

void Node::checkIterationCounts() {
  const int64_t mine = syncedThrough_.load();
  for (int r = 0; r < book_.worldSize(); ++r) {
    const int64_t theirs = r == rank() ? -1 : peerFinishedAt_[r].load();
    if (theirs < 0 || theirs == mine || (theirs > mine && !finishing_.load())) continue;
    // Under BSP every iteration needs every worker: a peer that finished cannot take part in an
    // iteration past its last, and one that went on waits for this rank's in vain.
    const bool peerShort = theirs < mine;
    const int shortRank = peerShort ? r : rank(), longRank = peerShort ? rank() : r;
    const int64_t shortCount = std::min(theirs, mine), longCount = std::max(theirs, mine);
    fail(std::make_exception_ptr(Error(strCat(
        "rank ", shortRank, " called finish() ", finishedAfter(shortCount, book_.settings().startIteration),
        ", but rank ", longRank, " went on to synchronize iteration ", longCount - 1,
        ": every worker must run the same number of iterations (give every rank the same number of batches, "
        "e.g. drop the last partial one)"))));
    return;
  }
}

}  // namespace poseidon
