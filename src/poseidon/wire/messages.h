// One builder per message type: the only place that knows what each header
// field means for each type (wire/frame.h has the layout). Senders build
// their headers here; receivers read type-specific fields through the
// readers below. The Van stamps `sender`, `job` and `payloadBytes`. Who handles each type, how it
// is scheduled and counted: wire/message_table.h.
//
//   type            layer             iteration           pair          aux
//   join            -                 -                   -             -      (sender: the joining rank)
//   book            -                 -                   -             -      (job: the new job id)
//   join-error      -                 -                   -             1: the rendezvous timed out
//   ps-push         layer             iteration           KV pair       gap (see psPush)
//   ps-aggregate    layer             iteration           KV pair       -
//   sfb-factors     layer             iteration           -             rows K
//   adam-factors    layer             iteration           -             rows K
//   adam-aggregate  layer             iteration           KV pair       -
//   sfb-notice      layer             iteration           -             -
//   sfb-decision    layer             iteration           -             -
//   group-push      layer             group's round       KV pair       -      (floats, then the lr as f32)
//   pull            layer             group's round       KV pair       -
//   pull-reply      layer             group's round       KV pair       -      (floats, then the version as i64)
//   model-init      layer             version             KV pair       -      (W, V, then a clock per group as i64)
//   state-request   -                 -                   -             -
//   state-reply     layer             version             KV pair       -      (as model-init)
//   local-push      layer             iteration           chunk         rows (0: a dense gradient)
//   local-result    layer             iteration           chunk         -
//   local-factors   layer             iteration           chunk         rows (all workers' together)
//   broadcast       sequence number   total floats        chunk index   chunk count
//   barrier         sequence number   finish: iterations  -             1: a worker's finish
//   heartbeat/abort/bye -             sender's iteration  -             -
#pragma once

#include <cstddef>
#include <cstdint>

#include "poseidon/wire/frame.h"

namespace poseidon {

// Floats travel as IEEE-754 binary32 in the machine's byte order.
constexpr size_t kFloatBytes = sizeof(float);
static_assert(kFloatBytes == 4, "the wire format assumes 32-bit floats");

namespace wire {

// Rendezvous (coordinator endpoint).
FrameHeader join(int rank);
FrameHeader book(uint64_t job);
FrameHeader joinError(bool timedOut = false);  // aux 1: the rendezvous timed out (TimeoutError)
bool joinTimedOut(const FrameHeader& h);

// Parameter server. `gap`: iterations since the sender's previous PS round of
// this layer (1 when the layer went by PS every step; more when the rounds in
// between went by SFB; 0 when unknown), so a shard knows a push that comes
// after a stretch of SFB rounds is the pair's next round, not a stray one.
FrameHeader psPush(int layer, int64_t iteration, int pair, int64_t gap = 0);
int64_t psGap(const FrameHeader& h);
FrameHeader psAggregate(int layer, int64_t iteration, int pair);
// Sufficient factors: U (rows x M) then V (rows x N) in the payload.
FrameHeader sfbFactors(int layer, int64_t iteration, int64_t rows);
FrameHeader adamFactors(int layer, int64_t iteration, int64_t rows);
FrameHeader adamAggregate(int layer, int64_t iteration, int pair);
// Straggler mode's agreement on an SFB round's contributors.
FrameHeader sfbNotice(int layer, int64_t iteration);
FrameHeader sfbDecision(int layer, int64_t iteration);

// Compute-group mode (kvstore/model_shard.h).
FrameHeader groupPush(int layer, int64_t round, int pair);
FrameHeader pull(int layer, int64_t round, int pair);
FrameHeader pullReply(int layer, int64_t round, int pair);
FrameHeader modelInit(int layer, int pair, int64_t version);
FrameHeader stateRequest();
FrameHeader stateReply(int layer, int pair, int64_t version);

// Local aggregation (client/local_group.h): a member's contribution to its leader, chunked like
// KV pairs (JobSettings::pairBytes each); rows > 0: factors U then V of that many rows, 0: dense.
FrameHeader localPush(int layer, int64_t iteration, int chunk, int64_t rows);
FrameHeader localResult(int layer, int64_t iteration, int chunk);
// SFB: every worker's factors as the leader's Syncer gathered them, stacked: U (rows x M) then V.
FrameHeader localFactors(int layer, int64_t iteration, int chunk, int64_t rows);

// Merged FC: iteration = the worker's round.
FrameHeader fcForward(int64_t round);
FrameHeader fcBackward(int64_t round);

// Collectives. `sequence` numbers the collective calls of a job (every rank
// makes them in the same order), so chunks of different calls never mix.
struct BroadcastChunk {
  uint32_t sequence = 0;
  int64_t totalFloats = 0;  // of the whole broadcast buffer
  uint32_t index = 0;       // this chunk
  uint32_t count = 0;       // chunks in the broadcast
};
FrameHeader broadcastChunk(const BroadcastChunk& chunk);
BroadcastChunk broadcastChunkOf(const FrameHeader& h);
// finishedAt >= 0: the barrier of a worker's finish(), which has begun its iterations up to
// finishedAt - 1 and will begin no more (Node::finish: BSP workers must all run the same ones).
FrameHeader barrier(uint32_t sequence, int64_t finishedAt = -1);
uint32_t collectiveSequence(const FrameHeader& h);  // broadcast or barrier
int64_t barrierFinishedAt(const FrameHeader& h);    // -1 unless a worker's finish barrier

// Control: each carries the sender's current iteration (liveness reports it).
FrameHeader heartbeat(int64_t iteration);
FrameHeader abort(int64_t iteration);
FrameHeader bye(int64_t iteration);

// Readers of type-specific fields.
int64_t factorRows(const FrameHeader& h);  // sfb-factors, adam-factors, local-push, local-factors
// Whether the message carries a BSP round's data (PS, SFB, Adam, straggler
// notices): those have a layer and an iteration, and only their order within
// one layer matters (the Van's priority scheduling relies on it).
bool isRoundData(MsgType type);
// The layer whose traffic counters a message counts under, or -1 for
// messages that belong to no layer (rendezvous, collectives, control).
int trafficLayer(const FrameHeader& h);
// Whether `iteration` is the sender's training iteration at send time (data
// and heartbeats), which liveness reports as the peer's last known one.
bool reportsSenderIteration(MsgType type);

}  // namespace wire
}  // namespace poseidon
