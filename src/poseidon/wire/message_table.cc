#include "poseidon/wire/message_table.h"

#include <array>

#include "poseidon/common/error.h"

namespace poseidon::wire {

namespace {

using H = Handler;
using S = SendClass;
using T = TrafficKind;
using M = MsgType;

// The header's fields per type are in messages.h's table; the payloads' codecs beside their builders.
constexpr MessageInfo kMessages[] = {
    // One row per message type, its columns aligned.
    // clang-format off
    // type             name              handler          traffic      send class   layer  liveness iteration
    {M::kJoin,          "join",           H::kCoordinator, T::kControl, S::kControl, false, false,   ""},
    {M::kBook,          "book",           H::kJoiner,      T::kControl, S::kControl, false, false,   ""},
    {M::kJoinError,     "join-error",     H::kJoiner,      T::kControl, S::kControl, false, false,   ""},
    {M::kPsPush,        "ps-push",        H::kServer,      T::kPS,      S::kRound,   true,  true,    "iteration"},
    {M::kPsAggregate,   "ps-aggregate",   H::kSyncer,      T::kPS,      S::kRound,   true,  false,   "iteration"},
    {M::kSfbFactors,    "sfb-factors",    H::kSyncer,      T::kSFB,     S::kRound,   true,  true,    "iteration"},
    {M::kAdamFactors,   "adam-factors",   H::kServer,      T::kAdam,    S::kRound,   true,  false,   "iteration"},
    {M::kAdamAggregate, "adam-aggregate", H::kSyncer,      T::kAdam,    S::kRound,   true,  false,   "iteration"},
    {M::kSfbNotice,     "sfb-notice",     H::kServer,      T::kSFB,     S::kRound,   true,  true,    "iteration"},
    {M::kSfbDecision,   "sfb-decision",   H::kSyncer,      T::kSFB,     S::kRound,   true,  false,   "iteration"},
    {M::kGroupPush,     "group-push",     H::kServer,      T::kPS,      S::kGroup,   true,  false,   "round"},
    {M::kPull,          "pull",           H::kServer,      T::kPS,      S::kGroup,   true,  false,   "round"},
    {M::kPullReply,     "pull-reply",     H::kPuller,      T::kPS,      S::kGroup,   true,  false,   "round"},
    {M::kModelInit,     "model-init",     H::kServer,      T::kPS,      S::kGroup,   true,  false,   "version"},
    {M::kStateRequest,  "state-request",  H::kServer,      T::kPS,      S::kGroup,   false, false,   ""},
    {M::kStateReply,    "state-reply",    H::kPuller,      T::kPS,      S::kGroup,   true,  false,   "version"},
    {M::kFcForward,     "fc-forward",     H::kFcServer,    T::kControl, S::kControl, false, false,   "round"},
    {M::kFcBackward,    "fc-backward",    H::kFcWorker,    T::kControl, S::kControl, false, false,   "round"},
    {M::kLocalPush,     "local-push",     H::kLocal,       T::kLocal,   S::kRound,   true,  true,    "iteration"},
    {M::kLocalResult,   "local-result",   H::kLocal,       T::kLocal,   S::kRound,   true,  false,   "iteration"},
    {M::kLocalFactors,  "local-factors",  H::kLocal,       T::kLocal,   S::kRound,   true,  false,   "iteration"},
    {M::kBroadcast,     "broadcast",      H::kCollectives, T::kControl, S::kControl, false, false,   "total floats"},
    {M::kBarrier,       "barrier",        H::kCollectives, T::kControl, S::kControl, false, false,   ""},
    {M::kHeartbeat,     "heartbeat",      H::kNode,        T::kControl, S::kControl, false, true,    "iteration"},
    {M::kAbort,         "abort",          H::kNode,        T::kControl, S::kControl, false, false,   "iteration"},
    {M::kBye,           "bye",            H::kNode,        T::kControl, S::kControl, false, false,   "iteration"},
    // clang-format on
};

}  // namespace

const MessageInfo* findMessage(uint16_t type) {
  for (const MessageInfo& m : kMessages)
    if (static_cast<uint16_t>(m.type) == type) return &m;
  return nullptr;
}

const MessageInfo& messageInfo(MsgType type) {
  const MessageInfo* m = findMessage(static_cast<uint16_t>(type));
  POSEIDON_ENFORCE(m != nullptr, strCat("message type ", static_cast<int>(type), " has no entry in the table"));
  return *m;
}

}  // namespace poseidon::wire
