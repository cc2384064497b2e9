#include "poseidon/client/group_client.h"

#include "poseidon/common/error.h"
#include "poseidon/wire/group_payloads.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

GroupClient::GroupClient(Van& van, const InformationBook& book, int rank, const StickyError& error,
                         std::function<void(std::exception_ptr)> fail, std::function<void()> throwIfFailed,
                         std::chrono::milliseconds waitTimeout)
    : van_(van),
      book_(book),
      rank_(rank),
      fail_(std::move(fail)),
      throwIfFailed_(std::move(throwIfFailed)),
      waitTimeout_(waitTimeout),
      puller_(
          book,
          [this](int dest, const FrameHeader& h, const std::vector<Van::Part>& parts) { van_.send(dest, h, parts); },
          error) {}

void GroupClient::setModel(std::vector<LayerBuffer> params) { puller_.setTargets(std::move(params)); }

void GroupClient::initModel(const std::vector<LayerBuffer>& momentum, int64_t version,
                            const std::vector<int64_t>& clocks) {
  throwIfFailed_();
  if (!firstWorker()) throw InvalidArgument("initModel: only the first worker initializes");
  const size_t groups = static_cast<size_t>(book_.settings().groups);
  if (clocks.size() != groups)
    throw InvalidArgument(strCat("initModel: ", clocks.size(), " clocks for ", groups, " groups"));
  const std::vector<LayerBuffer>& params = puller_.targets();
  const std::vector<uint8_t> clockBytes = wire::encodeClocks(clocks);
  std::vector<float> zeros;
  std::vector<Van::Part> parts;
  for (int l = 0; l < book_.layout().numLayers(); ++l) {
    if (!momentum.empty() && momentum[l].size() != params[l].size()) {
      throw InvalidArgument(strCat("initModel: layer ", l, " momentum has ", momentum[l].size(), " floats"));
    }
    for (const KvPair& p : book_.layout().pairsOf(l)) {
      parts.clear();
      params[l].forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) {
        parts.push_back({ptr, size_t(n) * kFloatBytes});
      });
      if (momentum.empty()) {
        zeros.assign(static_cast<size_t>(p.length), 0.0f);
        parts.push_back({zeros.data(), zeros.size() * kFloatBytes});
      } else {
        momentum[l].forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) {
          parts.push_back({ptr, size_t(n) * kFloatBytes});
        });
      }
      parts.push_back({clockBytes.data(), clockBytes.size()});
      van_.send(book_.shardRank(p.shard), wire::modelInit(l, p.index, version), parts);
    }
  }
}

void GroupClient::startPull(int64_t round) {
  throwIfFailed_();
  puller_.start(round);
}

void GroupClient::waitPulled(int layer) {
  if (!puller_.waitLayer(layer, waitTimeout_)) {
    fail_(std::make_exception_ptr(
        TimeoutError(strCat("rank ", rank_, " group ", group(), ": timed out after ", secondsText(waitTimeout_),
                            " waiting for layer '", book_.model().layers[layer].name, "' from the shards"))));
  }
  throwIfFailed_();
}

void GroupClient::waitPairPulled(int layer, int pair, int64_t round) {
  if (!puller_.waitPair(layer, pair, round, waitTimeout_)) {
    fail_(std::make_exception_ptr(
        TimeoutError(strCat("rank ", rank_, " group ", group(), ": timed out after ", secondsText(waitTimeout_),
                            " waiting for the reply to pair ", pair, " of layer '", book_.model().layers[layer].name,
                            "' before pushing more of it"))));
  }
  throwIfFailed_();
}

void GroupClient::waitPulled() {
  if (!puller_.waitAll(waitTimeout_)) {
    std::string layers;
    for (int l : puller_.missing()) layers += (layers.empty() ? "'" : ", '") + book_.model().layers[l].name + "'";
    fail_(std::make_exception_ptr(TimeoutError(
        strCat("rank ", rank_, " group ", group(), ": timed out after ", secondsText(waitTimeout_),
               " pulling layers ", layers, " from the shards (a slower group may hold them back: --staleness)"))));
  }
  throwIfFailed_();
}

std::pair<int64_t, std::vector<int64_t>> GroupClient::fetchModelState(std::vector<LayerBuffer> momentum) {
  throwIfFailed_();
  if (!firstWorker())
    throw InvalidArgument("fetchModelState: the first worker of a job with compute groups fetches the state");
  puller_.startState(std::move(momentum));
  if (!puller_.waitAll(waitTimeout_)) {
    fail_(
        std::make_exception_ptr(TimeoutError(strCat("rank ", rank_, ": timed out after ", secondsText(waitTimeout_),
                                                    " fetching the model's state from the shards"))));
  }
  throwIfFailed_();
  return {puller_.stateVersion(), puller_.stateClocks()};
}

}  // namespace poseidon
