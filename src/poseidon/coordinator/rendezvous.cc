#include "poseidon/coordinator/rendezvous.h"

#include <map>
#include <random>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/transport/multipart.h"
#include "poseidon/wire/frame.h"

namespace poseidon {

std::vector<uint8_t> encodeJoin(const JoinRequest& req) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(req.rank));
  w.u32(static_cast<uint32_t>(req.worldSize));
  w.u8(static_cast<uint8_t>(req.role));
  w.str(req.endpoint);
  w.u64(req.model.hash());
  writeModel(w, req.model);
  writeSettings(w, req.settings);
  return w.take();
}

JoinRequest decodeJoin(const void* data, size_t size) {
  ByteReader r(data, size);
  JoinRequest req;
  req.rank = static_cast<int>(r.u32());
  req.worldSize = static_cast<int>(r.u32());
  uint8_t role = r.u8();
  if (role < 1 || role > 3) throw ProtocolError(strCat("unknown role ", int(role)));
  req.role = static_cast<Role>(role);
  req.endpoint = r.str(1024);
  uint64_t hash = r.u64();
  req.model = readModel(r);
  req.settings = readSettings(r);
  r.expectEnd();
  if (req.model.hash() != hash) throw ProtocolError("model hash does not match the model description");
  if (req.worldSize < 1) throw ProtocolError(strCat("world size ", req.worldSize));
  return req;
}

std::string formatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i + 1) out += "-" + std::to_string(ranks[j]);
    else if (j == i + 1) out += "," + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {

void sendTo(zmq::socket_t& s, const std::string& identity, MsgType type, uint64_t job, const std::vector<uint8_t>& payload) {
  FrameHeader h;
  h.type = type;
  h.job = job;
  h.payloadBytes = payload.size();
  zmq::message_t head(kHeaderBytes);
  encodeHeader(h, static_cast<uint8_t*>(head.data()));
  s.send(zmq::buffer(identity), zmq::send_flags::sndmore);
  s.send(head, zmq::send_flags::sndmore);
  s.send(zmq::buffer(payload), zmq::send_flags::none);
}

void sendError(zmq::socket_t& s, const std::string& identity, const std::string& why) {
  sendTo(s, identity, MsgType::kJoinError, 0, std::vector<uint8_t>(why.begin(), why.end()));
}

}  // namespace

Coordinator::Coordinator(zmq::context_t& ctx, const std::string& host, int port, int worldSize,
                         std::chrono::milliseconds timeout, const CurveKeys* curve)
    : ctx_(ctx), address_(host + ":" + std::to_string(port)), worldSize_(worldSize), timeout_(timeout) {
  if (worldSize < 1) throw InvalidArgument(strCat("world size must be at least 1, got ", worldSize));
  socket_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
  socket_->set(zmq::sockopt::linger, 1000);
  socket_->set(zmq::sockopt::maxmsgsize, int64_t{256} << 20);
  if (curve) makeCurveServer(*socket_, *curve);
  try {
    socket_->bind("tcp://" + address_);
  } catch (const zmq::error_t& e) {
    throw IoError(strCat("cannot start the coordinator on ", address_, ": ", e.what(),
                         e.num() == EADDRINUSE ? " (the port is in use: set MASTER_PORT or --master-port to a free port)"
                                               : " (MASTER_ADDR must be an address of this machine)"));
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
      for (auto& [rank, j] : joined) sendTo(s, j.identity, MsgType::kBook, job, w.bytes());
      started = true;
    } catch (const Error& e) {
      failAll(e.what());
    }
  }
}

InformationBook joinJob(zmq::context_t& ctx, const RendezvousOptions& opts, const JoinRequest& req) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  if (opts.curve) makeCurveClient(s, *opts.curve);
  std::string address = opts.masterAddr + ":" + std::to_string(opts.masterPort);
  try {
    s.connect("tcp://" + address);
  } catch (const zmq::error_t& e) {
    throw IoError(strCat("cannot connect to coordinator at ", address, ": ", e.what()));
  }
  std::vector<uint8_t> payload = encodeJoin(req);
  FrameHeader h;
  h.type = MsgType::kJoin;
  h.sender = static_cast<uint32_t>(req.rank);
  h.payloadBytes = payload.size();
  zmq::message_t head(kHeaderBytes);
  encodeHeader(h, static_cast<uint8_t*>(head.data()));
  s.send(head, zmq::send_flags::sndmore);
  s.send(zmq::buffer(payload), zmq::send_flags::none);

  // Wait longer than the coordinator's own timeout so that, when a rank is
  // missing, we get its detailed error rather than our own; but not much
  // longer, so a dead coordinator is reported within 2x the timeout.
  auto wait = opts.timeout + opts.timeout / 2;
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw TimeoutError(strCat("rank ", req.rank, ": no answer from the coordinator at ", address, " within ",
                                wait.count() / 1000.0,
                                " s (is rank 0 running and reachable at that address, with the same job secret?)"));
    }
    try {
      zmq::poll(&item, 1, left);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw IoError(strCat("poll failed: ", e.what()));
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> parts = recvMultipart(s, 3);
    FrameHeader rh;
    if (parts.size() != 2 || !decodeHeader(parts[0].data(), parts[0].size(), 256u << 20, &rh).empty() ||
        rh.payloadBytes != parts[1].size()) {
      POSEIDON_LOG(kWarning) << "ignored a malformed reply from the coordinator";
      continue;
    }
    if (rh.type == MsgType::kJoinError) throw Error(parts[1].to_string());
    if (rh.type != MsgType::kBook) continue;
    ByteReader r(parts[1].data(), parts[1].size());
    InformationBook book = InformationBook::read(r);
    if (book.jobId() != rh.job) throw ProtocolError("book job id does not match its header");
    return book;
  }
}

}  // namespace poseidon
