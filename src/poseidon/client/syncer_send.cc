// The Syncer's sending side (syncer.h): a layer's gradient out by its scheme (PS pairs to their
// shards, sufficient factors to every peer, a compute group's push), and a straggler's skipped round.
// The rounds' state machine and the receiving side are in syncer.cc.
#include <algorithm>
#include <cstring>

#include "poseidon/client/syncer.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/kvstore/contributors.h"
#include "poseidon/wire/group_payloads.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

// ---- submit -------------------------------------------------------------------------

void Syncer::submitDense(int64_t iteration, LayerBuffer grad, std::shared_ptr<void> keepAlive) {
  if (grad.size() != spec_.numel()) {
    throw InvalidArgument(
        strCat("layer '", spec_.name, "': gradient has ", grad.size(), " floats, expected ", spec_.numel()));
  }
  Effects fx;
  std::vector<int> toSend;
  int64_t gap = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    Round& r = submitRoundLocked(iteration);
    Aggregates* a = aggregatesLocked(r, Scheme::kPS);
    if (!a) {
      fx.failure = mismatch(iteration, "this rank chose ps but another worker sent sfb factors");
    } else {
      gap = iteration - lastPsRound_;
      lastPsRound_ = iteration;
      r.phase = Phase::kAwaiting;
      r.contributed = true;
      r.out = grad;
      r.keepAlive = keepAlive;
      // Results that came before us (straggler mode) go in now; we push only
      // the pairs whose rounds are still open.
      for (size_t i = 0; i < a->pairs.size(); ++i) {
        PairSlot& slot = a->pairs[i];
        if (slot.in) {
          writeHeldLocked(r, slot, static_cast<int>(i));
        } else {
          slot.sending = true;
          ++a->sending;
          toSend.push_back(static_cast<int>(i));
        }
      }
      advanceLocked(iteration, r, fx);
    }
  }
  apply(iteration, fx);
  if (!toSend.empty()) {
    host_.schedule([this, iteration, gap, grad, keepAlive, toSend] { sendDense(iteration, gap, grad, toSend); });
  }
}

void Syncer::sendDense(int64_t iteration, int64_t gap, const LayerBuffer& grad, const std::vector<int>& pairIndices) {
  const InformationBook& book = host_.book();
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  std::exception_ptr failure;
  std::vector<Van::Part> parts;
  std::vector<uint8_t> narrow;  // a 16-bit wire: the pair rounded, the one copy before the van's
  for (int i : pairIndices) {
    const KvPair& p = pairs_[i];
    bool skip = failure != nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return;  // the job failed: the caller's buffer may be gone
      // Straggler mode: the pair may have completed without us since submit; nothing to push then.
      skip = skip || std::get<Aggregates>(rounds_.at(iteration).kind).pairs[i].in;
    }
    if (!skip) {
      // No lock here: while `sending` is set, a result for this pair is held
      // instead of being written into the memory we read.
      parts.clear();
      if (wire_ == WirePrecision::kFp32) {
        grad.forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) {
          parts.push_back({ptr, static_cast<size_t>(n) * kFloatBytes});
        });
      } else {
        narrow.resize(static_cast<size_t>(p.length) * elementBytes_);
        grad.forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t done) {
          encodeFloats(ptr, n, wire_, narrow.data() + static_cast<size_t>(done) * elementBytes_);
        });
        parts.push_back({narrow.data(), narrow.size()});
      }
      try {
        host_.send(book.shardRank(p.shard), wire::psPush(layer_, iteration, p.index, gap), parts);
      } catch (const Error& e) {
        failure =
            std::make_exception_ptr(IoError(strCat("layer '", spec_.name, "' iteration ", iteration, ": ", e.what())));
      }
    }
    Effects fx;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return;
      // A round with a pair being sent cannot finish, so it is still here.
      Round& r = rounds_.at(iteration);
      Aggregates& a = std::get<Aggregates>(r.kind);
      PairSlot& slot = a.pairs[i];
      slot.sending = false;
      --a.sending;
      if (slot.in && !slot.held.empty()) writeHeldLocked(r, slot, i);
      advanceLocked(iteration, r, fx);
    }
    apply(iteration, fx);
  }
  if (failure) {
    host_.fail(failure);
    return;
  }
  traceSent(iteration, startUs, "ps");
}

void Syncer::submitGroupPush(int64_t round, LayerBuffer grad, float lr, std::shared_ptr<void> keepAlive) {
  if (grad.size() != spec_.numel()) {
    throw InvalidArgument(
        strCat("layer '", spec_.name, "': gradient has ", grad.size(), " floats, expected ", spec_.numel()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    if (round <= lastGroupRound_) {
      throw InvalidArgument(strCat("layer '", spec_.name, "' submitted twice in round ", round));
    }
    lastGroupRound_ = round;
  }
  host_.schedule([this, round, grad, lr, keepAlive] { sendGroupPush(round, grad, lr); });
}

void Syncer::sendGroupPush(int64_t round, const LayerBuffer& grad, float lr) {
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  std::vector<Van::Part> parts;
  const std::vector<uint8_t> lrBytes = wire::encodeLearningRate(lr);
  const size_t window = static_cast<size_t>(std::max(0, host_.groupPushWindow()));
  try {
    for (size_t i = 0; i < pairs_.size(); ++i) {
      const KvPair& p = pairs_[i];
      // Paced by the replies (NodeOptions::groupPushWindow): a pair of this layer goes once the
      // group's update of the pair `window` before it is back, so this worker's pushes keep pace
      // with its group's slowest, whose link share TCP may starve (docs/omnivore.md).
      if (window > 0 && i >= window) host_.waitGroupPull(layer_, pairs_[i - window].index, round + 1);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closed_) return;  // the job failed: the caller's buffer may be gone
      }
      parts.clear();
      grad.forEach(p.offset, p.length, [&](float* ptr, int64_t n, int64_t) {
        parts.push_back({ptr, static_cast<size_t>(n) * kFloatBytes});
      });
      parts.push_back({lrBytes.data(), lrBytes.size()});
      host_.send(host_.book().shardRank(p.shard), wire::groupPush(layer_, round, p.index), parts);
    }
  } catch (const Error& e) {
    host_.fail(std::make_exception_ptr(IoError(strCat("layer '", spec_.name, "' round ", round, ": ", e.what()))));
    return;
  }
  if (Tracer* tracer = host_.tracer()) {
    tracer->span(strCat("push ", spec_.name, " (group)"), "send", 1, startUs, Tracer::nowMicros(), round);
  }
  host_.layerDone(layer_, round);
}

void Syncer::submitFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows,
                           LayerBuffer out, std::shared_ptr<void> keepAlive, FactorRebuild rebuild) {
  if (spec_.type != LayerType::kFC) {
    throw InvalidArgument(strCat("layer '", spec_.name, "' is not fully connected; it cannot use SFB"));
  }
  if (scheme == Scheme::kPS)
    throw InvalidArgument(strCat("layer '", spec_.name, "': factors submitted for a ps round"));
  if (rows < 1 || rows > kMaxFactorRows) {
    throw InvalidArgument(strCat("layer '", spec_.name, "': ", rows, " factor rows is out of range"));
  }
  if (out.size() != spec_.numel()) {
    throw InvalidArgument(
        strCat("layer '", spec_.name, "': output has ", out.size(), " floats, expected ", spec_.numel()));
  }
  Effects fx;
  bool send = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    Round& r = submitRoundLocked(iteration);
    Factors* f = scheme == Scheme::kSFB ? factorsLocked(r) : nullptr;
    Aggregates* a = scheme == Scheme::kAdam ? aggregatesLocked(r, Scheme::kAdam) : nullptr;
    if (!f && !a) {
      fx.failure = mismatch(
          iteration, strCat("this rank chose ", schemeName(scheme), " but another worker used a different scheme"));
    } else {
      r.phase = Phase::kAwaiting;
      r.contributed = true;
      r.out = out;
      r.rebuild = std::move(rebuild);
      // Decided without us (straggler mode): our factors would be ignored.
      send = !(f && f->decision && !(*f->decision)[me()]);
      r.factorsSending = send;
      advanceLocked(iteration, r, fx);
    }
  }
  apply(iteration, fx);
  if (send) {
    host_.schedule([this, iteration, scheme, u, v, rows, keepAlive] { sendFactors(iteration, scheme, u, v, rows); });
  }
}

void Syncer::sendFactors(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows) {
  sendFactorsOnce(iteration, scheme, u, v, rows);
  // Done with the caller's U and V: the round may finish now.
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    auto it = rounds_.find(iteration);
    if (it == rounds_.end()) return;
    it->second.factorsSending = false;
    advanceLocked(iteration, it->second, fx);
  }
  apply(iteration, fx);
}

void Syncer::sendFactorsOnce(int64_t iteration, Scheme scheme, const float* u, const float* v, int64_t rows) {
  const InformationBook& book = host_.book();
  const int64_t startUs = host_.tracer() ? Tracer::nowMicros() : 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;  // the job failed: the caller's factors may be gone
  }
  const int64_t uFloats = rows * spec_.m, vFloats = rows * spec_.n;
  std::vector<Van::Part> parts{{u, static_cast<size_t>(uFloats) * kFloatBytes},
                               {v, static_cast<size_t>(vFloats) * kFloatBytes}};
  std::vector<uint8_t> narrow;  // a 16-bit wire: U and V rounded once, the same bytes to every peer
  if (wire_ != WirePrecision::kFp32) {
    narrow.resize(static_cast<size_t>(uFloats + vFloats) * elementBytes_);
    encodeFloats(u, uFloats, wire_, narrow.data());
    encodeFloats(v, vFloats, wire_, narrow.data() + static_cast<size_t>(uFloats) * elementBytes_);
    parts.assign(1, {narrow.data(), narrow.size()});
  }
  try {
    if (scheme == Scheme::kAdam) {  // factors up to the layer's one server
      host_.send(book.layerKeeperRank(layer_), wire::adamFactors(layer_, iteration, rows), parts);
      traceSent(iteration, startUs, "adam");
      return;
    }
    const FrameHeader h = wire::sfbFactors(layer_, iteration, rows);
    // Peers first, ourselves last: our own copy costs no network time.
    for (int w : book.workerRanks()) {
      if (w != host_.rank()) host_.send(w, h, parts);
    }
    host_.send(host_.rank(), h, parts);
    if (straggler_) host_.send(book.layerKeeperRank(layer_), wire::sfbNotice(layer_, iteration), {});
    traceSent(iteration, startUs, "sfb");
  } catch (const Error& e) {
    host_.fail(
        std::make_exception_ptr(IoError(strCat("layer '", spec_.name, "' iteration ", iteration, ": ", e.what()))));
  }
}

bool Syncer::completeWithoutMe(int64_t iteration) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = rounds_.find(iteration);
  if (it == rounds_.end() || it->second.phase != Phase::kOpen) return false;
  const Round& r = it->second;
  if (const auto* a = std::get_if<Aggregates>(&r.kind)) return a->left == 0;
  if (const auto* f = std::get_if<Factors>(&r.kind)) {
    return f->decision && !(*f->decision)[me()] && factorSetLocked(*f).has_value();
  }
  return false;
}

void Syncer::submitSkipped(int64_t iteration, LayerBuffer out) {
  if (out.size() != spec_.numel()) {
    throw InvalidArgument(
        strCat("layer '", spec_.name, "': output has ", out.size(), " floats, expected ", spec_.numel()));
  }
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    auto it = rounds_.find(iteration);
    if (it == rounds_.end() || it->second.phase != Phase::kOpen ||
        std::holds_alternative<std::monostate>(it->second.kind)) {
      throw InvalidArgument(strCat("layer '", spec_.name, "' iteration ", iteration, " cannot be skipped"));
    }
    Round& r = it->second;
    r.phase = Phase::kAwaiting;
    r.out = out;
    if (auto* a = std::get_if<Aggregates>(&r.kind); a && a->scheme == Scheme::kPS) lastPsRound_ = iteration;
    if (auto* a = std::get_if<Aggregates>(&r.kind)) {
      for (size_t i = 0; i < a->pairs.size(); ++i)
        if (a->pairs[i].in) writeHeldLocked(r, a->pairs[i], static_cast<int>(i));
    }
    advanceLocked(iteration, r, fx);
  }
  apply(iteration, fx);
}

}  // namespace poseidon
