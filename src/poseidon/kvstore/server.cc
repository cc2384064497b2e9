#include "poseidon/kvstore/server.h"

#include "poseidon/common/error.h"
#include "poseidon/kvstore/contributors.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

KvServer::KvServer(const InformationBook& book, int shard) : book_(book), shard_(book, shard) {
  if (book.settings().policy == SchemePolicy::kAdam) adam_ = std::make_unique<AdamServer>(book, shard);
  if (book.settings().stragglerMode()) keeper_ = std::make_unique<SfbKeeper>(book, shard);
}

bool KvServer::handles(MsgType type) {
  return type == MsgType::kPsPush || type == MsgType::kAdamFactors || type == MsgType::kSfbNotice;
}

std::vector<Van::Part> KvServer::Outgoing::parts() const {
  std::vector<Van::Part> out;
  if (floats && length > 0) out.push_back({floats->data() + offset, static_cast<size_t>(length) * kFloatBytes});
  if (!trailer.empty()) out.push_back({trailer.data(), trailer.size()});
  return out;
}

KvServer::Outgoing KvServer::aggregate(KvShard::Completed&& done) const {
  Outgoing o;
  o.to = book_.workerRanks();
  o.header = wire::psAggregate(done.layer, done.iteration, done.pair);
  o.length = static_cast<int64_t>(done.sum.size());
  o.floats = std::make_shared<const std::vector<float>>(std::move(done.sum));
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

std::vector<KvServer::Outgoing> KvServer::handle(Message& msg, Clock::time_point now) {
  const FrameHeader& h = msg.header;
  const int sender = static_cast<int>(h.sender);
  std::vector<Outgoing> out;
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

std::vector<KvServer::Outgoing> KvServer::expire(Clock::time_point now) {
  std::vector<Outgoing> out;
  if (!hasDeadlines()) return out;
  for (auto& done : shard_.expire(now)) out.push_back(aggregate(std::move(done)));
  if (keeper_)
    for (const auto& d : keeper_->expire(now)) out.push_back(decision(d));
  return out;
}

}  // namespace poseidon
