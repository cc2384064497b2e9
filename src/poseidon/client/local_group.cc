#include "poseidon/client/local_group.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "poseidon/common/error.h"
#include "poseidon/sfb/sufficient_factors.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

LocalGroup::LocalGroup(const InformationBook& book, int rank, Host host)
    : book_(book),
      rank_(rank),
      leader_(book.leaderOf(rank)),
      L_(book.localRanks()),
      chunkFloats_(std::max<int64_t>(1, book.settings().pairBytes / static_cast<int64_t>(kFloatBytes))),
      host_(std::move(host)) {}

void LocalGroup::checkLayer(int layer, const char* what) const {
  if (layer < 0 || layer >= static_cast<int>(book_.model().layers.size())) {
    throw InvalidArgument(strCat(what, ": layer index ", layer, " out of range"));
  }
}

// ---- this rank's contribution (user's thread) ---------------------------------------------------

void LocalGroup::submitDense(int layer, int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  checkLayer(layer, "submitDense");
  if (grad.size() != numel(layer)) {
    throw InvalidArgument(strCat("layer '", book_.model().layers[layer].name, "': gradient has ", grad.size(),
                                 " floats, expected ", numel(layer)));
  }
  Round r;
  r.result = std::move(grad);
  r.keepAlive = std::move(keepAlive);
  ownSubmit(layer, iteration, std::move(r));
}

void LocalGroup::submitFactors(int layer, int64_t iteration, Scheme scheme, const float* u, const float* v,
                               int64_t rows, LayerBuffer out, std::shared_ptr<void> keepAlive) {
  checkLayer(layer, "submitFactors");
  const LayerSpec& spec = book_.model().layers[layer];
  if (rows < 1) throw InvalidArgument(strCat("layer '", spec.name, "': factors need at least one row, got ", rows));
  if (out.size() != spec.numel()) {
    throw InvalidArgument(
        strCat("layer '", spec.name, "': output has ", out.size(), " floats, expected ", spec.numel()));
  }
  Round r;
  r.factors = true;
  r.scheme = scheme;
  r.u = u;
  r.v = v;
  r.rows = rows;
  r.result = std::move(out);
  r.keepAlive = std::move(keepAlive);
  ownSubmit(layer, iteration, std::move(r));
}

void LocalGroup::ownSubmit(int layer, int64_t iteration, Round mine) {
  const Key key{iteration, layer};
  if (!leader()) {
    Round copy;  // what the pool's sends read; the caller's buffers stay alive through keepAlive
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Round& r = rounds_[key];
      // A member's round holds nothing before its own submit: the leader answers only after it.
      if (r.own) throw InvalidArgument(strCat("layer ", layer, " submitted twice in iteration ", iteration));
      mine.own = true;
      mine.pushing = true;
      r = mine;
      copy = std::move(mine);
    }
    host_.schedule([this, key, copy = std::move(copy)] {
      try {
        sendPush(key.second, key.first, copy);
      } catch (...) {
        host_.fail(std::current_exception());
        return;
      }
      bool done = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = rounds_.find(key);
        if (it == rounds_.end()) return;
        it->second.pushing = false;
        if (it->second.mean.seen.empty() || it->second.mean.missing > 0) return;
        done = writeMean(it->second);  // the mean came while the sends still read the buffer
        rounds_.erase(it);
      }
      if (done) host_.done(key.second, key.first);
    });
    return;
  }
  std::optional<Round> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round& r = rounds_[key];
    if (r.own) throw InvalidArgument(strCat("layer ", layer, " submitted twice in iteration ", iteration));
    if (r.members.empty()) r.members.resize(static_cast<size_t>(L_ - 1));
    mine.own = true;
    mine.members = std::move(r.members);
    mine.membersIn = r.membersIn;
    r = std::move(mine);
    if (r.membersIn == L_ - 1) {
      ready = std::move(r);
      rounds_.erase(key);
    }
  }
  if (ready) {
    host_.schedule([this, layer, iteration, round = std::move(*ready)]() mutable {
      try {
        combine(layer, iteration, std::move(round));
      } catch (...) {
        host_.fail(std::current_exception());
      }
    });
  }
}

// ---- member -> leader -------------------------------------------------------------------------------

void LocalGroup::sendPush(int layer, int64_t iteration, const Round& round) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
  }
  if (!round.factors) {
    const int64_t total = round.result.size();
    for (int64_t c = 0; c < chunks(total); ++c) {
      const int64_t begin = c * chunkFloats_, n = std::min(chunkFloats_, total - begin);
      std::vector<Van::Part> parts;
      round.result.forEach(begin, n, [&](float* p, int64_t count, int64_t) {
        parts.push_back({p, static_cast<size_t>(count) * kFloatBytes});
      });
      host_.send(leader_, wire::localPush(layer, iteration, static_cast<int>(c), 0), parts);
    }
    return;
  }
  // Factors: U (rows x m) then V (rows x n), as one flat range cut into chunks.
  const LayerSpec& spec = book_.model().layers[layer];
  const int64_t uFloats = round.rows * spec.m, total = uFloats + round.rows * spec.n;
  for (int64_t c = 0; c < chunks(total); ++c) {
    const int64_t begin = c * chunkFloats_, end = std::min(total, begin + chunkFloats_);
    std::vector<Van::Part> parts;
    if (begin < uFloats)
      parts.push_back({round.u + begin, static_cast<size_t>(std::min(end, uFloats) - begin) * kFloatBytes});
    if (end > uFloats) {
      const int64_t from = std::max(begin, uFloats);
      parts.push_back({round.v + (from - uFloats), static_cast<size_t>(end - from) * kFloatBytes});
    }
    host_.send(leader_, wire::localPush(layer, iteration, static_cast<int>(c), round.rows), parts);
  }
}

bool LocalGroup::take(Chunks& c, int64_t total, int64_t chunkFloats, const Message& msg, const std::string& what) {
  const FrameHeader& h = msg.header;
  const int64_t count = (total + chunkFloats - 1) / chunkFloats;
  if (c.seen.empty()) {
    c.data.assign(static_cast<size_t>(total), 0.f);
    c.seen.assign(static_cast<size_t>(count), false);
    c.missing = count;
  }
  if (static_cast<int64_t>(h.pair) >= count) {
    throw ProtocolError(strCat(what, ": chunk ", h.pair, " of ", count));
  }
  const int64_t begin = static_cast<int64_t>(h.pair) * chunkFloats, n = std::min(chunkFloats, total - begin);
  if (msg.size() != static_cast<size_t>(n) * kFloatBytes) {
    throw ProtocolError(strCat(what, ": chunk ", h.pair, " has ", msg.size(), " bytes, expected ", n * kFloatBytes));
  }
  if (c.seen[h.pair]) throw ProtocolError(strCat(what, ": chunk ", h.pair, " twice"));
  c.seen[h.pair] = true;
  std::memcpy(c.data.data() + begin, msg.data(), msg.size());
  return --c.missing == 0;
}

void LocalGroup::onPush(const Message& msg) {
  const FrameHeader& h = msg.header;
  const int sender = static_cast<int>(h.sender);
  if (!leader() || book_.leaderOf(sender) != rank_ || sender == rank_) {
    throw ProtocolError(strCat("local-push from rank ", sender, " to rank ", rank_, ", which is not its leader"));
  }
  const int layer = static_cast<int>(h.layer);
  if (layer >= static_cast<int>(book_.model().layers.size()))
    throw ProtocolError(strCat("layer ", layer, " does not exist"));
  const int64_t now = host_.iteration();
  if (h.iteration < now || h.iteration > now + 1) {
    throw ProtocolError(strCat("local-push of iteration ", h.iteration, " while the leader is at ", now));
  }
  const LayerSpec& spec = book_.model().layers[layer];
  const int64_t rows = wire::factorRows(h);
  if (rows > 0 && spec.type != LayerType::kFC) throw ProtocolError(strCat("factors for layer '", spec.name, "'"));
  if (rows > kMaxFactorRows) throw ProtocolError(strCat("local-push for layer ", layer, " with ", rows, " rows"));
  const int64_t total = rows > 0 ? rows * (spec.m + spec.n) : spec.numel();
  const Key key{h.iteration, layer};
  std::optional<Round> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Round& r = rounds_[key];
    if (r.members.empty()) r.members.resize(static_cast<size_t>(L_ - 1));
    Chunks& c = r.members[static_cast<size_t>(sender - rank_ - 1)];
    if (c.rows >= 0 && c.rows != rows) throw ProtocolError(strCat("local-push: rows ", rows, " after ", c.rows));
    c.rows = rows;
    if (!take(c, total, chunkFloats_, msg, strCat("local-push from rank ", sender, " layer ", layer))) return;
    ++r.membersIn;
    if (r.own && r.membersIn == L_ - 1) {
      ready = std::move(r);
      rounds_.erase(key);
    }
  }
  if (ready) {
    host_.schedule([this, layer, it = h.iteration, round = std::move(*ready)]() mutable {
      try {
        combine(layer, it, std::move(round));
      } catch (...) {
        host_.fail(std::current_exception());
      }
    });
  }
}

// ---- the leader's combine (pool) ---------------------------------------------------------------

void LocalGroup::combine(int layer, int64_t iteration, Round round) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
  }
  const LayerSpec& spec = book_.model().layers[layer];
  for (size_t m = 0; m < round.members.size(); ++m) {
    if ((round.members[m].rows > 0) != round.factors) {
      throw Error(strCat("layer '", spec.name, "' iteration ", iteration, ": rank ", rank_ + 1 + static_cast<int>(m),
                         " sent ", round.factors ? "a dense gradient" : "sfb factors", " but its leader (rank ", rank_,
                         ") chose ", round.factors ? "sfb" : "ps", " (the ranks disagree on the scheme)"));
    }
  }
  const float inv = 1.0f / static_cast<float>(L_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    syncing_[Key{iteration, layer}] = Syncing{round.result, round.factors && round.scheme == Scheme::kSFB};
  }
  if (!round.factors) {
    // The machine's sum in rank order, divided by L, in place in the leader's gradient.
    round.result.forEach(0, round.result.size(), [&](float* p, int64_t n, int64_t done) {
      for (int64_t i = 0; i < n; ++i) {
        float acc = p[i];
        for (const Chunks& c : round.members) acc += c.data[static_cast<size_t>(done + i)];
        p[i] = acc / static_cast<float>(L_);
      }
    });
    host_.submitDense(layer, iteration, round.result, round.keepAlive);
    return;
  }
  FactorRebuild rebuild;
  if (round.scheme == Scheme::kSFB) {
    rebuild = [this, layer, iteration, out = round.result](const std::vector<FactorView>& workers, float scale) {
      forwardFactors(layer, iteration, workers, scale, out);
    };
  }
  // One stacked factor set: the leader's rows, then each member's, U scaled by 1/L.
  struct Stack {
    std::vector<float> u, v;
    std::shared_ptr<void> own;
  };
  int64_t rows = round.rows;
  for (const Chunks& c : round.members) rows += c.rows;
  auto stack = std::make_shared<Stack>();
  stack->own = round.keepAlive;
  stack->u.reserve(static_cast<size_t>(rows * spec.m));
  stack->v.reserve(static_cast<size_t>(rows * spec.n));
  auto append = [&](const float* u, const float* v, int64_t k) {
    for (int64_t i = 0; i < k * spec.m; ++i) stack->u.push_back(u[i] * inv);
    stack->v.insert(stack->v.end(), v, v + k * spec.n);
  };
  append(round.u, round.v, round.rows);
  for (const Chunks& c : round.members) append(c.data.data(), c.data.data() + c.rows * spec.m, c.rows);
  round.members.clear();  // the stack has them now
  host_.submitFactors(layer, iteration, round.scheme, stack->u.data(), stack->v.data(), rows, round.result, stack,
                      std::move(rebuild));
}

namespace {

// The mean gradient (weight, then bias) of one stacked factor set, by the host's GEMM, as the Syncer
// rebuilds it.
std::vector<float> rebuildMean(const LayerSpec& spec, const float* u, const float* v, int64_t rows, float scale) {
  std::vector<float> mean(static_cast<size_t>(spec.numel()));
  const bool bias = spec.params.size() > 1;
  reconstructGradient({FactorView{u, v, rows}}, spec.m, spec.n, scale, mean.data(),
                      bias ? mean.data() + spec.m * spec.n : nullptr, nullptr);
  return mean;
}

}  // namespace

void LocalGroup::forwardFactors(int layer, int64_t iteration, const std::vector<FactorView>& workers, float scale,
                                const LayerBuffer& out) {
  const LayerSpec& spec = book_.model().layers[layer];
  int64_t rows = 0;
  for (const FactorView& w : workers) rows += w.rows;
  // One stack, U then V, in the Syncer's worker order: what its GEMM would have stacked.
  std::vector<float> flat(static_cast<size_t>(rows * (spec.m + spec.n)));
  float* u = flat.data();
  float* v = flat.data() + rows * spec.m;
  for (const FactorView& w : workers) {
    u = std::copy(w.u, w.u + w.rows * spec.m, u);
    v = std::copy(w.v, w.v + w.rows * spec.n, v);
  }
  const int64_t total = static_cast<int64_t>(flat.size());
  for (int member = rank_ + 1; member < rank_ + L_; ++member) {
    for (int64_t c = 0; c < chunks(total); ++c) {
      const int64_t begin = c * chunkFloats_, n = std::min(chunkFloats_, total - begin);
      host_.send(member, wire::localFactors(layer, iteration, static_cast<int>(c), rows),
                 {Van::Part{flat.data() + begin, static_cast<size_t>(n) * kFloatBytes}});
    }
  }
  const std::vector<float> mean = rebuildMean(spec, flat.data(), flat.data() + rows * spec.m, rows, scale);
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;  // nothing touches the caller's buffer once close() returned
  out.forEach(0, out.size(), [&](float* p, int64_t n, int64_t off) {
    std::memcpy(p, mean.data() + off, static_cast<size_t>(n) * kFloatBytes);
  });
}

// ---- leader -> members ---------------------------------------------------------------------------

void LocalGroup::layerSynced(int layer, int64_t iteration) {
  bool factorsDone = false;
  LayerBuffer result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = syncing_.find(Key{iteration, layer});
    if (it == syncing_.end()) {
      host_.fail(std::make_exception_ptr(Error(
          strCat("internal error: layer ", layer, " of iteration ", iteration, " synced without a local round"))));
      return;
    }
    const bool factors = it->second.factors;
    result = std::move(it->second.result);
    syncing_.erase(it);
    if (factors) {  // the members have the factors already (forwardFactors)
      if (closed_) return;
      factorsDone = true;
    }
  }
  if (factorsDone) {
    host_.done(layer, iteration);
    return;
  }
  // The sends copy the mean before the layer counts as done: only then may the user's step touch it.
  host_.schedule([this, layer, iteration, result = std::move(result)] {
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closed_) return;
      }
      const int64_t total = result.size();
      for (int member = rank_ + 1; member < rank_ + L_; ++member) {
        for (int64_t c = 0; c < chunks(total); ++c) {
          const int64_t begin = c * chunkFloats_, n = std::min(chunkFloats_, total - begin);
          std::vector<Van::Part> parts;
          result.forEach(begin, n, [&](float* p, int64_t count, int64_t) {
            parts.push_back({p, static_cast<size_t>(count) * kFloatBytes});
          });
          host_.send(member, wire::localResult(layer, iteration, static_cast<int>(c)), parts);
        }
      }
      host_.done(layer, iteration);
    } catch (...) {
      host_.fail(std::current_exception());
    }
  });
}

void LocalGroup::checkFromLeader(const FrameHeader& h) const {
  if (leader() || static_cast<int>(h.sender) != leader_) {
    throw ProtocolError(
        strCat(msgTypeName(h.type), " from rank ", h.sender, " to rank ", rank_, ", whose leader is rank ", leader_));
  }
}

void LocalGroup::onResult(const Message& msg) {
  const FrameHeader& h = msg.header;
  checkFromLeader(h);
  const int layer = static_cast<int>(h.layer);
  const Key key{h.iteration, layer};
  bool written = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = rounds_.find(key);
    if (it == rounds_.end() || !it->second.own) {
      throw ProtocolError(
          strCat("local-result for layer ", layer, " iteration ", h.iteration, ", which this rank has not submitted"));
    }
    Round& r = it->second;
    if (r.factors) throw ProtocolError(strCat("local-result for layer ", layer, ", whose round is sfb"));
    if (!take(r.mean, r.result.size(), chunkFloats_, msg, strCat("local-result layer ", layer))) return;
    if (r.pushing) return;  // the pool writes it once its sends are done
    written = writeMean(r);
    rounds_.erase(it);
  }
  if (written) host_.done(layer, h.iteration);
}

void LocalGroup::onFactors(const Message& msg) {
  const FrameHeader& h = msg.header;
  checkFromLeader(h);
  const int layer = static_cast<int>(h.layer);
  const Key key{h.iteration, layer};
  const int64_t rows = wire::factorRows(h);
  std::vector<float> stack;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = rounds_.find(key);
    if (it == rounds_.end() || !it->second.own || !it->second.factors) {
      throw ProtocolError(strCat("local-factors for layer ", layer, " iteration ", h.iteration,
                                 ", which this rank has not submitted as factors"));
    }
    Round& r = it->second;
    const LayerSpec& spec = book_.model().layers[layer];
    if (rows < 1 || rows > kMaxFactorRows || (r.gathered.rows >= 0 && rows != r.gathered.rows)) {
      throw ProtocolError(strCat("local-factors for layer ", layer, " with ", rows, " rows"));
    }
    r.gathered.rows = rows;
    if (!take(r.gathered, rows * (spec.m + spec.n), chunkFloats_, msg, strCat("local-factors layer ", layer))) return;
    stack = std::move(r.gathered.data);
  }
  // Every worker's factors are in: this rank's own GEMM, on the pool (the receive loop goes on).
  host_.schedule([this, key, rows, stack = std::move(stack)] {
    try {
      const LayerSpec& spec = book_.model().layers[key.second];
      std::vector<float> mean = rebuildMean(spec, stack.data(), stack.data() + rows * spec.m, rows,
                                            1.0f / static_cast<float>(book_.numWorkers()));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = rounds_.find(key);
        if (it == rounds_.end()) return;
        it->second.mean.data = std::move(mean);
        it->second.mean.seen.assign(1, true);
        it->second.mean.missing = 0;
      }
      meanComplete(key);
    } catch (...) {
      host_.fail(std::current_exception());
    }
  });
}

void LocalGroup::meanComplete(const Key& key) {
  bool written = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = rounds_.find(key);
    if (it == rounds_.end() || it->second.pushing) return;  // pushing: the pool writes it once its sends are done
    written = writeMean(it->second);
    rounds_.erase(it);
  }
  if (written) host_.done(key.second, key.first);
}

bool LocalGroup::writeMean(Round& round) const {
  // Under the lock: once close() returns, the caller's buffer is not written any more.
  if (closed_) return false;
  round.result.forEach(0, round.result.size(), [&](float* p, int64_t n, int64_t off) {
    std::memcpy(p, round.mean.data.data() + off, static_cast<size_t>(n) * kFloatBytes);
  });
  return true;
}

void LocalGroup::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

std::string LocalGroup::pending(int layer, int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(Key{iteration, layer});
  const std::string name = strCat("layer '", book_.model().layers.at(static_cast<size_t>(layer)).name, "'");
  if (!leader()) {
    if (it == rounds_.end()) return "";
    return strCat(name, ": the machine's mean from its leader, rank ", leader_);
  }
  if (it == rounds_.end()) return "";
  std::string who;
  for (size_t m = 0; m < it->second.members.size(); ++m) {
    const Chunks& c = it->second.members[m];
    if (c.seen.empty() || c.missing > 0) who += strCat(who.empty() ? "" : ", ", rank_ + 1 + static_cast<int>(m));
  }
  if (who.empty()) return "";
  return strCat(name, ": the contributions of this machine's rank(s) ", who);
}

}  // namespace poseidon
