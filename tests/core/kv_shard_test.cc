#include "poseidon/kvstore/kv_shard.h"

#include <gtest/gtest.h>

#include <cstring>

namespace poseidon {
namespace {

struct Fixture {
  ModelDesc model;
  InformationBook book;
  Fixture() {
    model.layers.push_back(LayerSpec::fc("fc", 3, 3));  // 12 floats
    std::vector<NodeInfo> nodes;
    for (int r = 0; r < 3; ++r) nodes.push_back({r, Role::kBoth, "tcp://x:1"});
    JobSettings s;
    s.pairBytes = 5 * 4;  // pairs of 5, 5, 2 floats
    book = InformationBook(1, nodes, model, s);
  }
};

std::vector<uint8_t> bytesOf(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The shard's one pass per push (decoded a block at a time and added in place) gives the sum of
// the decoded contributions in order, bit for bit, across block boundaries and on every wire.
TEST(KvShard, AccumulatingInPlaceEqualsDecodeThenAdd) {
  const int64_t n = 3 * 4096 + 17;
  for (WirePrecision wire : {WirePrecision::kFp32, WirePrecision::kBf16, WirePrecision::kFp16}) {
    std::vector<float> reference, sum;
    bool started = false;
    for (int w = 0; w < 3; ++w) {
      std::vector<float> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        values[static_cast<size_t>(i)] = 0.001f * static_cast<float>((i * 7 + w * 13) % 101) - 0.05f;
      std::vector<uint8_t> bytes(static_cast<size_t>(n) * wireElementBytes(wire));
      encodeFloats(values.data(), n, wire, bytes.data());
      std::vector<float> decoded(static_cast<size_t>(n));
      decodeFloats(bytes.data(), n, wire, decoded.data());
      if (w == 0)
        reference = decoded;
      else
        for (size_t i = 0; i < decoded.size(); ++i) reference[i] += decoded[i];
      accumulateContribution(sum, started, bytes.data(), n, wire);
    }
    ASSERT_EQ(sum.size(), reference.size());
    EXPECT_EQ(0, std::memcmp(sum.data(), reference.data(), sum.size() * sizeof(float))) << wirePrecisionName(wire);
  }
}

TEST(KvShard, SumsInWorkerOrderAndCompletesAtP1) {
  Fixture f;
  const KvPair& p = f.book.layout().pairsOf(0)[0];
  KvShard shard(f.book, p.shard);
  std::vector<float> a{1e8f, 1, 2, 3, 4}, b{1, 1, 1, 1, 1}, c{-1e8f, 0, 0, 0, 0};
  // Arrival order 2, 0, 1; the sum is taken in order 0, 1, 2.
  EXPECT_FALSE(shard.push(2, 0, 0, 0, bytesOf(c).data(), 20).has_value());
  EXPECT_FALSE(shard.push(0, 0, 0, 0, bytesOf(a).data(), 20).has_value());
  auto done = shard.push(1, 0, 0, 0, bytesOf(b).data(), 20);
  ASSERT_TRUE(done.has_value());
  std::vector<float> expect(5);
  for (int i = 0; i < 5; ++i) expect[i] = (a[i] + b[i]) + c[i];
  EXPECT_EQ(done->sum, expect);  // bit-exact: (1e8 + 1) - 1e8 == 0 in float, as in order 0,1,2
  EXPECT_EQ(done->iteration, 0);
}

TEST(KvShard, FutureIterationIsBufferedNotMixed) {
  Fixture f;
  const KvPair& p = f.book.layout().pairsOf(0)[2];  // 2 floats
  KvShard shard(f.book, p.shard);
  std::vector<float> one{1, 1}, ten{10, 10};
  auto b1 = bytesOf(one), b10 = bytesOf(ten);
  EXPECT_FALSE(shard.push(0, 0, 2, 0, b1.data(), 8));
  EXPECT_FALSE(shard.push(0, 0, 2, 1, b10.data(), 8));  // rank 0 already in iteration 1
  EXPECT_FALSE(shard.push(1, 0, 2, 0, b1.data(), 8));
  auto d0 = shard.push(2, 0, 2, 0, b1.data(), 8);
  ASSERT_TRUE(d0);
  EXPECT_EQ(d0->sum, (std::vector<float>{3, 3}));
  EXPECT_FALSE(shard.push(1, 0, 2, 1, b10.data(), 8));
  auto d1 = shard.push(2, 0, 2, 1, b10.data(), 8);
  ASSERT_TRUE(d1);
  EXPECT_EQ(d1->sum, (std::vector<float>{30, 30}));
}

TEST(KvShard, RejectsBadPushesWithoutChangingState) {
  Fixture f;
  const KvPair& p = f.book.layout().pairsOf(0)[0];
  KvShard shard(f.book, p.shard);
  std::vector<float> v{1, 2, 3, 4, 5};
  auto b = bytesOf(v);
  EXPECT_THROW(shard.push(0, 0, 0, 0, b.data(), 16), ProtocolError);    // wrong length
  EXPECT_THROW(shard.push(0, 5, 0, 0, b.data(), 20), ProtocolError);    // no such layer
  EXPECT_THROW(shard.push(0, 0, 9, 0, b.data(), 20), ProtocolError);    // no such pair
  EXPECT_THROW(shard.push(7, 0, 0, 0, b.data(), 20), ProtocolError);    // not a worker
  EXPECT_THROW(shard.push(0, 0, 0, 5, b.data(), 20), ProtocolError);    // too far ahead
  EXPECT_THROW(shard.push(0, 0, 0, -1, b.data(), 20), ProtocolError);   // already complete
  int other = -1;
  for (const auto& q : f.book.layout().pairsOf(0))
    if (q.shard != p.shard) other = q.index;
  ASSERT_GE(other, 0);
  EXPECT_THROW(shard.push(0, 0, other, 0, b.data(), 20), ProtocolError);  // owned by another shard
  EXPECT_FALSE(shard.push(0, 0, 0, 0, b.data(), 20));
  EXPECT_THROW(shard.push(0, 0, 0, 0, b.data(), 20), ProtocolError);  // duplicate
  EXPECT_FALSE(shard.push(1, 0, 0, 0, b.data(), 20));
  auto d = shard.push(2, 0, 0, 0, b.data(), 20);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->sum, (std::vector<float>{3, 6, 9, 12, 15}));  // the rejected pushes changed nothing
}

}  // namespace
}  // namespace poseidon

namespace poseidon {
namespace {

// A layer whose rounds went by SFB for a while (its factors), then by PS again: the
// push carries the gap since the layer's previous PS round, and the shard takes it
// as the pair's next round; without the gap such a push is still outside the window.
TEST(KvShard, APushAfterAStretchOfSfbRoundsIsThePairsNextRound) {
  Fixture f;
  const KvPair& p = f.book.layout().pairsOf(0)[2];  // 2 floats
  KvShard shard(f.book, p.shard);
  std::vector<float> one{1, 1};
  auto b = bytesOf(one);
  for (int w = 0; w < 3; ++w) shard.push(w, 0, 2, 0, b.data(), 8);  // round 0 by PS
  try {
    shard.push(0, 0, 2, 4, b.data(), 8);
    ADD_FAILURE() << "a push 4 iterations ahead without a gap was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("outside the open window (1..2)"), std::string::npos) << e.what();
  }
  const auto now = KvShard::Clock::now();
  EXPECT_FALSE(shard.push(0, 0, 2, 4, b.data(), 8, now, /*gap=*/4));  // rounds 1-3 went by SFB
  EXPECT_FALSE(shard.push(2, 0, 2, 4, b.data(), 8, now, 4));
  auto done = shard.push(1, 0, 2, 4, b.data(), 8, now, 4);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->iteration, 4);
  EXPECT_EQ(done->sum, (std::vector<float>{3, 3}));
  // A gap that does not lead back to the last completed round (4) is no excuse.
  EXPECT_THROW(shard.push(0, 0, 2, 9, b.data(), 8, now, 2), ProtocolError);
  EXPECT_FALSE(shard.push(0, 0, 2, 5, b.data(), 8, now, 1));
}

}  // namespace
}  // namespace poseidon
