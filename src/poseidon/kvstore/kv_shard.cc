#include "poseidon/kvstore/kv_shard.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"

namespace poseidon {

KvShard::KvShard(const InformationBook& book, int shard, WorkCharger* charger)
    : book_(book), shard_(shard), charger_(charger) {
  const KvLayout& layout = book.layout();
  for (int l = 0; l < layout.numLayers(); ++l) {
    for (const KvPair& p : layout.pairsOf(l)) {
      if (p.shard != shard) continue;
      PairState st;
      st.pair = &p;
      st.completed = book.settings().startIteration - 1;
      pairs_.emplace(key(p.layer, p.index), std::move(st));
    }
  }
}

int64_t KvShard::bytesOwned() const {
  int64_t b = 0;
  for (const auto& [k, st] : pairs_) b += st.pair->length * 4;
  return b;
}

namespace {
void addInto(std::vector<float>& sum, bool& started, std::vector<float>&& values) {
  if (!started) {
    sum = std::move(values);
    started = true;
    return;
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += values[i];
}
}  // namespace

void accumulateContribution(std::vector<float>& sum, bool& started, const uint8_t* data, int64_t length,
                            WirePrecision wire) {
  if (!started) {
    sum.resize(static_cast<size_t>(length));
    decodeFloats(data, length, wire, sum.data());
    started = true;
    return;
  }
  // 16 KB blocks stay in the cache: the payload is read once and the sum read and written once.
  constexpr int64_t kBlock = 4096;
  float block[kBlock];
  const size_t elementBytes = wireElementBytes(wire);
  for (int64_t at = 0; at < length; at += kBlock) {
    const int64_t n = std::min(kBlock, length - at);
    decodeFloats(data + static_cast<size_t>(at) * elementBytes, n, wire, block);
    float* s = sum.data() + at;
    for (int64_t i = 0; i < n; ++i) s[i] += block[i];
  }
}

std::optional<KvShard::Completed> KvShard::push(int senderRank, int layer, int pair, int64_t iteration,
                                                const uint8_t* data, size_t bytes, Clock::time_point now,
                                                int64_t gap) {
  int worker = book_.workerIndex(senderRank);
  if (worker < 0) throw ProtocolError(strCat("push from rank ", senderRank, ", which is not a worker"));
  auto it = pairs_.find(key(layer, pair));
  if (layer < 0 || pair < 0 || it == pairs_.end()) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, ", which shard ", shard_, " does not hold"));
  }
  PairState& st = it->second;
  const int64_t length = st.pair->length;
  const WirePrecision wire = book_.settings().wire;
  const size_t expected = static_cast<size_t>(length) * wireElementBytes(wire);
  if (bytes != expected) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, " has ", bytes, " bytes, expected ", expected,
                               " (", length, " floats as ", wirePrecisionName(wire), ")"));
  }
  const JobSettings& settings = book_.settings();
  if (iteration <= st.completed && settings.stragglerMode() && iteration >= settings.startIteration) {
    return std::nullopt;  // a straggler's late contribution: discarded, never mixed into a later round
  }
  // The rounds between the pair's last PS round and this one went by SFB (the
  // layer's factors): the push is the pair's next round however far ahead.
  const bool nextAfterSfb = gap > 0 && iteration - gap == st.completed &&
                            (st.rounds.empty() || (st.rounds.size() == 1 && st.rounds.count(iteration)));
  if (iteration <= st.completed || (iteration > st.completed + kMaxAhead && !nextAfterSfb)) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, " iteration ", iteration,
                               " outside the open window (", st.completed + 1, "..", st.completed + kMaxAhead, ")"));
  }
  const int workers = book_.numWorkers();
  Round& round = st.rounds[iteration];
  if (round.got.empty()) round.got.assign(workers, false);
  if (round.got[worker]) {
    throw ProtocolError(strCat("duplicate push from rank ", senderRank, " for layer ", layer, " pair ", pair,
                               " iteration ", iteration));
  }
  round.got[worker] = true;
  ++round.count;

  // One pass over the contribution: decoded (widened to fp32 from a 16-bit wire) and added in
  // place, charged together at full width on the fp32 values. Only an early arrival (out of
  // worker order, so that every sum adds in the same order) is kept as a copy until its turn.
  const WorkClock::time_point workStart = WorkClock::now();
  if (worker != round.next) {
    std::vector<float> values(length);
    decodeFloats(data, length, wire, values.data());
    round.early.emplace(worker, std::move(values));
  } else {
    accumulateContribution(round.sum, round.started, data, length, wire);
    ++round.next;
    // Add early arrivals that are now in order.
    for (auto e = round.early.find(round.next); e != round.early.end(); e = round.early.find(round.next)) {
      addInto(round.sum, round.started, std::move(e->second));
      round.early.erase(e);
      ++round.next;
    }
  }
  chargeSum(charger_, static_cast<double>(length) * sizeof(float), workStart);
  if (round.count >= workers) return finish(st, iteration);
  if (settings.stragglerMode() && !round.deadline && round.count >= workers - settings.dropStragglers) {
    round.deadline = now + std::chrono::milliseconds(settings.stragglerTimeoutMs);
  }
  return std::nullopt;
}

KvShard::Completed KvShard::finish(PairState& st, int64_t iteration) {
  Round& round = st.rounds.at(iteration);
  // Contributions still waiting for a missing predecessor: add them in
  // worker order now (the missing ones are the stragglers).
  for (auto& [w, values] : round.early) addInto(round.sum, round.started, std::move(values));
  Completed done;
  done.layer = st.pair->layer;
  done.pair = st.pair->index;
  done.iteration = iteration;
  done.sum = std::move(round.sum);
  done.contributors = round.got;
  st.rounds.erase(iteration);
  // Rounds complete in iteration order: under BSP no worker pushes t + 1
  // before it has every aggregate of t.
  if (iteration > st.completed) st.completed = iteration;
  return done;
}

std::vector<KvShard::Completed> KvShard::expire(Clock::time_point now) {
  std::vector<Completed> out;
  if (!book_.settings().stragglerMode()) return out;
  for (auto& [k, st] : pairs_) {
    for (auto r = st.rounds.begin(); r != st.rounds.end();) {
      int64_t iteration = r->first;
      bool due = r->second.deadline && *r->second.deadline <= now;
      ++r;  // finish() erases the round
      if (due) out.push_back(finish(st, iteration));
    }
  }
  return out;
}

std::vector<std::string> KvShard::openRounds() const {
  std::vector<std::string> out;
  for (const auto& [k, st] : pairs_) {
    for (const auto& [it, round] : st.rounds) {
      std::string missing;
      for (size_t w = 0; w < round.got.size(); ++w)
        if (!round.got[w]) missing += (missing.empty() ? "" : ",") + std::to_string(book_.workerRanks()[w]);
      out.push_back(strCat("layer ", st.pair->layer, " pair ", st.pair->index, " iteration ", it, " waits for ranks ",
                           missing));
    }
  }
  return out;
}

}  // namespace poseidon
