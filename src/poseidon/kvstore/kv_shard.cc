#include "poseidon/kvstore/kv_shard.h"

#include <cstring>

#include "poseidon/common/error.h"

namespace poseidon {

KvShard::KvShard(const InformationBook& book, int shard) : book_(book), shard_(shard) {
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

std::optional<KvShard::Completed> KvShard::push(int senderRank, int layer, int pair, int64_t iteration,
                                                const uint8_t* data, size_t bytes) {
  int worker = book_.workerIndex(senderRank);
  if (worker < 0) throw ProtocolError(strCat("push from rank ", senderRank, ", which is not a worker"));
  auto it = pairs_.find(key(layer, pair));
  if (layer < 0 || pair < 0 || it == pairs_.end()) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, ", which shard ", shard_, " does not hold"));
  }
  PairState& st = it->second;
  const int64_t length = st.pair->length;
  if (bytes != static_cast<size_t>(length) * sizeof(float)) {
    throw ProtocolError(strCat("push for layer ", layer, " pair ", pair, " has ", bytes, " bytes, expected ",
                               length * sizeof(float)));
  }
  if (iteration <= st.completed || iteration > st.completed + kMaxAhead) {
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

  std::vector<float> values(length);
  std::memcpy(values.data(), data, bytes);
  if (worker != round.next) {
    round.early.emplace(worker, std::move(values));
  } else {
    if (round.next == 0) {
      round.sum = std::move(values);
    } else {
      for (int64_t i = 0; i < length; ++i) round.sum[i] += values[i];
    }
    ++round.next;
    // Add early arrivals that are now in order.
    for (auto e = round.early.find(round.next); e != round.early.end(); e = round.early.find(round.next)) {
      if (round.next == 0) {
        round.sum = std::move(e->second);
      } else {
        for (int64_t i = 0; i < length; ++i) round.sum[i] += e->second[i];
      }
      round.early.erase(e);
      ++round.next;
    }
  }
  if (round.count < workers) return std::nullopt;
  // Complete rounds finish in iteration order: BSP workers cannot complete
  // t + 1 here before t, because each pushes t + 1 only after it has received
  // every aggregate of t.
  Completed done;
  done.layer = layer;
  done.pair = pair;
  done.iteration = iteration;
  done.sum = std::move(round.sum);
  st.rounds.erase(iteration);
  if (iteration > st.completed) st.completed = iteration;
  return done;
}

std::vector<std::string> KvShard::openRounds() const {
  std::vector<std::string> out;
  for (const auto& [k, st] : pairs_) {
    for (const auto& [it, round] : st.rounds) {
      std::vector<int> missing;
      for (size_t w = 0; w < round.got.size(); ++w)
        if (!round.got[w]) missing.push_back(book_.workerRanks()[w]);
      out.push_back(strCat("layer ", st.pair->layer, " pair ", st.pair->index, " iteration ", it, " waits for ranks ",
                           [&] {
                             std::string s;
                             for (int r : missing) s += (s.empty() ? "" : ",") + std::to_string(r);
                             return s;
                           }()));
    }
  }
  return out;
}

}  // namespace poseidon
