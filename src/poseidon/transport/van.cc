#include "poseidon/transport/van.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/common/log.h"
#include "poseidon/transport/multipart.h"
#include "poseidon/wire/message_table.h"
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

std::string Van::bindHostError(const std::string& host) {
  zmq::context_t ctx(1);
  zmq::socket_t probe(ctx, zmq::socket_type::router);
  probe.set(zmq::sockopt::linger, 0);
  try {
    probe.bind("tcp://" + host + ":*");
  } catch (const zmq::error_t& e) {
    return e.what();
  }
  return "";
}

Van::Van(zmq::context_t& ctx, const VanOptions& given)
    : ctx_(ctx),
      options_(given),
      router_(ctx, zmq::socket_type::router),
      loopIn_(ctx, zmq::socket_type::pull),
      loopOut_(ctx, zmq::socket_type::push) {
  if (given.sendWindowBytes < VanOptions::kAutoSendWindow ||
      (given.sendWindowBytes > 0 && given.sendWindowBytes < kMinSendWindow)) {
    throw InvalidArgument(strCat("the send window must be 0 (FIFO links), ", VanOptions::kAutoSendWindow,
                                 " (the runtime's default) or at least ", kMinSendWindow,
                                 " bytes (smaller ones cut messages into too many fragments), got ",
                                 given.sendWindowBytes));
  }
  options_.sendWindowBytes = sendWindowFor(given);
  autoSendWindow_ = given.sendWindowBytes == VanOptions::kAutoSendWindow;
  const VanOptions& options = options_;  // the window resolved
  router_.set(zmq::sockopt::rcvhwm, 0);
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options.maxPayloadBytes + kHeaderBytes));
  if (options.receiveBufferBytes < VanOptions::kOsReceiveBuffer) {
    throw InvalidArgument(strCat("the receive buffer must be >= -1 bytes (0: automatic, -1: the OS default), got ",
                                 options.receiveBufferBytes));
  }
  if (options.peersPerSendWindow < 0) {
    throw InvalidArgument(strCat("the peers per send window must be >= 0 (0: one window per connection), got ",
                                 options.peersPerSendWindow));
  }
  if (options.urgentLayers < VanOptions::kAutoUrgentLayers) {
    throw InvalidArgument(strCat("urgent layers must be >= 0 (or ", VanOptions::kAutoUrgentLayers, ": automatic), got ",
                                 options.urgentLayers));
  }
  if (options.urgentLayers > 0 && options.sendWindowBytes == 0) {
    throw InvalidArgument(
        strCat("urgent layers (", options.urgentLayers, ") need priority links: a send window, not FIFO links"));
  }
  // Before bind: accepted connections inherit it, so it bounds each peer's window from the start.
  if (const int rcvbuf = kernelReceiveBuffer(options); rcvbuf > 0) router_.set(zmq::sockopt::rcvbuf, rcvbuf);
  // Before bind, too: with urgent connections possible, every connection accepted here marks what it
  // sends - its ACKs, since a van sends nothing on the ROUTER - low-delay like the urgent data. A host
  // or switch queue that serves that mark first would otherwise hold an urgent connection's ACKs
  // behind the bulk bytes toward its sender, and its small window would stall on them (with every
  // conv layer urgent and two-band queues at 16 nodes: 25-33 TCP timeouts a run, 1.21x the bound).
  if (options.sendWindowBytes > 0 && options.urgentLayers != 0) router_.set(zmq::sockopt::tos, kUrgentTos);
  if (options.curve) makeCurveServer(router_, *options.curve);
  const std::string want = "tcp://" + options.bindHost + ":" + (options.port ? std::to_string(options.port) : "*");
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

void Van::close(const std::vector<bool>& quiet) {
  if (crypto_) crypto_->stop();  // hands over what is being encrypted (sendNow refuses once closed_ is set)
  if (closed_.exchange(true)) return;
  int linger = options_.lingerMs;
  if (scheduler_) {
    // The sender hands over what is queued, then the sockets linger for what is left of lingerMs
    // (a queue to a dead peer never empties: lingerMs in all, as with FIFO links).
    const auto stopBy = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, linger));
    scheduler_->stop(stopBy);
    linger = static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(stopBy - std::chrono::steady_clock::now()).count()));
  }
  for (size_t r = 0; r < peers_.size(); ++r) {
    auto& p = peers_[r];
    if (!p || !p->socket) continue;
    std::lock_guard<std::mutex> lock(p->mutex);
    p->socket->set(zmq::sockopt::linger, r < quiet.size() && quiet[r] ? 0 : linger);
    p->socket->close();
    if (p->urgent) {
      p->urgent->set(zmq::sockopt::linger, r < quiet.size() && quiet[r] ? 0 : linger);
      p->urgent->close();
    }
  }
  std::lock_guard<std::mutex> lock(loopOutMutex_);
  loopOut_.close();
  loopIn_.close();
  if (monitor_) monitor_->stop();
  router_.close();
}

int Van::kernelSendWindow(const VanOptions& options, size_t peers) {
  const int window = sendWindowFor(options);
  if (window <= 0) return 0;
  if (options.peersPerSendWindow <= 0 || peers <= static_cast<size_t>(options.peersPerSendWindow)) return window;
  const int64_t grown = int64_t{window} * static_cast<int64_t>(peers) / int64_t{options.peersPerSendWindow};
  return static_cast<int>(std::min<int64_t>(grown, std::numeric_limits<int>::max()));
}

namespace {
// A node holds about three descriptors per connection: the DEALER's TCP socket and its mailbox, and
// the peer's connection accepted on the ROUTER. With the urgent connections (two per peer) 256 nodes
// need ~1,600, past the soft limit of 1,024 that many systems start processes with. Raise the soft
// limit toward the hard one, as Go's runtime does at start-up, and say so once if even that is short:
// libzmq meets EMFILE on a later connect or accept, far from this cause.
void ensureDescriptors(size_t connections) {
  const uint64_t needed = 3 * connections + 64;
  const uint64_t limit = raiseDescriptorLimit(needed);
  if (limit < needed) {
    POSEIDON_LOG(kWarning) << "this node's " << connections << " connections need about " << needed
                           << " file descriptors and the limit is " << limit << " (hard " << hardDescriptorLimit()
                           << "): raise it (ulimit -n) or expect 'Too many open files'";
  }
}
}  // namespace

int Van::defaultSendWindow(size_t peers, bool lowDelayFirst, int rule) {
  if (rule >= 2 && lowDelayFirst && peers > static_cast<size_t>(kReceiveManyPeers)) return kTwoBandSendWindow;
  return kDefaultSendWindow;
}

int Van::sendWindowFor(const VanOptions& options) {
  if (options.sendWindowBytes != VanOptions::kAutoSendWindow) return options.sendWindowBytes;
  return defaultSendWindow(static_cast<size_t>(std::max(0, options.worldSize - 1)),
                           options.egressQueue == EgressQueue::kTos);
}

int Van::urgentLayerCount(const VanOptions& options, size_t peers, bool lowDelayFirst, int belowFcBulk) {
  if (options.urgentLayers != VanOptions::kAutoUrgentLayers) return std::max(0, options.urgentLayers);
  if (sendWindowFor(options) <= 0 || peers <= static_cast<size_t>(VanOptions::kAutoUrgentPeers)) return 0;
  const bool belowFc = lowDelayFirst && belowFcBulk > 0 && peers > static_cast<size_t>(VanOptions::kAutoBelowFcPeers);
  return belowFc ? belowFcBulk : VanOptions::kAutoUrgentLayerCount;
}

namespace {
// "10.0.0.2" of "tcp://10.0.0.2:5555" ("::1" of "tcp://[::1]:5555").
std::string endpointHost(const std::string& endpoint) {
  std::string host = endpoint.substr(endpoint.rfind('/') + 1);
  host = host.substr(0, host.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}
}  // namespace

int Van::kernelReceiveBuffer(const VanOptions& options) {
  if (options.receiveBufferBytes != 0) return std::max(0, options.receiveBufferBytes);
  const int64_t window = sendWindowFor(options);
  if (window <= 0) return 0;
  if (options.worldSize - 1 > kReceiveManyPeers)
    return static_cast<int>(window * kManyPeersReceivePerSendWindowNum / kManyPeersReceivePerSendWindowDen);
  return static_cast<int>(window * kReceivePerSendWindowNum / kReceivePerSendWindowDen);
}

void Van::connectPeers(int selfRank, const std::vector<std::string>& endpoints, uint64_t job, const ModelDesc* model) {
  POSEIDON_ENFORCE(rank_ < 0, "connectPeers called twice");
  if (selfRank < 0 || selfRank >= static_cast<int>(endpoints.size())) {
    throw InvalidArgument(strCat("rank ", selfRank, " outside world of ", endpoints.size()));
  }
  rank_ = selfRank;
  job_ = job;
  peers_.clear();
  const int kernelWindow = kernelSendWindow(options_, endpoints.size() - 1);
  const size_t peers = endpoints.size() - 1;
  const int belowFcBulk = model ? model->layersBelowFcBulk() : 0;
  // Only a queue the node is told is two-band takes the layers below the FC stack (VanOptions::
  // egressQueue). Where that choice would change the count, auto reads the queue for the log: the user
  // learns what it is and that --host-queue tos would take them.
  const bool lowDelayFirst = options_.egressQueue == EgressQueue::kTos;
  const bool choice = belowFcBulk > 0 && urgentLayerCount(options_, peers, false, belowFcBulk) !=
                                             urgentLayerCount(options_, peers, true, belowFcBulk);
  if (options_.egressQueue == EgressQueue::kAuto && choice) {
    egressProbe_ = probeEgressQueue(endpointHost(endpoints[(static_cast<size_t>(selfRank) + 1) % endpoints.size()]));
  }
  urgentLayers_ = urgentLayerCount(options_, peers, lowDelayFirst, belowFcBulk);
  if (options_.urgentLayers == VanOptions::kAutoUrgentLayers && urgentLayers_ > 0) {
    const EgressProbe& p = egressProbe_;
    const std::string queue = lowDelayFirst       ? std::string("told the egress queue is two-band (--host-queue tos)")
                              : !p.error.empty()  ? strCat("the egress queue could not be read (", p.error, ")")
                              : !p.device.empty() ? strCat(p.device, "'s egress queue is ", p.qdisc,
                                                           p.lowDelayFirst ? ", which serves TOS low-delay first" : "")
                                                  : std::string("the egress queue taken as taking turns");
    const std::string line =
        strCat("rank ", selfRank, ": ", urgentLayers_, " urgent layers on a second connection per peer; ", queue,
               urgentLayers_ == belowFcBulk && lowDelayFirst ? ": every layer below the FC stack"
               : choice && !lowDelayFirst
                   ? strCat(" (--host-queue tos would take the ", belowFcBulk,
                            " layers below the FC stack: faster on strict two-band queues in the bench; "
                            "unmeasured on a NIC's own pfifo_fast, docs/scheduling.md)")
                   : "");
    if (selfRank == 0) {
      POSEIDON_LOG(kInfo) << line;
    } else {
      POSEIDON_LOG(kDebug) << line;
    }
  }
  if (autoSendWindow_ && selfRank == 0) {
    POSEIDON_LOG(kInfo) << "rank 0: send window " << options_.sendWindowBytes << " bytes, the runtime's default for "
                        << peers << " peers"
                        << (lowDelayFirst ? " told the egress queue is two-band (--host-queue tos)" : "");
  }
  ensureDescriptors(peers * (urgentLayers_ > 0 ? 2 : 1));
  auto dealer = [&](size_t r, int tos) {
    auto socket = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    // FIFO: unlimited. Priority: one message in the pipe and the window in the kernel, so the
    // queue above (which reorders) keeps the rest.
    socket->set(zmq::sockopt::sndhwm, options_.sendWindowBytes > 0 ? 1 : 0);
    if (kernelWindow > 0) socket->set(zmq::sockopt::sndbuf, kernelWindow);
    socket->set(zmq::sockopt::linger, options_.lingerMs);
    // Messages queue until the TCP connection is up instead of being refused.
    socket->set(zmq::sockopt::immediate, 0);
    if (tos != 0) socket->set(zmq::sockopt::tos, tos);
    if (options_.curve) makeCurveClient(*socket, *options_.curve);
    try {
      socket->connect(endpoints[r]);
    } catch (const zmq::error_t& e) {
      throw IoError(strCat("cannot connect to rank ", r, " at ", endpoints[r], ": ", e.what()));
    }
    return socket;
  };
  for (size_t r = 0; r < endpoints.size(); ++r) {
    auto peer = std::make_unique<Peer>();
    if (static_cast<int>(r) != selfRank) {
      peer->socket = dealer(r, 0);
      if (urgentLayers_ > 0) peer->urgent = dealer(r, kUrgentTos);
    }
    peers_.push_back(std::move(peer));
  }
  if (options_.sendWindowBytes > 0) {
    std::vector<zmq::socket_t*> links;
    for (auto& p : peers_) links.push_back(p->socket.get());
    // The urgent connections are links P..2P-1 (isUrgent()).
    if (urgentLayers_ > 0)
      for (auto& p : peers_) links.push_back(p->urgent.get());
    scheduler_ = std::make_unique<PriorityScheduler>(ctx_, std::move(links),
                                                     static_cast<size_t>(options_.sendWindowBytes), peers_.size());
  }
  if (options_.curve && options_.charger && options_.charger->chargesCrypto()) {
    crypto_ = std::make_unique<ChargedCrypto>(
        *options_.charger, [this](int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body) {
          sendNow(dest, header, std::move(head), std::move(body));
        });
  }
}

int Van::sendBufferBytes(int rank) {
  POSEIDON_ENFORCE(rank >= 0 && rank < static_cast<int>(peers_.size()) && peers_[rank]->socket,
                   "no connection to rank ", rank);
  std::lock_guard<std::mutex> lock(peers_[rank]->mutex);
  return peers_[rank]->socket->get(zmq::sockopt::sndbuf);
}

size_t Van::queuedMessages() { return scheduler_ ? scheduler_->queued() : 0; }

bool Van::waitQueuedAtMost(size_t n, std::chrono::milliseconds timeout) {
  return scheduler_ ? scheduler_->waitQueuedAtMost(n, timeout) : true;
}

void Van::holdSends(bool hold, size_t letThrough) {
  if (scheduler_) scheduler_->hold(hold, letThrough);
}

bool Van::isUrgent(const FrameHeader& header) const {
  // All of a layer's round data or none of it, so that the layer's messages stay in order (one
  // connection); the BSP protocol never orders messages of different layers (docs/scheduling.md).
  return urgentLayers_ > 0 && wire::messageInfo(header.type).sendClass == wire::SendClass::kRound &&
         header.layer < static_cast<uint32_t>(urgentLayers_);
}

TrafficKind Van::kindOf(MsgType type) { return wire::messageInfo(type).traffic; }

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
  } catch (const zmq::error_t& e) {
    throw IoError(strCat("send of ", msgTypeName(header.type), " to rank ", dest, " failed: ", e.what()));
  }
  if (crypto_) {
    // CURVE encrypts what leaves on the I/O thread of this outbound connection; the bytes reach the
    // link when it is done, and the caller goes on meanwhile.
    if (closed_) throw IoError("transport closed");
    crypto_->encrypt(dest, header, std::move(head), std::move(body));
    return;
  }
  sendNow(dest, header, std::move(head), std::move(body));
}

void Van::sendNow(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body) {
  const size_t total = body.size();
  try {
    if (scheduler_) {
      if (closed_) throw IoError("transport closed");
      const bool urgent = isUrgent(header);
      if (urgent) urgentBytesSent_.fetch_add(kHeaderBytes + total, std::memory_order_relaxed);
      scheduler_->enqueue(urgent ? dest + static_cast<int>(peers_.size()) : dest, header, std::move(head),
                          std::move(body));
      counters_.addSent(wire::trafficLayer(header), kindOf(header.type), kHeaderBytes + total);
      counters_.addDataSentTo(dest, kindOf(header.type), kHeaderBytes + total);
      return;
    }
    Peer& peer = *peers_[dest];
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (closed_) throw IoError("transport closed");
    peer.socket->send(head, zmq::send_flags::sndmore);
    peer.socket->send(body, zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    throw IoError(strCat("send of ", msgTypeName(header.type), " to rank ", dest, " failed: ", e.what()));
  }
  counters_.addSent(wire::trafficLayer(header), kindOf(header.type), kHeaderBytes + total);
  counters_.addDataSentTo(dest, kindOf(header.type), kHeaderBytes + total);
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
  // ROUTER prepends the sender's identity frame. Two frames: a whole message; three: a fragment.
  size_t first = loopback ? 0 : 1;
  std::string why;
  FrameHeader h;
  const bool fragment = !loopback && parts.size() == first + 3;
  if (parts.size() != first + 2 && !fragment) {
    why = strCat("message with ", parts.size() - first, " frames (expected header + payload [+ fragment])");
  } else {
    why = decodeHeader(parts[first].data(), parts[first].size(), options_.maxPayloadBytes, &h);
    if (why.empty() && !fragment && h.payloadBytes != parts[first + 1].size()) {
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
  if (fragment) return addFragment(h, parts[first + 1], parts[first + 2], peer, out);
  out->header = h;
  out->payload = std::move(parts[first + 1]);
  out->peer = std::move(peer);
  if (!loopback) {
    counters_.addReceived(wire::trafficLayer(h), kindOf(h.type), kHeaderBytes + h.payloadBytes);
    return decrypted(out);
  }
  return true;
}

void Van::admitArrivals() {
  if (!crypto_) return;
  // Every message already here goes to its I/O thread now: its decryption starts when it arrives,
  // not when the loop (busy with a message before it) gets to read it. Bounded, so that a flood
  // cannot keep the loop from delivering.
  zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
  for (int i = 0; i < 256; ++i) {
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(0));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw IoError(strCat("poll failed: ", e.what()));
    }
    if (!(item.revents & ZMQ_POLLIN)) return;
    Message m;
    receiveFrom(router_, false, &m);  // a valid whole message goes to crypto_ (decrypted())
  }
}

bool Van::decrypted(Message* out) {
  if (!crypto_) return true;
  // CURVE decrypts it on the I/O thread of this inbound connection.
  crypto_->decrypt(std::move(*out));
  return false;
}

bool Van::addFragment(const FrameHeader& h, zmq::message_t& chunk, const zmq::message_t& where, const std::string& peer,
                      Message* out) {
  std::string why;
  zmq::message_t payload;
  if (!reassembler_.add(h, chunk, where, &payload, &why)) {
    if (!why.empty()) rejected(peer, why);
    return false;
  }
  out->header = h;
  out->payload = std::move(payload);
  out->peer = peer;
  counters_.addReceived(wire::trafficLayer(h), kindOf(h.type), kHeaderBytes + h.payloadBytes);
  return decrypted(out);
}

bool Van::poll(Message* out, int timeoutMs) {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {loopIn_.handle(), 0, ZMQ_POLLIN, 0},
                             {monitor_ ? monitor_->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
  const int numItems = monitor_ ? 3 : 2;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    admitArrivals();
    auto now = std::chrono::steady_clock::now(), until = deadline;
    auto at = std::chrono::steady_clock::time_point::max();
    if (crypto_ && crypto_->takeDecrypted(now, out, &at)) return true;  // charged decryption: the first one done
    if (at != std::chrono::steady_clock::time_point::max()) {
      if (at - now < std::chrono::milliseconds(1)) {  // below zmq_poll's resolution
        std::this_thread::sleep_until(at);
        continue;
      }
      until = std::min(until, at);
    }
    // To the deadline rounded up (a 0 ms poll in its last fraction of a millisecond would spin); to a
    // decryption's end rounded down (at least 1 ms here; the rest is the sleep above).
    auto left = until == deadline ? std::chrono::ceil<std::chrono::milliseconds>(until - now)
                                  : std::chrono::floor<std::chrono::milliseconds>(until - now);
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
