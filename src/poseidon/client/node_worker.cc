// Node's worker side (node.h): a layer's synchronization submitted to its Syncer, the iteration's
// waits, straggler dropping's skips, and compute-group pushes through GroupClient. Lifecycle,
// failure, the receive loop and routing are node.cc; its end (finish, leave) node_end.cc.
#include <algorithm>

#include "poseidon/client/node.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

// ---- worker API ------------------------------------------------------------------

void Node::send(int dest, const FrameHeader& header, const std::vector<Van::Part>& parts) {
  van_->send(dest, header, parts);
}

void Node::schedule(std::function<void()> task) { pool_->schedule(std::move(task)); }

void Node::scheduleRebuild(int64_t iteration, std::function<void()> task) {
  if (options_.deferReconstruction) {
    std::lock_guard<std::mutex> lock(rebuildMutex_);
    if (iteration > rebuildsReleased_) {
      heldRebuilds_.emplace_back(iteration, std::move(task));
      return;
    }
  }
  schedule(std::move(task));
}

void Node::submitted() {
  if (options_.deferReconstruction && ++submitted_ == layerCount()) releaseRebuilds(iteration_.load());
}

void Node::releaseRebuilds(int64_t through) {
  if (!options_.deferReconstruction) return;
  if (error_.failed() || finished_) {  // the rounds' buffers may be gone; the pool is, after finish()
    dropHeldRebuilds();
    return;
  }
  std::vector<std::function<void()>> go;
  {
    std::lock_guard<std::mutex> lock(rebuildMutex_);
    rebuildsReleased_ = std::max(rebuildsReleased_, through);
    auto keep = heldRebuilds_.begin();
    for (auto& held : heldRebuilds_) {
      if (held.first <= through) {
        go.push_back(std::move(held.second));
      } else {
        *keep++ = std::move(held);
      }
    }
    heldRebuilds_.erase(keep, heldRebuilds_.end());
  }
  for (auto& task : go) schedule(std::move(task));
}

int Node::heldReconstructions() const {
  std::lock_guard<std::mutex> lock(rebuildMutex_);
  return static_cast<int>(heldRebuilds_.size());
}

void Node::dropHeldRebuilds() {
  std::vector<std::pair<int64_t, std::function<void()>>> drop;
  {
    std::lock_guard<std::mutex> lock(rebuildMutex_);
    drop.swap(heldRebuilds_);
  }
}

void Node::checkNotFinished(const char* call) const {
  if (finished_) throw InvalidArgument(strCat(call, " after finish(): rank ", rank(), "'s job is over"));
}

void Node::beginIteration(int64_t iteration) {
  if (!isWorker()) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  checkNotFinished("beginIteration");
  throwIfFailed();
  int64_t expected = begun_ ? iteration_.load() + 1 : book_.settings().startIteration;
  if (iteration != expected) {
    throw InvalidArgument(strCat("beginIteration(", iteration, "): expected iteration ", expected));
  }
  barrier_->begin(iteration);
  begun_ = true;
  iteration_ = iteration;
  submitted_ = 0;
  releaseRebuilds(iteration - 1);
}

void Node::tookPart() {
  // Stored, then the peers' counts read: the receive loop stores a count, then reads ours, so one of
  // the two sees the other. Read here too, not only by the waits: with a model staged through the host
  // this runs on the staging thread, possibly after the user thread's wait has read them.
  if (!countsIterations()) return;
  syncedThrough_ = iteration_.load() + 1;
  checkIterationCounts();
}

Scheme Node::schemeFor(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(book_.model().layers.size())) {
    throw InvalidArgument(strCat("layer index ", layer, " out of range"));
  }
  // Compute groups push dense gradients to the shards that hold the model (factors to the
  // shards are not built: docs/omnivore.md).
  if (book_.settings().groupMode()) return Scheme::kPS;
  return book_.bestScheme(layer, book_.settings().batch);
}

void Node::submitDense(int layer, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  checkNotFinished("submitDense");
  throwIfFailed();
  if (!barrier_ || layer < 0 || layer >= layerCount()) {
    throw InvalidArgument(strCat("submitDense: layer index ", layer, " out of range (rank ", rank(), " has ",
                                 barrier_ ? layerCount() : 0, " worker layers)"));
  }
  // Local aggregation: the machine's ranks meet on its leader first (client/local_group.h).
  if (local_) {
    local_->submitDense(layer, iteration_.load(), std::move(grad), std::move(keepAlive));
  } else {
    syncers_[layer]->submitDense(iteration_.load(), std::move(grad), std::move(keepAlive));
  }
  tookPart();
  submitted();
}

void Node::submitFactors(int layer, const float* u, const float* v, int64_t rows, LayerBuffer out,
                         std::shared_ptr<void> keepAlive, FactorRebuild rebuild) {
  checkNotFinished("submitFactors");
  throwIfFailed();
  if (!barrier_ || layer < 0 || layer >= layerCount()) {
    throw InvalidArgument(strCat("submitFactors: layer index ", layer, " out of range"));
  }
  Scheme scheme = schemeFor(layer);
  if (scheme == Scheme::kPS) {
    throw InvalidArgument(strCat("submitFactors: BestScheme chose ps for layer '", book_.model().layers[layer].name,
                                 "' at the job's batch of ", book_.settings().batch,
                                 "; submit its dense gradient instead"));
  }
  if (local_) {
    // With local ranks every rank rebuilds its SFB mean into `out` by the host's GEMM (LocalGroup).
    if (rebuild) throw InvalidArgument("submitFactors: a device rebuild cannot be combined with local ranks");
    local_->submitFactors(layer, iteration_.load(), scheme, u, v, rows, std::move(out), std::move(keepAlive));
  } else {
    syncers_[layer]->submitFactors(iteration_.load(), scheme, u, v, rows, std::move(out), std::move(keepAlive),
                                   scheme == Scheme::kSFB ? std::move(rebuild) : nullptr);
  }
  tookPart();
  submitted();
}

bool Node::alreadyComplete() const {
  if (!book_.settings().stragglerMode() || syncers_.empty()) return false;
  const int64_t t = iteration_.load();
  for (const auto& s : syncers_)
    if (!s->completeWithoutMe(t)) return false;
  return true;
}

void Node::skipIteration(const std::vector<LayerBuffer>& outputs) {
  checkNotFinished("skipIteration");
  throwIfFailed();
  if (outputs.size() != syncers_.size()) {
    throw InvalidArgument(strCat("skipIteration: ", outputs.size(), " buffers for ", syncers_.size(), " layers"));
  }
  if (!alreadyComplete()) throw InvalidArgument("skipIteration: the iteration has not completed without this worker");
  releaseRebuilds(iteration_.load());
  for (size_t l = 0; l < syncers_.size(); ++l) syncers_[l]->submitSkipped(iteration_.load(), outputs[l]);
  tookPart();
  ++skipped_;
}

int64_t Node::droppedContributions() const {
  int64_t n = 0;
  for (const auto& s : syncers_) n += s->droppedContributions();
  return n;
}

std::vector<std::vector<bool>> Node::contributors(int layer, int64_t iteration) const {
  return syncers_.at(static_cast<size_t>(layer))->contributors(iteration);
}

void Node::layerDone(int layer, int64_t iteration) {
  if (local_) return local_->layerSynced(layer, iteration);  // the members' copy first
  barrierDone(layer, iteration);
}

void Node::barrierDone(int layer, int64_t iteration) {
  if (!barrier_->layerDone(layer, iteration)) {
    // Cannot happen under BSP; treat it as a bug rather than corrupt state.
    fail(std::make_exception_ptr(Error(strCat("internal error: layer ", layer, " finished iteration ", iteration,
                                              " during iteration ", iteration_.load()))));
  }
}

// The barrier allows two heartbeat periods more than the liveness timeout: when
// a peer dies, the liveness check names it before the barrier times out.
void Node::waitIteration() { waitIteration(waitTimeout()); }

bool Node::layerReady(int layer) const {
  return barrier_ && layer >= 0 && layer < layerCount() && barrier_->isDone(layer);
}

std::string Node::pendingWhat(int layer, int64_t iteration) const {
  const std::string local = local_ ? local_->pending(layer, iteration) : std::string();
  if (!local.empty() || syncers_.empty()) return local.empty() ? strCat("layer ", layer) : local;
  return syncers_[layer]->pending(iteration);
}

void Node::waitLayer(int layer) {
  if (!barrier_) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  checkNotFinished("waitLayer");
  if (layer < 0 || layer >= layerCount()) {
    throw InvalidArgument(strCat("waitLayer: layer index ", layer, " out of range (rank ", rank(), " has ",
                                 layerCount(), " worker layers)"));
  }
  releaseRebuilds(iteration_.load());  // the caller has nothing more to hand over before this
  checkIterationCounts();
  throwIfFailed();
  bool done = false;
  try {
    done = barrier_->waitLayer(layer, waitTimeout());
  } catch (...) {
    quiesce();
    throw;
  }
  if (done) return;
  const int64_t it = iteration_.load();
  fail(std::make_exception_ptr(
      TimeoutError(strCat("rank ", rank(), " iteration ", it, ": timed out after ", secondsText(waitTimeout()),
                          " waiting for ", pendingWhat(layer, it)))));
  throwIfFailed();
}

void Node::waitIteration(std::chrono::milliseconds timeout) {
  if (!barrier_) throw InvalidArgument(strCat("rank ", rank(), " is not a worker; it has no iterations"));
  checkNotFinished("waitIteration");
  releaseRebuilds(iteration_.load());
  checkIterationCounts();
  throwIfFailed();
  std::vector<int> pending;
  try {
    pending = barrier_->wait(timeout);
  } catch (...) {
    quiesce();
    throw;
  }
  if (pending.empty()) return;
  const int64_t it = iteration_.load();
  std::string what;
  for (size_t i = 0; i < pending.size() && i < 8; ++i) what += (i ? "; " : "") + pendingWhat(pending[i], it);
  if (pending.size() > 8) what += strCat("; and ", pending.size() - 8, " more layers");
  fail(std::make_exception_ptr(TimeoutError(strCat("rank ", rank(), " iteration ", it, ": timed out after ",
                                                   secondsText(timeout), " waiting for ", what))));
  throwIfFailed();
}

// ---- compute-group mode ----------------------------------------------------------------

GroupClient& Node::groups() {
  if (!groups_) throw InvalidArgument("this job has no compute groups (or this rank is not a worker)");
  return *groups_;
}

void Node::submitGroupPush(int layer, LayerBuffer grad, float lr, std::shared_ptr<void> keepAlive) {
  throwIfFailed();
  if (!groups_) throw InvalidArgument("submitGroupPush: this job has no compute groups");
  if (layer < 0 || layer >= static_cast<int>(syncers_.size())) {
    throw InvalidArgument(strCat("submitGroupPush: layer index ", layer, " out of range"));
  }
  syncers_[layer]->submitGroupPush(iteration_.load(), std::move(grad), lr, std::move(keepAlive));
}

void Node::waitGroupPull(int layer, int pair, int64_t round) { groups_->waitPairPulled(layer, pair, round); }

int64_t Node::groupPacedPushes() const { return groups_ ? groups_->pacedPushes() : 0; }

std::map<int64_t, int64_t> Node::stalenessHistogram() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->stalenessHistogram() : std::map<int64_t, int64_t>{};
}

bool Node::recordModelUpdates(int layer, int pair) {
  std::lock_guard<std::mutex> lock(serverMutex_);
  if (!server_ || !server_->model()) return false;
  const auto& pairs = book_.layout().pairsOf(layer);
  if (pair < 0 || pair >= static_cast<int>(pairs.size()) || book_.shardRank(pairs[pair].shard) != rank()) return false;
  server_->model()->recordPair(layer, pair);
  return true;
}

std::vector<std::vector<float>> Node::recordedModel() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->recorded() : std::vector<std::vector<float>>{};
}

int64_t Node::maxGroupLead() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->maxLead() : 0;
}

int64_t Node::groupEarlyPulls() const {
  std::lock_guard<std::mutex> lock(serverMutex_);
  return server_ && server_->model() ? server_->model()->earlyPulls() : 0;
}

}  // namespace poseidon
