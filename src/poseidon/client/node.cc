#include "poseidon/client/node.h"

#include <algorithm>

#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

Node::Node(const NodeOptions& options) : options_(options), ctx_(options.ioThreads) {}

std::unique_ptr<Node> Node::start(const NodeOptions& options, const ModelDesc& model) {
  if (options.worldSize < 1) throw InvalidArgument(strCat("world size must be at least 1, got ", options.worldSize));
  if (options.rank < 0 || options.rank >= options.worldSize) {
    throw InvalidArgument(strCat("rank ", options.rank, " is outside the world of ", options.worldSize, " ranks"));
  }
  if (options.threads < 1) {
    throw InvalidArgument(strCat("the syncer thread pool needs at least 1 thread, got ", options.threads));
  }
  if (options.timeout.count() <= 0) throw InvalidArgument("the timeout must be positive");
  if (options.ioThreads < 1 || options.ioThreads > 64) {
    throw InvalidArgument(strCat("ZeroMQ I/O threads must be in [1, 64], got ", options.ioThreads));
  }
  if (options.sendWindowBytes > 0 && options.settings.groupMode()) {
    throw InvalidArgument("priority scheduling (a send window) is for BSP jobs; compute groups order their pulls and "
                          "pushes across layers, so they keep FIFO links");
  }
  std::unique_ptr<Node> node(new Node(options));
  const CurveKeys* curve = nullptr;
  if (!options.secret.empty()) {
    node->keys_ = deriveCurveKeys(options.secret);
    node->zap_ = std::make_unique<ZapAuthenticator>(node->ctx_, node->keys_);
    curve = &node->keys_;
  } else if (options.worldSize > 1 && options.masterAddr.rfind("127.", 0) != 0) {
    POSEIDON_LOG(kWarning) << "no job secret (POSEIDON_SECRET or POSEIDON_SECRET_FILE): any host that can reach "
                              "this job's ports can join it";
  }
  if (options.rank == 0) {
    node->coordinator_ = std::make_unique<Coordinator>(node->ctx_, options.masterAddr, options.masterPort,
                                                       options.worldSize, options.timeout, curve,
                                                       options.masterPortChosen);
  }
  VanOptions vo;
  vo.curve = curve;
  vo.bindHost = options.bindHost;
  vo.port = options.dataPort;
  vo.maxPayloadBytes = options.maxPayloadBytes;
  vo.receiveBufferBytes = options.receiveBufferBytes;
  vo.sendWindowBytes = options.sendWindowBytes;
  vo.charger = options.charger;
  node->van_ = std::make_unique<Van>(node->ctx_, vo);

  JoinRequest req;
  req.rank = options.rank;
  req.worldSize = options.worldSize;
  req.role = options.role;
  req.endpoint = node->van_->endpoint();
  req.model = model;
  req.settings = options.settings;
  RendezvousOptions ro;
  ro.masterAddr = options.masterAddr;
  ro.masterPort = options.masterPort;
  ro.timeout = options.timeout;
  ro.curve = curve;
  node->book_ = joinJob(node->ctx_, ro, req);
  if (options.charger) node->book_.setDeviceModel(&options.charger->model());

  const InformationBook& book = node->book_;
  const int layers = static_cast<int>(book.model().layers.size());
  node->van_->counters().resize(layers);
  std::vector<std::string> endpoints;
  for (const auto& n : book.nodes()) endpoints.push_back(n.endpoint);
  node->van_->connectPeers(options.rank, endpoints, book.jobId());
  if (node->isServer())
    node->server_ = std::make_unique<KvServer>(book, book.shardIndex(options.rank), options.charger);
  if (node->isWorker()) {
    for (int l = 0; l < layers; ++l) node->syncers_.push_back(std::make_unique<Syncer>(static_cast<SyncHost&>(*node), l));
    node->barrier_ = std::make_unique<IterationBarrier>(layers, node->error_);
    node->pool_ = std::make_unique<ThreadPool>(options.threads);
    if (book.settings().groupMode()) {
      Node* n = node.get();
      node->puller_ = std::make_unique<Puller>(
          book, [n](int dest, const FrameHeader& h, const std::vector<Van::Part>& parts) { n->van_->send(dest, h, parts); },
          node->error_);
    }
  }
  node->iteration_ = book.settings().startIteration;
  node->liveness_ = std::make_unique<Liveness>(book.worldSize(), options.rank, options.timeout, options.heartbeat,
                                               book.settings().startIteration, std::chrono::steady_clock::now());
  Node* self = node.get();
  node->collectives_ = std::make_unique<Collectives>(
      *node->van_, book, options.rank, node->error_, [self](std::exception_ptr e) { self->fail(std::move(e)); },
      node->waitTimeout());
  node->fc_ = std::make_unique<FcChannel>(node->error_, book.worldSize());
  node->loop_ = std::thread([self] { self->receiveLoop(); });
  POSEIDON_LOG(kInfo) << "rank " << options.rank << " (" << roleName(options.role) << ") joined job "
                      << std::hex << book.jobId() << std::dec << ": " << book.numWorkers() << " workers, "
                      << book.numServers() << " server shards, " << layers << " layers; data endpoint "
                      << node->van_->endpoint();
  return node;
}

Node::~Node() {
  // A rank that goes without finish() (its program ended or threw) tells its peers, so they stop
  // now with that reason instead of declaring it lost after the timeout.
  if (loop_.joinable() && !finished_ && !error_.failed()) {
    fail(std::make_exception_ptr(AbortedError(
        strCat("rank ", rank(), " left the job before finish() (its program ended or threw an error)"))));
  }
  // Queued sends and reconstructions must not touch the caller's buffers any more.
  for (auto& s : syncers_) s->close();
  stopLoop_ = true;
  if (loop_.joinable()) loop_.join();
  pool_.reset();  // drains queued sends while the van is still open
  if (van_) van_->close();
  coordinator_.reset();
}

uint64_t Node::refusedConnections() const {
  return van_->refusedConnections() + (zap_ ? zap_->refused() : 0);
}

// ---- failure ------------------------------------------------------------------

void Node::fail(std::exception_ptr error) { fail(std::move(error), true); }

void Node::fail(std::exception_ptr error, bool tellPeers) {
  if (!error_.set(std::move(error))) return;
  const std::string why = error_.message();
  POSEIDON_LOG(kError) << why;
  if (barrier_) barrier_->wake();
  if (collectives_) collectives_->wake();
  if (puller_) puller_->wake();
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
    try {
      route(msg);
    } catch (const ProtocolError& e) {
      van_->rejected(msg.peer, strCat(describe(msg.header), ": ", e.what()));
    } catch (const std::exception& e) {
      fail(std::make_exception_ptr(
          Error(strCat("rank ", rank(), ": handling ", describe(msg.header), " failed: ", e.what()))));
    }
  }
}

void Node::sendAll(const std::vector<KvServer::Outgoing>& out) {
  for (const KvServer::Outgoing& o : out) {
    const std::vector<Van::Part> parts = o.parts();
    for (int dest : o.to) van_->send(dest, o.header, parts);
  }
}

// The Van has checked the frame, its job and its sender; route it by type.
void Node::route(Message& msg) {
  const FrameHeader& h = msg.header;
  if (KvServer::handles(h.type)) {
    if (!server_) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank that is not a server"));
    std::vector<KvServer::Outgoing> out;
    {
      std::lock_guard<std::mutex> lock(serverMutex_);
      out = server_->handle(msg);
    }
    sendAll(out);
    return;
  }
  if (h.type == MsgType::kPullReply || h.type == MsgType::kStateReply) {
    if (!puller_) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank that does not pull"));
    if (h.type == MsgType::kPullReply) puller_->onReply(msg);
    else puller_->onStateReply(msg);
    return;
  }
  switch (h.type) {
    case MsgType::kPsAggregate:
    case MsgType::kAdamAggregate:
    case MsgType::kSfbDecision:
    case MsgType::kSfbFactors: {
      if (syncers_.empty()) throw ProtocolError(strCat(msgTypeName(h.type), " to a rank that is not a worker"));
      if (h.layer >= syncers_.size()) throw ProtocolError(strCat("layer ", h.layer, " does not exist"));
      Syncer& s = *syncers_[h.layer];
      if (h.type == MsgType::kSfbFactors) s.onFactors(msg);
      else if (h.type == MsgType::kSfbDecision) s.onDecision(msg);
      else s.onAggregate(msg);
      return;
    }
    case MsgType::kBroadcast:
    case MsgType::kBarrier:
      collectives_->deliver(std::move(msg));
      return;
    case MsgType::kFcForward: {
      if (rank() != kFcServerRank) throw ProtocolError(strCat("fc-forward to rank ", rank(), ", not the FC server"));
      FcChannel::Request r;
      r.from = static_cast<int>(h.sender);
      r.round = h.iteration;
      r.payload.assign(msg.data(), msg.data() + msg.size());
      fc_->deliverRequest(std::move(r));
      return;
    }
    case MsgType::kFcBackward:
      if (h.sender != kFcServerRank)
        throw ProtocolError(strCat("fc-backward from rank ", h.sender, ", not the FC server"));
      fc_->deliverReply(h.iteration, std::vector<uint8_t>(msg.data(), msg.data() + msg.size()));
      return;
    case MsgType::kAbort: {
      std::string why(reinterpret_cast<const char*>(msg.data()), std::min<size_t>(msg.size(), 4096));
      fail(std::make_exception_ptr(
               AbortedError(strCat("rank ", h.sender, " failed (at its iteration ", h.iteration, "): ", why))),
           /*tellPeers=*/false);
      return;
    }
    case MsgType::kHeartbeat:
    case MsgType::kBye:
      return;
    default:
      throw ProtocolError(strCat("unexpected ", msgTypeName(h.type), " on a data endpoint"));
  }
}

// ---- merged FC -------------------------------------------------------------------

std::vector<uint8_t> Node::fcExchange(int64_t round, std::vector<uint8_t> request) {
  if (!isWorker()) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no FC rounds"));
  throwIfFailed();
  fc_->expectReply(round);
  if (rank() == kFcServerRank) {
    fc_->deliverRequest({rank(), round, std::move(request)});  // a rank does not send to itself
  } else {
    van_->send(kFcServerRank, wire::fcForward(round), request.data(), request.size());
  }
  std::vector<uint8_t> reply;
  if (!fc_->waitReply(&reply, waitTimeout())) {
    fail(std::make_exception_ptr(TimeoutError(
        strCat("rank ", rank(), ": timed out after ", waitTimeout().count() / 1000.0,
               " s waiting for the FC server (rank ", kFcServerRank, ") to answer round ", round, "'s fc-forward"))));
    throwIfFailed();
  }
  return reply;
}

bool Node::nextFcRequest(FcChannel::Request* out, std::chrono::milliseconds wait) {
  if (rank() != kFcServerRank) throw InvalidArgument(strCat("rank ", rank(), " is not the FC server"));
  return fc_->nextRequest(out, wait);
}

void Node::sendFcReply(int dest, int64_t round, const std::vector<uint8_t>& reply) {
  if (dest == rank()) {
    fc_->deliverReply(round, reply);
  } else {
    van_->send(dest, wire::fcBackward(round), reply.data(), reply.size());
  }
}

// ---- worker API ------------------------------------------------------------------

void Node::send(int dest, const FrameHeader& header, const std::vector<Van::Part>& parts) {
  van_->send(dest, header, parts);
}

void Node::schedule(std::function<void()> task) { pool_->schedule(std::move(task)); }

void Node::beginIteration(int64_t iteration) {
  if (!isWorker()) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  throwIfFailed();
  int64_t expected = begun_ ? iteration_.load() + 1 : book_.settings().startIteration;
  if (iteration != expected) {
    throw InvalidArgument(strCat("beginIteration(", iteration, "): expected iteration ", expected));
  }
  barrier_->begin(iteration);
  begun_ = true;
  iteration_ = iteration;
}

Scheme Node::schemeFor(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(book_.model().layers.size())) {
    throw InvalidArgument(strCat("layer index ", layer, " out of range"));
  }
  // Compute groups push dense gradients to the shards that hold the model (factors to the
  // shards are not built: docs/omnivore.md).
  if (book_.settings().groupMode()) return Scheme::kPS;
  return book_.bestScheme(layer, book_.settings().batch);
}

void Node::submitDense(int layer, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  throwIfFailed();
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("submitDense: layer index ", layer, " out of range (rank ", rank(),
                                 " has ", syncers_.size(), " worker layers)"));
  }
  syncers_[layer]->submitDense(iteration_.load(), std::move(grad), std::move(keepAlive));
}

void Node::submitFactors(int layer, const float* u, const float* v, int64_t rows, LayerBuffer out,
                         std::shared_ptr<void> keepAlive) {
  throwIfFailed();
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("submitFactors: layer index ", layer, " out of range"));
  }
  Scheme scheme = schemeFor(layer);
  if (scheme == Scheme::kPS) {
    throw InvalidArgument(strCat("submitFactors: BestScheme chose ps for layer '", book_.model().layers[layer].name,
                                 "' at the job's batch of ", book_.settings().batch,
                                 "; submit its dense gradient instead"));
  }
  syncers_[layer]->submitFactors(iteration_.load(), scheme, u, v, rows, std::move(out), std::move(keepAlive));
}

bool Node::alreadyComplete() const {
  if (!book_.settings().stragglerMode() || syncers_.empty()) return false;
  const int64_t t = iteration_.load();
  for (const auto& s : syncers_)
    if (!s->completeWithoutMe(t)) return false;
  return true;
}

void Node::skipIteration(const std::vector<LayerBuffer>& outputs) {
  throwIfFailed();
  if (outputs.size() != syncers_.size()) {
    throw InvalidArgument(strCat("skipIteration: ", outputs.size(), " buffers for ", syncers_.size(), " layers"));
  }
  if (!alreadyComplete()) throw InvalidArgument("skipIteration: the iteration has not completed without this worker");
  for (size_t l = 0; l < syncers_.size(); ++l) syncers_[l]->submitSkipped(iteration_.load(), outputs[l]);
  ++skipped_;
}

int64_t Node::droppedContributions() const {
  int64_t n = 0;
  for (const auto& s : syncers_) n += s->droppedContributions();
  return n;
}

std::vector<std::vector<bool>> Node::contributors(int layer, int64_t iteration) const {
  return syncers_.at(static_cast<size_t>(layer))->contributors(iteration);
}

void Node::layerDone(int layer, int64_t iteration) {
  if (!barrier_->layerDone(layer, iteration)) {
    // Cannot happen under BSP; treat it as a bug rather than corrupt state.
    fail(std::make_exception_ptr(Error(strCat("internal error: layer ", layer, " finished iteration ", iteration,
                                              " during iteration ", iteration_.load()))));
  }
}

// The barrier allows two heartbeat periods more than the liveness timeout: when
// a peer dies, the liveness check names it before the barrier times out.
void Node::waitIteration() { waitIteration(waitTimeout()); }

bool Node::layerReady(int layer) const {
  return barrier_ && layer >= 0 && layer < static_cast<int>(syncers_.size()) && barrier_->isDone(layer);
}

void Node::waitLayer(int layer) {
  if (!barrier_) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("waitLayer: layer index ", layer, " out of range (rank ", rank(), " has ",
                                 syncers_.size(), " worker layers)"));
  }
  bool done = false;
  try {
    done = barrier_->waitLayer(layer, waitTimeout());
  } catch (...) {
    quiesce();
    throw;
  }
  if (done) return;
  const int64_t it = iteration_.load();
  fail(std::make_exception_ptr(TimeoutError(strCat("rank ", rank(), " iteration ", it, ": timed out after ",
                                                   waitTimeout().count() / 1000.0, " s waiting for ",
                                                   syncers_[layer]->pending(it)))));
  throwIfFailed();
}

void Node::waitIteration(std::chrono::milliseconds timeout) {
  if (!barrier_) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  std::vector<int> pending;
  try {
    pending = barrier_->wait(timeout);
  } catch (...) {
    quiesce();
    throw;
  }
  if (pending.empty()) return;
  const int64_t it = iteration_.load();
  std::string what;
  for (size_t i = 0; i < pending.size() && i < 8; ++i) what += (i ? "; " : "") + syncers_[pending[i]]->pending(it);
  if (pending.size() > 8) what += strCat("; and ", pending.size() - 8, " more layers");
  fail(std::make_exception_ptr(TimeoutError(strCat("rank ", rank(), " iteration ", it, ": timed out after ",
                                                   timeout.count() / 1000.0, " s waiting for ", what))));
  throwIfFailed();
}

// ---- compute-group mode ----------------------------------------------------------------

void Node::setModel(std::vector<LayerBuffer> params) {
  if (!puller_) throw InvalidArgument("setModel: this job has no compute groups (or this rank is not a worker)");
  puller_->setTargets(std::move(params));
}

void Node::initModel(const std::vector<LayerBuffer>& momentum, int64_t version, const std::vector<int64_t>& clocks) {
  throwIfFailed();
  if (!puller_) throw InvalidArgument("initModel: this job has no compute groups (or this rank is not a worker)");
  if (rank() != book_.workerRanks().front()) throw InvalidArgument("initModel: only the first worker initializes");
  const size_t groups = static_cast<size_t>(book_.settings().groups);
  if (clocks.size() != groups) throw InvalidArgument(strCat("initModel: ", clocks.size(), " clocks for ", groups, " groups"));
  const std::vector<LayerBuffer>& params = puller_->targets();
  ByteWriter tail;
  for (int64_t c : clocks) tail.i64(c);
  const std::vector<uint8_t> clockBytes = tail.take();
  std::vector<float> zeros;
  std::vector<Van::Part> parts;
  for (int l = 0; l < book_.layout().numLayers(); ++l) {
    if (!momentum.empty() && momentum[l].size() != params[l].size()) {
      throw InvalidArgument(strCat("initModel: layer ", l, " momentum has ", momentum[l].size(), " floats"));
    }
    for (const KvPair& p : book_.layout().pairsOf(l)) {
      parts.clear();
      params[l].forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) { parts.push_back({ptr, size_t(n) * kFloatBytes}); });
      if (momentum.empty()) {
        zeros.assign(static_cast<size_t>(p.length), 0.0f);
        parts.push_back({zeros.data(), zeros.size() * kFloatBytes});
      } else {
        momentum[l].forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) { parts.push_back({ptr, size_t(n) * kFloatBytes}); });
      }
      parts.push_back({clockBytes.data(), clockBytes.size()});
      van_->send(book_.shardRank(p.shard), wire::modelInit(l, p.index, version), parts);
    }
  }
}

void Node::startPull(int64_t round) {
  throwIfFailed();
  if (!puller_) throw InvalidArgument("startPull: this job has no compute groups (or this rank is not a worker)");
  puller_->start(round);
}

void Node::waitPulled(int layer) {
  if (!puller_->waitLayer(layer, waitTimeout())) {
    fail(std::make_exception_ptr(TimeoutError(strCat("rank ", rank(), " group ", group(), ": timed out after ",
                                                     waitTimeout().count() / 1000.0, " s waiting for layer '",
                                                     book_.model().layers[layer].name, "' from the shards"))));
  }
  throwIfFailed();
}

void Node::waitPulled() {
  if (!puller_->waitAll(waitTimeout())) {
    std::string layers;
    for (int l : puller_->missing()) layers += (layers.empty() ? "'" : ", '") + book_.model().layers[l].name + "'";
    fail(std::make_exception_ptr(TimeoutError(strCat(
        "rank ", rank(), " group ", group(), ": timed out after ", waitTimeout().count() / 1000.0,
        " s pulling layers ", layers, " from the shards (a slower group may hold them back: --staleness)"))));
  }
  throwIfFailed();
}

std::pair<int64_t, std::vector<int64_t>> Node::fetchModelState(std::vector<LayerBuffer> momentum) {
  throwIfFailed();
  if (!puller_ || rank() != book_.workerRanks().front()) {
    throw InvalidArgument("fetchModelState: the first worker of a job with compute groups fetches the state");
  }
  puller_->startState(std::move(momentum));
  if (!puller_->waitAll(waitTimeout())) {
    fail(std::make_exception_ptr(TimeoutError(strCat("rank ", rank(), ": timed out after ", waitTimeout().count() / 1000.0,
                                                     " s fetching the model's state from the shards"))));
  }
  throwIfFailed();
  return {puller_->stateVersion(), puller_->stateClocks()};
}

std::vector<int64_t> Node::pulledVersions() const { return puller_ ? puller_->versions() : std::vector<int64_t>{}; }

void Node::submitGroupPush(int layer, LayerBuffer grad, float lr, std::shared_ptr<void> keepAlive) {
  throwIfFailed();
  if (!puller_) throw InvalidArgument("submitGroupPush: this job has no compute groups");
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("submitGroupPush: layer index ", layer, " out of range"));
  }
  syncers_[layer]->submitGroupPush(iteration_.load(), std::move(grad), lr, std::move(keepAlive));
}

std::map<int64_t, int64_t> Node::stalenessHistogram() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->stalenessHistogram() : std::map<int64_t, int64_t>{};
}

bool Node::recordModelUpdates(int layer, int pair) {
  std::lock_guard<std::mutex> lock(serverMutex_);
  if (!server_ || !server_->model()) return false;
  const auto& pairs = book_.layout().pairsOf(layer);
  if (pair < 0 || pair >= static_cast<int>(pairs.size()) || book_.shardRank(pairs[pair].shard) != rank()) return false;
  server_->model()->recordPair(layer, pair);
  return true;
}

std::vector<std::vector<float>> Node::recordedModel() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->recorded() : std::vector<std::vector<float>>{};
}

int64_t Node::maxGroupLead() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->maxLead() : 0;
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

void Node::finish() {
  if (finished_) return;
  barrier();
  finished_ = true;
  // Say bye, so that peers still finishing do not take our silence for a failure.
  sendToPeers(wire::bye(iteration_.load()), {}, false);
  stopLoop_ = true;
  if (loop_.joinable()) loop_.join();
  pool_.reset();
  van_->close();
}

}  // namespace poseidon
