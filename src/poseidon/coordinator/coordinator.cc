#include "poseidon/coordinator/coordinator.h"

#include <cstdlib>
#include <map>
#include <random>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/common/ranks.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/transport/multipart.h"
#include "poseidon/transport/security.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

namespace {

// Whether this rank was started by that launcher (launch/env.h: POSEIDON_LAUNCHER).
bool launchedBy(const char* launcher) {
  const char* ours = std::getenv("POSEIDON_LAUNCHER");
  return ours && std::string(ours) == launcher;
}


void sendTo(zmq::socket_t& s, const std::string& identity, FrameHeader h, const std::vector<uint8_t>& payload) {
  h.payloadBytes = payload.size();
  zmq::message_t head(kHeaderBytes);
  encodeHeader(h, static_cast<uint8_t*>(head.data()));
  s.send(zmq::buffer(identity), zmq::send_flags::sndmore);
  s.send(head, zmq::send_flags::sndmore);
  s.send(zmq::buffer(payload), zmq::send_flags::none);
}

void sendError(zmq::socket_t& s, const std::string& identity, const std::string& why, bool timedOut = false) {
  sendTo(s, identity, wire::joinError(timedOut), std::vector<uint8_t>(why.begin(), why.end()));
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
                       : portChosen ? (launchedBy("poseidon launch")  // it set MASTER_PORT from its flag
                                           ? " (the port is in use: another job or a leftover process holds it; "
                                             "choose another --master-port, or leave it out for a free one)"
                                           : " (the port is in use: another job or a leftover process holds it; is "
                                             "another rank of this job also rank 0? otherwise choose another "
                                             "MASTER_PORT)")
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

namespace {

// "settings mismatch between rank 0 and rank 1: batch=16 vs 32" - only what differs (it listed all
// twelve settings of both).
std::string settingsMismatch(int a, const JobSettings& as, int b, const JobSettings& bs) {
  auto split = [](const std::string& text) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= text.size()) {
      const size_t end = std::min(text.find(' ', at), text.size());
      out.push_back(text.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  const std::vector<std::string> x = split(as.describe()), y = split(bs.describe());
  std::string diff;
  bool resumed = false;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (x[i] == y[i]) continue;
    diff += (diff.empty() ? "" : ", ") + x[i] + " vs " + y[i].substr(std::min(y[i].find('=') + 1, y[i].size()));
    resumed = resumed || x[i].rfind("start-iteration=", 0) == 0;
  }
  // Floats that differ past describe()'s six digits: both in full.
  if (diff.empty()) diff = strCat(as.describe(), " vs ", bs.describe());
  return strCat("settings mismatch between rank ", a, " and rank ", b, ": ", diff, " (every rank must pass the same",
                resumed ? "; they resumed different checkpoints: is another job writing the same checkpoint directory?"
                        : "",
                ")");
}

// The rendezvous' state on the coordinator's thread: who joined from where, and once something is
// fatal, the reason every rank gets.
class Rendezvous {
 public:
  Rendezvous(zmq::socket_t& socket, int worldSize, const std::string& address, std::chrono::milliseconds timeout)
      : s_(socket),
        worldSize_(worldSize),
        address_(address),
        timeout_(timeout),
        deadline_(std::chrono::steady_clock::now() + timeout) {}

  // After the timeout, names the ranks that never came.
  void checkDeadline() {
    if (started_ || !fatal_.empty() || std::chrono::steady_clock::now() <= deadline_) return;
    std::vector<int> missing;
    for (int r = 0; r < worldSize_; ++r)
      if (!joined_.count(r)) missing.push_back(r);
    const uint64_t refused = refusedNonMembers();
    failAll(strCat("waited ", timeout_.count() / 1000.0, " s for rank", missing.size() > 1 ? "s " : " ",
                   formatRanks(missing), " to join coordinator at ", address_,
                   refused > 0 ? strCat(" (", refused,
                                        " connections were refused for not holding this job's secret: do all ranks "
                                        "share POSEIDON_SECRET or POSEIDON_SECRET_FILE?)")
                               : " (are they running, and do they use the same MASTER_ADDR/MASTER_PORT?)"),
            /*timedOut=*/true);
  }

  // One message on the socket: a join (or something malformed, answered with its error).
  void onMessage() {
    std::vector<zmq::message_t> parts = recvMultipart(s_, 4);
    if (parts.size() != 3) {
      POSEIDON_LOG(kWarning) << "coordinator: ignored malformed message with " << parts.size() << " frames";
      return;
    }
    std::string identity = parts[0].to_string();
    JoinRequest req;
    std::string why = decodeJoinMessage(parts[1], parts[2], &req);
    if (!why.empty()) {
      POSEIDON_LOG(kWarning) << "coordinator: rejected join message: " << why;
      sendError(s_, identity, "malformed join message: " + why);
      return;
    }
    if (admit(identity, req) && static_cast<int>(joined_.size()) == worldSize_) start();
  }

 private:
  struct Joined {
    std::string identity;
    JoinRequest req;
  };

  static std::string decodeJoinMessage(const zmq::message_t& head, const zmq::message_t& payload, JoinRequest* req) {
    FrameHeader h;
    std::string why = decodeHeader(head.data(), head.size(), 256u << 20, &h);
    if (why.empty() && h.type != MsgType::kJoin)
      why = strCat("unexpected ", msgTypeName(h.type), " on the coordinator port");
    if (why.empty() && h.payloadBytes != payload.size()) why = "payload length does not match its header";
    if (!why.empty()) return why;
    try {
      *req = decodeJoin(payload.data(), payload.size());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  void failAll(const std::string& why, bool timedOut = false) {
    fatal_ = why;
    fatalTimedOut_ = timedOut;
    POSEIDON_LOG(kError) << "rendezvous failed: " << why;
    for (auto& [rank, j] : joined_) sendError(s_, j.identity, why, timedOut);
  }

  // Whether the rank is in; a refused one got its reason.
  bool admit(const std::string& identity, const JoinRequest& req) {
    if (!fatal_.empty()) {
      sendError(s_, identity, fatal_, fatalTimedOut_);
      return false;
    }
    if (started_) {
      sendError(s_, identity,
                strCat("rank ", req.rank, " tried to join coordinator at ", address_, " but the job already started"));
      return false;
    }
    if (req.worldSize != worldSize_) {
      joined_[req.rank] = {identity, req};
      failAll(strCat("world size mismatch: rank ", req.rank, " was started with world size ", req.worldSize,
                     " but the coordinator (rank 0) has world size ", worldSize_));
      return false;
    }
    if (req.rank < 0 || req.rank >= worldSize_) {
      sendError(s_, identity, strCat("rank ", req.rank, " is outside the world of ", worldSize_, " ranks"));
      return false;
    }
    if (joined_.count(req.rank)) {
      sendError(s_, identity, strCat("rank ", req.rank, " joined twice (two processes with the same RANK?)"));
      return false;
    }
    joined_[req.rank] = {identity, req};
    POSEIDON_LOG(kDebug) << "coordinator: rank " << req.rank << " joined from " << req.endpoint;
    return true;
  }

  // Everyone is in: the model and the settings must agree; then every rank gets the book.
  void start() {
    const JoinRequest& ref = joined_.begin()->second.req;
    for (auto& [rank, j] : joined_) {
      if (auto diff = ModelDesc::firstDifference(ref.model, j.req.model)) {
        failAll(strCat("model mismatch between rank ", ref.rank, " and rank ", rank, ": ", *diff));
        return;
      }
      if (!(j.req.settings == ref.settings)) {
        failAll(settingsMismatch(ref.rank, ref.settings, rank, j.req.settings));
        return;
      }
    }
    std::vector<NodeInfo> nodes;
    for (auto& [rank, j] : joined_) nodes.push_back({rank, j.req.role, j.req.endpoint});
    std::random_device rd;
    uint64_t job = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (job == 0) job = 1;
    try {
      InformationBook book(job, nodes, ref.model, ref.settings);
      ByteWriter w;
      book.write(w);
      for (auto& [rank, j] : joined_) sendTo(s_, j.identity, wire::book(job), w.bytes());
      started_ = true;
    } catch (const Error& e) {
      failAll(e.what());
    }
  }

  zmq::socket_t& s_;
  const int worldSize_;
  const std::string address_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::steady_clock::time_point deadline_;
  std::map<int, Joined> joined_;
  std::string fatal_;     // once set, every node gets this error
  bool fatalTimedOut_ = false;  // ... as a TimeoutError (the rendezvous ran out of time)
  bool started_ = false;  // book sent
};

}  // namespace

void Coordinator::run() {
  Rendezvous rendezvous(*socket_, worldSize_, address_, timeout_);
  while (!stop_) {
    zmq::pollitem_t items[] = {{socket_->handle(), 0, ZMQ_POLLIN, 0},
                               {monitor_ ? monitor_->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, monitor_ ? 2 : 1, std::chrono::milliseconds(100));
      if (monitor_ && (items[1].revents & ZMQ_POLLIN)) monitor_->onReadable();
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      POSEIDON_LOG(kError) << "coordinator poll failed: " << e.what();
      return;
    }
    rendezvous.checkDeadline();
    if (items[0].revents & ZMQ_POLLIN) rendezvous.onMessage();
  }
}

}  // namespace poseidon
