#include "poseidon/coordinator/coordinator.h"

#include <map>
#include <random>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/common/ranks.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/transport/multipart.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

namespace {

void sendTo(zmq::socket_t& s, const std::string& identity, FrameHeader h, const std::vector<uint8_t>& payload) {
  h.payloadBytes = payload.size();
  zmq::message_t head(kHeaderBytes);
  encodeHeader(h, static_cast<uint8_t*>(head.data()));
  s.send(zmq::buffer(identity), zmq::send_flags::sndmore);
  s.send(head, zmq::send_flags::sndmore);
  s.send(zmq::buffer(payload), zmq::send_flags::none);
}

void sendError(zmq::socket_t& s, const std::string& identity, const std::string& why) {
  sendTo(s, identity, wire::joinError(), std::vector<uint8_t>(why.begin(), why.end()));
}

}  // namespace

Coordinator::Coordinator(zmq::context_t& ctx, const std::string& host, int port, int worldSize,
                         std::chrono::milliseconds timeout, const CurveKeys* curve, bool portChosen)
    : ctx_(ctx), address_(host + ":" + std::to_string(port)), worldSize_(worldSize), timeout_(timeout) {
  if (worldSize < 1) throw InvalidArgument(strCat("world size must be at least 1, got ", worldSize));
  socket_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
  socket_->set(zmq::sockopt::linger, 1000);
  socket_->set(zmq::sockopt::maxmsgsize, int64_t{256} << 20);
  if (curve) makeCurveServer(*socket_, *curve);
  try {
    socket_->bind("tcp://" + address_);
  } catch (const zmq::error_t& e) {
    const char* hint = e.num() != EADDRINUSE ? " (MASTER_ADDR must be an address of this machine)"
                       : portChosen ? " (the port is in use: another job or a leftover process holds it; is another "
                                      "rank of this job also rank 0? otherwise choose another MASTER_PORT)"
                                    : " (the port is in use: set MASTER_PORT or --master-port to a free port)";
    throw IoError(strCat("cannot start the coordinator on ", address_, ": ", e.what(), hint));
  }
  if (curve) monitor_ = std::make_unique<HandshakeMonitor>(ctx, *socket_, "coordinator " + address_);
  thread_ = std::thread([this] { run(); });
}

Coordinator::~Coordinator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  monitor_.reset();
}

void Coordinator::run() {
  struct Joined {
    std::string identity;
    JoinRequest req;
  };
  std::map<int, Joined> joined;
  std::string fatal;     // once set, every node gets this error
  bool started = false;  // book sent
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  zmq::socket_t& s = *socket_;

  auto failAll = [&](const std::string& why) {
    fatal = why;
    POSEIDON_LOG(kError) << "rendezvous failed: " << why;
    for (auto& [rank, j] : joined) sendError(s, j.identity, why);
  };

  while (!stop_) {
    zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor_ ? monitor_->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    zmq::pollitem_t& item = items[0];
    try {
      zmq::poll(items, monitor_ ? 2 : 1, std::chrono::milliseconds(100));
      if (monitor_ && (items[1].revents & ZMQ_POLLIN)) monitor_->onReadable();
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      POSEIDON_LOG(kError) << "coordinator poll failed: " << e.what();
      return;
    }
    if (!started && fatal.empty() && std::chrono::steady_clock::now() > deadline) {
      std::vector<int> missing;
      for (int r = 0; r < worldSize_; ++r)
        if (!joined.count(r)) missing.push_back(r);
      failAll(strCat("waited ", timeout_.count() / 1000.0, " s for rank", missing.size() > 1 ? "s " : " ",
                     formatRanks(missing), " to join coordinator at ", address_,
                     " (are they running, and do they use the same MASTER_ADDR/MASTER_PORT?)"));
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;

    std::vector<zmq::message_t> parts = recvMultipart(s, 4);
    if (parts.size() != 3) {
      POSEIDON_LOG(kWarning) << "coordinator: ignored malformed message with " << parts.size() << " frames";
      continue;
    }
    std::string identity = parts[0].to_string();
    FrameHeader h;
    std::string why = decodeHeader(parts[1].data(), parts[1].size(), 256u << 20, &h);
    if (why.empty() && h.type != MsgType::kJoin) why = strCat("unexpected ", msgTypeName(h.type), " on the coordinator port");
    if (why.empty() && h.payloadBytes != parts[2].size()) why = "payload length does not match its header";
    JoinRequest req;
    if (why.empty()) {
      try {
        req = decodeJoin(parts[2].data(), parts[2].size());
      } catch (const Error& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      POSEIDON_LOG(kWarning) << "coordinator: rejected join message: " << why;
      sendError(s, identity, "malformed join message: " + why);
      continue;
    }
    if (!fatal.empty()) {
      sendError(s, identity, fatal);
      continue;
    }
    if (started) {
      sendError(s, identity, strCat("rank ", req.rank, " tried to join coordinator at ", address_,
                                    " but the job already started"));
      continue;
    }
    if (req.worldSize != worldSize_) {
      joined[req.rank] = {identity, req};
      failAll(strCat("world size mismatch: rank ", req.rank, " was started with world size ", req.worldSize,
                     " but the coordinator (rank 0) has world size ", worldSize_));
      continue;
    }
    if (req.rank < 0 || req.rank >= worldSize_) {
      sendError(s, identity, strCat("rank ", req.rank, " is outside the world of ", worldSize_, " ranks"));
      continue;
    }
    if (joined.count(req.rank)) {
      sendError(s, identity, strCat("rank ", req.rank, " joined twice (two processes with the same RANK?)"));
      continue;
    }
    joined[req.rank] = {identity, req};
    POSEIDON_LOG(kDebug) << "coordinator: rank " << req.rank << " joined from " << req.endpoint;
    if (static_cast<int>(joined.size()) < worldSize_) continue;

    // Everyone is in: the model and the settings must agree.
    const JoinRequest& ref = joined.begin()->second.req;
    for (auto& [rank, j] : joined) {
      if (auto diff = ModelDesc::firstDifference(ref.model, j.req.model)) {
        failAll(strCat("model mismatch between rank ", ref.rank, " and rank ", rank, ": ", *diff));
        break;
      }
      if (!(j.req.settings == ref.settings)) {
        failAll(strCat("settings mismatch between rank ", ref.rank, " (", ref.settings.describe(), ") and rank ", rank,
                       " (", j.req.settings.describe(), ")"));
        break;
      }
    }
    if (!fatal.empty()) continue;
    std::vector<NodeInfo> nodes;
    for (auto& [rank, j] : joined) nodes.push_back({rank, j.req.role, j.req.endpoint});
    std::random_device rd;
    uint64_t job = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (job == 0) job = 1;
    try {
      InformationBook book(job, nodes, ref.model, ref.settings);
      ByteWriter w;
      book.write(w);
      for (auto& [rank, j] : joined) sendTo(s, j.identity, wire::book(job), w.bytes());
      started = true;
    } catch (const Error& e) {
      failAll(e.what());
    }
  }
}

}  // namespace poseidon
