// CURVE's encryption charged by an injected charger (the benchmark's ranks; common/work_charger.h):
// ZeroMQ's I/O threads encrypt and decrypt while the sender and the receive loop go on, so a
// message reaches the link once it is encrypted and the receive loop once it is decrypted, each
// connection stays FIFO, and close() still sends what was being encrypted.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "poseidon/bench/device.h"
#include "poseidon/transport/security.h"
#include "poseidon/transport/van.h"
#include "poseidon/wire/frame.h"

namespace poseidon {
namespace {

constexpr uint64_t kJob = 11;
using Clock = std::chrono::steady_clock;

FrameHeader header(MsgType type, uint32_t layer) {
  FrameHeader h;
  h.type = type;
  h.layer = layer;
  return h;
}

// Two ranks over CURVE; encryption at 1e6 bytes/s on 2 I/O threads per process (a message of
// n bytes, header included, takes n / 1e6 s on its lane).
struct CurveLink {
  static VanOptions options(const CurveKeys& keys, int sendWindow, WorkCharger* charger) {
    VanOptions o;
    o.curve = &keys;
    o.charger = charger;
    o.lingerMs = 60000;  // close() delivers what it flushes on a loaded machine too
    o.sendWindowBytes = sendWindow;
    return o;
  }
  static DeviceModel model(bool charged) {
    DeviceModel m;
    m.name = "test";
    m.cryptoBytes = charged ? 1e6 : 0;
    m.cryptoLanes = 2;
    return m;
  }
  // Both vans share one device, as they shared the process-wide model before it was injected.
  explicit CurveLink(bool charged, int sendWindow = 0)
      : device(model(charged)), keys(deriveCurveKeys("van-crypto-test")), zap(ctx, keys) {
    a = std::make_unique<Van>(ctx, options(keys, sendWindow, &device));
    b = std::make_unique<Van>(ctx, options(keys, 0, &device));
    std::vector<std::string> endpoints{a->endpoint(), b->endpoint()};
    a->connectPeers(0, endpoints, kJob);
    b->connectPeers(1, endpoints, kJob);
  }
  bench::ChargedDevice device;
  zmq::context_t ctx;
  CurveKeys keys;
  ZapAuthenticator zap;
  std::unique_ptr<Van> a, b;
};

std::vector<uint8_t> payload(size_t wireBytes, uint8_t salt) {
  std::vector<uint8_t> v(wireBytes - kHeaderBytes);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 13 + salt);
  return v;
}

// Polls until a message comes (each wait bounded, up to 100 s in all on a loaded machine).
bool next(Van& van, Message* m) {
  for (int i = 0; i < 100; ++i)
    if (van.poll(m, 1000)) return true;
  return false;
}

TEST(VanCrypto, EncryptionAndDecryptionRunBesideTheSenderAndTheReceiveLoop) {
  CurveLink link(/*charged=*/true);
  Van &a = *link.a, &b = *link.b;
  const auto big = payload(2000000, 1);  // 2 s to encrypt on a's I/O thread, 2 s to decrypt on b's
  const auto start = Clock::now();
  a.send(1, header(MsgType::kPsPush, 3), big.data(), big.size());
  // send() returned at once; the message reaches the link when its encryption is done (checked when
  // this thread got here well before that, as it does unless the machine stalls it for seconds).
  const uint64_t sentRightAway = a.counters().total(TrafficKind::kPS).bytesSent;
  if (Clock::now() - start < std::chrono::seconds(1)) {
    EXPECT_EQ(sentRightAway, 0u);
  }

  // It arrives (the receive loop counts it) but is not delivered while it is being decrypted...
  Message m;
  bool early = false;
  for (int i = 0; i < 1000 && b.counters().total(TrafficKind::kPS).bytesReceived == 0; ++i) {
    if (b.poll(&m, 100)) {
      early = true;
      break;
    }
  }
  ASSERT_FALSE(early) << "delivered before its decryption";
  ASSERT_EQ(b.counters().total(TrafficKind::kPS).bytesReceived, 2000000u);
  EXPECT_EQ(a.counters().total(TrafficKind::kPS).bytesSent, 2000000u);
  // ... and meanwhile the receive loop takes other messages: b's own comes first.
  const uint8_t one = 42;
  b.send(1, header(MsgType::kBarrier, 0), &one, 1);
  ASSERT_TRUE(next(b, &m));
  EXPECT_EQ(m.header.type, MsgType::kBarrier);
  ASSERT_TRUE(next(b, &m));
  EXPECT_EQ(m.header.type, MsgType::kPsPush);
  EXPECT_EQ(m.header.layer, 3u);
  ASSERT_EQ(m.size(), big.size());
  EXPECT_TRUE(std::equal(big.begin(), big.end(), m.data()));
  // Encrypted, then decrypted: at least 4 s after the send.
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - start).count(), 3.99);
}

TEST(VanCrypto, EachConnectionStaysFifoAndCloseSendsWhatIsBeingEncrypted) {
  CurveLink link(/*charged=*/true);
  Van &a = *link.a, &b = *link.b;
  // A large message, then small ones: each waits for the ones before it on its I/O thread.
  const auto big = payload(300000, 2), small = payload(kHeaderBytes + 10, 3);
  a.send(1, header(MsgType::kPsPush, 1), big.data(), big.size());
  for (uint32_t layer = 2; layer < 6; ++layer) a.send(1, header(MsgType::kPsPush, layer), small.data(), small.size());
  a.close();  // every message is still being encrypted: close() hands them over first
  for (uint32_t layer = 1; layer < 6; ++layer) {
    Message m;
    ASSERT_TRUE(next(b, &m)) << "layer " << layer;
    EXPECT_EQ(m.header.layer, layer);
    EXPECT_EQ(m.size(), layer == 1 ? big.size() : small.size());
  }
}

// Priority links (docs/scheduling.md) behind the encryption: a fragmented message and the small ones
// after it arrive whole and in order, and close() flushes both stages.
TEST(VanCrypto, PriorityLinksTakeWhatWasEncryptedAndCloseFlushesBoth) {
  CurveLink link(/*charged=*/true, /*sendWindow=*/4096);
  Van &a = *link.a, &b = *link.b;
  const auto big = payload(200000, 5), small = payload(kHeaderBytes + 10, 6);  // 49 fragments
  a.send(1, header(MsgType::kPsPush, 1), big.data(), big.size());
  for (uint32_t layer = 2; layer < 5; ++layer) a.send(1, header(MsgType::kPsPush, layer), small.data(), small.size());
  a.close();
  for (uint32_t layer = 1; layer < 5; ++layer) {
    Message m;
    ASSERT_TRUE(next(b, &m)) << "layer " << layer;
    EXPECT_EQ(m.header.layer, layer);
    const auto& want = layer == 1 ? big : small;
    ASSERT_EQ(m.size(), want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), m.data()));
  }
}

TEST(VanCrypto, WithoutACryptoRateNothingWaits) {
  CurveLink link(/*charged=*/false);
  Van &a = *link.a, &b = *link.b;
  const auto big = payload(1000000, 4);
  a.send(1, header(MsgType::kPsPush, 0), big.data(), big.size());
  EXPECT_EQ(a.counters().total(TrafficKind::kPS).bytesSent, 1000000u);  // handed over in send()
  Message m;
  ASSERT_TRUE(next(b, &m));
  EXPECT_EQ(m.size(), big.size());
}

}  // namespace
}  // namespace poseidon
