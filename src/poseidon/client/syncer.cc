#include "poseidon/client/syncer.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/kvstore/contributors.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

namespace {
constexpr size_t kFinishedHistory = 256;

// `src` holds wire floats at any alignment (a received payload).
void copyScaled(const LayerBuffer& out, int64_t offset, int64_t length, const uint8_t* src, WirePrecision wire,
                float divisor) {
  const int64_t eb = static_cast<int64_t>(wireElementBytes(wire));
  out.forEach(offset, length, [&](float* dst, int64_t n, int64_t done) {
    decodeFloats(src + done * eb, n, wire, dst);
    for (int64_t i = 0; i < n; ++i) dst[i] /= divisor;
  });
}

void copyOut(const LayerBuffer& out, int64_t offset, int64_t length, const float* src) {
  out.forEach(offset, length, [&](float* dst, int64_t n, int64_t done) {
    std::memcpy(dst, src + done, static_cast<size_t>(n) * kFloatBytes);
  });
}
}  // namespace

Syncer::Syncer(SyncHost& host, int layer)
    : host_(host),
      layer_(layer),
      spec_(host.book().model().layers.at(layer)),
      pairs_(host.book().layout().pairsOf(layer)),
      straggler_(host.book().settings().stragglerMode()),
      wire_(host.book().settings().wire),
      elementBytes_(wireElementBytes(wire_)),
      lastPsRound_(host.book().settings().startIteration - 1) {}

std::exception_ptr Syncer::mismatch(int64_t iteration, const std::string& what) const {
  return std::make_exception_ptr(InvalidArgument(strCat("layer '", spec_.name, "' iteration ", iteration, ": ", what,
                                                        " (workers must use the same batch size and scheme policy)")));
}

void Syncer::apply(int64_t iteration, Effects& fx) {
  if (fx.failure) host_.fail(fx.failure);
  if (fx.rebuild) host_.scheduleRebuild(iteration, std::move(fx.rebuild));
  if (fx.layerDone) host_.layerDone(layer_, iteration);
}

// ---- rounds -------------------------------------------------------------------------

Syncer::Round& Syncer::submitRoundLocked(int64_t iteration) {
  auto twice = [&] { return InvalidArgument(strCat("layer '", spec_.name, "' submitted twice in iteration ", iteration)); };
  if (finished_.count(iteration)) throw twice();
  Round& r = rounds_[iteration];
  if (r.phase != Phase::kOpen) throw twice();
  return r;
}

Syncer::Round* Syncer::findRoundLocked(int64_t iteration, bool create, const char* what) {
  if (finished_.count(iteration)) return nullptr;
  auto it = rounds_.find(iteration);
  if (it != rounds_.end()) return &it->second;
  if (!create) return nullptr;
  int64_t current = host_.currentIteration();
  int64_t ahead = straggler_ ? kMaxAheadStraggler : 1;
  if (iteration < current || iteration > current + ahead) {
    throw ProtocolError(strCat(what, " for layer ", layer_, " iteration ", iteration, " outside the open window (",
                               current, "..", current + ahead, ")"));
  }
  return &rounds_[iteration];
}

Syncer::Aggregates* Syncer::aggregatesLocked(Round& r, Scheme scheme) {
  if (std::holds_alternative<std::monostate>(r.kind)) {
    Aggregates a;
    a.scheme = scheme;
    a.pairs.resize(pairs_.size());
    a.left = pairs_.size();
    r.kind = std::move(a);
  }
  auto* a = std::get_if<Aggregates>(&r.kind);
  return a && a->scheme == scheme ? a : nullptr;
}

Syncer::Factors* Syncer::factorsLocked(Round& r) {
  if (std::holds_alternative<std::monostate>(r.kind)) {
    const size_t workers = static_cast<size_t>(host_.book().numWorkers());
    Factors f;
    f.payload.resize(workers);
    f.rows.assign(workers, 0);
    f.seen.assign(workers, false);
    r.kind = std::move(f);
  }
  return std::get_if<Factors>(&r.kind);
}

std::optional<std::vector<bool>> Syncer::factorSetLocked(const Factors& f) const {
  std::vector<bool> set;
  if (straggler_) {
    if (!f.decision) return std::nullopt;
    set = *f.decision;
  } else {
    set.assign(f.seen.size(), true);
  }
  for (size_t w = 0; w < set.size(); ++w)
    if (set[w] && !f.seen[w]) return std::nullopt;
  return set;
}

void Syncer::advanceLocked(int64_t iteration, Round& r, Effects& fx) {
  Aggregates* a = std::get_if<Aggregates>(&r.kind);
  Factors* f = std::get_if<Factors>(&r.kind);
  const bool allPairsIn = a && a->left == 0 && a->sending == 0 && !r.factorsSending;
  std::optional<std::vector<bool>> set =
      f && r.phase == Phase::kAwaiting && !r.factorsSending ? factorSetLocked(*f) : std::nullopt;
  // Each action erases the round from rounds_: nothing may touch r after it.
  if (attemptTransition(r, Phase::kAwaiting, Phase::kFinished, allPairsIn,
                        [&] { finishAggregatesLocked(iteration, r, *a, fx); })) {
    return;
  }
  attemptTransition(r, Phase::kAwaiting, Phase::kRebuilding, set.has_value(),
                    [&] { startRebuildLocked(iteration, r, std::move(*set), fx); });
}

void Syncer::finishAggregatesLocked(int64_t iteration, Round& r, Aggregates& a, Effects& fx) {
  bool excluded = false;
  std::vector<std::vector<bool>> who;
  for (auto& slot : a.pairs) {
    excluded = excluded || (!slot.contributors.empty() && !slot.contributors[me()]);
    who.push_back(std::move(slot.contributors));
  }
  if (r.contributed && excluded) ++dropped_;
  if (Tracer* tracer = host_.tracer()) {
    int64_t now = Tracer::nowMicros();
    tracer->span(strCat("receive ", spec_.name, a.scheme == Scheme::kAdam ? " (adam)" : " (ps)"), "receive", 2,
                 r.sentAtUs ? r.sentAtUs : now, now, iteration);
  }
  finished_[iteration] = std::move(who);
  while (finished_.size() > kFinishedHistory) finished_.erase(finished_.begin());
  rounds_.erase(iteration);
  fx.layerDone = true;
}

void Syncer::startRebuildLocked(int64_t iteration, Round& r, std::vector<bool> set, Effects& fx) {
  if (r.contributed && !set[me()]) ++dropped_;
  finished_[iteration] = {set};
  while (finished_.size() > kFinishedHistory) finished_.erase(finished_.begin());
  auto shared = std::make_shared<Round>(std::move(rounds_.extract(iteration).mapped()));
  fx.rebuild = [this, iteration, shared, set = std::move(set)] { reconstruct(iteration, std::move(*shared), set); };
}

void Syncer::writeHeldLocked(const Round& r, PairSlot& slot, int pair) const {
  const KvPair& p = pairs_[pair];
  copyOut(r.out, p.offset, p.length, slot.held.data());
  std::vector<float>().swap(slot.held);
}

void Syncer::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  rounds_.clear();
}

std::vector<std::vector<bool>> Syncer::contributors(int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = finished_.find(iteration);
  return it == finished_.end() ? std::vector<std::vector<bool>>{} : it->second;
}

int64_t Syncer::droppedContributions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

// ---- receive ------------------------------------------------------------------------------

void Syncer::onAggregate(Message& msg) {
  const FrameHeader& h = msg.header;
  const InformationBook& book = host_.book();
  if (h.pair >= pairs_.size()) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, ", which does not exist"));
  }
  const int pair = static_cast<int>(h.pair);
  const KvPair& p = pairs_[pair];
  const bool adam = h.type == MsgType::kAdamAggregate;
  const int owner = adam ? book.layerKeeperRank(layer_) : book.shardRank(p.shard);
  if (static_cast<int>(h.sender) != owner) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, " from rank ", h.sender,
                               ", which does not own that pair"));
  }
  const size_t floatBytes = static_cast<size_t>(p.length) * elementBytes_;
  const size_t mask = straggler_ && !adam ? maskBytes(book.numWorkers()) : 0;
  if (msg.size() != floatBytes + mask) {
    throw ProtocolError(strCat("aggregate for layer ", layer_, " pair ", h.pair, " has ", msg.size(), " bytes"));
  }
  std::vector<bool> contributors = mask ? decodeMask(msg.data() + floatBytes, mask, book.numWorkers())
                                        : std::vector<bool>(static_cast<size_t>(book.numWorkers()), true);
  const float divisor = static_cast<float>(countMask(contributors));
  const uint8_t* sum = msg.data();
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    Round* r = findRoundLocked(h.iteration, straggler_, "aggregate");
    if (!r || (!straggler_ && !r->contributed)) {
      throw ProtocolError(strCat("aggregate for layer ", layer_, " iteration ", h.iteration,
                                 ", which this worker has not pushed"));
    }
    Aggregates* a = aggregatesLocked(*r, adam ? Scheme::kAdam : Scheme::kPS);
    if (!a) {
      throw ProtocolError(strCat("aggregate for layer ", layer_, " iteration ", h.iteration, ", which uses another scheme"));
    }
    PairSlot& slot = a->pairs[pair];
    if (slot.in) throw ProtocolError(strCat("duplicate aggregate for layer ", layer_, " pair ", h.pair));
    slot.in = true;
    --a->left;
    slot.contributors = std::move(contributors);
    if (r->phase == Phase::kOpen || slot.sending) {
      // Before this worker's submit (straggler mode), or while our push still
      // reads this pair's memory: hold it until it can be written.
      slot.held.resize(static_cast<size_t>(p.length));
      decodeFloats(sum, p.length, wire_, slot.held.data());
      for (float& x : slot.held) x /= divisor;
    } else {
      copyScaled(r->out, p.offset, p.length, sum, wire_, divisor);
    }
    advanceLocked(h.iteration, *r, fx);
  }
  apply(h.iteration, fx);
}

void Syncer::onFactors(Message& msg) {
  const FrameHeader& h = msg.header;
  const InformationBook& book = host_.book();
  if (spec_.type != LayerType::kFC) throw ProtocolError(strCat("sfb factors for non-fc layer ", layer_));
  int worker = book.workerIndex(static_cast<int>(h.sender));
  if (worker < 0) throw ProtocolError(strCat("sfb factors from rank ", h.sender, ", which is not a worker"));
  const int64_t rows = wire::factorRows(h);
  if (rows < 1 || rows > kMaxFactorRows) throw ProtocolError(strCat("sfb factors with ", rows, " rows"));
  const size_t expected = static_cast<size_t>(rows * (spec_.m + spec_.n)) * elementBytes_;
  if (msg.size() != expected) {
    throw ProtocolError(strCat("sfb factors for layer ", layer_, " with ", rows, " rows have ", msg.size(),
                               " bytes, expected ", expected));
  }
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    if (straggler_ && (h.iteration < host_.currentIteration() || finished_.count(h.iteration))) {
      return;  // a straggler's factors for a round that finished without them
    }
    Round* r = findRoundLocked(h.iteration, true, "sfb factors");
    if (!r) throw ProtocolError(strCat("sfb factors for layer ", layer_, " iteration ", h.iteration, ", already finished"));
    Factors* f = factorsLocked(*r);
    if (!f) {
      const auto* a = std::get_if<Aggregates>(&r->kind);
      fx.failure = mismatch(h.iteration, strCat("rank ", h.sender, " sent sfb factors (", rows,
                                                " rows) but this rank chose ", schemeName(a->scheme)));
    } else {
      if (f->seen[worker]) throw ProtocolError(strCat("duplicate sfb factors from rank ", h.sender, " for layer ", layer_));
      f->seen[worker] = true;
      ++f->count;
      if (!(f->decision && !(*f->decision)[worker])) {  // else late: not in the decided set
        f->rows[worker] = rows;
        f->payload[worker] = std::move(msg.payload);
      }
      advanceLocked(h.iteration, *r, fx);
    }
  }
  apply(h.iteration, fx);
}

void Syncer::onDecision(Message& msg) {
  const FrameHeader& h = msg.header;
  const InformationBook& book = host_.book();
  if (!straggler_ || spec_.type != LayerType::kFC) throw ProtocolError(strCat("unexpected sfb decision for layer ", layer_));
  if (static_cast<int>(h.sender) != book.layerKeeperRank(layer_)) {
    throw ProtocolError(strCat("sfb decision for layer ", layer_, " from rank ", h.sender, ", which does not keep it"));
  }
  std::vector<bool> set = decodeMask(msg.data(), msg.size(), book.numWorkers());
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    Round* r = findRoundLocked(h.iteration, true, "sfb decision");
    if (!r) throw ProtocolError(strCat("duplicate sfb decision for layer ", layer_));
    Factors* f = factorsLocked(*r);
    if (!f) throw ProtocolError(strCat("sfb decision for layer ", layer_, " iteration ", h.iteration, ", which uses ps"));
    if (f->decision) throw ProtocolError(strCat("duplicate sfb decision for layer ", layer_));
    for (size_t w = 0; w < set.size(); ++w)
      if (!set[w]) f->payload[w] = zmq::message_t();  // late factors are ignored
    f->decision = std::move(set);
    advanceLocked(h.iteration, *r, fx);
  }
  apply(h.iteration, fx);
}

// ---- reconstruction (pool) ----------------------------------------------------------------

void Syncer::reconstruct(int64_t iteration, Round round, std::vector<bool> set) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;  // the job failed: the output buffer may be gone
  }
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  if (Tracer* tracer = host_.tracer()) {
    tracer->span(strCat("receive ", spec_.name, " (sfb)"), "receive", 2, round.sentAtUs ? round.sentAtUs : startUs,
                 startUs, iteration);
  }
  const WorkClock::time_point workStart = WorkClock::now();
  try {
    const Factors& f = std::get<Factors>(round.kind);
    const int64_t m = spec_.m, n = spec_.n;
    std::vector<FactorView> views;
    std::vector<std::vector<float>> wide;  // a 16-bit wire: each worker's factors widened to fp32
    wide.reserve(f.payload.size());
    for (size_t w = 0; w < f.payload.size(); ++w) {
      if (!set[w]) continue;
      const float* base = static_cast<const float*>(f.payload[w].data());
      if (wire_ != WirePrecision::kFp32) {
        wide.emplace_back(static_cast<size_t>(f.rows[w] * (m + n)));
        decodeFloats(static_cast<const uint8_t*>(f.payload[w].data()), f.rows[w] * (m + n), wire_, wide.back().data());
        base = wide.back().data();
      }
      views.push_back({base, base + f.rows[w] * m, f.rows[w]});
    }
    const float scale = 1.0f / static_cast<float>(views.size());
    int64_t rows = 0;
    for (const auto& v : views) rows += v.rows;
    if (round.rebuild) {  // the caller's GEMM (a CUDA layer's, on its device)
      round.rebuild(views, scale);
      chargeGemm(host_.charger(), 2.0 * static_cast<double>(rows) * static_cast<double>(m) * static_cast<double>(n),
                 workStart);
      traceRebuilt(iteration, startUs);
      host_.layerDone(layer_, iteration);
      return;
    }
    const bool bias = spec_.params.size() > 1;
    float* w = round.out.contiguousAt(0, m * n);
    float* b = bias ? round.out.contiguousAt(m * n, m) : nullptr;
    std::vector<float> tmpW, tmpB;
    if (!w) tmpW.resize(static_cast<size_t>(m * n));
    if (bias && !b) tmpB.resize(static_cast<size_t>(m));
    {
      std::lock_guard<std::mutex> lock(scratchMutex_);
      reconstructGradient(views, m, n, scale, w ? w : tmpW.data(), bias ? (b ? b : tmpB.data()) : nullptr, &scratch_);
    }
    if (!w) copyOut(round.out, 0, m * n, tmpW.data());
    if (bias && !b) copyOut(round.out, m * n, m, tmpB.data());
    chargeGemm(host_.charger(), 2.0 * static_cast<double>(rows) * static_cast<double>(m) * static_cast<double>(n),
               workStart);
  } catch (const std::exception& e) {
    host_.fail(std::make_exception_ptr(
        Error(strCat("layer '", spec_.name, "' iteration ", iteration, ": reconstructing the gradient failed: ", e.what()))));
    return;
  }
  traceRebuilt(iteration, startUs);
  host_.layerDone(layer_, iteration);
}

void Syncer::traceRebuilt(int64_t iteration, int64_t startUs) {
  if (Tracer* tracer = host_.tracer()) {
    tracer->span(strCat("reconstruct ", spec_.name, " (sfb GEMM)"), "receive", 2, startUs, Tracer::nowMicros(), iteration);
  }
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
  if (r.phase == Phase::kOpen) {
    return strCat("layer '", spec_.name, "' was not submitted by this worker (did backward reach it?)");
  }
  if (const auto* a = std::get_if<Aggregates>(&r.kind)) {
    if (a->scheme == Scheme::kAdam) {
      return strCat("layer '", spec_.name, "' (adam): the full matrix from server rank ", book.layerKeeperRank(layer_));
    }
    std::vector<int> shards;
    std::string missing;
    for (size_t i = 0; i < pairs_.size(); ++i) {
      if (a->pairs[i].in) continue;
      missing += (missing.empty() ? "" : ",") + std::to_string(i);
      int s = book.shardRank(pairs_[i].shard);
      if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
    }
    std::sort(shards.begin(), shards.end());
    std::string ranks;
    for (int s : shards) ranks += (ranks.empty() ? "" : ",") + std::to_string(s);
    return strCat("layer '", spec_.name, "' (ps): aggregates of pairs ", missing, " from server rank(s) ", ranks);
  }
  const auto* f = std::get_if<Factors>(&r.kind);
  if (!f) return strCat("layer '", spec_.name, "': nothing arrived yet");
  if (straggler_ && !f->decision) {
    return strCat("layer '", spec_.name, "' (sfb): the contributor decision from rank ", book.layerKeeperRank(layer_));
  }
  std::string ranks;
  for (size_t w = 0; w < f->seen.size(); ++w)
    if (!f->seen[w] && (!f->decision || (*f->decision)[w])) {
      ranks += (ranks.empty() ? "" : ",") + std::to_string(book.workerRanks()[w]);
    }
  return strCat("layer '", spec_.name, "' (sfb): factors from worker rank(s) ", ranks);
}

}  // namespace poseidon
