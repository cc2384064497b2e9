#include "poseidon/client/syncer.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/kvstore/contributors.h"

namespace poseidon {

namespace {
constexpr size_t kFinishedHistory = 256;

void copyScaled(const LayerBuffer& out, int64_t offset, int64_t length, const uint8_t* src, float divisor) {
  out.forEach(offset, length, [&](float* dst, int64_t n, int64_t done) {
    std::memcpy(dst, src + done * sizeof(float), static_cast<size_t>(n) * sizeof(float));
    for (int64_t i = 0; i < n; ++i) dst[i] /= divisor;
  });
}
}  // namespace

Syncer::Syncer(SyncHost& host, int layer)
    : host_(host),
      layer_(layer),
      spec_(host.book().model().layers.at(layer)),
      pairs_(host.book().layout().pairsOf(layer)),
      straggler_(host.book().settings().stragglerMode()) {}

Syncer::Round& Syncer::roundLocked(int64_t iteration) {
  auto it = rounds_.find(iteration);
  if (it != rounds_.end()) return it->second;
  Round& r = rounds_[iteration];
  int workers = host_.book().numWorkers();
  r.pairSeen.assign(pairs_.size(), false);
  r.pairsLeft = pairs_.size();
  r.early.resize(pairs_.size());
  r.pairContributors.resize(pairs_.size());
  r.factors.resize(workers);
  r.rows.assign(workers, 0);
  r.factorSeen.assign(workers, false);
  return r;
}

Syncer::Round& Syncer::submitRoundLocked(int64_t iteration) {
  auto twice = [&] { return InvalidArgument(strCat("layer '", spec_.name, "' submitted twice in iteration ", iteration)); };
  if (contributors_.count(iteration)) throw twice();
  Round& r = roundLocked(iteration);
  if (r.submitted || r.skipped) throw twice();
  return r;
}

Syncer::Round* Syncer::findRoundLocked(int64_t iteration, bool create, const char* what) {
  if (contributors_.count(iteration)) return nullptr;
  auto it = rounds_.find(iteration);
  if (it != rounds_.end()) return &it->second;
  if (!create) return nullptr;
  int64_t current = host_.currentIteration();
  int64_t ahead = straggler_ ? kMaxAheadStraggler : 1;
  if (iteration < current || iteration > current + ahead) {
    throw ProtocolError(strCat(what, " for layer ", layer_, " iteration ", iteration, " outside the open window (",
                               current, "..", current + ahead, ")"));
  }
  return &roundLocked(iteration);
}

bool Syncer::schemeOf(int64_t iteration, Scheme* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it == rounds_.end() || !it->second.submitted) return false;
  *out = it->second.scheme;
  return true;
}

std::vector<std::vector<bool>> Syncer::contributors(int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = contributors_.find(iteration);
  return it == contributors_.end() ? std::vector<std::vector<bool>>{} : it->second;
}

int64_t Syncer::droppedContributions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

// ---- submit -------------------------------------------------------------------------

void Syncer::submitDense(int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  if (grad.size() != spec_.numel()) {
    throw InvalidArgument(strCat("layer '", spec_.name, "': gradient has ", grad.size(), " floats, expected ",
                                 spec_.numel()));
  }
  bool done = false;
  std::vector<int> toSend;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round& r = submitRoundLocked(iteration);
    if (r.factorsSeen > 0 || r.decided) {
      host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration,
                        ": this rank chose ps but another worker sent sfb factors (workers must use the same batch "
                        "size and scheme policy)"));
      return;
    }
    r.submitted = true;
    r.scheme = Scheme::kPS;
    r.out = grad;
    r.keepAlive = keepAlive;
    // Results that came before us (straggler mode) go in now; we send only
    // the pairs whose rounds are still open.
    applyEarlyLocked(r, grad, &toSend);
    done = maybeFinishLocked(iteration, r);
  }
  if (done) {
    host_.layerDone(layer_, iteration);
    return;
  }
  if (!toSend.empty()) {
    host_.schedule([this, iteration, grad, keepAlive, toSend] { sendDense(iteration, grad, toSend); });
  }
}

void Syncer::applyEarlyLocked(Round& r, const LayerBuffer& out, std::vector<int>* open) {
  for (size_t i = 0; i < pairs_.size(); ++i) {
    if (!r.pairSeen[i]) {
      if (open) open->push_back(static_cast<int>(i));
      continue;
    }
    const KvPair& p = pairs_[i];
    out.forEach(p.offset, p.length, [&](float* dst, int64_t n, int64_t off) {
      std::memcpy(dst, r.early[i].data() + off, static_cast<size_t>(n) * sizeof(float));
    });
    std::vector<float>().swap(r.early[i]);
  }
}

void Syncer::sendDense(int64_t iteration, const LayerBuffer& grad, const std::vector<int>& pairIndices) {
  const InformationBook& book = host_.book();
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  try {
    std::vector<Van::Part> parts;
    for (int i : pairIndices) {
      const KvPair& p = pairs_[i];
      // In straggler mode a result for this pair may arrive without our push and
      // is written into the same memory: check under the lock and send nothing
      // then. Otherwise no result can precede our push, and the receive thread
      // must not wait on this lock while a pair is copied out.
      std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
      if (straggler_) {
        lock.lock();
        auto it = rounds_.find(iteration);
        if (it == rounds_.end() || it->second.pairSeen[i]) continue;
      }
      parts.clear();
      grad.forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) {
        parts.push_back({ptr, static_cast<size_t>(n) * sizeof(float)});
      });
      FrameHeader h;
      h.type = MsgType::kPsPush;
      h.job = book.jobId();
      h.layer = static_cast<uint32_t>(layer_);
      h.iteration = iteration;
      h.pair = static_cast<uint32_t>(p.index);
      host_.van().send(book.shardRank(p.shard), h, parts);
    }
    traceSent(iteration, startUs, "ps");
  } catch (const Error& e) {
    host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration, ": ", e.what()));
  }
}

void Syncer::submitFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows,
                           LayerBuffer out, std::shared_ptr<void> keepAlive) {
  if (spec_.type != LayerType::kFC) {
    throw InvalidArgument(strCat("layer '", spec_.name, "' is not fully connected; it cannot use SFB"));
  }
  if (scheme == Scheme::kPS) throw InvalidArgument(strCat("layer '", spec_.name, "': factors submitted for a ps round"));
  if (rows < 1 || rows > kMaxFactorRows) {
    throw InvalidArgument(strCat("layer '", spec_.name, "': ", rows, " factor rows is out of range"));
  }
  if (out.size() != spec_.numel()) {
    throw InvalidArgument(strCat("layer '", spec_.name, "': output has ", out.size(), " floats, expected ",
                                 spec_.numel()));
  }
  bool send = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round& r = submitRoundLocked(iteration);
    bool mismatch = scheme == Scheme::kSFB ? r.aggregatesArrived : (r.factorsSeen > 0 || r.decided);
    if (mismatch) {
      host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration, ": this rank chose ", schemeName(scheme),
                        " but another worker used a different scheme (workers must use the same batch size and "
                        "scheme policy)"));
      return;
    }
    r.submitted = true;
    r.scheme = scheme;
    r.out = out;
    if (scheme == Scheme::kSFB) {
      // Decided without us (straggler mode): our factors would be ignored.
      if (straggler_ && r.decided && !r.decision[me()]) send = false;
      maybeFinishLocked(iteration, r);
    }
  }
  if (send) {
    host_.schedule([this, iteration, scheme, u, v, rows, keepAlive] { sendFactors(iteration, scheme, u, v, rows); });
  }
}

void Syncer::sendFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows) {
  const InformationBook& book = host_.book();
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  try {
    FrameHeader h;
    h.type = scheme == Scheme::kAdam ? MsgType::kAdamFactors : MsgType::kSfbFactors;
    h.job = book.jobId();
    h.layer = static_cast<uint32_t>(layer_);
    h.iteration = iteration;
    h.aux = static_cast<uint32_t>(rows);
    size_t ub = static_cast<size_t>(rows * spec_.m) * sizeof(float);
    size_t vb = static_cast<size_t>(rows * spec_.n) * sizeof(float);
    if (scheme == Scheme::kAdam) {  // factors up to the layer's one server
      host_.van().send(book.adamOwnerRank(layer_), h, {Van::Part{u, ub}, Van::Part{v, vb}});
      traceSent(iteration, startUs, "adam");
      return;
    }
    // Peers first, ourselves last: our own copy costs no network time.
    for (int w : book.workerRanks()) {
      if (w != host_.rank()) host_.van().send(w, h, {Van::Part{u, ub}, Van::Part{v, vb}});
    }
    host_.van().send(host_.rank(), h, {Van::Part{u, ub}, Van::Part{v, vb}});
    if (straggler_) {  // tell the layer's keeper that our factors are out
      FrameHeader n = h;
      n.type = MsgType::kSfbNotice;
      host_.van().send(book.adamOwnerRank(layer_), n, static_cast<const void*>(nullptr), size_t{0});
    }
    traceSent(iteration, startUs, "sfb");
  } catch (const Error& e) {
    host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration, ": ", e.what()));
  }
}

bool Syncer::completeWithoutMe(int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it == rounds_.end()) return false;
  const Round& r = it->second;
  if (r.submitted || r.skipped) return false;
  if (r.aggregatesArrived) return r.pairsLeft == 0;
  std::vector<bool> set;
  return r.decided && !r.decision[me()] && factorSetReadyLocked(r, &set);
}

void Syncer::submitSkipped(int64_t iteration, LayerBuffer out) {
  if (out.size() != spec_.numel()) {
    throw InvalidArgument(strCat("layer '", spec_.name, "': output has ", out.size(), " floats, expected ",
                                 spec_.numel()));
  }
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = rounds_.find(iteration);
    if (it == rounds_.end() || it->second.submitted || it->second.skipped) {
      throw InvalidArgument(strCat("layer '", spec_.name, "' iteration ", iteration, " cannot be skipped"));
    }
    Round& r = it->second;
    r.skipped = true;
    r.out = out;
    applyEarlyLocked(r, out, nullptr);
    done = maybeFinishLocked(iteration, r);
  }
  if (done) host_.layerDone(layer_, iteration);
}

// ---- receive ------------------------------------------------------------------------------

void Syncer::onAggregate(Message& msg) {
  const FrameHeader& h = msg.header;
  const InformationBook& book = host_.book();
  if (h.pair >= pairs_.size()) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, ", which does not exist"));
  }
  const KvPair& p = pairs_[h.pair];
  const bool adam = h.type == MsgType::kAdamAggregate;
  const int owner = adam ? book.adamOwnerRank(layer_) : book.shardRank(p.shard);
  if (static_cast<int>(h.sender) != owner) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, " from rank ", h.sender,
                               ", which does not own that pair"));
  }
  const size_t floatBytes = static_cast<size_t>(p.length) * sizeof(float);
  const size_t mask = straggler_ && !adam ? maskBytes(book.numWorkers()) : 0;
  if (msg.size() != floatBytes + mask) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, " has ", msg.size(), " bytes"));
  }
  std::vector<bool> contributors = mask ? decodeMask(msg.data() + floatBytes, mask, book.numWorkers())
                                        : std::vector<bool>(static_cast<size_t>(book.numWorkers()), true);
  const float divisor = static_cast<float>(countMask(contributors));
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round* r = findRoundLocked(h.iteration, straggler_, "aggregate");
    if (!r || (!straggler_ && !r->submitted)) {
      throw ProtocolError(strCat("aggregate for layer ", layer_, " iteration ", h.iteration,
                                 ", which this worker has not pushed"));
    }
    Scheme expected = adam ? Scheme::kAdam : Scheme::kPS;
    if ((r->submitted && r->scheme != expected) || r->factorsSeen > 0 || r->decided) {
      throw ProtocolError(strCat("aggregate for layer ", layer_, " iteration ", h.iteration, ", which uses another scheme"));
    }
    if (r->pairSeen[h.pair]) throw ProtocolError(strCat("duplicate aggregate for layer ", layer_, " pair ", h.pair));
    r->pairSeen[h.pair] = true;
    --r->pairsLeft;
    r->aggregatesArrived = true;
    r->pairContributors[h.pair] = std::move(contributors);
    if (r->submitted || r->skipped) {
      copyScaled(r->out, p.offset, p.length, msg.data(), divisor);
    } else {  // straggler mode: the result came before this worker's submit
      std::vector<float>& e = r->early[h.pair];
      e.resize(static_cast<size_t>(p.length));
      std::memcpy(e.data(), msg.data(), floatBytes);
      for (float& x : e) x /= divisor;
    }
    done = maybeFinishLocked(h.iteration, *r);
  }
  if (done) host_.layerDone(layer_, h.iteration);
}

void Syncer::onFactors(Message& msg) {
  const FrameHeader& h = msg.header;
  const InformationBook& book = host_.book();
  if (spec_.type != LayerType::kFC) throw ProtocolError(strCat("sfb factors for non-fc layer ", layer_));
  int worker = book.workerIndex(static_cast<int>(h.sender));
  if (worker < 0) throw ProtocolError(strCat("sfb factors from rank ", h.sender, ", which is not a worker"));
  const int64_t rows = h.aux;
  if (rows < 1 || rows > kMaxFactorRows) throw ProtocolError(strCat("sfb factors with ", rows, " rows"));
  if (msg.size() != static_cast<size_t>(rows * (spec_.m + spec_.n)) * sizeof(float)) {
    throw ProtocolError(strCat("sfb factors for layer ", layer_, " with ", rows, " rows have ", msg.size(),
                               " bytes, expected ", rows * (spec_.m + spec_.n) * 4));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (straggler_ && (h.iteration < host_.currentIteration() || contributors_.count(h.iteration))) {
    return;  // a straggler's factors for a round that finished without them
  }
  Round* r = findRoundLocked(h.iteration, true, "sfb factors");
  if (!r) throw ProtocolError(strCat("sfb factors for layer ", layer_, " iteration ", h.iteration, ", already finished"));
  if ((r->submitted && r->scheme != Scheme::kSFB) || r->aggregatesArrived) {
    host_.fail(strCat("layer '", spec_.name, "' iteration ", h.iteration, ": rank ", h.sender, " sent sfb factors (",
                      rows, " rows) but this rank chose ", schemeName(r->scheme),
                      " (workers must use the same batch size and scheme policy)"));
    return;
  }
  if (r->factorSeen[worker]) throw ProtocolError(strCat("duplicate sfb factors from rank ", h.sender, " for layer ", layer_));
  r->factorSeen[worker] = true;
  ++r->factorsSeen;
  if (straggler_ && r->decided && !r->decision[worker]) return;  // late: not in the decided set
  r->rows[worker] = rows;
  r->factors[worker] = std::move(msg.payload);
  maybeFinishLocked(h.iteration, *r);
}

void Syncer::onDecision(Message& msg) {
  const FrameHeader& h = msg.header;
  const InformationBook& book = host_.book();
  if (!straggler_ || spec_.type != LayerType::kFC) throw ProtocolError(strCat("unexpected sfb decision for layer ", layer_));
  if (static_cast<int>(h.sender) != book.adamOwnerRank(layer_)) {
    throw ProtocolError(strCat("sfb decision for layer ", layer_, " from rank ", h.sender, ", which does not keep it"));
  }
  std::vector<bool> set = decodeMask(msg.data(), msg.size(), book.numWorkers());
  std::lock_guard<std::mutex> lock(mutex_);
  Round* r = findRoundLocked(h.iteration, true, "sfb decision");
  if (!r || r->decided) throw ProtocolError(strCat("duplicate sfb decision for layer ", layer_));
  if ((r->submitted && r->scheme != Scheme::kSFB) || r->aggregatesArrived) {
    throw ProtocolError(strCat("sfb decision for layer ", layer_, " iteration ", h.iteration, ", which uses ps"));
  }
  r->decided = true;
  r->decision = std::move(set);
  for (size_t w = 0; w < r->decision.size(); ++w)
    if (!r->decision[w]) r->factors[w] = zmq::message_t();  // late factors are ignored
  maybeFinishLocked(h.iteration, *r);
}

bool Syncer::factorSetReadyLocked(const Round& r, std::vector<bool>* set) const {
  if (straggler_) {
    if (!r.decided) return false;
    *set = r.decision;
  } else {
    set->assign(r.factorSeen.size(), true);
  }
  for (size_t w = 0; w < set->size(); ++w)
    if ((*set)[w] && !r.factorSeen[w]) return false;
  return true;
}

bool Syncer::maybeFinishLocked(int64_t iteration, Round& r) {
  if (!r.submitted && !r.skipped) return false;
  const bool aggregates = r.submitted ? r.scheme != Scheme::kSFB : r.aggregatesArrived;
  auto remember = [&](std::vector<std::vector<bool>> who) {
    contributors_[iteration] = std::move(who);
    while (contributors_.size() > kFinishedHistory) contributors_.erase(contributors_.begin());
  };
  if (aggregates) {
    if (r.pairsLeft > 0) return false;
    bool excluded = false;
    for (const auto& c : r.pairContributors) excluded = excluded || (!c.empty() && !c[me()]);
    if (r.submitted && excluded) ++dropped_;
    if (Tracer* tracer = host_.tracer()) {
      int64_t now = Tracer::nowMicros();
      tracer->span(strCat("receive ", spec_.name, r.scheme == Scheme::kAdam ? " (adam)" : " (ps)"), "receive", 2,
                   r.sentAtUs ? r.sentAtUs : now, now, iteration);
    }
    remember(std::move(r.pairContributors));
    rounds_.erase(iteration);
    return true;
  }
  std::vector<bool> set;
  if (r.reconstructing || !factorSetReadyLocked(r, &set)) return false;
  r.reconstructing = true;
  if (r.submitted && !set[me()]) ++dropped_;
  remember({set});
  auto node = rounds_.extract(iteration);
  auto shared = std::make_shared<Round>(std::move(node.mapped()));
  host_.schedule([this, iteration, shared, set] { reconstruct(iteration, std::move(*shared), set); });
  return false;
}

void Syncer::reconstruct(int64_t iteration, Round round, std::vector<bool> set) {
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  if (Tracer* tracer = host_.tracer()) {
    tracer->span(strCat("receive ", spec_.name, " (sfb)"), "receive", 2, round.sentAtUs ? round.sentAtUs : startUs,
                 startUs, iteration);
  }
  try {
    const int64_t m = spec_.m, n = spec_.n;
    std::vector<FactorView> views;
    for (size_t w = 0; w < round.factors.size(); ++w) {
      if (!set[w]) continue;
      const auto* base = static_cast<const float*>(round.factors[w].data());
      views.push_back({base, base + round.rows[w] * m, round.rows[w]});
    }
    const float scale = 1.0f / static_cast<float>(views.size());
    const bool bias = spec_.params.size() > 1;
    float* w = round.out.contiguousAt(0, m * n);
    float* b = bias ? round.out.contiguousAt(m * n, m) : nullptr;
    std::lock_guard<std::mutex> lock(scratchMutex_);
    std::vector<float> tmpW, tmpB;
    if (!w) tmpW.resize(static_cast<size_t>(m * n));
    if (bias && !b) tmpB.resize(static_cast<size_t>(m));
    reconstructGradient(views, m, n, scale, w ? w : tmpW.data(), bias ? (b ? b : tmpB.data()) : nullptr, &scratch_);
    if (!w) round.out.forEach(0, m * n, [&](float* d, int64_t k, int64_t done) { std::memcpy(d, tmpW.data() + done, k * 4); });
    if (bias && !b) round.out.forEach(m * n, m, [&](float* d, int64_t k, int64_t done) { std::memcpy(d, tmpB.data() + done, k * 4); });
  } catch (const std::exception& e) {
    host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration, ": reconstructing the gradient failed: ", e.what()));
    return;
  }
  if (Tracer* tracer = host_.tracer()) {
    tracer->span(strCat("reconstruct ", spec_.name, " (sfb GEMM)"), "receive", 2, startUs, Tracer::nowMicros(), iteration);
  }
  host_.layerDone(layer_, iteration);
}

void Syncer::traceSent(int64_t iteration, int64_t startUs, const char* scheme) {
  Tracer* tracer = host_.tracer();
  if (!tracer) return;
  int64_t now = Tracer::nowMicros();
  tracer->span(strCat("send ", spec_.name, " (", scheme, ")"), "send", 1, startUs, now, iteration);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it != rounds_.end()) it->second.sentAtUs = now;
}

std::string Syncer::pending(int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it == rounds_.end()) return strCat("layer '", spec_.name, "' was not submitted (did backward reach it?)");
  const Round& r = it->second;
  const InformationBook& book = host_.book();
  if (!r.submitted && !r.skipped) {
    return strCat("layer '", spec_.name, "' was not submitted by this worker (did backward reach it?)");
  }
  if (r.scheme == Scheme::kAdam) {
    return strCat("layer '", spec_.name, "' (adam): the full matrix from server rank ", book.adamOwnerRank(layer_));
  }
  if (r.scheme == Scheme::kPS || r.aggregatesArrived) {
    std::vector<int> shards;
    std::string missing;
    for (size_t i = 0; i < pairs_.size(); ++i) {
      if (r.pairSeen[i]) continue;
      missing += (missing.empty() ? "" : ",") + std::to_string(i);
      int s = book.shardRank(pairs_[i].shard);
      if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
    }
    std::sort(shards.begin(), shards.end());
    std::string ranks;
    for (int s : shards) ranks += (ranks.empty() ? "" : ",") + std::to_string(s);
    return strCat("layer '", spec_.name, "' (ps): aggregates of pairs ", missing, " from server rank(s) ", ranks);
  }
  if (straggler_ && !r.decided) {
    return strCat("layer '", spec_.name, "' (sfb): the contributor decision from rank ", book.adamOwnerRank(layer_));
  }
  std::string ranks;
  for (size_t w = 0; w < r.factorSeen.size(); ++w)
    if (!r.factorSeen[w] && (!r.decided || r.decision[w])) ranks += (ranks.empty() ? "" : ",") + std::to_string(book.workerRanks()[w]);
  return strCat("layer '", spec_.name, "' (sfb): factors from worker rank(s) ", ranks);
}

}  // namespace poseidon
