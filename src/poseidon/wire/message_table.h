// One entry per message type: what the runtime needs to know about a message, in one place. The
// frame's validation (a known type), its name in errors, who handles it (Node::route and the KV
// server), how the Van schedules and counts it, what liveness reads from it and what its
// `iteration` field means all come from here. A new message type is a MsgType number (frame.h), an
// entry here, its builder and payload codec (messages.h) and its handler.
#pragma once

#include <cstdint>

#include "poseidon/wire/frame.h"

namespace poseidon {

// What the traffic counters count a message's bytes under (transport/counters.h).
// kLocal: between the ranks of one machine (local aggregation, client/local_group.h), never on the
// network between machines.
enum class TrafficKind : int { kPS = 0, kSFB = 1, kControl = 2, kAdam = 3, kLocal = 4 };
constexpr int kTrafficKinds = 5;

namespace wire {

// Who handles a message where it arrives.
enum class Handler : uint8_t {
  kCoordinator,  // rank 0's coordinator endpoint (rendezvous)
  kJoiner,       // a joining node, answered by the coordinator
  kServer,       // the rank's KV server role (kvstore/server.h)
  kSyncer,       // the worker's Syncer of the message's layer (client/syncer.h)
  kPuller,       // the worker's compute-group client (client/group_client.h)
  kCollectives,  // broadcast and barrier (client/collectives.h)
  kFcServer,     // merged FC: the FC server's inbox (client/fc_link.h)
  kFcWorker,     // merged FC: the worker's reply slot (client/fc_link.h)
  kNode,         // the node itself: abort, heartbeats, goodbyes
  kLocal,        // local aggregation: the machine's leader or member side (client/local_group.h)
};

// How the Van's priority scheduler orders a message against others on one link
// (docs/scheduling.md).
enum class SendClass : uint8_t {
  kControl,  // ahead of everything
  kRound,    // a BSP round's data: by (iteration, layer), the next forward's first layer first
  kGroup,    // compute-group traffic: behind the rest, FIFO among itself
};

struct MessageInfo {
  MsgType type;
  const char* name;
  Handler handler;
  TrafficKind traffic;
  SendClass sendClass;
  bool layerTraffic;            // its `layer` field names a layer whose traffic counters count it
  bool reportsSenderIteration;  // its `iteration` is the sender's training iteration (liveness reads it)
  const char* iteration;        // what the `iteration` field holds ("" when nothing)
};

// The entry of a type, or nullptr for a number no build of this wire version knows.
const MessageInfo* findMessage(uint16_t type);
// The entry of a known type.
const MessageInfo& messageInfo(MsgType type);

}  // namespace wire
}  // namespace poseidon
