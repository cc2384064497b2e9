#include "poseidon/sfb/keeper.h"

#include "poseidon/common/error.h"

namespace poseidon {

SfbKeeper::SfbKeeper(const InformationBook& book, int shard) : book_(book), shard_(shard) {}

std::optional<SfbKeeper::Decision> SfbKeeper::notice(int senderRank, int layer, int64_t iteration,
                                                     Clock::time_point now) {
  const auto& layers = book_.model().layers;
  if (layer < 0 || layer >= static_cast<int>(layers.size()) || layers[layer].type != LayerType::kFC) {
    throw ProtocolError(strCat("sfb notice for layer ", layer, ", which is not an fc layer"));
  }
  if (book_.layerKeeperRank(layer) != book_.shardRank(shard_)) {
    throw ProtocolError(strCat("sfb notice for layer ", layer, ", which shard ", shard_, " does not keep"));
  }
  int worker = book_.workerIndex(senderRank);
  if (worker < 0) throw ProtocolError(strCat("sfb notice from rank ", senderRank, ", which is not a worker"));
  const JobSettings& s = book_.settings();
  auto done = completed_.find(layer);
  int64_t last = done == completed_.end() ? s.startIteration - 1 : done->second;
  if (iteration <= last && iteration >= s.startIteration) return std::nullopt;  // late: discarded
  if (iteration <= last || iteration > last + kMaxAhead) {
    throw ProtocolError(strCat("sfb notice for layer ", layer, " iteration ", iteration, " outside the open window"));
  }
  Round& r = rounds_[{layer, iteration}];
  if (r.got.empty()) r.got.assign(book_.numWorkers(), false);
  if (r.got[worker]) throw ProtocolError(strCat("duplicate sfb notice from rank ", senderRank));
  r.got[worker] = true;
  ++r.count;
  const int workers = book_.numWorkers();
  if (r.count >= workers) return decide(layer, iteration);
  if (!r.deadline && r.count >= workers - s.dropStragglers) {
    r.deadline = now + std::chrono::milliseconds(s.stragglerTimeoutMs);
  }
  return std::nullopt;
}

SfbKeeper::Decision SfbKeeper::decide(int layer, int64_t iteration) {
  auto it = rounds_.find({layer, iteration});
  Decision d;
  d.layer = layer;
  d.iteration = iteration;
  d.contributors = it->second.got;
  rounds_.erase(it);
  int64_t& last = completed_.try_emplace(layer, book_.settings().startIteration - 1).first->second;
  if (iteration > last) last = iteration;
  return d;
}

std::vector<SfbKeeper::Decision> SfbKeeper::expire(Clock::time_point now) {
  std::vector<Decision> out;
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    auto key = it->first;
    bool due = it->second.deadline && *it->second.deadline <= now;
    ++it;
    if (due) out.push_back(decide(key.first, key.second));
  }
  return out;
}

}  // namespace poseidon
