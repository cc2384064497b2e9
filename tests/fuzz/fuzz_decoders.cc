// libFuzzer target over every decoder of network data: the frame header,
// join requests, the information book, the KV store's and Adam server's
// validation of pushes, the whole server role (KvServer, in straggler mode,
// with the SFB keeper), and a worker's Syncer receiving aggregates, factors
// and decisions, merged FC's payloads. Built and run by tests/fuzz/run.sh (Debian's clang,
// -fsanitize=fuzzer,address,undefined). The first input byte picks the
// decoder. Any crash, sanitizer report, or exception other than the
// documented ones (Error and its subclasses) is a bug.
//
// With -DPOSEIDON_FUZZ_SEEDS it instead writes valid seed inputs to a directory.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "poseidon/client/fc_channel.h"
#include "poseidon/client/syncer.h"
#include "poseidon/common/bytes.h"
#include "poseidon/common/error.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/coordinator/rendezvous.h"
#include "poseidon/kvstore/adam_server.h"
#include "poseidon/kvstore/kv_shard.h"
#include "poseidon/kvstore/server.h"
#include "poseidon/wire/frame.h"
#include "poseidon/wire/messages.h"

using namespace poseidon;

namespace {

ModelDesc smallModel() {
  ModelDesc m;
  m.name = "fuzz";
  m.layers.push_back(LayerSpec::conv("conv", 4, 2, 3, 3));
  m.layers.push_back(LayerSpec::fc("fc", 8, 5));
  m.layers.push_back(LayerSpec::other("one", {{"w", {1}}}));
  return m;
}

InformationBook makeBook(int dropStragglers, int groups = 0, WirePrecision wire = WirePrecision::kFp32) {
  std::vector<NodeInfo> nodes;
  for (int r = 0; r < 3; ++r) nodes.push_back({r, Role::kBoth, "tcp://127.0.0.1:1"});
  JobSettings s;
  s.pairBytes = 16 * 4;
  s.batch = 2;
  s.dropStragglers = dropStragglers;
  s.stragglerTimeoutMs = dropStragglers ? 10 : 0;
  s.groups = groups;
  s.momentum = groups ? 0.5f : 0.0f;
  s.wire = wire;
  return InformationBook(7, nodes, smallModel(), s);
}

// Three workers in three compute groups: the shards hold the model (kvstore/model_shard.h).
const InformationBook& groupBook() {
  static const InformationBook b = makeBook(0, 3);
  return b;
}

const InformationBook& book() {
  static const InformationBook b = makeBook(0);
  return b;
}

// The same cluster with straggler dropping: the server role then also keeps SFB rounds.
const InformationBook& stragglerBook() {
  static const InformationBook b = makeBook(1);
  return b;
}

// With a 16-bit wire (payloads of 2 bytes per float), plain and with straggler dropping.
const InformationBook& bf16Book() {
  static const InformationBook b = makeBook(0, 0, WirePrecision::kBf16);
  return b;
}
const InformationBook& bf16StragglerBook() {
  static const InformationBook b = makeBook(1, 0, WirePrecision::kBf16);
  return b;
}

// A worker's view of the job for the Syncer: nothing is sent anywhere; scheduled
// work (reconstructions) runs at once.
class FuzzHost : public SyncHost {
 public:
  explicit FuzzHost(const InformationBook& book) : book_(book) {}
  const InformationBook& book() const override { return book_; }
  int rank() const override { return 1; }
  void send(int, const FrameHeader&, const std::vector<Van::Part>&) override {}
  void schedule(std::function<void()> task) override { task(); }
  void layerDone(int, int64_t) override {}
  void fail(std::exception_ptr) override {}
  int64_t currentIteration() const override { return 0; }
  Tracer* tracer() const override { return nullptr; }

 private:
  const InformationBook& book_;
};

Message fuzzMessage(FrameHeader h, uint32_t sender, const uint8_t* data, size_t n) {
  Message m;
  m.header = h;
  m.header.sender = sender;
  m.header.payloadBytes = n;
  m.payload = zmq::message_t(data, n);
  return m;
}

struct Fields {
  uint32_t sender, layer, pair, rows;
  int64_t iteration;
};

Fields readFields(const uint8_t*& data, size_t& size) {
  Fields f{};
  uint8_t buf[24] = {0};
  size_t n = std::min<size_t>(size, sizeof buf);
  std::memcpy(buf, data, n);
  data += n;
  size -= n;
  std::memcpy(&f.sender, buf, 4);
  std::memcpy(&f.layer, buf + 4, 4);
  std::memcpy(&f.pair, buf + 8, 4);
  std::memcpy(&f.rows, buf + 12, 4);
  std::memcpy(&f.iteration, buf + 16, 8);
  f.sender %= 5;  // mostly valid ranks, some invalid
  f.layer %= 5;
  f.pair %= 6;
  f.rows %= 9;
  f.iteration %= 5;
  return f;
}

}  // namespace

// Case 6 runs in any of four modes: the first byte after the selector picks it (bit 0: straggler
// dropping, bit 1: a bf16 wire).
const InformationBook& f6book(uint8_t pick) {
  if (pick & 2) return pick % 2 ? bf16StragglerBook() : bf16Book();
  return pick % 2 ? stragglerBook() : book();
}

#ifndef POSEIDON_FUZZ_SEEDS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 9;
  ++data;
  --size;
  try {
    switch (which) {
      case 0: {
        FrameHeader h;
        std::string why = decodeHeader(data, size, 1 << 20, &h);
        if (why.empty() && (size != kHeaderBytes || h.magic != kWireMagic)) __builtin_trap();
        break;
      }
      case 1:
        decodeJoin(data, size);
        break;
      case 2: {
        ByteReader r(data, size);
        InformationBook::read(r);
        break;
      }
      case 3: {
        // A fresh shard per input: pushes of one input build on each other (inputs of odd length
        // against a bf16 wire's 2-byte floats).
        KvShard shard(size % 2 ? bf16Book() : book(), 0);
        while (size > 0) {
          Fields f = readFields(data, size);
          size_t n = std::min<size_t>(size, f.rows * 16);
          shard.push(static_cast<int>(f.sender), static_cast<int>(f.layer), static_cast<int>(f.pair), f.iteration, data, n);
          data += n;
          size -= n;
        }
        break;
      }
      case 4: {
        AdamServer adam(book(), book().layout().pairsOf(1)[0].shard);
        while (size > 0) {
          Fields f = readFields(data, size);
          size_t n = std::min<size_t>(size, f.rows * 13 * 4);
          zmq::message_t payload(data, n);
          adam.push(static_cast<int>(f.sender), static_cast<int>(f.layer), f.iteration, f.rows, std::move(payload));
          data += n;
          size -= n;
        }
        break;
      }
      case 5: {
        // The server role: pushes and SFB notices, deadlines expiring as the input goes on.
        KvServer server(stragglerBook(), 0);
        auto now = KvServer::Clock::time_point();
        while (size > 0) {
          Fields f = readFields(data, size);
          size_t n = std::min<size_t>(size, f.rows * 16);
          FrameHeader h = f.pair % 2 ? wire::sfbNotice(static_cast<int>(f.layer), f.iteration)
                                     : wire::psPush(static_cast<int>(f.layer), f.iteration, static_cast<int>(f.pair));
          Message m = fuzzMessage(h, f.sender, data, n);
          try {
            server.handle(m, now);
          } catch (const ProtocolError&) {
          }
          now += std::chrono::milliseconds(f.rows * 2);
          server.expire(now);
          data += n;
          size -= n;
        }
        break;
      }
      case 7: {
        // The server role of compute-group mode: model init, pulls and group pushes.
        KvServer server(groupBook(), 0);
        while (size > 0) {
          Fields f = readFields(data, size);
          size_t n = std::min<size_t>(size, f.rows * 16);
          FrameHeader h = f.pair % 3 == 0   ? wire::modelInit(static_cast<int>(f.layer), static_cast<int>(f.pair / 3), 0)
                          : f.pair % 3 == 1 ? wire::pull(static_cast<int>(f.layer), f.iteration, static_cast<int>(f.pair / 3))
                                            : wire::groupPush(static_cast<int>(f.layer), f.iteration,
                                                              static_cast<int>(f.pair / 3));
          Message m = fuzzMessage(h, f.sender, data, n);
          try {
            server.handle(m);
          } catch (const ProtocolError&) {
          }
          data += n;
          size -= n;
        }
        break;
      }
      case 6: {
        // A worker's receive path: aggregates, factors and decisions for both layers.
        if (size == 0) break;
        const InformationBook& b = f6book(data[0]);
        FuzzHost host(b);
        Syncer conv(host, 0), fc(host, 1);
        ++data;
        --size;
        while (size > 0) {
          Fields f = readFields(data, size);
          size_t n = std::min<size_t>(size, f.rows * 13 * 4 + (f.pair & 1));
          Syncer& s = f.layer % 2 ? fc : conv;
          const int layer = f.layer % 2;
          FrameHeader h;
          switch (f.pair % 3) {
            case 0: h = wire::psAggregate(layer, f.iteration, static_cast<int>(f.pair / 3)); break;
            case 1: h = wire::sfbFactors(layer, f.iteration, f.rows); break;
            default: h = wire::sfbDecision(layer, f.iteration); break;
          }
          Message m = fuzzMessage(h, f.sender, data, n);
          try {
            if (h.type == MsgType::kPsAggregate) s.onAggregate(m);
            else if (h.type == MsgType::kSfbFactors) s.onFactors(m);
            else s.onDecision(m);
          } catch (const ProtocolError&) {
          }
          data += n;
          size -= n;
        }
        break;
      }
      case 8: {
        // Merged FC's payloads (client/fc_channel.h): every view must lie inside the payload.
        std::vector<uint8_t> payload(data, data + size);
        try {
          FcForwardView f = decodeFcForward(payload);
          volatile float sum = 0;
          for (int64_t i = 0; i < f.rows * f.cols; ++i) sum = sum + f.activations[i];
          for (int64_t i = 0; i < f.rows; ++i) sum = sum + static_cast<float>(f.labels[i]);
        } catch (const ProtocolError&) {
        }
        FcBackwardView b = decodeFcBackward(payload);
        volatile float sum = 0;
        for (int64_t i = 0; i < b.rows * b.cols; ++i) sum = sum + b.gradient[i];
        break;
      }
    }
  } catch (const Error&) {
    // The documented way to reject bad input.
  }
  return 0;
}
#else
int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  auto write = [&](const std::string& name, uint8_t which, const std::vector<uint8_t>& bytes) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    f.put(static_cast<char>(which));
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  FrameHeader h;
  h.type = MsgType::kPsPush;
  h.payloadBytes = 64;
  std::vector<uint8_t> head(kHeaderBytes);
  encodeHeader(h, head.data());
  write("header-push", 0, head);
  JoinRequest req;
  req.rank = 1;
  req.worldSize = 3;
  req.endpoint = "tcp://127.0.0.1:5000";
  req.model = smallModel();
  write("join", 1, encodeJoin(req));
  ByteWriter w;
  book().write(w);
  write("book", 2, w.bytes());
  // A complete round of one pair: three workers push pair 0 of layer 0.
  std::vector<uint8_t> pushes;
  for (uint32_t s = 0; s < 3; ++s) {
    uint32_t fields[4] = {s, 0, 0, 4};
    int64_t it = 0;
    pushes.insert(pushes.end(), reinterpret_cast<uint8_t*>(fields), reinterpret_cast<uint8_t*>(fields) + 16);
    pushes.insert(pushes.end(), reinterpret_cast<uint8_t*>(&it), reinterpret_cast<uint8_t*>(&it) + 8);
    pushes.insert(pushes.end(), 64, 0x3f);
  }
  write("kv-round", 3, pushes);
  std::vector<uint8_t> factors;
  for (uint32_t s = 0; s < 3; ++s) {
    uint32_t fields[4] = {s, 1, 0, 2};
    int64_t it = 0;
    factors.insert(factors.end(), reinterpret_cast<uint8_t*>(fields), reinterpret_cast<uint8_t*>(fields) + 16);
    factors.insert(factors.end(), reinterpret_cast<uint8_t*>(&it), reinterpret_cast<uint8_t*>(&it) + 8);
    factors.insert(factors.end(), 2 * 13 * 4, 0x3f);
  }
  write("adam-round", 4, factors);
  // The server role: a complete round of pair 0 (pair field 0: pushes).
  write("server-round", 5, pushes);
  // A worker receiving the SFB factors of all three workers (pair field 1: factors).
  std::vector<uint8_t> sfb{0};
  for (uint32_t s = 0; s < 3; ++s) {
    uint32_t fields[4] = {s, 1, 1, 2};
    int64_t it = 0;
    sfb.insert(sfb.end(), reinterpret_cast<uint8_t*>(fields), reinterpret_cast<uint8_t*>(fields) + 16);
    sfb.insert(sfb.end(), reinterpret_cast<uint8_t*>(&it), reinterpret_cast<uint8_t*>(&it) + 8);
    sfb.insert(sfb.end(), 2 * 13 * 4 + 1, 0x3f);
  }
  write("syncer-sfb", 6, sfb);
  std::vector<float> x(6, 0.5f);
  std::vector<int64_t> y = {1, 2};
  write("fc-forward", 8, encodeFcForward(0.1f, 2, 3, x.data(), y.data()));
  write("fc-backward", 8, encodeFcBackward(0.5, 2, 3, x.data()));
  return 0;
}
#endif
