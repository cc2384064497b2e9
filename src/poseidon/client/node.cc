#include "poseidon/client/node.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/kvstore/contributors.h"

namespace poseidon {

// Lock order: a Syncer's mutex may be held while taking Node::mutex_ (via
// layerDone / fail), never the other way round.

Node::Node(const NodeOptions& options) : options_(options), ctx_(1) {}

std::unique_ptr<Node> Node::start(const NodeOptions& options, const ModelDesc& model) {
  if (options.worldSize < 1) throw InvalidArgument(strCat("world size must be at least 1, got ", options.worldSize));
  if (options.rank < 0 || options.rank >= options.worldSize) {
    throw InvalidArgument(strCat("rank ", options.rank, " is outside the world of ", options.worldSize, " ranks"));
  }
  if (options.threads < 1) throw InvalidArgument(strCat("--threads must be at least 1, got ", options.threads));
  if (options.timeout.count() <= 0) throw InvalidArgument("the timeout must be positive");
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
                                                       options.worldSize, options.timeout, curve);
  }
  VanOptions vo;
  vo.curve = curve;
  vo.bindHost = options.bindHost;
  vo.port = options.dataPort;
  vo.maxPayloadBytes = options.maxPayloadBytes;
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

  const InformationBook& book = node->book_;
  const int layers = static_cast<int>(book.model().layers.size());
  node->van_->counters().resize(layers);
  std::vector<std::string> endpoints;
  for (const auto& n : book.nodes()) endpoints.push_back(n.endpoint);
  node->van_->connectPeers(options.rank, endpoints);
  if (node->isServer()) {
    node->shard_ = std::make_unique<KvShard>(book, book.shardIndex(options.rank));
    if (book.settings().policy == SchemePolicy::kAdam) {
      node->adam_ = std::make_unique<AdamServer>(book, book.shardIndex(options.rank));
    }
    if (book.settings().stragglerMode()) {
      node->keeper_ = std::make_unique<SfbKeeper>(book, book.shardIndex(options.rank));
    }
  }
  if (node->isWorker()) {
    for (int l = 0; l < layers; ++l) node->syncers_.push_back(std::make_unique<Syncer>(static_cast<SyncHost&>(*node), l));
    node->pool_ = std::make_unique<ThreadPool>(options.threads);
  }
  node->iteration_ = book.settings().startIteration;
  node->heartbeat_ = options.heartbeat.count() > 0
                         ? options.heartbeat
                         : std::max(std::chrono::milliseconds(50), std::min(std::chrono::milliseconds(1000),
                                                                            options.timeout / 6));
  auto now = std::chrono::steady_clock::now();
  node->lastHeard_.assign(book.worldSize(), now);
  node->lastIteration_.assign(book.worldSize(), book.settings().startIteration);
  node->departed_.assign(book.worldSize(), false);
  node->nextHeartbeat_ = now;
  node->layerDone_.assign(layers, true);
  node->layersLeft_ = 0;
  node->loop_ = std::thread([n = node.get()] { n->receiveLoop(); });
  POSEIDON_LOG(kInfo) << "rank " << options.rank << " (" << roleName(options.role) << ") joined job "
                      << std::hex << book.jobId() << std::dec << ": " << book.numWorkers() << " workers, "
                      << book.numServers() << " server shards, " << layers << " layers; data endpoint "
                      << node->van_->endpoint();
  return node;
}

Node::~Node() {
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

void Node::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) return;
    error_ = why;
  }
  cv_.notify_all();
  POSEIDON_LOG(kError) << why;
  // Tell the peers, so they stop at once with this reason instead of timing out.
  sendToPeers(MsgType::kAbort, why.data(), why.size(), false);
}

void Node::sendToPeers(MsgType type, const void* data, size_t size, bool skipDeparted) {
  FrameHeader h;
  h.type = type;
  h.job = book_.jobId();
  h.iteration = iteration_.load();
  for (int r = 0; r < book_.worldSize(); ++r) {
    if (r == rank() || (skipDeparted && departed_[r])) continue;
    try {
      van_->send(r, h, data, size);
    } catch (const Error&) {
      // Best effort: a peer that cannot be reached is noticed by its own silence.
    }
  }
}

void Node::abort(const std::string& why) { fail(strCat("rank ", rank(), " aborted the job: ", why)); }

void Node::throwError() const {
  // mutex_ held by the caller or error_ already immutable (set once).
  if (aborted_) throw AbortedError(error_);
  throw Error(error_);
}

void Node::checkError() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) throwError();
}

// ---- receive loop ----------------------------------------------------------------

void Node::heartbeatAndCheckPeers() {
  auto now = std::chrono::steady_clock::now();
  if (now >= nextHeartbeat_) {
    nextHeartbeat_ = now + heartbeat_;
    sendToPeers(MsgType::kHeartbeat, nullptr, 0, true);
  }
  for (int r = 0; r < book_.worldSize(); ++r) {
    if (r == rank() || departed_[r]) continue;
    auto silent = now - lastHeard_[r];
    if (silent > options_.timeout) {
      fail(strCat("rank ", rank(), ": lost rank ", r, " (nothing from it for ",
                  std::chrono::duration_cast<std::chrono::milliseconds>(silent).count() / 1000.0,
                  " s; last known at iteration ", lastIteration_[r], "): it died, hung or became unreachable"));
      departed_[r] = true;  // report each lost peer once
    }
  }
}

void Node::receiveLoop() {
  Message msg;
  int64_t pollMs = std::min<int64_t>(100, heartbeat_.count());
  if (book_.settings().stragglerMode()) {
    pollMs = std::min<int64_t>(pollMs, std::max<int64_t>(1, book_.settings().stragglerTimeoutMs / 4));
  }
  while (!stopLoop_) {
    bool got = false;
    try {
      got = van_->poll(&msg, static_cast<int>(pollMs));
    } catch (const Error& e) {
      fail(strCat("rank ", rank(), ": transport failed: ", e.what()));
      return;
    }
    heartbeatAndCheckPeers();
    if (shard_ || keeper_) {
      try {
        expireStragglerRounds();
      } catch (const Error& e) {
        fail(strCat("rank ", rank(), ": ", e.what()));
      }
    }
    if (!got) continue;
    try {
      if (msg.header.job != book_.jobId()) {
        throw ProtocolError(strCat("frame for job ", std::hex, msg.header.job, ", this job is ", book_.jobId()));
      }
      if (static_cast<int>(msg.header.sender) >= book_.worldSize()) {
        throw ProtocolError(strCat("sender rank ", msg.header.sender, " outside the world of ", book_.worldSize()));
      }
      const int sender = static_cast<int>(msg.header.sender);
      lastHeard_[sender] = std::chrono::steady_clock::now();
      if (msg.header.type == MsgType::kHeartbeat || msg.header.type == MsgType::kPsPush ||
          msg.header.type == MsgType::kSfbFactors || msg.header.type == MsgType::kSfbNotice) {
        lastIteration_[sender] = msg.header.iteration;
      }
      if (msg.header.type == MsgType::kBye) departed_[sender] = true;
      dispatch(msg);
    } catch (const ProtocolError& e) {
      van_->rejected(msg.peer, strCat(describe(msg.header), ": ", e.what()));
    } catch (const std::exception& e) {
      fail(strCat("rank ", rank(), ": handling ", describe(msg.header), " failed: ", e.what()));
    }
  }
}

void Node::dispatch(Message& msg) {
  const FrameHeader& h = msg.header;
  switch (h.type) {
    case MsgType::kPsPush:
      if (!shard_) throw ProtocolError("ps push to a rank that is not a server");
      onPush(msg);
      return;
    case MsgType::kAdamFactors:
      if (!adam_) throw ProtocolError("adam factors to a rank that is not an adam server");
      onAdamFactors(msg);
      return;
    case MsgType::kSfbNotice: {
      if (!keeper_) throw ProtocolError("sfb notice to a rank that keeps no sfb rounds");
      auto d = keeper_->notice(static_cast<int>(h.sender), static_cast<int>(h.layer), h.iteration);
      if (d) sendDecision(*d);
      return;
    }
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
    case MsgType::kBarrier: {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto& box = mail_[{static_cast<uint16_t>(h.type), h.layer}];
        if (box.size() >= static_cast<size_t>(book_.worldSize()) * 1024 * 1024) throw ProtocolError("mailbox full");
        box.push_back(std::move(msg));
      }
      cv_.notify_all();
      return;
    }
    case MsgType::kAbort: {
      std::string why(reinterpret_cast<const char*>(msg.data()), std::min<size_t>(msg.size(), 4096));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_.empty()) return;
        error_ = strCat("rank ", h.sender, " failed (at its iteration ", h.iteration, "): ", why);
        aborted_ = true;
      }
      cv_.notify_all();
      POSEIDON_LOG(kError) << "rank " << rank() << ": job aborted by rank " << h.sender << ": " << why;
      return;
    }
    case MsgType::kHeartbeat:
    case MsgType::kBye:
      return;
    default:
      throw ProtocolError(strCat("unexpected ", msgTypeName(h.type), " on a data endpoint"));
  }
}

void Node::onPush(Message& msg) {
  const FrameHeader& h = msg.header;
  auto done = shard_->push(static_cast<int>(h.sender), static_cast<int>(h.layer), static_cast<int>(h.pair),
                           h.iteration, msg.data(), msg.size());
  if (done) sendAggregate(*done);
}

void Node::sendAggregate(const KvShard::Completed& done) {
  FrameHeader out;
  out.type = MsgType::kPsAggregate;
  out.job = book_.jobId();
  out.layer = static_cast<uint32_t>(done.layer);
  out.iteration = done.iteration;
  out.pair = static_cast<uint32_t>(done.pair);
  const size_t bytes = done.sum.size() * sizeof(float);
  // Straggler mode: the contributor mask follows the floats, so workers divide
  // by the number of contributions and know whether theirs was among them.
  std::vector<uint8_t> mask;
  if (book_.settings().stragglerMode()) mask = encodeMask(done.contributors);
  for (int w : book_.workerRanks()) van_->send(w, out, {Van::Part{done.sum.data(), bytes}, Van::Part{mask.data(), mask.size()}});
}

void Node::sendDecision(const SfbKeeper::Decision& d) {
  FrameHeader out;
  out.type = MsgType::kSfbDecision;
  out.job = book_.jobId();
  out.layer = static_cast<uint32_t>(d.layer);
  out.iteration = d.iteration;
  std::vector<uint8_t> mask = encodeMask(d.contributors);
  for (int w : book_.workerRanks()) van_->send(w, out, mask.data(), mask.size());
}

void Node::expireStragglerRounds() {
  if (!book_.settings().stragglerMode()) return;
  auto now = std::chrono::steady_clock::now();
  if (shard_)
    for (const auto& done : shard_->expire(now)) sendAggregate(done);
  if (keeper_)
    for (const auto& d : keeper_->expire(now)) sendDecision(d);
}

void Node::onAdamFactors(Message& msg) {
  const FrameHeader& h = msg.header;
  auto done = adam_->push(static_cast<int>(h.sender), static_cast<int>(h.layer), h.iteration, h.aux,
                          std::move(msg.payload));
  if (!done) return;
  FrameHeader out;
  out.type = MsgType::kAdamAggregate;
  out.job = book_.jobId();
  out.layer = h.layer;
  out.iteration = h.iteration;
  for (const KvPair& p : book_.layout().pairsOf(done->layer)) {
    out.pair = static_cast<uint32_t>(p.index);
    for (int w : book_.workerRanks()) van_->send(w, out, done->sum.data() + p.offset, static_cast<size_t>(p.length) * 4);
  }
}

// ---- worker API ------------------------------------------------------------------

void Node::schedule(std::function<void()> task) { pool_->schedule(std::move(task)); }

void Node::beginIteration(int64_t iteration) {
  if (!isWorker()) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) throwError();
  int64_t expected = begun_ ? iteration_.load() + 1 : book_.settings().startIteration;
  if (iteration != expected) {
    throw InvalidArgument(strCat("beginIteration(", iteration, "): expected iteration ", expected));
  }
  if (layersLeft_ != 0) {
    throw InvalidArgument(strCat("beginIteration(", iteration, ") before waitIteration() finished iteration ",
                                 iteration_.load()));
  }
  begun_ = true;
  iteration_ = iteration;
  std::fill(layerDone_.begin(), layerDone_.end(), false);
  layersLeft_ = static_cast<int>(layerDone_.size());
}

Scheme Node::schemeFor(int layer, int64_t rows) const {
  if (layer < 0 || layer >= static_cast<int>(book_.model().layers.size())) {
    throw InvalidArgument(strCat("layer index ", layer, " out of range"));
  }
  return book_.bestScheme(layer, std::max<int64_t>(rows, 1));
}

void Node::submitDense(int layer, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  checkError();
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("submitDense: layer index ", layer, " out of range (rank ", rank(),
                                 " has ", syncers_.size(), " worker layers)"));
  }
  syncers_[layer]->submitDense(iteration_.load(), std::move(grad), std::move(keepAlive));
}

void Node::submitFactors(int layer, const float* u, const float* v, int64_t rows, LayerBuffer out,
                         std::shared_ptr<void> keepAlive) {
  checkError();
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("submitFactors: layer index ", layer, " out of range"));
  }
  Scheme scheme = schemeFor(layer, rows);
  if (scheme == Scheme::kPS) {
    throw InvalidArgument(strCat("submitFactors: BestScheme chose ps for layer '", book_.model().layers[layer].name,
                                 "' at ", rows, " rows; submit its dense gradient instead"));
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
  checkError();
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (iteration != iteration_.load() || layerDone_[layer]) {
      // Cannot happen under BSP; treat it as a bug rather than corrupt state.
      error_ = strCat("internal error: layer ", layer, " finished iteration ", iteration, " during iteration ",
                      iteration_.load());
    } else {
      layerDone_[layer] = true;
      --layersLeft_;
    }
  }
  cv_.notify_all();
}

// The barrier allows two heartbeat periods more than the liveness timeout: when
// a peer dies, the liveness check names it before the barrier times out.
void Node::waitIteration() { waitIteration(waitTimeout()); }

void Node::waitIteration(std::chrono::milliseconds timeout) {
  std::vector<int> pending;
  int64_t it;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    bool ok = cv_.wait_for(lock, timeout, [&] { return !error_.empty() || layersLeft_ == 0; });
    if (!error_.empty()) throwError();
    if (ok) return;
    it = iteration_.load();
    for (size_t l = 0; l < layerDone_.size(); ++l)
      if (!layerDone_[l]) pending.push_back(static_cast<int>(l));
  }
  // Outside mutex_: Syncer::pending takes the syncer's lock (see lock order).
  std::string what;
  for (size_t i = 0; i < pending.size() && i < 8; ++i) what += (i ? "; " : "") + syncers_[pending[i]]->pending(it);
  if (pending.size() > 8) what += strCat("; and ", pending.size() - 8, " more layers");
  std::string why = strCat("rank ", rank(), " iteration ", it, ": timed out after ", timeout.count() / 1000.0,
                           " s waiting for ", what);
  fail(why);
  throw TimeoutError(why);
}

// ---- collectives -------------------------------------------------------------------

std::vector<Message> Node::takeMail(MsgType type, uint32_t seq, size_t count, const char* what) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto key = std::make_pair(static_cast<uint16_t>(type), seq);
  bool ok = cv_.wait_for(lock, waitTimeout(),
                         [&] { return !error_.empty() || mail_[key].size() >= count; });
  if (!error_.empty()) throwError();
  if (!ok) {
    std::vector<bool> seen(book_.worldSize(), false);
    for (const auto& m : mail_[key]) seen[m.header.sender] = true;
    std::vector<int> missing;
    for (int r = 0; r < book_.worldSize(); ++r)
      if (!seen[r] && r != rank()) missing.push_back(r);
    std::string why = strCat("rank ", rank(), ": timed out after ", waitTimeout().count() / 1000.0, " s in ", what,
                             " waiting for rank(s) ", formatRanks(missing));
    lock.unlock();
    fail(why);
    throw TimeoutError(why);
  }
  std::vector<Message> out = std::move(mail_[key]);
  mail_.erase(key);
  return out;
}

void Node::broadcast(int root, LayerBuffer buffer) {
  checkError();
  if (root < 0 || root >= book_.worldSize()) throw InvalidArgument(strCat("broadcast root ", root, " out of range"));
  const uint32_t seq = collectiveSeq_++;
  const int64_t chunk = std::max<int64_t>(1, book_.settings().pairBytes / 4);
  const int64_t total = buffer.size();
  const int64_t chunks = (total + chunk - 1) / chunk;
  if (rank() == root) {
    FrameHeader h;
    h.type = MsgType::kBroadcast;
    h.job = book_.jobId();
    h.layer = seq;
    h.iteration = total;
    h.aux = static_cast<uint32_t>(chunks);
    std::vector<Van::Part> parts;
    for (int r = 0; r < book_.worldSize(); ++r) {
      if (r == root) continue;
      for (int64_t c = 0; c < std::max<int64_t>(chunks, 1); ++c) {
        parts.clear();
        int64_t off = c * chunk, len = std::min(chunk, total - off);
        if (len > 0) buffer.forEach(off, len, [&](float* p, int64_t n, int64_t) { parts.push_back({p, size_t(n) * 4}); });
        h.pair = static_cast<uint32_t>(c);
        van_->send(r, h, parts);
      }
    }
    return;
  }
  std::vector<Message> msgs = takeMail(MsgType::kBroadcast, seq, std::max<int64_t>(chunks, 1), "broadcast");
  std::vector<bool> seen(std::max<int64_t>(chunks, 1), false);
  for (const Message& m : msgs) {
    const FrameHeader& h = m.header;
    if (static_cast<int>(h.sender) != root || h.iteration != total || h.aux != chunks) {
      throw Error(strCat("broadcast mismatch: rank ", h.sender, " sent ", h.iteration, " floats from root ", root,
                         ", rank ", rank(), " expects ", total, " from root ", root,
                         " (do all ranks build the same model?)"));
    }
    int64_t off = static_cast<int64_t>(h.pair) * chunk, len = std::min(chunk, total - off);
    if (h.pair >= seen.size() || seen[h.pair] || (len > 0 && m.size() != size_t(len) * 4)) {
      throw Error(strCat("broadcast chunk ", h.pair, " from rank ", h.sender, " is malformed"));
    }
    seen[h.pair] = true;
    if (len > 0) buffer.forEach(off, len, [&](float* p, int64_t n, int64_t done) { std::memcpy(p, m.data() + done * 4, n * 4); });
  }
}

void Node::barrier() {
  checkError();
  const uint32_t seq = collectiveSeq_++;
  FrameHeader h;
  h.type = MsgType::kBarrier;
  h.job = book_.jobId();
  h.layer = seq;
  for (int r = 0; r < book_.worldSize(); ++r)
    if (r != rank()) van_->send(r, h, static_cast<const void*>(nullptr), size_t{0});
  std::vector<Message> msgs = takeMail(MsgType::kBarrier, seq, book_.worldSize() - 1, "barrier");
  std::vector<bool> seen(book_.worldSize(), false);
  for (const Message& m : msgs) {
    if (seen[m.header.sender]) throw Error(strCat("barrier: rank ", m.header.sender, " arrived twice"));
    seen[m.header.sender] = true;
  }
}

void Node::finish() {
  if (finished_) return;
  barrier();
  finished_ = true;
  // Say bye, so that peers still finishing do not take our silence for a failure.
  sendToPeers(MsgType::kBye, nullptr, 0, false);
  stopLoop_ = true;
  if (loop_.joinable()) loop_.join();
  pool_.reset();
  van_->close();
}

}  // namespace poseidon
