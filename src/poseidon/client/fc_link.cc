#include "poseidon/client/fc_link.h"

#include <utility>

#include "poseidon/common/error.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

FcLink::FcLink(Van& van, int rank, int worldSize, bool isWorker, const StickyError& error,
               std::function<void(std::exception_ptr)> fail, std::function<void()> throwIfFailed,
               std::chrono::milliseconds waitTimeout)
    : van_(van),
      rank_(rank),
      isWorker_(isWorker),
      fail_(std::move(fail)),
      throwIfFailed_(std::move(throwIfFailed)),
      waitTimeout_(waitTimeout),
      channel_(error, worldSize) {}

std::vector<uint8_t> FcLink::exchange(int64_t round, std::vector<uint8_t> request) {
  if (!isWorker_) throw InvalidArgument(strCat("rank ", rank_, " is not a worker; it has no FC rounds"));
  throwIfFailed_();
  channel_.expectReply(round);
  if (rank_ == kFcServerRank) {
    channel_.deliverRequest({rank_, round, std::move(request)});  // a rank does not send to itself
  } else {
    van_.send(kFcServerRank, wire::fcForward(round), request.data(), request.size());
  }
  std::vector<uint8_t> reply;
  if (!channel_.waitReply(&reply, waitTimeout_)) {
    fail_(std::make_exception_ptr(TimeoutError(
        strCat("rank ", rank_, ": timed out after ", secondsText(waitTimeout_),
               " waiting for the FC server (rank ", kFcServerRank, ") to answer round ", round, "'s fc-forward"))));
    throwIfFailed_();
  }
  return reply;
}

bool FcLink::nextRequest(FcChannel::Request* out, std::chrono::milliseconds wait) {
  if (rank_ != kFcServerRank) throw InvalidArgument(strCat("rank ", rank_, " is not the FC server"));
  return channel_.nextRequest(out, wait);
}

void FcLink::sendReply(int dest, int64_t round, const std::vector<uint8_t>& reply) {
  if (dest == rank_) {
    channel_.deliverReply(round, reply);
  } else {
    van_.send(dest, wire::fcBackward(round), reply.data(), reply.size());
  }
}

void FcLink::onForward(Message& msg) {
  if (rank_ != kFcServerRank) throw ProtocolError(strCat("fc-forward to rank ", rank_, ", not the FC server"));
  FcChannel::Request r;
  r.from = static_cast<int>(msg.header.sender);
  r.round = msg.header.iteration;
  r.payload.assign(msg.data(), msg.data() + msg.size());
  channel_.deliverRequest(std::move(r));
}

void FcLink::onBackward(Message& msg) {
  if (msg.header.sender != kFcServerRank) {
    throw ProtocolError(strCat("fc-backward from rank ", msg.header.sender, ", not the FC server"));
  }
  channel_.deliverReply(msg.header.iteration, std::vector<uint8_t>(msg.data(), msg.data() + msg.size()));
}

}  // namespace poseidon
