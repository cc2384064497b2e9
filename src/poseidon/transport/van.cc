#include "poseidon/transport/van.h"

#include <atomic>
#include <cstring>

#include "poseidon/common/device_model.h"
#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/transport/multipart.h"
#include "poseidon/wire/messages.h"

// ThreadSanitizer cannot see the happens-before that libzmq's lock-free pipes
// give a message handed from one of our threads to another (libzmq is not
// instrumented). On the loopback both ends are our code, so state it: the
// sender releases and the receive loop acquires the van's loopback token.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define POSEIDON_HANDOVER_RELEASE(addr) __tsan_release(addr)
#define POSEIDON_HANDOVER_ACQUIRE(addr) __tsan_acquire(addr)
#else
#define POSEIDON_HANDOVER_RELEASE(addr) ((void)(addr))
#define POSEIDON_HANDOVER_ACQUIRE(addr) ((void)(addr))
#endif

namespace poseidon {
namespace {
std::atomic<uint64_t> gLoopbackId{0};
}  // namespace

void Van::rejected(const std::string& peer, const std::string& why) {
  uint64_t k = rejected_.fetch_add(1);
  if (k < 20 || k % 1000 == 0) {
    POSEIDON_LOG(kWarning) << "rejected frame from " << peer << ": " << why << " (" << k + 1 << " rejected so far)";
  }
}

Van::Van(zmq::context_t& ctx, const VanOptions& options)
    : ctx_(ctx),
      options_(options),
      router_(ctx, zmq::socket_type::router),
      loopIn_(ctx, zmq::socket_type::pull),
      loopOut_(ctx, zmq::socket_type::push) {
  router_.set(zmq::sockopt::rcvhwm, 0);
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options.maxPayloadBytes + kHeaderBytes));
  if (options.receiveBufferBytes < 0) {
    throw InvalidArgument(strCat("the receive buffer must be >= 0 bytes (0: the OS default), got ",
                                 options.receiveBufferBytes));
  }
  // Before bind: accepted connections inherit it, so it bounds each peer's window from the start.
  if (options.receiveBufferBytes > 0) router_.set(zmq::sockopt::rcvbuf, options.receiveBufferBytes);
  if (options.curve) makeCurveServer(router_, *options.curve);
  std::string want = "tcp://" + options.bindHost + ":" + (options.port ? std::to_string(options.port) : "*");
  try {
    router_.bind(want);
  } catch (const zmq::error_t& e) {
    throw IoError(strCat("cannot bind data endpoint ", want, ": ", e.what(),
                         e.num() == EADDRINUSE ? " (port in use: pick another port)" : ""));
  }
  endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  if (options.curve) monitor_ = std::make_unique<HandshakeMonitor>(ctx, router_, endpoint_);
  std::string loop = "inproc://poseidon-loop-" + std::to_string(gLoopbackId.fetch_add(1));
  loopIn_.set(zmq::sockopt::rcvhwm, 0);
  loopIn_.set(zmq::sockopt::linger, 0);
  loopIn_.bind(loop);
  loopOut_.set(zmq::sockopt::sndhwm, 0);
  loopOut_.set(zmq::sockopt::linger, 0);
  loopOut_.connect(loop);
}

Van::~Van() { close(); }

void Van::close() {
  if (closed_.exchange(true)) return;
  for (auto& p : peers_) {
    if (!p || !p->socket) continue;
    std::lock_guard<std::mutex> lock(p->mutex);
    p->socket->set(zmq::sockopt::linger, options_.lingerMs);
    p->socket->close();
  }
  std::lock_guard<std::mutex> lock(loopOutMutex_);
  loopOut_.close();
  loopIn_.close();
  if (monitor_) monitor_->stop();
  router_.close();
}

void Van::connectPeers(int selfRank, const std::vector<std::string>& endpoints, uint64_t job) {
  POSEIDON_ENFORCE(rank_ < 0, "connectPeers called twice");
  if (selfRank < 0 || selfRank >= static_cast<int>(endpoints.size())) {
    throw InvalidArgument(strCat("rank ", selfRank, " outside world of ", endpoints.size()));
  }
  rank_ = selfRank;
  job_ = job;
  peers_.clear();
  for (size_t r = 0; r < endpoints.size(); ++r) {
    auto peer = std::make_unique<Peer>();
    if (static_cast<int>(r) != selfRank) {
      peer->socket = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
      peer->socket->set(zmq::sockopt::sndhwm, 0);
      peer->socket->set(zmq::sockopt::linger, options_.lingerMs);
      // Messages queue until the TCP connection is up instead of being refused.
      peer->socket->set(zmq::sockopt::immediate, 0);
      if (options_.curve) makeCurveClient(*peer->socket, *options_.curve);
      try {
        peer->socket->connect(endpoints[r]);
      } catch (const zmq::error_t& e) {
        throw IoError(strCat("cannot connect to rank ", r, " at ", endpoints[r], ": ", e.what()));
      }
    }
    peers_.push_back(std::move(peer));
  }
}

TrafficKind Van::kindOf(MsgType type) {
  switch (type) {
    case MsgType::kPsPush:
    case MsgType::kPsAggregate:
    case MsgType::kGroupPush:
    case MsgType::kPull:
    case MsgType::kPullReply:
    case MsgType::kModelInit:
    case MsgType::kStateRequest:
    case MsgType::kStateReply: return TrafficKind::kPS;
    case MsgType::kSfbFactors:
    case MsgType::kSfbNotice:
    case MsgType::kSfbDecision: return TrafficKind::kSFB;
    case MsgType::kAdamFactors:
    case MsgType::kAdamAggregate: return TrafficKind::kAdam;
    default: return TrafficKind::kControl;
  }
}

void Van::send(int dest, FrameHeader header, const Part* partsBegin, size_t numParts) {
  const Part* partsEnd = partsBegin + numParts;
  if (dest < 0 || dest >= static_cast<int>(peers_.size())) {
    throw InvalidArgument(strCat("send to rank ", dest, " outside world of ", peers_.size()));
  }
  size_t total = 0;
  for (const Part* p = partsBegin; p != partsEnd; ++p) total += p->bytes;
  header.payloadBytes = total;
  header.sender = static_cast<uint32_t>(rank_);
  header.job = job_;
  zmq::message_t head(kHeaderBytes);
  encodeHeader(header, static_cast<uint8_t*>(head.data()));
  zmq::message_t body(total);
  size_t off = 0;
  for (const Part* p = partsBegin; p != partsEnd; ++p) {
    if (p->bytes) std::memcpy(static_cast<uint8_t*>(body.data()) + off, p->data, p->bytes);
    off += p->bytes;
  }
  try {
    if (dest == rank_) {
      std::lock_guard<std::mutex> lock(loopOutMutex_);
      if (closed_) throw IoError("transport closed");
      POSEIDON_HANDOVER_RELEASE(&loopOut_);
      loopOut_.send(head, zmq::send_flags::sndmore);
      loopOut_.send(body, zmq::send_flags::none);
      return;
    }
    if (options_.curve) chargeCrypto(static_cast<double>(kHeaderBytes + total));  // CURVE encrypts what leaves
    Peer& peer = *peers_[dest];
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (closed_) throw IoError("transport closed");
    peer.socket->send(head, zmq::send_flags::sndmore);
    peer.socket->send(body, zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    throw IoError(strCat("send of ", msgTypeName(header.type), " to rank ", dest, " failed: ", e.what()));
  }
  counters_.addSent(wire::trafficLayer(header), kindOf(header.type), kHeaderBytes + total);
}

bool Van::receiveFrom(zmq::socket_t& socket, bool loopback, Message* out) {
  // The whole multipart message, so that a malformed one is consumed whole.
  std::vector<zmq::message_t> parts = recvMultipart(socket, 8);
  if (parts.empty()) return false;
  if (loopback) POSEIDON_HANDOVER_ACQUIRE(&loopOut_);
  std::string peer = loopback ? "loopback" : "?";
  // The identity frame is made up by the ROUTER; the peer's address is
  // metadata of the frames that came over the wire.
  if (!loopback && parts.size() > 1) {
    try {
      if (const char* addr = parts[1].gets("Peer-Address")) peer = addr;
    } catch (const zmq::error_t&) {
    }
  }
  // ROUTER prepends the sender's identity frame.
  size_t first = loopback ? 0 : 1;
  std::string why;
  FrameHeader h;
  if (parts.size() != first + 2) {
    why = strCat("message with ", parts.size() - first, " frames (expected header + payload)");
  } else {
    why = decodeHeader(parts[first].data(), parts[first].size(), options_.maxPayloadBytes, &h);
    if (why.empty() && h.payloadBytes != parts[first + 1].size()) {
      why = strCat("header says ", h.payloadBytes, " payload bytes but the payload frame has ", parts[first + 1].size());
    }
    if (why.empty() && h.job != job_) why = strCat("frame for job ", std::hex, h.job, ", this job is ", job_);
    if (why.empty() && h.sender >= peers_.size()) {
      why = strCat("sender rank ", h.sender, " outside the world of ", peers_.size());
    }
  }
  if (!why.empty()) {
    rejected(peer, why);
    return false;
  }
  out->header = h;
  out->payload = std::move(parts[first + 1]);
  out->peer = std::move(peer);
  if (!loopback) {
    counters_.addReceived(wire::trafficLayer(h), kindOf(h.type), kHeaderBytes + h.payloadBytes);
    if (options_.curve) chargeCrypto(static_cast<double>(kHeaderBytes + h.payloadBytes));  // and decrypts it
  }
  return true;
}

bool Van::poll(Message* out, int timeoutMs) {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {loopIn_.handle(), 0, ZMQ_POLLIN, 0},
                             {monitor_ ? monitor_->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
  const int numItems = monitor_ ? 3 : 2;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    try {
      zmq::poll(items, numItems, left);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw IoError(strCat("poll failed: ", e.what()));
    }
    if (numItems == 3 && (items[2].revents & ZMQ_POLLIN)) monitor_->onReadable();
    // Loopback first: it carries this node's own contributions.
    if ((items[1].revents & ZMQ_POLLIN) && receiveFrom(loopIn_, true, out)) return true;
    if ((items[0].revents & ZMQ_POLLIN) && receiveFrom(router_, false, out)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

}  // namespace poseidon
