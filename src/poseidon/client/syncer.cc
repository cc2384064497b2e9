#include "poseidon/client/syncer.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"

namespace poseidon {

Syncer::Syncer(SyncHost& host, int layer)
    : host_(host),
      layer_(layer),
      spec_(host.book().model().layers.at(layer)),
      pairs_(host.book().layout().pairsOf(layer)) {}

Syncer::Round& Syncer::roundLocked(int64_t iteration) {
  auto it = rounds_.find(iteration);
  if (it != rounds_.end()) return it->second;
  Round& r = rounds_[iteration];
  int workers = host_.book().numWorkers();
  r.pairSeen.assign(pairs_.size(), false);
  r.pairsLeft = pairs_.size();
  r.factors.resize(workers);
  r.rows.assign(workers, 0);
  r.factorSeen.assign(workers, false);
  r.factorsLeft = workers;
  return r;
}

bool Syncer::schemeOf(int64_t iteration, Scheme* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it == rounds_.end() || !it->second.submitted) return false;
  *out = it->second.scheme;
  return true;
}

void Syncer::submitDense(int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  if (grad.size() != spec_.numel()) {
    throw InvalidArgument(strCat("layer '", spec_.name, "': gradient has ", grad.size(), " floats, expected ",
                                 spec_.numel()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round& r = roundLocked(iteration);
    if (r.submitted) throw InvalidArgument(strCat("layer '", spec_.name, "' submitted twice in iteration ", iteration));
    int early = host_.book().numWorkers() - r.factorsLeft;
    if (early > 0) {
      host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration,
                        ": this rank chose ps but another worker sent sfb factors (workers must use the same batch "
                        "size and scheme policy)"));
      return;
    }
    r.submitted = true;
    r.scheme = Scheme::kPS;
    r.out = grad;
    r.keepAlive = keepAlive;
    if (pairs_.empty()) {  // a layer without parameters has nothing to sync
      rounds_.erase(iteration);
      host_.layerDone(layer_, iteration);
      return;
    }
  }
  host_.schedule([this, iteration, grad, keepAlive] { sendDense(iteration, grad); });
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

void Syncer::sendDense(int64_t iteration, const LayerBuffer& grad) {
  const InformationBook& book = host_.book();
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  try {
    std::vector<Van::Part> parts;
    for (const KvPair& p : pairs_) {
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round& r = roundLocked(iteration);
    if (r.submitted) throw InvalidArgument(strCat("layer '", spec_.name, "' submitted twice in iteration ", iteration));
    if (scheme == Scheme::kAdam && r.factorsLeft < host_.book().numWorkers()) {
      host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration,
                        ": this rank chose adam but another worker sent sfb factors"));
      return;
    }
    r.submitted = true;
    r.scheme = scheme;
    r.out = out;
    if (scheme == Scheme::kSFB) maybeReconstructLocked(iteration, r);
  }
  host_.schedule([this, iteration, scheme, u, v, rows, keepAlive] { sendFactors(iteration, scheme, u, v, rows); });
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
    traceSent(iteration, startUs, "sfb");
  } catch (const Error& e) {
    host_.fail(strCat("layer '", spec_.name, "' iteration ", iteration, ": ", e.what()));
  }
}

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
  if (msg.size() != static_cast<size_t>(p.length) * sizeof(float)) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, " has ", msg.size(), " bytes"));
  }
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = rounds_.find(h.iteration);
    if (it == rounds_.end() || !it->second.submitted || it->second.scheme != (adam ? Scheme::kAdam : Scheme::kPS)) {
      throw ProtocolError(strCat("aggregate for layer ", layer_, " iteration ", h.iteration,
                                 ", which this worker has not pushed"));
    }
    Round& r = it->second;
    if (r.pairSeen[h.pair]) throw ProtocolError(strCat("duplicate aggregate for layer ", layer_, " pair ", h.pair));
    r.pairSeen[h.pair] = true;
    const float divisor = static_cast<float>(book.numWorkers());
    const uint8_t* src = msg.data();
    r.out.forEach(p.offset, p.length, [&](float* dst, int64_t n, int64_t done) {
      std::memcpy(dst, src + done * sizeof(float), static_cast<size_t>(n) * sizeof(float));
      for (int64_t i = 0; i < n; ++i) dst[i] /= divisor;
    });
    if (--r.pairsLeft == 0) {
      if (Tracer* tracer = host_.tracer()) {
        tracer->span(strCat("receive ", spec_.name, adam ? " (adam)" : " (ps)"), "receive", 2, r.sentAtUs ? r.sentAtUs : Tracer::nowMicros(),
                     Tracer::nowMicros(), h.iteration);
      }
      rounds_.erase(it);
      done = true;
    }
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
  int64_t current = host_.currentIteration();
  if (h.iteration < current || h.iteration > current + 1) {
    throw ProtocolError(strCat("sfb factors for layer ", layer_, " iteration ", h.iteration,
                               " outside the open window (", current, "..", current + 1, ")"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Round& r = roundLocked(h.iteration);
  if (r.submitted && r.scheme != Scheme::kSFB) {
    host_.fail(strCat("layer '", spec_.name, "' iteration ", h.iteration, ": rank ", h.sender,
                      " sent sfb factors (", rows, " rows) but this rank chose ", schemeName(r.scheme),
                      " (workers must use the same batch size and scheme policy)"));
    return;
  }
  if (r.factorSeen[worker]) throw ProtocolError(strCat("duplicate sfb factors from rank ", h.sender, " for layer ", layer_));
  r.factorSeen[worker] = true;
  r.rows[worker] = rows;
  r.factors[worker] = std::move(msg.payload);
  --r.factorsLeft;
  maybeReconstructLocked(h.iteration, r);
}

void Syncer::maybeReconstructLocked(int64_t iteration, Round& round) {
  if (!round.submitted || round.factorsLeft > 0 || round.reconstructing) return;
  round.reconstructing = true;
  auto node = rounds_.extract(iteration);
  auto shared = std::make_shared<Round>(std::move(node.mapped()));
  host_.schedule([this, iteration, shared] { reconstruct(iteration, std::move(*shared)); });
}

void Syncer::reconstruct(int64_t iteration, Round round) {
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  if (Tracer* tracer = host_.tracer()) {
    tracer->span(strCat("receive ", spec_.name, " (sfb)"), "receive", 2, round.sentAtUs ? round.sentAtUs : startUs,
                 startUs, iteration);
  }
  try {
    const int64_t m = spec_.m, n = spec_.n;
    std::vector<FactorView> views;
    views.reserve(round.factors.size());
    for (size_t w = 0; w < round.factors.size(); ++w) {
      const auto* base = static_cast<const float*>(round.factors[w].data());
      views.push_back({base, base + round.rows[w] * m, round.rows[w]});
    }
    const float scale = 1.0f / static_cast<float>(host_.book().numWorkers());
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

std::string Syncer::pending(int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it == rounds_.end()) return strCat("layer '", spec_.name, "' was not submitted (did backward reach it?)");
  const Round& r = it->second;
  const InformationBook& book = host_.book();
  if (!r.submitted) return strCat("layer '", spec_.name, "' was not submitted by this worker (did backward reach it?)");
  if (r.scheme == Scheme::kAdam) {
    return strCat("layer '", spec_.name, "' (adam): the full matrix from server rank ", book.adamOwnerRank(layer_));
  }
  if (r.scheme == Scheme::kPS) {
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
  std::string ranks;
  for (size_t w = 0; w < r.factorSeen.size(); ++w)
    if (!r.factorSeen[w]) ranks += (ranks.empty() ? "" : ",") + std::to_string(book.workerRanks()[w]);
  return strCat("layer '", spec_.name, "' (sfb): factors from worker rank(s) ", ranks);
}

}  // namespace poseidon
