#include "poseidon/client/puller.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/wire/group_payloads.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

Puller::Puller(const InformationBook& book, Send send, const StickyError& error)
    : book_(book), send_(std::move(send)), error_(error) {}

void Puller::setTargets(std::vector<LayerBuffer> params) {
  const KvLayout& layout = book_.layout();
  if (static_cast<int>(params.size()) != layout.numLayers()) {
    throw InvalidArgument(strCat("pull targets for ", params.size(), " layers, the model has ", layout.numLayers()));
  }
  for (int l = 0; l < layout.numLayers(); ++l) {
    if (params[l].size() != book_.model().layers[l].numel()) {
      throw InvalidArgument(strCat("layer ", l, ": ", params[l].size(), " parameters to pull into, expected ",
                                   book_.model().layers[l].numel()));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  targets_ = std::move(params);
  versions_.assign(targets_.size(), -1);
}

// Every pair of every layer is awaited again (a pull or a state fetch begins).
void Puller::expectEveryPairLocked() {
  const KvLayout& layout = book_.layout();
  got_.assign(targets_.size(), {});
  left_.assign(targets_.size(), 0);
  for (int l = 0; l < layout.numLayers(); ++l) {
    got_[l].assign(layout.pairsOf(l).size(), false);
    left_[l] = static_cast<int>(layout.pairsOf(l).size());
  }
  layersLeft_ = layout.numLayers();
}

void Puller::start(int64_t round) {
  const KvLayout& layout = book_.layout();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (targets_.empty()) throw InvalidArgument("pull before the model's parameters were registered");
    if (open_ && layersLeft_ > 0) throw InvalidArgument(strCat("pull of round ", round, " before round ", round_, " arrived"));
    round_ = round;
    open_ = true;
    stateMode_ = false;
    expectEveryPairLocked();
  }
  // Layer order, so the first layers' parameters come first.
  for (int l = 0; l < layout.numLayers(); ++l) {
    for (const KvPair& p : layout.pairsOf(l)) send_(book_.shardRank(p.shard), wire::pull(l, round, p.index), {});
  }
}

void Puller::startState(std::vector<LayerBuffer> momentum) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (targets_.empty()) throw InvalidArgument("state fetch before the model's parameters were registered");
    if (open_ && layersLeft_ > 0) throw InvalidArgument("state fetch while a pull is still arriving");
    if (momentum.size() != targets_.size()) throw InvalidArgument("state fetch: one momentum buffer per layer");
    for (size_t l = 0; l < momentum.size(); ++l) {
      if (momentum[l].size() != targets_[l].size()) {
        throw InvalidArgument(strCat("state fetch: layer ", l, " momentum has ", momentum[l].size(), " floats"));
      }
    }
    momentum_ = std::move(momentum);
    stateMode_ = true;
    open_ = true;
    stateVersion_ = -1;
    stateClocks_.clear();
    expectEveryPairLocked();
  }
  for (int s : book_.serverRanks()) send_(s, wire::stateRequest(), {});
}

// The pair a reply names; it must exist and come from the shard that owns it.
const KvPair& Puller::pairOf(const FrameHeader& h, const char* what) const {
  const KvLayout& layout = book_.layout();
  if (h.layer >= static_cast<uint32_t>(layout.numLayers()) || h.pair >= layout.pairsOf(h.layer).size()) {
    throw ProtocolError(strCat(what, " for layer ", h.layer, " pair ", h.pair, ", which does not exist"));
  }
  const KvPair& p = layout.pairsOf(h.layer)[h.pair];
  if (static_cast<int>(h.sender) != book_.shardRank(p.shard)) {
    throw ProtocolError(strCat(what, " for layer ", h.layer, " pair ", h.pair, " from rank ", h.sender,
                               ", which does not own it"));
  }
  return p;
}

void Puller::onStateReply(Message& msg) {
  const FrameHeader& h = msg.header;
  const KvPair& p = pairOf(h, "state reply");
  const size_t groups = static_cast<size_t>(std::max(1, book_.settings().groups));
  const wire::ModelStateView state =
      wire::decodeModelState(msg.data(), msg.size(), static_cast<size_t>(p.length), groups,
                             strCat("state reply for layer ", h.layer, " pair ", h.pair));
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_ || !stateMode_) throw ProtocolError("state reply without a state request");
    if (got_[h.layer][h.pair]) throw ProtocolError(strCat("duplicate state reply for layer ", h.layer, " pair ", h.pair));
    got_[h.layer][h.pair] = true;
    targets_[h.layer].forEach(p.offset, p.length, [&](float* dst, int64_t n, int64_t off) {
      std::memcpy(dst, state.w + off * kFloatBytes, static_cast<size_t>(n) * kFloatBytes);
    });
    momentum_[h.layer].forEach(p.offset, p.length, [&](float* dst, int64_t n, int64_t off) {
      std::memcpy(dst, state.v + off * kFloatBytes, static_cast<size_t>(n) * kFloatBytes);
    });
    // Every pair had as many updates when all groups stopped at the same round; keep the first.
    if (stateVersion_ < 0) {
      stateVersion_ = h.iteration;
      stateClocks_ = state.clocks;
    }
    if (--left_[h.layer] == 0) {
      --layersLeft_;
      done = layersLeft_ == 0;
    }
  }
  if (done) cv_.notify_all();
}

int64_t Puller::stateVersion() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stateVersion_;
}

std::vector<int64_t> Puller::stateClocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stateClocks_;
}

void Puller::onReply(Message& msg) {
  const FrameHeader& h = msg.header;
  const KvPair& p = pairOf(h, "pull reply");
  const wire::PullReplyView reply = wire::decodePullReply(msg.data(), msg.size(), static_cast<size_t>(p.length),
                                                          strCat("pull reply for layer ", h.layer, " pair ", h.pair));
  const int64_t version = reply.version;
  bool layerDone = false, pairWaiters = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pairWaiters = pairWaiters_ > 0;
    if (!open_ || stateMode_ || h.iteration != round_) {
      throw ProtocolError(strCat("pull reply for round ", h.iteration, ", this worker pulls round ", round_));
    }
    if (got_[h.layer][h.pair]) throw ProtocolError(strCat("duplicate pull reply for layer ", h.layer, " pair ", h.pair));
    got_[h.layer][h.pair] = true;
    targets_[h.layer].forEach(p.offset, p.length, [&](float* dst, int64_t n, int64_t done) {
      std::memcpy(dst, reply.w + done * kFloatBytes, static_cast<size_t>(n) * kFloatBytes);
    });
    if (h.pair == 0) versions_[h.layer] = version;
    if (--left_[h.layer] == 0) {
      --layersLeft_;
      layerDone = true;
    }
  }
  if (layerDone || pairWaiters) cv_.notify_all();
}

bool Puller::waitLayer(int layer, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool ok = cv_.wait_for(lock, timeout, [&] { return error_.failed() || (open_ && left_.at(layer) == 0); });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  return ok;
}

bool Puller::waitPair(int layer, int pair, int64_t round, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] { return error_.failed() || !open_ || stateMode_ || round_ != round || got_.at(layer).at(pair); };
  if (ready()) return true;
  ++pairWaits_;
  ++pairWaiters_;
  const bool ok = cv_.wait_for(lock, timeout, ready);
  --pairWaiters_;
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  return ok;
}

int64_t Puller::pairWaits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pairWaits_;
}

bool Puller::waitAll(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool ok = cv_.wait_for(lock, timeout, [&] { return error_.failed() || (open_ && layersLeft_ == 0); });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  return ok;
}

std::vector<int> Puller::missing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> out;
  for (size_t l = 0; l < left_.size(); ++l)
    if (left_[l] > 0) out.push_back(static_cast<int>(l));
  return out;
}

std::vector<int64_t> Puller::versions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return versions_;
}

void Puller::wake() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

}  // namespace poseidon
