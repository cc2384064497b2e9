#include "poseidon/kvstore/server.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/kvstore/contributors.h"
#include "poseidon/wire/group_payloads.h"
#include "poseidon/wire/message_table.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

KvServer::KvServer(const InformationBook& book, int shard, WorkCharger* charger)
    : book_(book), charger_(charger), shard_(book, shard, charger) {
  if (book.settings().policy == SchemePolicy::kAdam) adam_ = std::make_unique<AdamServer>(book, shard, charger);
  if (book.settings().stragglerMode()) keeper_ = std::make_unique<SfbKeeper>(book, shard);
  if (book.settings().groupMode()) model_ = std::make_unique<ModelShard>(book, shard);
}

bool KvServer::handles(MsgType type) { return wire::messageInfo(type).handler == wire::Handler::kServer; }

std::vector<Van::Part> KvServer::Outgoing::parts() const {
  std::vector<Van::Part> out;
  if (!narrow.empty()) out.push_back({narrow.data(), narrow.size()});
  if (floats && length > 0) out.push_back({floats->data() + offset, static_cast<size_t>(length) * kFloatBytes});
  if (!trailer.empty()) out.push_back({trailer.data(), trailer.size()});
  return out;
}

KvServer::Outgoing KvServer::aggregate(KvShard::Completed&& done) const {
  Outgoing o;
  o.to = book_.workerRanks();
  o.header = wire::psAggregate(done.layer, done.iteration, done.pair);
  o.length = static_cast<int64_t>(done.sum.size());
  const WirePrecision wire = book_.settings().wire;
  if (wire != WirePrecision::kFp32) {
    // Summed in fp32 (KvShard), rounded once for the way back; charged like a sum's pass.
    const WorkClock::time_point workStart = WorkClock::now();
    o.narrow.resize(done.sum.size() * wireElementBytes(wire));
    encodeFloats(done.sum.data(), o.length, wire, o.narrow.data());
    chargeSum(charger_, static_cast<double>(done.sum.size()) * sizeof(float), workStart);
  } else {
    o.floats = std::make_shared<const std::vector<float>>(std::move(done.sum));
  }
  // Straggler mode: the contributor mask follows the floats, so workers divide
  // by the number of contributions and know whether theirs was among them.
  if (book_.settings().stragglerMode()) o.trailer = encodeMask(done.contributors);
  return o;
}

KvServer::Outgoing KvServer::decision(const SfbKeeper::Decision& d) const {
  Outgoing o;
  o.to = book_.workerRanks();
  o.header = wire::sfbDecision(d.layer, d.iteration);
  o.trailer = encodeMask(d.contributors);
  return o;
}

namespace {
std::vector<KvServer::Outgoing> pullReplies(std::vector<ModelShard::Reply>&& replies) {
  std::vector<KvServer::Outgoing> out;
  for (auto& r : replies) {
    KvServer::Outgoing o;
    o.to = {r.toRank};
    o.header = wire::pullReply(r.layer, r.iteration, r.pair);
    o.length = static_cast<int64_t>(r.params->size());
    o.floats = std::move(r.params);
    o.trailer = wire::encodeVersion(r.version);
    out.push_back(std::move(o));
  }
  return out;
}
}  // namespace

std::vector<KvServer::Outgoing> KvServer::handle(Message& msg, Clock::time_point now) {
  const FrameHeader& h = msg.header;
  const int sender = static_cast<int>(h.sender);
  std::vector<Outgoing> out;
  if (h.type == MsgType::kStateRequest) {
    if (!model_) throw ProtocolError("state request to a server of a job without compute groups");
    if (sender != book_.workerRanks().front()) throw ProtocolError("state request from a worker other than the first");
    for (auto& st : model_->snapshot()) {
      Outgoing o;
      o.to = {sender};
      o.header = wire::stateReply(st.layer, st.pair, st.version);
      const size_t n = st.w.size();
      auto wv = std::make_shared<std::vector<float>>(std::move(st.w));
      wv->insert(wv->end(), st.v.begin(), st.v.end());
      o.floats = wv;
      o.length = static_cast<int64_t>(2 * n);
      o.trailer = wire::encodeClocks(st.clocks);
      out.push_back(std::move(o));
    }
    return out;
  }
  if (h.type == MsgType::kGroupPush || h.type == MsgType::kPull || h.type == MsgType::kModelInit) {
    if (!model_) throw ProtocolError(strCat(msgTypeName(h.type), " to a server of a job without compute groups"));
    return handleGroup(msg);
  }
  switch (h.type) {
    case MsgType::kPsPush: {
      auto done = shard_.push(sender, static_cast<int>(h.layer), static_cast<int>(h.pair), h.iteration, msg.data(),
                              msg.size(), now, wire::psGap(h));
      if (done) out.push_back(aggregate(std::move(*done)));
      return out;
    }
    case MsgType::kAdamFactors: {
      if (!adam_) throw ProtocolError("adam factors to a rank that is not an adam server");
      auto done = adam_->push(sender, static_cast<int>(h.layer), h.iteration, wire::factorRows(h),
                              std::move(msg.payload));
      if (!done) return out;
      auto sum = std::make_shared<const std::vector<float>>(std::move(done->sum));
      for (const KvPair& p : book_.layout().pairsOf(done->layer)) {
        Outgoing o;
        o.to = book_.workerRanks();
        o.header = wire::adamAggregate(done->layer, done->iteration, p.index);
        o.floats = sum;
        o.offset = p.offset;
        o.length = p.length;
        out.push_back(std::move(o));
      }
      return out;
    }
    case MsgType::kSfbNotice: {
      if (!keeper_) throw ProtocolError("sfb notice to a rank that keeps no sfb rounds");
      auto d = keeper_->notice(sender, static_cast<int>(h.layer), h.iteration, now);
      if (d) out.push_back(decision(*d));
      return out;
    }
    default:
      throw ProtocolError(strCat("unexpected ", msgTypeName(h.type), " to a server"));
  }
}

std::vector<KvServer::Outgoing> KvServer::handleGroup(Message& msg) {
  const FrameHeader& h = msg.header;
  const int sender = static_cast<int>(h.sender), layer = static_cast<int>(h.layer), pair = static_cast<int>(h.pair);
  const auto& pairs = book_.layout();
  if (layer < 0 || layer >= pairs.numLayers() || pair < 0 || pair >= static_cast<int>(pairs.pairsOf(layer).size())) {
    throw ProtocolError(strCat(msgTypeName(h.type), " for layer ", h.layer, " pair ", h.pair, ", which does not exist"));
  }
  const size_t n = static_cast<size_t>(pairs.pairsOf(layer)[static_cast<size_t>(pair)].length);
  switch (h.type) {
    case MsgType::kPull:
      if (msg.size() != 0) throw ProtocolError("pull with a payload");
      return pullReplies(model_->pull(sender, layer, pair, h.iteration));
    case MsgType::kGroupPush: {
      const wire::GroupPushView push =
          wire::decodeGroupPush(msg.data(), msg.size(), n, strCat("group push for layer ", layer, " pair ", pair));
      std::vector<float> grad(n);
      std::memcpy(grad.data(), push.gradient, n * kFloatBytes);
      return pullReplies(model_->push(sender, layer, pair, h.iteration, grad.data(), n, push.lr));
    }
    default: {  // model init
      const size_t groups = static_cast<size_t>(std::max(1, book_.settings().groups));
      const wire::ModelStateView init = wire::decodeModelState(msg.data(), msg.size(), n, groups,
                                                               strCat("model init for layer ", layer, " pair ", pair));
      std::vector<float> wv(2 * n);
      std::memcpy(wv.data(), init.w, n * kFloatBytes);
      std::memcpy(wv.data() + n, init.v, n * kFloatBytes);
      return pullReplies(model_->init(sender, layer, pair, wv.data(), wv.data() + n, h.iteration, init.clocks));
    }
  }
}

std::vector<KvServer::Outgoing> KvServer::expire(Clock::time_point now) {
  std::vector<Outgoing> out;
  if (!hasDeadlines()) return out;
  for (auto& done : shard_.expire(now)) out.push_back(aggregate(std::move(done)));
  if (keeper_)
    for (const auto& d : keeper_->expire(now)) out.push_back(decision(d));
  return out;
}

}  // namespace poseidon
