#include "poseidon/kvstore/model_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "poseidon/common/error.h"

namespace poseidon {

ModelShard::ModelShard(const InformationBook& book, int shard)
    : book_(book),
      shard_(shard),
      groups_(std::max(1, book.settings().groups)),
      k_(book.groupSize()),
      stalenessBound_(book.settings().staleness),
      mu_(book.settings().momentum),
      lambda_(book.settings().weightDecay) {
  const KvLayout& layout = book.layout();
  for (int l = 0; l < layout.numLayers(); ++l) {
    for (const KvPair& p : layout.pairsOf(l)) {
      if (p.shard != shard) continue;
      PairState_ st;
      st.pair = &p;
      st.clock.assign(static_cast<size_t>(groups_), book.settings().startIteration);
      pairs_.emplace(key(p.layer, p.index), std::move(st));
    }
  }
}

ModelShard::PairState_& ModelShard::stateOf(int layer, int pair, const char* what) {
  auto it = pairs_.find(key(layer, pair));
  if (layer < 0 || pair < 0 || it == pairs_.end()) {
    throw ProtocolError(strCat(what, " for layer ", layer, " pair ", pair, ", which shard ", shard_, " does not hold"));
  }
  return it->second;
}

int ModelShard::memberOf(int senderRank, int* group) const {
  const int worker = book_.workerIndex(senderRank);
  if (worker < 0) throw ProtocolError(strCat("rank ", senderRank, " is not a worker"));
  *group = book_.groupOf(worker);
  return worker - *group * k_;
}

std::vector<ModelShard::Reply> ModelShard::init(int senderRank, int layer, int pair, const float* w, const float* v,
                                                int64_t version, const std::vector<int64_t>& clocks) {
  if (senderRank != book_.workerRanks().front()) {
    throw ProtocolError(strCat("model init from rank ", senderRank, ": only the first worker initializes the model"));
  }
  PairState_& st = stateOf(layer, pair, "model init");
  if (st.initialized) throw ProtocolError(strCat("model init for layer ", layer, " pair ", pair, " twice"));
  if (clocks.size() != static_cast<size_t>(groups_) || version < 0) {
    throw ProtocolError(strCat("model init for layer ", layer, " pair ", pair, " with ", clocks.size(),
                               " group clocks for ", groups_, " groups"));
  }
  const size_t n = static_cast<size_t>(st.pair->length);
  st.w.assign(w, w + n);
  st.v = v ? std::vector<float>(v, v + n) : std::vector<float>(n, 0.0f);
  st.version = version;
  st.clock = clocks;
  st.initialized = true;
  if (&st == recordedPair_) recorded_.push_back(st.w);
  std::vector<Reply> out;
  answer(st, &out);
  return out;
}

std::vector<ModelShard::Reply> ModelShard::pull(int senderRank, int layer, int pair, int64_t iteration) {
  PairState_& st = stateOf(layer, pair, "pull");
  int group = 0;
  const int member = memberOf(senderRank, &group);
  const int64_t c = st.clock[static_cast<size_t>(group)];
  // The group's current round, or the next one (a member that pushed its part of round c may
  // ask for c + 1 while the others still compute c).
  if (iteration < c || iteration > c + 1) {
    throw ProtocolError(strCat("pull for layer ", layer, " pair ", pair, " round ", iteration, " of group ", group,
                               ", which is at round ", c));
  }
  GroupRound& r = st.rounds[{group, iteration}];
  if (r.pulled.empty()) {
    r.pulled.assign(static_cast<size_t>(k_), false);
    r.pushed.assign(static_cast<size_t>(k_), false);
  }
  if (r.pulled[static_cast<size_t>(member)]) {
    throw ProtocolError(strCat("duplicate pull from rank ", senderRank, " for layer ", layer, " pair ", pair));
  }
  r.pulled[static_cast<size_t>(member)] = true;
  ++r.pulls;
  if (iteration == c + 1) ++earlyPulls_;
  std::vector<Reply> out;
  answer(st, &out);
  return out;
}

void ModelShard::answer(PairState_& st, std::vector<Reply>* out) {
  if (!st.initialized) return;
  const int64_t slowest = *std::min_element(st.clock.begin(), st.clock.end());
  for (auto& [gt, r] : st.rounds) {
    const int group = gt.first;
    const int64_t t = gt.second;
    if (r.servedVersion >= 0 || r.pulls < k_ || t != st.clock[static_cast<size_t>(group)]) continue;
    if (stalenessBound_ >= 0 && t - slowest > stalenessBound_) continue;  // SSP: wait for the slowest group
    maxLead_ = std::max(maxLead_, t - slowest);
    r.servedVersion = st.version;
    auto params = std::make_shared<const std::vector<float>>(st.w);
    const std::vector<int>& workers = book_.workerRanks();
    for (int m = 0; m < k_; ++m) {
      out->push_back({workers[static_cast<size_t>(group * k_ + m)], st.pair->layer, st.pair->index, t, st.version,
                      params});
    }
  }
}

std::vector<ModelShard::Reply> ModelShard::push(int senderRank, int layer, int pair, int64_t iteration,
                                                const float* grad, size_t floats, float lr) {
  PairState_& st = stateOf(layer, pair, "push");
  int group = 0;
  const int member = memberOf(senderRank, &group);
  if (floats != static_cast<size_t>(st.pair->length)) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, " has ", floats, " floats, expected ",
                               st.pair->length));
  }
  if (!(lr >= 0) || lr > 1e6f) throw ProtocolError(strCat("push for layer ", layer, " with learning rate ", lr));
  auto it = st.rounds.find({group, iteration});
  if (iteration != st.clock[static_cast<size_t>(group)] || it == st.rounds.end() || it->second.servedVersion < 0) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, " round ", iteration, " of group ", group,
                               ", which has not pulled it"));
  }
  GroupRound& r = it->second;
  if (r.pushed[static_cast<size_t>(member)]) {
    throw ProtocolError(strCat("duplicate push from rank ", senderRank, " for layer ", layer, " pair ", pair));
  }
  r.pushed[static_cast<size_t>(member)] = true;
  ++r.pushes;
  std::vector<float> values(grad, grad + floats);
  auto add = [&](std::vector<float>&& x) {
    if (!r.started) {
      r.sum = std::move(x);
      r.started = true;
    } else {
      for (size_t i = 0; i < r.sum.size(); ++i) r.sum[i] += x[i];
    }
    ++r.next;
  };
  if (member != r.next) {
    r.early.emplace(member, std::move(values));
  } else {
    add(std::move(values));
    for (auto e = r.early.find(r.next); e != r.early.end(); e = r.early.find(r.next)) {
      add(std::move(e->second));
      r.early.erase(e);
    }
  }
  std::vector<Reply> out;
  if (r.pushes < k_) return out;
  apply(st, group, r, lr);
  st.rounds.erase(it);
  answer(st, &out);
  return out;
}

void ModelShard::apply(PairState_& st, int group, GroupRound& r, float lr) {
  ++staleness_[st.version - r.servedVersion];
  const float k = static_cast<float>(k_);
  // PyTorch's SGD, operation for operation as LibTorch computes it on this CPU (its vectorized
  // add-with-alpha is a fused multiply-add), so that one group reproduces the user's optimizer
  // bit for bit: d = g + lambda W; buf = mu buf + d; W -= eta buf. That is the paper's
  // V <- mu V - eta (g + lambda W), W <- W + V with V = -eta buf while eta is constant; with a
  // learning-rate schedule it keeps PyTorch's meaning (the current eta scales the buffer).
  for (size_t i = 0; i < st.w.size(); ++i) {
    const float g = r.sum[i] / k;
    const float d = lambda_ != 0 ? std::fma(st.w[i], lambda_, g) : g;
    st.v[i] = mu_ != 0 ? st.v[i] * mu_ + d : d;
    st.w[i] = std::fma(st.v[i], -lr, st.w[i]);
  }
  ++st.version;
  ++st.clock[static_cast<size_t>(group)];
  if (&st == recordedPair_) recorded_.push_back(st.w);
}

void ModelShard::recordPair(int layer, int pair) {
  recordedPair_ = &stateOf(layer, pair, "record");
  recorded_.clear();
  if (recordedPair_->initialized) recorded_.push_back(recordedPair_->w);
}

std::vector<ModelShard::PairState> ModelShard::snapshot() const {
  std::vector<PairState> out;
  for (const auto& [k, st] : pairs_) {
    out.push_back({st.pair->layer, st.pair->index, st.w, st.v, st.version, st.clock});
  }
  return out;
}

}  // namespace poseidon
