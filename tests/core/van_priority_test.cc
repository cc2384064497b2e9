// Priority scheduling of the links (VanOptions::sendWindowBytes; docs/scheduling.md): the most
// urgent queued message goes first (control, then lower layers, FIFO within a layer), a message
// larger than the window goes in fragments that the receiver reassembles, and malformed fragments
// are rejected without losing the good ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>
#include <zmq_addon.hpp>

#include "expect_error.h"
#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"
#include "poseidon/transport/van.h"
#include "poseidon/wire/frame.h"

namespace poseidon {
namespace {

constexpr uint64_t kJob = 7;

std::vector<uint8_t> pattern(size_t n, int salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(salt) * 7 + 1);
  return v;
}

FrameHeader header(MsgType type, uint32_t layer, int64_t iteration = 0) {
  FrameHeader h;
  h.type = type;
  h.layer = layer;
  h.iteration = iteration;
  return h;
}

// A message to send: its type, layer and payload size (the payload: pattern(bytes, its index)).
struct Sent {
  MsgType type;
  uint32_t layer;
  size_t bytes;
};

void sendAll(Van& from, const std::vector<Sent>& sent) {
  for (size_t i = 0; i < sent.size(); ++i) {
    auto p = pattern(sent[i].bytes, static_cast<int>(i));
    from.send(1, header(sent[i].type, sent[i].layer), p.data(), p.size());
  }
}

// Rank 0 (a) sends over priority-scheduled links with a 4 KB window (and `urgentLayers`) to rank 1
// (b), which needs no scheduling of its own to receive.
struct Link {
  static VanOptions scheduled(int urgentLayers) {
    VanOptions o;
    o.sendWindowBytes = 4096;
    o.urgentLayers = urgentLayers;
    return o;
  }
  explicit Link(int urgentLayers = 0) : b(ctx, VanOptions{}), a(ctx, scheduled(urgentLayers)) {
    std::vector<std::string> endpoints{a.endpoint(), b.endpoint()};
    a.connectPeers(0, endpoints, kJob);
    b.connectPeers(1, endpoints, kJob);
  }
  zmq::context_t ctx;
  Van b, a;
};

// Polls until a message comes (each wait bounded, up to 100 s in all on a loaded machine).
Message next(Van& van) {
  Message m;
  for (int i = 0; i < 100; ++i)
    if (van.poll(&m, 1000)) return m;
  ADD_FAILURE() << "no message came";
  return m;
}

TEST(VanPriority, ControlFirstThenLowerLayersThenFifoWithinALayer) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  using P = Van::Priority;
  EXPECT_EQ(Van::priorityOf(header(MsgType::kHeartbeat, 0, 9)), P(kMin, 0));
  EXPECT_EQ(Van::priorityOf(header(MsgType::kBarrier, 3)), P(kMin, 0));
  EXPECT_EQ(Van::priorityOf(header(MsgType::kAbort, 0)), P(kMin, 0));
  EXPECT_EQ(Van::priorityOf(header(MsgType::kPsPush, 7, 4)), P(4, 7));
  EXPECT_EQ(Van::priorityOf(header(MsgType::kPsAggregate, 2, 4)), P(4, 2));
  EXPECT_EQ(Van::priorityOf(header(MsgType::kSfbFactors, 5, 3)), P(3, 5));  // an earlier iteration goes first
  EXPECT_LT(Van::priorityOf(header(MsgType::kSfbFactors, 5, 3)), Van::priorityOf(header(MsgType::kPsPush, 0, 4)));
  EXPECT_EQ(Van::priorityOf(header(MsgType::kPull, 1)), P(kMax, kMax));
}

TEST(VanPriority, QueuedMessagesGoMostUrgentFirstAndFragmentsArriveWhole) {
  Link link;
  Van &a = link.a, &b = link.b;
  a.holdSends(true);
  // In the order sent; 40000 and 10000 bytes go as 10 and 3 fragments.
  const std::vector<Sent> sent{{MsgType::kPsPush, 9, 40000},    {MsgType::kPsPush, 3, 10000},
                               {MsgType::kSfbFactors, 1, 5000}, {MsgType::kPsAggregate, 2, 100},
                               {MsgType::kPsPush, 1, 200},      {MsgType::kHeartbeat, 0, 0}};
  sendAll(a, sent);
  EXPECT_EQ(a.queuedMessages(), 10u + 3 + 2 + 1 + 1 + 1);
  a.holdSends(false);
  // Control, then layer 1 (its two messages in the order sent), 2, 3, 9.
  for (size_t i : {5, 2, 4, 3, 1, 0}) {
    Message m = next(b);
    EXPECT_EQ(m.header.type, sent[i].type) << "message " << i;
    EXPECT_EQ(m.header.layer, sent[i].layer) << "message " << i;
    EXPECT_EQ(m.header.sender, 0u);
    EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + m.size()), pattern(sent[i].bytes, static_cast<int>(i)))
        << "message " << i;
  }
  EXPECT_EQ(a.queuedMessages(), 0u);
  EXPECT_EQ(b.rejectedFrames(), 0u);
  // The counters see whole messages on both ends.
  EXPECT_EQ(a.counters().total(TrafficKind::kPS).bytesSent, 40000u + 10000 + 100 + 200 + 4 * kHeaderBytes);
  EXPECT_EQ(b.counters().total(TrafficKind::kPS).bytesReceived, 40000u + 10000 + 100 + 200 + 4 * kHeaderBytes);
  a.close();
  EXPECT_ERROR_CONTAINS(a.send(1, header(MsgType::kPsPush, 0), static_cast<const void*>(nullptr), size_t{0}), IoError,
                        "transport closed");
}

// An urgent message enqueued while a large one is half handed over passes between its fragments.
TEST(VanPriority, AnUrgentMessagePassesBetweenTheFragmentsOfALargeOne) {
  Link link;
  Van &a = link.a, &b = link.b;
  a.holdSends(true, 3);  // three fragments go, then the sender holds
  auto big = pattern(40000, 1), urgent = pattern(300, 2);
  a.send(1, header(MsgType::kPsPush, 9, 5), big.data(), big.size());
  ASSERT_TRUE(a.waitQueuedAtMost(7, std::chrono::seconds(100)));  // the sender handed over three
  ASSERT_EQ(a.queuedMessages(), 7u);
  a.send(1, header(MsgType::kPsPush, 0, 5), urgent.data(), urgent.size());
  a.holdSends(false);
  Message first = next(b), second = next(b);
  EXPECT_EQ(first.header.layer, 0u);  // whole before the large one's last seven fragments
  EXPECT_EQ(std::vector<uint8_t>(first.data(), first.data() + first.size()), urgent);
  EXPECT_EQ(second.header.layer, 9u);
  EXPECT_EQ(std::vector<uint8_t>(second.data(), second.data() + second.size()), big);
}

TEST(VanPriority, CloseSendsWhatIsQueued) {
  Link link;
  Van &a = link.a, &b = link.b;
  a.holdSends(true);
  auto p = pattern(100000, 3);
  a.send(1, header(MsgType::kPsAggregate, 4), p.data(), p.size());
  a.close();  // lingers: the 25 fragments still go
  Message m = next(b);
  EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + m.size()), p);
}

// VanOptions::urgentLayers: layers 0 and 1's round data are counted as urgent (the next test sees them
// leave on their own connection); every message still arrives whole, each layer in the order sent.
TEST(VanPriority, UrgentLayersAreCountedAndArriveWholeInOrder) {
  Link link(2);
  Van &a = link.a, &b = link.b;
  a.holdSends(true);
  const std::vector<Sent> sent{{MsgType::kPsPush, 5, 40000},    {MsgType::kPsPush, 1, 9000},
                               {MsgType::kPsAggregate, 0, 300}, {MsgType::kPsPush, 1, 50},
                               {MsgType::kSfbFactors, 2, 700},  {MsgType::kBarrier, 0, 0}};
  sendAll(a, sent);
  // The round data of layers 0 and 1 (not the barrier, a control message, though its layer is 0).
  EXPECT_EQ(a.urgentBytesSent(), 9000u + 300 + 50 + 3 * kHeaderBytes);
  a.holdSends(false);
  std::vector<size_t> order;
  for (size_t k = 0; k < sent.size(); ++k) {
    Message m = next(b);
    size_t i = 0;
    while (i < sent.size() &&
           !(sent[i].type == m.header.type && sent[i].layer == m.header.layer && sent[i].bytes == m.size()))
      ++i;
    ASSERT_LT(i, sent.size()) << "an unexpected message: layer " << m.header.layer << ", " << m.size() << " bytes";
    EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + m.size()), pattern(sent[i].bytes, static_cast<int>(i)));
    order.push_back(i);
  }
  // Two connections may deliver in either order between them, but within a layer the order sent
  // holds (layer 1: message 1 before message 3).
  auto at = [&](size_t i) { return std::find(order.begin(), order.end(), i) - order.begin(); };
  EXPECT_LT(at(1), at(3));
  EXPECT_EQ(b.rejectedFrames(), 0u);
  EXPECT_EQ(b.counters().total(TrafficKind::kPS).bytesReceived, 40000u + 9000 + 300 + 50 + 4 * kHeaderBytes);
}

// The urgent messages leave on a connection of their own: a raw ROUTER in the peer's place sees
// layers 0 and 1's round data (whole or in fragments) come from one connection, and layer 5's and a
// layer-0 barrier from another.
TEST(VanPriority, UrgentLayersLeaveOnASecondConnection) {
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  VanOptions o;
  o.sendWindowBytes = 4096;
  o.urgentLayers = 2;
  Van a(ctx, o);
  a.connectPeers(0, {a.endpoint(), router.get(zmq::sockopt::last_endpoint)}, kJob);
  auto big = pattern(9000, 1), small = pattern(300, 2);
  a.send(1, header(MsgType::kPsPush, 5), big.data(), big.size());           // 3 fragments, bulk
  a.send(1, header(MsgType::kPsPush, 1), big.data(), big.size());           // 3 fragments, urgent
  a.send(1, header(MsgType::kPsAggregate, 0), small.data(), small.size());  // urgent
  a.send(1, header(MsgType::kBarrier, 0), small.data(), small.size());      // control: bulk
  std::set<std::string> urgent, bulk;
  for (int k = 0; k < 8; ++k) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::seconds(100)), 1) << "only " << k << " of 8 messages came";
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(parts)));
    ASSERT_GE(parts.size(), 3u);
    FrameHeader h;
    ASSERT_EQ(decodeHeader(parts[1].data(), parts[1].size(), kDefaultMaxPayloadBytes, &h), "");
    const bool isUrgent = h.type != MsgType::kBarrier && h.layer < 2;
    (isUrgent ? urgent : bulk).insert(parts[0].to_string());
  }
  EXPECT_EQ(urgent.size(), 1u);
  EXPECT_EQ(bulk.size(), 1u);
  EXPECT_NE(urgent, bulk);
  a.close();
}

// The TOS of this host's established TCP connections whose local port is `port` (`ss --tos`), one
// entry per connection; empty if there is no ss to ask.
std::vector<std::string> tosOfConnectionsOn(const std::string& endpoint) {
  const std::string port = endpoint.substr(endpoint.rfind(':') + 1);
  std::vector<std::string> tos;
  FILE* ss = popen("ss -Htn --tos state established 2>/dev/null", "r");
  if (ss == nullptr) return tos;
  char line[512];
  while (fgets(line, sizeof line, ss) != nullptr) {
    // "Recv-Q Send-Q Local:Port Peer:Port tos:0x10 class_id:0 ..."
    std::istringstream in(line);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    if (w.size() < 5 || w[2].substr(w[2].rfind(':') + 1) != port) continue;
    for (const auto& x : w)
      if (x.rfind("tos:", 0) == 0) tos.push_back(x.substr(4));
  }
  pclose(ss);
  return tos;
}

// A van that may use urgent connections accepts its peers' connections marked low-delay too, so
// that what it sends on them, the ACKs of their data, is not held behind bulk bytes in a queue that
// serves the mark first; a van without urgent layers leaves its accepted connections unmarked.
TEST(VanPriority, AcceptedConnectionsMarkTheirAcksLikeTheUrgentData) {
  if (std::system("ss -V > /dev/null 2>&1") != 0) GTEST_SKIP() << "no ss (iproute2) to read the TOS with";
  zmq::context_t ctx;
  VanOptions urgent, plain;
  urgent.sendWindowBytes = plain.sendWindowBytes = 4096;
  urgent.urgentLayers = 2;
  plain.urgentLayers = 0;
  Van a(ctx, urgent), b(ctx, plain);
  const std::vector<std::string> endpoints{a.endpoint(), b.endpoint()};
  a.connectPeers(0, endpoints, kJob);
  b.connectPeers(1, endpoints, kJob);
  // Layer 0 (urgent at a) and layer 5 (bulk) each way: every connection is up once these are in.
  auto p = pattern(300, 4);
  for (uint32_t layer : {0u, 5u}) {
    a.send(1, header(MsgType::kPsPush, layer), p.data(), p.size());
    b.send(0, header(MsgType::kPsPush, layer), p.data(), p.size());
  }
  for (int k = 0; k < 2; ++k) {
    next(a);
    next(b);
  }
  // a's ROUTER accepted b's one connection, b's accepted a's two (bulk and urgent).
  EXPECT_THAT(tosOfConnectionsOn(a.endpoint()), ::testing::ElementsAre("0x10"));
  EXPECT_THAT(tosOfConnectionsOn(b.endpoint()), ::testing::ElementsAre("0", "0"));
  a.close();
  b.close();
}

TEST(VanPriority, UrgentLayersNeedASendWindow) {
  zmq::context_t ctx;
  VanOptions o;
  o.urgentLayers = 2;
  EXPECT_ERROR_CONTAINS(Van(ctx, o), InvalidArgument,
                        "urgent layers (2) need priority links: a send window, not FIFO links");
  o.sendWindowBytes = 4096;
  o.urgentLayers = -2;
  EXPECT_ERROR_CONTAINS(Van(ctx, o), InvalidArgument, "urgent layers must be >= 0 (or -1: automatic), got -2");
}

// The routing ids under which a raw ROUTER at rank 1 sees a van's round data of layers 2 and 3
// arrive, in a world of `world` ranks (the others unreachable: nothing is sent to them).
std::vector<std::string> connectionsOfLayers2And3(const VanOptions& o, size_t world, int* urgentLayers) {
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  Van a(ctx, o);
  std::vector<std::string> endpoints{a.endpoint(), router.get(zmq::sockopt::last_endpoint)};
  endpoints.resize(world, "tcp://127.0.0.1:1");
  a.connectPeers(0, endpoints, kJob);
  *urgentLayers = a.urgentLayers();
  auto small = pattern(300, 3);
  a.send(1, header(MsgType::kPsPush, 2), small.data(), small.size());
  a.send(1, header(MsgType::kPsPush, 3), small.data(), small.size());
  std::vector<std::string> ids;
  for (int k = 0; k < 2; ++k) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::seconds(100)) != 1) break;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(router, std::back_inserter(parts)) || parts.size() < 3) break;
    ids.push_back(parts[0].to_string());
  }
  a.close();
  return ids;
}

// VanOptions::urgentLayers' default (kAutoUrgentLayers): with a send window and more than 8 peers
// the first 3 layers take the urgent connections; with 8 peers or fewer, or FIFO links, none do.
TEST(VanPriority, UrgentLayersAreAutomaticPastEightPeers) {
  VanOptions o;
  EXPECT_EQ(o.urgentLayers, VanOptions::kAutoUrgentLayers);
  EXPECT_EQ(Van::urgentLayerCount(o, 31), 0);  // FIFO links
  o.sendWindowBytes = 4096;
  EXPECT_EQ(Van::urgentLayerCount(o, 1), 0);
  EXPECT_EQ(Van::urgentLayerCount(o, 8), 0);
  EXPECT_EQ(Van::urgentLayerCount(o, 9), 3);
  EXPECT_EQ(Van::urgentLayerCount(o, 255), 3);
  // Where the egress queue serves the mark first, past 16 peers: every layer below an FC stack that
  // holds the bulk.
  EXPECT_EQ(Van::urgentLayerCount(o, 17, true, 16), 16);
  EXPECT_EQ(Van::urgentLayerCount(o, 31, true, 16), 16);
  EXPECT_EQ(Van::urgentLayerCount(o, 16, true, 16), 3);  // 16 nodes: 3 measured faster
  EXPECT_EQ(Van::urgentLayerCount(o, 31, true, 0), 3);   // no such stack (resnet-152)
  EXPECT_EQ(Van::urgentLayerCount(o, 31, false, 16), 3);
  EXPECT_EQ(Van::urgentLayerCount(o, 8, true, 16), 0);
  o.urgentLayers = 0;
  EXPECT_EQ(Van::urgentLayerCount(o, 31), 0);
  EXPECT_EQ(Van::urgentLayerCount(o, 31, true, 16), 0);
  o.urgentLayers = 5;
  EXPECT_EQ(Van::urgentLayerCount(o, 1), 5);
  EXPECT_EQ(Van::urgentLayerCount(o, 31, true, 16), 5);
  // On real sockets: 9 peers put layer 2 (urgent) and layer 3 (bulk) on two connections, 8 peers on one.
  o.urgentLayers = VanOptions::kAutoUrgentLayers;
  int used = -1;
  auto nine = connectionsOfLayers2And3(o, 10, &used);
  EXPECT_EQ(used, 3);
  ASSERT_EQ(nine.size(), 2u);
  EXPECT_NE(nine[0], nine[1]);
  auto eight = connectionsOfLayers2And3(o, 9, &used);
  EXPECT_EQ(used, 0);
  ASSERT_EQ(eight.size(), 2u);
  EXPECT_EQ(eight[0], eight[1]);
}

// The automatic rule on real sockets, 17 peers, with the job's model: only a node told its queue is
// two-band (VanOptions::egressQueue kTos) takes vgg19's 16 conv layers; auto reads the queue for the
// log (toward 127.0.0.1 the loopback's noqueue) and keeps 3, as on Linux's pfifo_fast, where the 16
// measured slower under the bench's shaper (bench/results/pfifo-fast/, leaf/); told fifo, 3; without
// a model, 3 and no probe.
TEST(VanPriority, OnlyAQueueToldTwoBandTakesTheLayersBelowTheFcStack) {
  zmq::context_t ctx;
  const ModelDesc vgg19 = zooModel("vgg19", 0.1);
  ASSERT_EQ(vgg19.layersBelowFcBulk(), 16);
  auto used = [&](EgressQueue queue, const ModelDesc* model, EgressProbe* probe) {
    VanOptions o;
    o.sendWindowBytes = 4096;
    o.lingerMs = 0;
    o.egressQueue = queue;
    Van a(ctx, o);
    std::vector<std::string> endpoints{a.endpoint()};
    endpoints.resize(18, "tcp://127.0.0.1:1");  // 17 peers, nothing listening
    a.connectPeers(0, endpoints, kJob, model);
    *probe = a.egressProbe();
    return a.urgentLayers();
  };
  EgressProbe probe;
  EXPECT_EQ(used(EgressQueue::kAuto, &vgg19, &probe), 3);
  EXPECT_EQ(probe.device, "lo");
  EXPECT_EQ(probe.qdisc, "noqueue");
  EXPECT_EQ(probe.error, "");
  EXPECT_EQ(used(EgressQueue::kTos, &vgg19, &probe), 16);
  EXPECT_EQ(probe.device, "");  // told: not read
  EXPECT_EQ(used(EgressQueue::kFifo, &vgg19, &probe), 3);
  EXPECT_EQ(used(EgressQueue::kTos, nullptr, &probe), 3);
  EXPECT_EQ(used(EgressQueue::kAuto, nullptr, &probe), 3);
  EXPECT_EQ(probe.device, "");
}

// A van whose connections need more descriptors than the soft limit raises it toward the hard one
// (100 peers with urgent connections: ~660), instead of meeting EMFILE inside libzmq later.
TEST(VanPriority, ManyPeersRaiseTheDescriptorLimit) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  if (before.rlim_max != RLIM_INFINITY && before.rlim_max < 1024) GTEST_SKIP() << "hard limit " << before.rlim_max;
  rlimit low = before;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  {
    zmq::context_t ctx;
    VanOptions o;
    o.sendWindowBytes = 4096;
    o.lingerMs = 0;
    Van a(ctx, o);
    std::vector<std::string> endpoints{a.endpoint()};
    endpoints.resize(101, "tcp://127.0.0.1:1");
    a.connectPeers(0, endpoints, kJob);
    EXPECT_EQ(a.urgentLayers(), 3);
    rlimit now{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
    EXPECT_GE(now.rlim_cur, rlim_t{3 * 200 + 64});
    a.close();
  }
  setrlimit(RLIMIT_NOFILE, &before);
}

TEST(VanPriority, ANegativeWindowIsRefused) {
  zmq::context_t ctx;
  VanOptions o;
  o.sendWindowBytes = -2;  // -1 is the runtime's default (VanWindow tests)
  EXPECT_ERROR_CONTAINS(Van(ctx, o), InvalidArgument,
                        "the send window must be 0 (FIFO links), -1 (the runtime's default) or at least 4096 bytes "
                        "(smaller ones cut messages into too many fragments), got -2");
  o.sendWindowBytes = 100;
  EXPECT_ERROR_CONTAINS(Van(ctx, o), InvalidArgument, "or at least 4096 bytes");
}

// Raw three-frame messages from a DEALER that is not a Van: each bad fragment is counted and
// dropped, and a good fragmented message after them still arrives whole.
TEST(VanPriority, MalformedFragmentsAreRejectedAndTheGoodOnesStillArrive) {
  zmq::context_t ctx;
  VanOptions o;
  Van b(ctx, o);
  b.connectPeers(1, {"tcp://127.0.0.1:1", b.endpoint()}, kJob);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(b.endpoint());
  auto sendFragment = [&](FrameHeader h, uint64_t payloadBytes, const std::vector<uint8_t>& chunk, uint64_t id,
                          uint64_t offset, size_t whereBytes = 16) {
    h.job = kJob;
    h.sender = 0;
    h.payloadBytes = payloadBytes;
    uint8_t head[kHeaderBytes];
    encodeHeader(h, head);
    std::vector<uint8_t> where(whereBytes, 0);
    if (whereBytes >= 16) {
      std::memcpy(where.data(), &id, 8);
      std::memcpy(where.data() + 8, &offset, 8);
    }
    raw.send(zmq::buffer(head, kHeaderBytes), zmq::send_flags::sndmore);
    raw.send(zmq::buffer(chunk), zmq::send_flags::sndmore);
    raw.send(zmq::buffer(where), zmq::send_flags::none);
  };
  const auto h = header(MsgType::kPsPush, 2);
  const auto good = pattern(12, 1);
  std::vector<uint8_t> first(good.begin(), good.begin() + 8), second(good.begin() + 8, good.end());
  sendFragment(h, 12, first, 1, 0, 8);   // a fragment frame of 8 bytes
  sendFragment(h, 12, second, 2, 8);     // message 2 does not start at 0
  sendFragment(h, 4, first, 3, 0);       // 8 bytes of a 4-byte message
  sendFragment(h, 12, first, 4, 0);      // message 4 starts well ...
  auto other = h;
  other.layer = 3;
  sendFragment(other, 12, second, 4, 8);  // ... and goes on with another header: dropped whole
  sendFragment(h, 12, second, 4, 8);      // so its late rest is out of place too
  sendFragment(h, 12, first, 5, 0);       // message 5 arrives whole
  sendFragment(h, 12, second, 5, 8);
  Message m = next(b);
  EXPECT_EQ(m.header.type, MsgType::kPsPush);
  EXPECT_EQ(m.header.layer, 2u);
  EXPECT_EQ(std::vector<uint8_t>(m.data(), m.data() + m.size()), good);
  EXPECT_EQ(b.rejectedFrames(), 5u);
}

}  // namespace
}  // namespace poseidon
