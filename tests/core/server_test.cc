// The server role without sockets: KvServer (routing to the KV shard, Adam's
// server and the SFB keeper, and the messages it returns), AdamServer,
// SfbKeeper and KvShard::expire.
#include "poseidon/kvstore/server.h"

#include <gtest/gtest.h>

#include <cstring>

#include "expect_error.h"
#include "small_job.h"
#include "poseidon/common/error.h"
#include "poseidon/kvstore/contributors.h"
#include "poseidon/wire/messages.h"

namespace poseidon {
namespace {

using Clock = std::chrono::steady_clock;

InformationBook makeBook(SchemePolicy policy, int dropStragglers = 0) {
  return testing::smallJob(policy, dropStragglers);
}

Message message(FrameHeader h, int sender, const void* data, size_t bytes) {
  Message m;
  m.header = h;
  m.header.sender = static_cast<uint32_t>(sender);
  m.header.payloadBytes = bytes;
  m.payload = zmq::message_t(data, bytes);
  m.peer = "test";
  return m;
}

Message push(const InformationBook& book, int sender, int layer, int pair, int64_t it, std::vector<float> v) {
  (void)book;
  return message(wire::psPush(layer, it, pair), sender, v.data(), v.size() * 4);
}

std::vector<float> floatsOf(const KvServer::Outgoing& o) {
  return std::vector<float>(o.floats->begin() + o.offset, o.floats->begin() + o.offset + o.length);
}

TEST(KvServer, ReturnsTheAggregateForEveryWorkerOnceP1PushesArrived) {
  InformationBook book = makeBook(SchemePolicy::kAuto);
  const KvPair& p = book.layout().pairsOf(0)[0];
  KvServer server(book, p.shard);
  auto m0 = push(book, 2, 0, 0, 0, {1, 2, 3, 4});
  auto m1 = push(book, 0, 0, 0, 0, {10, 20, 30, 40});
  auto m2 = push(book, 1, 0, 0, 0, {100, 200, 300, 400});
  EXPECT_TRUE(server.handle(m0).empty());
  EXPECT_TRUE(server.handle(m1).empty());
  auto out = server.handle(m2);
  ASSERT_EQ(out.size(), 1u);
  const KvServer::Outgoing& o = out[0];
  EXPECT_EQ(o.to, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(o.header.type, MsgType::kPsAggregate);
  EXPECT_EQ(o.header.layer, 0u);
  EXPECT_EQ(o.header.pair, 0u);
  EXPECT_EQ(o.header.iteration, 0);
  EXPECT_EQ(floatsOf(o), (std::vector<float>{111, 222, 333, 444}));
  EXPECT_TRUE(o.trailer.empty());  // no contributor mask outside straggler mode
  ASSERT_EQ(o.parts().size(), 1u);
  EXPECT_EQ(o.parts()[0].bytes, 16u);
}

// A 16-bit wire: pushes are widened and summed in fp32 in worker order; the sum goes back rounded
// once; a push of the wrong size for the wire is refused. Straggler mode's mask still follows.
TEST(KvServer, SixteenBitWireSumsInFp32AndRoundsTheResultOnce) {
  InformationBook book = testing::smallJob(SchemePolicy::kAuto, 1, WirePrecision::kBf16);
  const KvPair& p = book.layout().pairsOf(0)[0];
  KvServer server(book, p.shard);
  auto narrow = [](std::vector<float> v) {
    std::vector<uint8_t> b(v.size() * 2);
    encodeFloats(v.data(), static_cast<int64_t>(v.size()), WirePrecision::kBf16, b.data());
    return b;
  };
  // 256 + 1 + 1 is 258 in fp32; rounding after each add (bf16 sums) would give 256 (ties to even twice).
  // 2^30 - 2^30 + 1 is 1 in worker order; in arrival order (1 + 2^30) - 2^30 it would be 0.
  const std::vector<float> a{256, 1.0f, 3.0f, 0x1p30f}, b{1, 1.0f / 3, 5.0f, -0x1p30f}, c{1, 0, 7.0f, 1};
  auto wrong = message(wire::psPush(0, 0, 0), 0, a.data(), a.size() * 4);  // fp32-sized
  EXPECT_ERROR_CONTAINS(server.handle(wrong), ProtocolError, "has 16 bytes, expected 8 (4 floats as bf16)");
  std::vector<std::vector<uint8_t>> wireBytes{narrow(a), narrow(b), narrow(c)};
  auto m2 = message(wire::psPush(0, 0, 0), 2, wireBytes[2].data(), 8);
  auto m0 = message(wire::psPush(0, 0, 0), 0, wireBytes[0].data(), 8);
  auto m1 = message(wire::psPush(0, 0, 0), 1, wireBytes[1].data(), 8);
  EXPECT_TRUE(server.handle(m2).empty());
  EXPECT_TRUE(server.handle(m0).empty());
  auto out = server.handle(m1);
  ASSERT_EQ(out.size(), 1u);
  const KvServer::Outgoing& o = out[0];
  EXPECT_EQ(o.floats, nullptr);
  std::vector<float> sum(4);
  for (int i = 0; i < 4; ++i) {
    sum[i] = bf16ToFloat(floatToBf16(a[i]));
    sum[i] += bf16ToFloat(floatToBf16(b[i]));
    sum[i] += bf16ToFloat(floatToBf16(c[i]));
  }
  ASSERT_EQ(sum[0], 258.0f) << "precondition: the fp32 sum differs from a bf16 one (256)";
  ASSERT_EQ(sum[3], 1.0f) << "precondition: the sum in worker order differs from arrival order's (0)";
  ASSERT_EQ(o.parts().size(), 2u);  // the rounded sum, then the contributor mask
  ASSERT_EQ(o.parts()[0].bytes, 8u);
  EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>(o.parts()[0].data),
                                 static_cast<const uint8_t*>(o.parts()[0].data) + 8),
            narrow(sum));
  EXPECT_EQ(decodeMask(o.trailer.data(), o.trailer.size(), 3), (std::vector<bool>{true, true, true}));
}

TEST(KvServer, RejectsWhatDoesNotFitAndChangesNothing) {
  InformationBook book = makeBook(SchemePolicy::kAuto);
  const KvPair& p = book.layout().pairsOf(0)[0];
  KvServer server(book, p.shard);
  auto shortPush = push(book, 0, 0, 0, 0, {1, 2, 3});
  EXPECT_THROW(server.handle(shortPush), ProtocolError);
  auto farFuture = push(book, 0, 0, 0, 5, {1, 2, 3, 4});
  EXPECT_ERROR_CONTAINS(server.handle(farFuture), ProtocolError, "outside the open window");
  // Not the server's roles in this job: no Adam server, no keeper.
  std::vector<float> f(2 * (4 + 3));
  auto adam = message(wire::adamFactors(1, 0, 2), 0, f.data(), f.size() * 4);
  EXPECT_ERROR_CONTAINS(server.handle(adam), ProtocolError, "not an adam server");
  auto notice = message(wire::sfbNotice(1, 0), 0, nullptr, 0);
  EXPECT_ERROR_CONTAINS(server.handle(notice), ProtocolError, "keeps no sfb rounds");
  auto heartbeat = message(wire::heartbeat(0), 0, nullptr, 0);
  EXPECT_ERROR_CONTAINS(server.handle(heartbeat), ProtocolError, "unexpected heartbeat");
  // The rejected pushes changed nothing: three good pushes still complete the round.
  for (int w : {0, 1}) {
    auto m = push(book, w, 0, 0, 0, {1, 1, 1, 1});
    EXPECT_TRUE(server.handle(m).empty());
  }
  auto last = push(book, 2, 0, 0, 0, {1, 1, 1, 1});
  auto out = server.handle(last);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(floatsOf(out[0]), (std::vector<float>{3, 3, 3, 3}));
  EXPECT_TRUE(KvServer::handles(MsgType::kPsPush));
  EXPECT_FALSE(KvServer::handles(MsgType::kPsAggregate));
}

TEST(KvServer, AdamRebuildsTheLayerAndReturnsItPairByPair) {
  InformationBook book = makeBook(SchemePolicy::kAdam);
  const int keeper = book.layerKeeperRank(1);
  KvServer server(book, book.shardIndex(keeper));
  // Worker w sends rows=1: u = (w+1) * [1, 2, 3, 4], v = [1, 0, 2].
  std::vector<float> expected(16, 0.0f);
  for (int w = 0; w < 3; ++w) {
    std::vector<float> uv{float(w + 1), float(2 * (w + 1)), float(3 * (w + 1)), float(4 * (w + 1)), 1, 0, 2};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) expected[i * 3 + j] += uv[i] * uv[4 + j];
      expected[12 + i] += uv[i];
    }
    auto m = message(wire::adamFactors(1, 0, 1), w, uv.data(), uv.size() * 4);
    auto out = server.handle(m);
    if (w < 2) {
      EXPECT_TRUE(out.empty());
      continue;
    }
    ASSERT_EQ(out.size(), book.layout().pairsOf(1).size());
    std::vector<float> got;
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_EQ(out[k].header.type, MsgType::kAdamAggregate);
      EXPECT_EQ(out[k].header.pair, k);
      EXPECT_EQ(out[k].to, (std::vector<int>{0, 1, 2}));
      auto part = floatsOf(out[k]);
      got.insert(got.end(), part.begin(), part.end());
    }
    EXPECT_EQ(got, expected);
  }
  // A second set for the same iteration from worker 0 is a protocol error.
  std::vector<float> uv(7, 1.0f);
  auto again = message(wire::adamFactors(1, 0, 1), 0, uv.data(), uv.size() * 4);
  EXPECT_THROW(server.handle(again), ProtocolError);
  // Factors for a layer this server does not keep, or with a wrong size.
  auto conv = message(wire::adamFactors(0, 1, 1), 0, uv.data(), uv.size() * 4);
  EXPECT_ERROR_CONTAINS(server.handle(conv), ProtocolError, "not an fc layer");
  auto wrong = message(wire::adamFactors(1, 1, 2), 0, uv.data(), uv.size() * 4);
  EXPECT_ERROR_CONTAINS(server.handle(wrong), ProtocolError, "2 rows");
}

TEST(KvServer, StragglerModeExpiresRoundsWithTheContributorsItHas) {
  InformationBook book = makeBook(SchemePolicy::kAuto, /*dropStragglers=*/1);
  const KvPair& p = book.layout().pairsOf(0)[1];
  KvServer server(book, p.shard);
  EXPECT_TRUE(server.hasDeadlines());
  const auto t0 = Clock::now();
  auto a = push(book, 0, 0, 1, 0, {1, 2});
  auto b = push(book, 2, 0, 1, 0, {10, 20});
  EXPECT_TRUE(server.handle(a, t0).empty());
  EXPECT_TRUE(server.handle(b, t0).empty());  // P1 - D = 2 in: the 100 ms deadline starts
  EXPECT_TRUE(server.expire(t0 + std::chrono::milliseconds(99)).empty());
  auto out = server.expire(t0 + std::chrono::milliseconds(100));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(floatsOf(out[0]), (std::vector<float>{11, 22}));
  EXPECT_EQ(decodeMask(out[0].trailer.data(), out[0].trailer.size(), 3), (std::vector<bool>{true, false, true}));
  // The straggler's late push is discarded, never mixed into a later round.
  auto late = push(book, 1, 0, 1, 0, {1000, 1000});
  EXPECT_TRUE(server.handle(late, t0 + std::chrono::milliseconds(150)).empty());
  for (int w = 0; w < 3; ++w) {
    auto next = push(book, w, 0, 1, 1, {1, 1});
    auto done = server.handle(next, t0 + std::chrono::milliseconds(200));
    if (w == 2) {
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(floatsOf(done[0]), (std::vector<float>{3, 3}));
    }
  }
}

TEST(KvServer, StragglerModeKeeperDecidesTheSfbContributors) {
  InformationBook book = makeBook(SchemePolicy::kAuto, /*dropStragglers=*/1);
  const int keeper = book.layerKeeperRank(1);
  KvServer server(book, book.shardIndex(keeper));
  const auto t0 = Clock::now();
  // All three notices: decided at once.
  for (int w = 0; w < 3; ++w) {
    auto n = message(wire::sfbNotice(1, 0), w, nullptr, 0);
    auto out = server.handle(n, t0);
    if (w < 2) {
      EXPECT_TRUE(out.empty());
    } else {
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].header.type, MsgType::kSfbDecision);
      EXPECT_EQ(out[0].to, (std::vector<int>{0, 1, 2}));
      EXPECT_EQ(decodeMask(out[0].trailer.data(), out[0].trailer.size(), 3), (std::vector<bool>{true, true, true}));
    }
  }
  // Iteration 1: two notices, then the deadline decides without worker 0.
  for (int w : {1, 2}) {
    auto n = message(wire::sfbNotice(1, 1), w, nullptr, 0);
    EXPECT_TRUE(server.handle(n, t0).empty());
  }
  auto out = server.expire(t0 + std::chrono::milliseconds(100));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.iteration, 1);
  EXPECT_EQ(decodeMask(out[0].trailer.data(), out[0].trailer.size(), 3), (std::vector<bool>{false, true, true}));
  // Worker 0's late notice is discarded; a duplicate is a protocol error.
  auto late = message(wire::sfbNotice(1, 1), 0, nullptr, 0);
  EXPECT_TRUE(server.handle(late, t0).empty());
  auto first = message(wire::sfbNotice(1, 2), 0, nullptr, 0);
  EXPECT_TRUE(server.handle(first, t0).empty());
  auto dup = message(wire::sfbNotice(1, 2), 0, nullptr, 0);
  EXPECT_ERROR_CONTAINS(server.handle(dup), ProtocolError, "duplicate sfb notice");
  // The conv layer has no SFB rounds to keep.
  auto conv = message(wire::sfbNotice(0, 2), 1, nullptr, 0);
  EXPECT_ERROR_CONTAINS(server.handle(conv), ProtocolError, "not an fc layer");
}

TEST(KvShardExpire, NothingExpiresOutsideStragglerModeOrBeforeTheDeadline) {
  InformationBook book = makeBook(SchemePolicy::kAuto);
  const KvPair& p = book.layout().pairsOf(0)[0];
  KvShard shard(book, p.shard);
  std::vector<float> v{1, 2, 3, 4};
  const auto t0 = Clock::now();
  shard.push(0, 0, 0, 0, reinterpret_cast<const uint8_t*>(v.data()), 16, t0);
  shard.push(1, 0, 0, 0, reinterpret_cast<const uint8_t*>(v.data()), 16, t0);
  EXPECT_TRUE(shard.expire(t0 + std::chrono::hours(1)).empty());  // no straggler mode: wait for all P1
  ASSERT_EQ(shard.openRounds().size(), 1u);
  EXPECT_NE(shard.openRounds()[0].find("waits for ranks 2"), std::string::npos) << shard.openRounds()[0];

  InformationBook sbook = makeBook(SchemePolicy::kAuto, 1);
  KvShard straggling(sbook, p.shard);
  straggling.push(0, 0, 0, 0, reinterpret_cast<const uint8_t*>(v.data()), 16, t0);
  EXPECT_TRUE(straggling.expire(t0 + std::chrono::hours(1)).empty());  // 1 < P1 - D: no deadline yet
  straggling.push(1, 0, 0, 0, reinterpret_cast<const uint8_t*>(v.data()), 16, t0);
  EXPECT_TRUE(straggling.expire(t0 + std::chrono::milliseconds(50)).empty());
  auto done = straggling.expire(t0 + std::chrono::milliseconds(100));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].sum, (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(done[0].contributors, (std::vector<bool>{true, true, false}));
  EXPECT_TRUE(straggling.openRounds().empty());
}

}  // namespace
}  // namespace poseidon
