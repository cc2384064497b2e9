// KvServer: the server role of a node (paper section 4.1).
//
// It owns the node's KV shard and, when the job needs them, Project Adam's
// per-layer server (the benchmark baseline, kvstore/adam_server.h), the
// SFB keeper (straggler mode, sfb/keeper.h), and in compute-group mode the
// shard's part of the model (kvstore/model_shard.h). Like KvShard it does no I/O:
// handle() validates one inbound message and returns the messages to send,
// which the node sends; so the whole server side is unit-tested without
// sockets.
//
//   ps-push       -> KvShard::push      -> ps-aggregate to every worker once
//                                          the pair's round is complete (the
//                                          fp32 sum, rounded once for a 16-bit wire)
//   adam-factors  -> AdamServer::push   -> adam-aggregate, one per KV pair of
//                                          the layer, to every worker
//   sfb-notice    -> SfbKeeper::notice  -> sfb-decision to every worker
//   model-init, pull, group-push -> ModelShard -> pull-reply to each member
//                                          of a group whose pull is answered
//
// Threads: owned by the node's receive loop; not thread-safe, with one exception: handle() of
// ps-pushes of different KV pairs may run at once (the node's sum lanes, NodeOptions::sumThreads),
// each pair's pushes one after another, while the loop handles the other types; the KV shard's pair
// table is fixed at construction and each pair's rounds are its own. expire() (straggler mode) visits
// every pair: a node in straggler mode sums on the loop.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "poseidon/coordinator/book.h"
#include "poseidon/kvstore/adam_server.h"
#include "poseidon/kvstore/kv_shard.h"
#include "poseidon/kvstore/model_shard.h"
#include "poseidon/sfb/keeper.h"
#include "poseidon/transport/van.h"

namespace poseidon {

class KvServer {
 public:
  using Clock = std::chrono::steady_clock;

  // charger: the bench's charge for the server's own work (common/work_charger.h); null: none.
  // Not owned; must outlive the server.
  KvServer(const InformationBook& book, int shard, WorkCharger* charger = nullptr);

  // The message types this role accepts.
  static bool handles(MsgType type);

  // A message to send: header (wire/messages.h), then floats[offset, offset +
  // length) of a buffer shared by all destinations, then the trailer.
  struct Outgoing {
    std::vector<int> to;  // destination ranks
    FrameHeader header;
    std::shared_ptr<const std::vector<float>> floats;
    int64_t offset = 0, length = 0;
    // A 16-bit wire (JobSettings::wire): the aggregate already rounded, sent in place of `floats`.
    std::vector<uint8_t> narrow;
    std::vector<uint8_t> trailer;  // straggler mode: the contributor mask
    std::vector<Van::Part> parts() const;
  };

  // One inbound message (one of handles()'s types). Throws ProtocolError when
  // it does not fit; nothing changes then.
  std::vector<Outgoing> handle(Message& msg, Clock::time_point now = Clock::now());
  // Straggler mode: completes the rounds whose deadline has passed.
  std::vector<Outgoing> expire(Clock::time_point now);
  // Whether expire() can ever return anything (straggler mode).
  bool hasDeadlines() const { return book_.settings().stragglerMode(); }

  const KvShard& shard() const { return shard_; }
  const ModelShard* model() const { return model_.get(); }
  ModelShard* model() { return model_.get(); }

 private:
  std::vector<Outgoing> handleGroup(Message& msg);
  Outgoing aggregate(KvShard::Completed&& done) const;
  Outgoing decision(const SfbKeeper::Decision& d) const;

  const InformationBook& book_;
  WorkCharger* charger_;
  KvShard shard_;
  std::unique_ptr<AdamServer> adam_;    // Adam baseline only
  std::unique_ptr<SfbKeeper> keeper_;   // straggler mode only
  std::unique_ptr<ModelShard> model_;   // compute-group mode only
};

}  // namespace poseidon
