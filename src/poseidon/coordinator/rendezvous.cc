#include "poseidon/coordinator/rendezvous.h"

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/transport/multipart.h"
#include "poseidon/wire/messages.h"

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
  FrameHeader h = wire::join(req.rank);
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
    if (rh.type == MsgType::kJoinError) {
      if (wire::joinTimedOut(rh)) throw TimeoutError(parts[1].to_string());
      throw Error(parts[1].to_string());
    }
    if (rh.type != MsgType::kBook) continue;
    ByteReader r(parts[1].data(), parts[1].size());
    InformationBook book = InformationBook::read(r);
    if (book.jobId() != rh.job) throw ProtocolError("book job id does not match its header");
    return book;
  }
}

}  // namespace poseidon
