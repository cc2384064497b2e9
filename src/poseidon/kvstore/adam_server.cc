#include "poseidon/kvstore/adam_server.h"

#include "poseidon/common/error.h"

namespace poseidon {

AdamServer::AdamServer(const InformationBook& book, int shard, WorkCharger* charger)
    : book_(book), shard_(shard), charger_(charger) {}

std::optional<AdamServer::Completed> AdamServer::push(int senderRank, int layer, int64_t iteration, int64_t rows,
                                                      zmq::message_t&& payload) {
  const auto& layers = book_.model().layers;
  if (layer < 0 || layer >= static_cast<int>(layers.size()) || layers[layer].type != LayerType::kFC) {
    throw ProtocolError(strCat("adam factors for layer ", layer, ", which is not an fc layer"));
  }
  if (book_.layerKeeperRank(layer) != book_.shardRank(shard_)) {
    throw ProtocolError(strCat("adam factors for layer ", layer, ", which shard ", shard_, " does not hold"));
  }
  int worker = book_.workerIndex(senderRank);
  if (worker < 0) throw ProtocolError(strCat("adam factors from rank ", senderRank, ", which is not a worker"));
  const LayerSpec& spec = layers[layer];
  if (rows < 1 || rows > kMaxFactorRows ||
      payload.size() != static_cast<size_t>(rows * (spec.m + spec.n)) * sizeof(float)) {
    throw ProtocolError(strCat("adam factors for layer ", layer, " with ", rows, " rows have ", payload.size(), " bytes"));
  }
  auto done = completed_.find(layer);
  int64_t last = done == completed_.end() ? book_.settings().startIteration - 1 : done->second;
  if (iteration <= last || iteration > last + kMaxAhead) {
    throw ProtocolError(strCat("adam factors for layer ", layer, " iteration ", iteration, " outside the open window"));
  }
  Round& r = rounds_[{layer, iteration}];
  const int workers = book_.numWorkers();
  if (r.got.empty()) {
    r.got.assign(workers, false);
    r.factors.resize(workers);
    r.rows.assign(workers, 0);
  }
  if (r.got[worker]) throw ProtocolError(strCat("duplicate adam factors from rank ", senderRank));
  r.got[worker] = true;
  r.rows[worker] = rows;
  r.factors[worker] = std::move(payload);
  if (++r.count < workers) return std::nullopt;

  const WorkClock::time_point workStart = WorkClock::now();
  Completed c;
  c.layer = layer;
  c.iteration = iteration;
  c.sum.resize(static_cast<size_t>(spec.numel()));
  std::vector<FactorView> views;
  for (int w = 0; w < workers; ++w) {
    const auto* base = static_cast<const float*>(r.factors[w].data());
    views.push_back({base, base + r.rows[w] * spec.m, r.rows[w]});
  }
  reconstructGradient(views, spec.m, spec.n, 1.0f, c.sum.data(), spec.params.size() > 1 ? c.sum.data() + spec.m * spec.n : nullptr,
                      &scratch_);
  int64_t totalRows = 0;
  for (const auto& v : views) totalRows += v.rows;
  chargeGemm(charger_, 2.0 * static_cast<double>(totalRows) * static_cast<double>(spec.m) * static_cast<double>(spec.n),
             workStart);
  rounds_.erase({layer, iteration});
  completed_[layer] = std::max(last, iteration);
  return c;
}

}  // namespace poseidon
