// Several nodes in one process, each with its own ZeroMQ context and real
// TCP sockets on localhost. The multi-process tests (tests/integration) run
// the same scenario across real processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "../integration/scenario.h"
#include "expect_error.h"
#include "poseidon/client/node.h"
#include "poseidon/launch/env.h"

namespace poseidon {
namespace {

using testing::runScenario;
using testing::scenarioModel;

// Every node's configured timeout; the tests' own polls wait no longer than this.
constexpr std::chrono::milliseconds kNodeTimeout{20000};

std::vector<std::unique_ptr<Node>> startNodes(int n, SchemePolicy policy, std::vector<Role> roles = {},
                                              int sendWindowBytes = 0, WirePrecision wire = WirePrecision::kFp32,
                                              std::function<void(NodeOptions&)> adjust = nullptr) {
  int port = freePort("127.0.0.1");
  std::vector<std::future<std::unique_ptr<Node>>> futures;
  for (int r = 0; r < n; ++r) {
    NodeOptions o;
    o.rank = r;
    o.worldSize = n;
    o.masterPort = port;
    o.role = roles.empty() ? Role::kBoth : roles[r];
    o.timeout = kNodeTimeout;
    o.settings.batch = testing::kScenarioBatch;
    o.settings.pairBytes = testing::kScenarioPairBytes;
    o.settings.policy = policy;
    o.van.sendWindowBytes = sendWindowBytes;
    o.settings.wire = wire;
    if (adjust) adjust(o);
    futures.push_back(std::async(std::launch::async, [o] { return Node::start(o, scenarioModel()); }));
  }
  std::vector<std::unique_ptr<Node>> nodes;
  for (auto& f : futures) nodes.push_back(f.get());
  return nodes;
}

void runAll(std::vector<std::unique_ptr<Node>>& nodes, int iterations, SchemePolicy policy, bool byLayer = false,
            double psTolerance = 1e-6) {
  std::vector<std::future<std::vector<testing::LayerCheck>>> futures;
  for (auto& n : nodes) {
    Node* node = n.get();
    futures.push_back(std::async(std::launch::async, [node, iterations, byLayer] {
      std::vector<testing::LayerCheck> checks;
      if (node->isWorker()) checks = runScenario(*node, iterations, 0, byLayer);
      node->finish();
      return checks;
    }));
  }
  for (auto& f : futures) {
    auto checks = f.get();
    for (size_t l = 0; l < checks.size(); ++l) {
      const auto& c = checks[l];
      if (c.scheme == Scheme::kPS) {
        EXPECT_TRUE(c.bitExact) << "layer " << l;
        // A 16-bit wire rounds the sum once for the way back: half an ulp of its 8 (bf16) or 11 (fp16)
        // significant bits, against the double sum of the rounded gradients.
        EXPECT_LT(c.maxRelError, psTolerance) << "layer " << l;
      } else {
        EXPECT_LT(c.maxRelError, 1e-5) << "layer " << l;
      }
      if (policy == SchemePolicy::kPS) {
        EXPECT_EQ(c.scheme, Scheme::kPS);
      }
    }
  }
}

TEST(NodeInProcess, ThreeNodesAutoScheme) {
  auto nodes = startNodes(3, SchemePolicy::kAuto);
  EXPECT_EQ(nodes[0]->schemeFor(4), Scheme::kSFB);  // huge
  EXPECT_EQ(nodes[0]->schemeFor(2), Scheme::kPS);   // odd
  runAll(nodes, 3, SchemePolicy::kAuto);
}

// --transport-security none: no CURVE even with a secret. Each rank holds a different secret, which
// under CURVE would keep every connection from completing its handshake (the job would time out);
// without it they join and sync exactly.
TEST(NodeInProcess, TransportSecurityNoneIgnoresTheSecret) {
  auto nodes = startNodes(3, SchemePolicy::kAuto, {}, 0, WirePrecision::kFp32, [](NodeOptions& o) {
    o.secret = "secret of rank " + std::to_string(o.rank);
    o.security = TransportSecurity::kNone;
  });
  EXPECT_EQ(nodes[0]->schemeFor(4), Scheme::kSFB);
  runAll(nodes, 2, SchemePolicy::kAuto);
  EXPECT_EQ(parseTransportSecurity("none"), TransportSecurity::kNone);
  EXPECT_EQ(std::string(transportSecurityName(TransportSecurity::kCurve)), "curve");
  EXPECT_ERROR_CONTAINS(parseTransportSecurity("tls"), InvalidArgument,
                        "transport security must be curve or none, got 'tls'");
}

TEST(NodeInProcess, AdamBaselineRebuildsOnTheLayerServer) {
  auto nodes = startNodes(3, SchemePolicy::kAdam);
  EXPECT_EQ(nodes[0]->schemeFor(4), Scheme::kAdam);
  EXPECT_EQ(nodes[0]->schemeFor(1), Scheme::kPS);  // conv
  runAll(nodes, 2, SchemePolicy::kAdam);
  // All of 'huge' meets on one server: its owner moved far more adam bytes than the others.
  int owner = nodes[0]->book().layerKeeperRank(4);
  for (auto& n : nodes) {
    auto t = n->counters().layer(4, TrafficKind::kAdam);
    if (n->rank() == owner) EXPECT_GT(t.bytesSent, 60000u * 4 * 2 * 2) << "owner";
    else EXPECT_LT(t.bytesSent, 20000u * 4) << n->rank();
  }
}

TEST(NodeInProcess, SeparateWorkerAndServerRoles) {
  auto nodes = startNodes(4, SchemePolicy::kPS, {Role::kWorker, Role::kServer, Role::kBoth, Role::kWorker});
  EXPECT_EQ(nodes[0]->book().numWorkers(), 3);
  EXPECT_EQ(nodes[0]->book().numServers(), 2);
  runAll(nodes, 2, SchemePolicy::kPS);
}

TEST(NodeInProcess, BroadcastAndBarrier) {
  auto nodes = startNodes(3, SchemePolicy::kAuto);
  std::vector<std::future<std::vector<float>>> futures;
  for (auto& n : nodes) {
    Node* node = n.get();
    futures.push_back(std::async(std::launch::async, [node] {
      // 40000 floats: several broadcast chunks of one pair each.
      std::vector<float> w(40000, static_cast<float>(node->rank()));
      std::vector<float> b(3, -1.f);
      if (node->rank() == 1) b = {1.5f, 2.5f, 3.5f};
      node->broadcast(0, LayerBuffer::contiguous(w.data(), 40000));
      node->broadcast(1, LayerBuffer({FloatSpan{b.data(), 1}, FloatSpan{b.data() + 1, 2}}));
      node->barrier();
      node->finish();
      w.insert(w.end(), b.begin(), b.end());
      return w;
    }));
  }
  for (auto& f : futures) {
    auto w = f.get();
    for (size_t i = 0; i < 40000; ++i) ASSERT_EQ(w[i], 0.f);
    EXPECT_EQ(w[40000], 1.5f);
    EXPECT_EQ(w[40002], 3.5f);
  }
}

// NodeOptions::deferReconstruction (a CUDA model's, the bench's GPU node): an SFB layer's factor set
// is complete as soon as both workers submitted it, but its GEMM is held until the worker hands over
// the iteration's last layer (iteration 1) or waits for a sync (iteration 0), and the mean is the
// same as without holding it.
TEST(NodeInProcess, DeferredReconstructionWaitsForTheBackwardsHandOver) {
  auto nodes = startNodes(2, SchemePolicy::kAuto, {}, 0, WirePrecision::kFp32,
                          [](NodeOptions& o) { o.deferReconstruction = true; });
  const int kHuge = 4;
  ASSERT_EQ(nodes[0]->schemeFor(kHuge), Scheme::kSFB);
  const ModelDesc& model = nodes[0]->book().model();
  const int L = static_cast<int>(model.layers.size());
  // Polls a condition that the other node's thread or the receive loop makes true (no wait of the
  // node's own may be called here: a wait releases what is held); the deadline is the nodes' timeout.
  auto until = [](const std::function<bool()>& what) {
    const auto deadline = std::chrono::steady_clock::now() + kNodeTimeout;
    while (!what()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  };
  std::vector<std::future<std::string>> futures;
  for (auto& n : nodes) {
    Node* node = n.get();
    futures.push_back(std::async(std::launch::async, [node, &model, L, until, kHuge]() -> std::string {
      const int me = node->book().workerIndex(node->rank());
      std::string failures;
      for (int64_t t = 0; t < 2; ++t) {
        node->beginIteration(t);
        std::vector<std::vector<float>> out(static_cast<size_t>(L)), us(L), vs(L);
        auto submit = [&](int l) {
          const LayerSpec& spec = model.layers[l];
          out[l].assign(static_cast<size_t>(spec.numel()), 0.f);
          if (node->schemeFor(l) == Scheme::kSFB) {
            us[l] = testing::factorU(me, l, t, testing::kScenarioBatch, spec.m);
            vs[l] = testing::factorV(me, l, t, testing::kScenarioBatch, spec.n);
            node->submitFactors(l, us[l].data(), vs[l].data(), testing::kScenarioBatch,
                                LayerBuffer::contiguous(out[l].data(), spec.numel()));
          } else {
            out[l] = testing::denseGradient(me, l, t, spec.numel());
            node->submitDense(l, LayerBuffer::contiguous(out[l].data(), spec.numel()));
          }
        };
        submit(kHuge);  // the top layer first, as a backward hands it over
        // Both factor sets in: the round is complete and its GEMM held, not run.
        if (!until([&] { return node->heldReconstructions() == 1; })) failures += "never held; ";
        if (node->layerReady(kHuge)) failures += "rebuilt before the hand-over; ";
        if (t == 0) {
          node->waitLayer(kHuge);  // a wait releases it: the caller has nothing more to hand over
        }
        for (int l = kHuge - 1; l >= 0; --l) submit(l);
        // Iteration 1: the last layer's submit released it (no wait of ours ran).
        if (!until([&] { return node->layerReady(kHuge); })) failures += "not rebuilt after the last submit; ";
        node->waitIteration();
        if (node->heldReconstructions() != 0) failures += "still held; ";
        auto ref = testing::referenceMean(model.layers[kHuge], Scheme::kSFB, 2, t, kHuge, testing::kScenarioBatch);
        double maxErr = 0, maxRef = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          maxErr = std::max(maxErr, std::abs(out[kHuge][i] - ref[i]));
          maxRef = std::max(maxRef, std::abs(ref[i]));
        }
        if (!(maxErr <= 1e-5 * maxRef)) failures += "iteration " + std::to_string(t) + ": wrong mean; ";
      }
      node->finish();
      return failures;
    }));
  }
  for (auto& f : futures) EXPECT_EQ(f.get(), "");
}

// Priority-scheduled links (a 4 KB window: every 64 KB pair in fragments), the barrier waited for
// layer by layer: the same exact results (multiprocess_test.cc compares them with FIFO's bit for bit).
TEST(NodeInProcess, PriorityLinksLayerByLayer) {
  auto nodes = startNodes(3, SchemePolicy::kAuto, {}, 4096);
  EXPECT_ERROR_CONTAINS(nodes[0]->waitLayer(9), InvalidArgument, "waitLayer: layer index 9 out of range");
  runAll(nodes, 3, SchemePolicy::kAuto, true);
}

// A node binds before it meets its peers, so the job's size reaches its van from NodeOptions::worldSize:
// past 8 peers the automatic receive buffer is seven eighths of the send window, and a job runs on it.
TEST(NodeInProcess, PastEightPeersNodesBindWithSevenEighthsOfTheWindow) {
  auto few = startNodes(3, SchemePolicy::kAuto, {}, 8192);
  for (auto& n : few) EXPECT_EQ(n->receiveBufferBytes(), 8192 * 4 / 3);
  runAll(few, 1, SchemePolicy::kAuto, true);
  auto many = startNodes(10, SchemePolicy::kAuto, {}, 8192);
  for (auto& n : many) EXPECT_EQ(n->receiveBufferBytes(), 7168);
  runAll(many, 2, SchemePolicy::kAuto, true);
}

TEST(NodeInProcess, PriorityLinksAreForBspJobsOnly) {
  NodeOptions o;
  o.settings.groups = 2;
  o.van.sendWindowBytes = 4096;
  EXPECT_ERROR_CONTAINS(Node::start(o, scenarioModel()), InvalidArgument,
                        "priority scheduling (a send window) is for BSP jobs");
}

// The default ZeroMQ I/O threads: half the host's cores over the ranks sharing it (LOCAL_WORLD_SIZE),
// 2 to 16; a malformed LOCAL_WORLD_SIZE is refused by name (it used to count as one rank, silently);
// an empty one is unset; a negative count of I/O threads is refused.
TEST(NodeInProcess, DefaultIoThreadsShareTheHostsCores) {
  const char* saved = std::getenv("LOCAL_WORLD_SIZE");
  const std::string keep = saved ? saved : "";
  const int alone = std::clamp(static_cast<int>(std::thread::hardware_concurrency() / 2), 2, 16);
  ::unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(defaultIoThreads(), alone);
  ::setenv("LOCAL_WORLD_SIZE", "4096", 1);
  EXPECT_EQ(defaultIoThreads(), 2);  // many ranks on a host: the floor
  ::setenv("LOCAL_WORLD_SIZE", "", 1);
  EXPECT_EQ(defaultIoThreads(), alone);
  ::setenv("LOCAL_WORLD_SIZE", "two", 1);
  EXPECT_ERROR_CONTAINS(defaultIoThreads(), InvalidArgument,
                        "environment variable LOCAL_WORLD_SIZE='two' is not an integer in [1, 1048576]");
  ::setenv("LOCAL_WORLD_SIZE", "0", 1);
  EXPECT_ERROR_CONTAINS(Node::start(NodeOptions{}, scenarioModel()), InvalidArgument,
                        "environment variable LOCAL_WORLD_SIZE='0' is not an integer in [1, 1048576]");
  if (saved)
    ::setenv("LOCAL_WORLD_SIZE", keep.c_str(), 1);
  else
    ::unsetenv("LOCAL_WORLD_SIZE");
  NodeOptions o;
  o.ioThreads = -1;
  EXPECT_ERROR_CONTAINS(Node::start(o, scenarioModel()), InvalidArgument,
                        "ZeroMQ I/O threads must be in [0, 64] (0: half the host's cores per rank on it), got -1");
  NodeOptions many;
  many.threads = 100000;  // aborted with a backtrace before the bound
  EXPECT_ERROR_CONTAINS(Node::start(many, scenarioModel()), InvalidArgument,
                        "the syncer thread pool needs 1 to 1024 threads, got 100000");
}

// freePort picks below the kernel's ephemeral range, where no outgoing connection or port-0 bind can
// take the port before its user binds it; the port binds.
TEST(NodeInProcess, FreePortsComeFromBelowTheEphemeralRange) {
  int low = 32768, high = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> low >> high)) GTEST_SKIP() << "no ip_local_port_range";
  if (low <= 10000 + 64) GTEST_SKIP() << "ephemeral range starts at " << low;
  for (int i = 0; i < 4; ++i) {
    const int port = freePort("127.0.0.1");
    EXPECT_GE(port, std::max(10000, low - 8192));
    EXPECT_LT(port, low);
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::router);
    s.set(zmq::sockopt::linger, 0);
    EXPECT_NO_THROW(s.bind("tcp://127.0.0.1:" + std::to_string(port)));
  }
}

// An address that is not this machine's binds no port, in the range or the kernel's: a clear error
// with ZeroMQ's reason, not a zmq::error_t from deep inside a launcher. 192.0.2.1 is TEST-NET-1.
TEST(NodeInProcess, FreePortOnAnAddressNotOursSaysSo) {
  int nonlocalBind = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_nonlocal_bind") >> nonlocalBind;
  if (nonlocalBind != 0) GTEST_SKIP() << "net.ipv4.ip_nonlocal_bind is on: any address binds here";
  EXPECT_ERROR_CONTAINS(freePort("192.0.2.1"), IoError,
                        "cannot bind a TCP port on 192.0.2.1: Cannot assign requested address");
}

// The shard's sums on the receive loop (0) or on 1 or 3 threads beside it (NodeOptions::sumThreads;
// every other test runs the default 2): each PS layer bit for bit the reference sum in worker order,
// whichever thread summed each pair and in whatever order the pairs completed.
TEST(NodeInProcess, SumsOnAnyNumberOfThreadsAreBitExact) {
  for (int threads : {0, 1, 3}) {
    SCOPED_TRACE(threads);
    auto nodes = startNodes(3, SchemePolicy::kPS, {}, 0, WirePrecision::kFp32,
                            [threads](NodeOptions& o) { o.sumThreads = threads; });
    runAll(nodes, 3, SchemePolicy::kPS);
    // The lanes did the sums (each node's shard gets pushes from the other two), or the loop did.
    for (const auto& n : nodes) {
      if (threads == 0)
        EXPECT_EQ(n->pushesSummedOnLanes(), 0);
      else
        EXPECT_GT(n->pushesSummedOnLanes(), 0);
    }
  }
  NodeOptions o;
  o.sumThreads = 65;
  EXPECT_ERROR_CONTAINS(Node::start(o, scenarioModel()), InvalidArgument,
                        "the shard's sum threads must be in [0, 64] (0: on the receive loop), got 65");
}

// A 16-bit wire: every PS result equals, bit for bit, each gradient rounded to 16 bits, summed in
// fp32 in worker order, rounded once and divided; every SFB result is the product of the rounded
// factors (float error only). Each layer's payload on the wire is exactly half of fp32's.
TEST(NodeInProcess, SixteenBitWireRoundsOnceAndSumsInFp32) {
  std::map<int, TrafficTotals> fp32;  // rank 1's sent and received data bytes per layer, fp32 wire
  {
    auto nodes = startNodes(3, SchemePolicy::kAuto);
    runAll(nodes, 2, SchemePolicy::kAuto);
    for (int l = 0; l < 5; ++l) {
      fp32[l] = nodes[1]->counters().layer(l, TrafficKind::kPS);
      fp32[l] += nodes[1]->counters().layer(l, TrafficKind::kSFB);
    }
  }
  for (auto [wire, tolerance] :
       {std::pair{WirePrecision::kBf16, 1.0 / 256}, std::pair{WirePrecision::kFp16, 1.0 / 2048}}) {
    SCOPED_TRACE(wirePrecisionName(wire));
    auto nodes = startNodes(3, SchemePolicy::kAuto, {}, 0, wire);
    EXPECT_EQ(nodes[0]->schemeFor(4), Scheme::kSFB);
    runAll(nodes, 2, SchemePolicy::kAuto, false, tolerance);
    for (int l = 0; l < 5; ++l) {
      TrafficTotals t = nodes[1]->counters().layer(l, TrafficKind::kPS);
      t += nodes[1]->counters().layer(l, TrafficKind::kSFB);
      ASSERT_EQ(t.messagesSent, fp32[l].messagesSent) << "layer " << l;
      ASSERT_EQ(t.messagesReceived, fp32[l].messagesReceived) << "layer " << l;
      EXPECT_EQ(2 * (t.bytesSent - t.messagesSent * kHeaderBytes),
                fp32[l].bytesSent - fp32[l].messagesSent * kHeaderBytes)
          << "layer " << l;
      EXPECT_EQ(2 * (t.bytesReceived - t.messagesReceived * kHeaderBytes),
                fp32[l].bytesReceived - fp32[l].messagesReceived * kHeaderBytes)
          << "layer " << l;
    }
  }
}

// Merged FC's model-parallel link: every worker (the FC server's own rank included, which does not
// send to itself) sends its round's activations to rank 0's FC server thread and gets its reply.
TEST(NodeInProcess, MergedFcExchangesEachWorkersRoundWithTheFcServer) {
  auto nodes = startNodes(3, SchemePolicy::kPS);
  constexpr int kRounds = 3;
  std::thread server([&] {
    std::map<std::pair<int, int64_t>, int> seen;
    for (int served = 0; served < 3 * kRounds;) {
      FcChannel::Request r;
      if (!nodes[0]->fc().nextRequest(&r, std::chrono::milliseconds(100))) continue;
      FcForwardView v = decodeFcForward(r.payload);
      ++seen[{r.from, r.round}];
      // loss: the lr plus the label sum; gradient: activation x 2 + the sender's rank.
      double loss = v.lr;
      std::vector<float> g(static_cast<size_t>(v.rows * v.cols));
      for (int64_t i = 0; i < v.rows; ++i) loss += static_cast<double>(v.labels[i]);
      for (size_t i = 0; i < g.size(); ++i) g[i] = v.activations[i] * 2 + static_cast<float>(r.from);
      nodes[0]->fc().sendReply(r.from, r.round, encodeFcBackward(loss, v.rows, v.cols, g.data()));
      ++served;
    }
    EXPECT_EQ(seen.size(), 3u * kRounds);  // each (worker, round) once
  });
  std::vector<std::thread> workers;
  for (auto& n : nodes) {
    Node* node = n.get();
    workers.emplace_back([node] {
      for (int64_t round = 0; round < kRounds; ++round) {
        const int rows = 2 + node->rank(), cols = 3;
        std::vector<float> x(static_cast<size_t>(rows * cols));
        std::vector<int64_t> y(static_cast<size_t>(rows), round);
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 0.25f * static_cast<float>(round);
        FcBackwardView v;
        std::vector<uint8_t> reply = node->fc().exchange(round, encodeFcForward(0.5f, rows, cols, x.data(), y.data()));
        v = decodeFcBackward(reply);
        EXPECT_EQ(v.rows, rows);
        EXPECT_EQ(v.cols, cols);
        EXPECT_EQ(v.loss, 0.5 + static_cast<double>(rows * round));
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(v.gradient[i], x[i] * 2 + static_cast<float>(node->rank()));
      }
      node->finish();
    });
  }
  for (auto& t : workers) t.join();
  server.join();
  // Only the FC server takes requests.
  FcChannel::Request r;
  EXPECT_ERROR_CONTAINS(nodes[1]->fc().nextRequest(&r, std::chrono::milliseconds(1)), InvalidArgument,
                        "rank 1 is not the FC server");
}

TEST(FcChannel, PayloadsRoundTripAndMalformedOnesAreRefused) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> y = {7, 9};
  std::vector<uint8_t> p = encodeFcForward(0.125f, 2, 3, x.data(), y.data());
  EXPECT_EQ(p.size(), 24u + 16u + 24u);
  FcForwardView f = decodeFcForward(p);
  EXPECT_EQ(f.lr, 0.125f);
  EXPECT_EQ(f.rows, 2);
  EXPECT_EQ(f.cols, 3);
  EXPECT_EQ(f.labels[1], 9);
  EXPECT_EQ(f.activations[5], 6.f);
  std::vector<uint8_t> cut(p.begin(), p.end() - 4);
  EXPECT_ERROR_CONTAINS(decodeFcForward(cut), ProtocolError,
                        "fc-forward: 2 x 3 needs 40 bytes after the head, the payload has 36");
  EXPECT_ERROR_CONTAINS(decodeFcForward(std::vector<uint8_t>(10)), ProtocolError,
                        "fc-forward of 10 bytes is shorter than its 24-byte head");
  std::vector<uint8_t> neg = p;
  neg[7] = 0x80;  // rows < 0
  EXPECT_ERROR_CONTAINS(decodeFcForward(neg), ProtocolError, "is not a matrix size");
  std::vector<uint8_t> b = encodeFcBackward(1.5, 2, 3, x.data());
  FcBackwardView v = decodeFcBackward(b);
  EXPECT_EQ(v.loss, 1.5);
  EXPECT_EQ(v.gradient[4], 5.f);
  b.push_back(0);
  EXPECT_ERROR_CONTAINS(decodeFcBackward(b), ProtocolError,
                        "fc-backward: 2 x 3 needs 24 bytes after the head, the payload has 25");

  // A worker's mailbox takes the reply to its outstanding round only, once; the server's queue is bounded.
  StickyError error;
  FcChannel channel(error, 2);
  EXPECT_ERROR_CONTAINS(channel.deliverReply(0, {}), ProtocolError,
                        "fc-backward for round 0, but no request is outstanding");
  channel.expectReply(4);
  EXPECT_ERROR_CONTAINS(channel.deliverReply(3, {}), ProtocolError,
                        "fc-backward for round 3, but round 4's is awaited");
  channel.deliverReply(4, {1, 2});
  EXPECT_ERROR_CONTAINS(channel.deliverReply(4, {}), ProtocolError, "no request is outstanding");
  std::vector<uint8_t> got;
  ASSERT_TRUE(channel.waitReply(&got, std::chrono::milliseconds(0)));
  EXPECT_EQ(got, (std::vector<uint8_t>{1, 2}));
  for (size_t i = 0; i < FcChannel::kMaxQueuedPerWorker; ++i) channel.deliverRequest({0, int64_t(i), {}});
  EXPECT_ERROR_CONTAINS(
      channel.deliverRequest({0, 9, {}}), ProtocolError,
      "fc-forward from rank 0 (round 9): 2 of its requests (2 in all) already wait for the FC server");
  channel.deliverRequest({1, 0, {}});  // another worker's still fits
  FcChannel::Request r;
  ASSERT_TRUE(channel.nextRequest(&r, std::chrono::milliseconds(0)));
  EXPECT_EQ(r.round, 0);
  // The job's error wakes a waiting worker with that error.
  channel.expectReply(5);
  error.set(std::make_exception_ptr(AbortedError("rank 2 failed")));
  EXPECT_ERROR_CONTAINS(channel.waitReply(&got, std::chrono::milliseconds(60000)), AbortedError, "rank 2 failed");
}

TEST(NodeInProcess, TimeoutNamesMissingLayerAndRank) {
  auto nodes = startNodes(2, SchemePolicy::kPS);
  // Rank 1 never submits; rank 0's barrier must time out naming what is missing.
  nodes[0]->beginIteration(0);
  nodes[1]->beginIteration(0);
  std::vector<float> g(scenarioModel().layers[3].numel(), 1.f);
  for (int l = 0; l < 5; ++l) {
    std::vector<float>* buf = new std::vector<float>(scenarioModel().layers[l].numel(), 1.f);
    nodes[0]->submitDense(l, LayerBuffer::contiguous(buf->data(), buf->size()), std::shared_ptr<void>(buf, [](void* p) { delete static_cast<std::vector<float>*>(p); }));
  }
  try {
    nodes[0]->waitIteration(std::chrono::milliseconds(1500));
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("rank 0 iteration 0: timed out after 1.5 s"), std::string::npos) << what;
    EXPECT_NE(what.find("layer 'huge' (ps): aggregates of pairs"), std::string::npos) << what;
  }
  // The failure is sticky, type and all, and was sent to rank 1: its wait ends with rank 0's
  // reason (AbortedError), not with a timeout of its own (that would be a TimeoutError).
  EXPECT_THROW(nodes[0]->waitIteration(), TimeoutError);
  EXPECT_THROW(nodes[1]->waitIteration(std::chrono::milliseconds(600000)), AbortedError);
}

// The rendezvous' refusals as a user meets them: rank 0's own timeout is a TimeoutError like every
// other rank's (it was a plain Error), and a settings mismatch names what differs, not all twelve
// settings of both ranks.
TEST(NodeInProcess, RendezvousRefusalsSayWhatIsWrong) {
  NodeOptions o;
  o.rank = 0;
  o.worldSize = 2;
  o.masterPort = freePort("127.0.0.1");
  o.timeout = std::chrono::milliseconds(1000);
  o.settings.batch = testing::kScenarioBatch;
  EXPECT_ERROR_CONTAINS(Node::start(o, scenarioModel()), TimeoutError, "waited 1 s for rank 1 to join coordinator");
  try {
    startNodes(2, SchemePolicy::kPS, {}, 0, WirePrecision::kFp32, [](NodeOptions& n) {
      if (n.rank == 1) {
        n.settings.batch *= 2;
        n.settings.startIteration = 6;
      }
    });
    FAIL() << "mismatched settings were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              strCat("settings mismatch between rank 0 and rank 1: batch=", testing::kScenarioBatch, " vs ",
                     2 * testing::kScenarioBatch,
                     ", start-iteration=0 vs 6 (every rank must pass the same; they resumed different checkpoints: is "
                     "another job writing the same checkpoint directory?)"));
  }
}

}  // namespace
}  // namespace poseidon
