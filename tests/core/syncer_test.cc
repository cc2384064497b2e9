// Syncer on its own, without sockets: a fake host records what it sends, runs
// the pool's tasks when the test says so, and collects layerDone and failures.
// The multi-process tests (tests/integration) run the same rounds over ZeroMQ.
#include "poseidon/client/syncer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <future>

#include "expect_error.h"
#include "small_job.h"
#include "poseidon/kvstore/contributors.h"
#include "poseidon/wire/messages.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;

constexpr int kConv = testing::kSmallConv;  // 6 floats: pairs of 4 and 2
constexpr int kFc = testing::kSmallFc;      // 4 x 3 + bias = 16 floats

InformationBook makeBook(int dropStragglers = 0) { return testing::smallJob(SchemePolicy::kAuto, dropStragglers); }

struct Sent {
  int dest;
  FrameHeader header;
  std::vector<float> floats;
};

class FakeHost : public SyncHost {
 public:
  FakeHost(InformationBook book, int rank) : book_(std::move(book)), rank_(rank) {}
  const InformationBook& book() const override { return book_; }
  int rank() const override { return rank_; }
  void send(int dest, const FrameHeader& header, const std::vector<Van::Part>& parts) override {
    if (duringSend) duringSend(dest, header);  // before the bytes are read, as a receive thread could
    Sent s{dest, header, {}};
    for (const auto& p : parts) {
      const auto* f = static_cast<const float*>(p.data);
      s.floats.insert(s.floats.end(), f, f + p.bytes / 4);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sent.push_back(std::move(s));
  }
  void schedule(std::function<void()> task) override { tasks.push_back(std::move(task)); }
  void layerDone(int layer, int64_t iteration) override { done.push_back({layer, iteration}); }
  void fail(std::exception_ptr error) override { failures.push_back(error); }
  int64_t currentIteration() const override { return iteration; }
  Tracer* tracer() const override { return nullptr; }

  void runTasks() {
    while (!tasks.empty()) {
      auto t = std::move(tasks.front());
      tasks.pop_front();
      t();
    }
  }
  std::string failure(size_t i = 0) const {
    try {
      std::rethrow_exception(failures.at(i));
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  InformationBook book_;
  int rank_;
  int64_t iteration = 0;
  std::function<void(int, const FrameHeader&)> duringSend;
  std::mutex mutex_;
  std::vector<Sent> sent;
  std::deque<std::function<void()>> tasks;
  std::vector<std::pair<int, int64_t>> done;
  std::vector<std::exception_ptr> failures;
};

Message message(FrameHeader h, int sender, const std::vector<float>& floats, const std::vector<uint8_t>& tail = {}) {
  Message m;
  m.header = h;
  m.header.sender = static_cast<uint32_t>(sender);
  std::vector<uint8_t> bytes(floats.size() * 4);
  std::memcpy(bytes.data(), floats.data(), bytes.size());
  bytes.insert(bytes.end(), tail.begin(), tail.end());
  m.header.payloadBytes = bytes.size();
  m.payload = zmq::message_t(bytes.data(), bytes.size());
  m.peer = "test";
  return m;
}

// The aggregate of a conv pair as its owner would send it.
Message aggregate(const InformationBook& book, int pair, int64_t it, std::vector<float> sum,
                  const std::vector<bool>& mask = {}) {
  const KvPair& p = book.layout().pairsOf(kConv)[pair];
  return message(wire::psAggregate(kConv, it, pair), book.shardRank(p.shard), sum,
                 mask.empty() ? std::vector<uint8_t>{} : encodeMask(mask));
}

TEST(Syncer, PsRoundPushesEveryPairToItsOwnerAndWritesTheMean) {
  FakeHost host(makeBook(), 1);
  Syncer s(host, kConv);
  std::vector<float> grad{1, 2, 3, 4, 5, 6};
  s.submitDense(0, LayerBuffer::contiguous(grad.data(), 6), nullptr);
  EXPECT_TRUE(host.sent.empty());  // Send runs on the pool, not on the caller's thread
  host.runTasks();
  const auto& pairs = host.book().layout().pairsOf(kConv);
  ASSERT_EQ(host.sent.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(host.sent[i].dest, host.book().shardRank(pairs[i].shard));
    EXPECT_EQ(host.sent[i].header.type, MsgType::kPsPush);
    EXPECT_EQ(host.sent[i].header.pair, static_cast<uint32_t>(i));
    EXPECT_EQ(host.sent[i].header.iteration, 0);
  }
  EXPECT_EQ(host.sent[0].floats, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(host.sent[1].floats, (std::vector<float>{5, 6}));
  auto a1 = aggregate(host.book(), 1, 0, {30, 60});
  s.onAggregate(a1);
  EXPECT_TRUE(host.done.empty());  // one pair still missing
  auto a0 = aggregate(host.book(), 0, 0, {3, 6, 9, 12});
  s.onAggregate(a0);
  EXPECT_EQ(grad, (std::vector<float>{1, 2, 3, 4, 10, 20}));
  EXPECT_EQ(host.done, (std::vector<std::pair<int, int64_t>>{{kConv, 0}}));
  EXPECT_TRUE(host.failures.empty());
  EXPECT_EQ(s.contributors(0).size(), 2u);
}

TEST(Syncer, SfbRoundRebuildsTheMeanGradientFromEveryWorkersFactors) {
  FakeHost host(makeBook(), 1);
  Syncer s(host, kFc);
  std::vector<float> out(16, -1.0f);
  std::vector<float> u{1, 2, 3, 4}, v{1, 0, 2};  // rows = 1
  s.submitFactors(0, Scheme::kSFB, u.data(), v.data(), 1, LayerBuffer::contiguous(out.data(), 16), nullptr);
  host.runTasks();
  ASSERT_EQ(host.sent.size(), 3u);  // peers first, itself last
  EXPECT_EQ(host.sent[0].dest, 0);
  EXPECT_EQ(host.sent[1].dest, 2);
  EXPECT_EQ(host.sent[2].dest, 1);
  EXPECT_EQ(host.sent[0].header.type, MsgType::kSfbFactors);
  EXPECT_EQ(wire::factorRows(host.sent[0].header), 1);
  EXPECT_EQ(host.sent[0].floats, (std::vector<float>{1, 2, 3, 4, 1, 0, 2}));
  // Worker w's factors: u * (w + 1), v.
  std::vector<float> expect(16, 0.0f);
  for (int w = 0; w < 3; ++w) {
    std::vector<float> uv;
    for (float x : u) uv.push_back(x * float(w + 1));
    uv.insert(uv.end(), v.begin(), v.end());
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) expect[i * 3 + j] += uv[i] * v[j] / 3;
      expect[12 + i] += uv[i] / 3;
    }
    auto m = message(wire::sfbFactors(kFc, 0, 1), w, uv);
    s.onFactors(m);
  }
  EXPECT_TRUE(host.done.empty());  // the GEMM runs on the pool
  ASSERT_EQ(host.tasks.size(), 1u);
  host.runTasks();
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(out[i], expect[i], 1e-6f) << i;
  EXPECT_EQ(host.done, (std::vector<std::pair<int, int64_t>>{{kFc, 0}}));
  EXPECT_EQ(s.contributors(0), (std::vector<std::vector<bool>>{{true, true, true}}));
}

// A CUDA layer's rebuild (FactorRebuild) gets every worker's factors in worker order and the scale,
// in place of the host GEMM: the output buffer stays untouched and the layer is done once it returns.
TEST(Syncer, SfbRoundWithTheCallersRebuildHandsItEveryWorkersFactors) {
  FakeHost host(makeBook(), 1);
  Syncer s(host, kFc);
  std::vector<float> out(16, -1.0f);
  std::vector<float> u{1, 2, 3, 4}, v{1, 0, 2};
  std::vector<std::vector<float>> seenU, seenV;
  float seenScale = 0;
  s.submitFactors(0, Scheme::kSFB, u.data(), v.data(), 1, LayerBuffer::contiguous(out.data(), 16), nullptr,
                  [&](const std::vector<FactorView>& workers, float scale) {
                    for (const auto& w : workers) {
                      seenU.emplace_back(w.u, w.u + w.rows * 4);
                      seenV.emplace_back(w.v, w.v + w.rows * 3);
                    }
                    seenScale = scale;
                  });
  host.runTasks();
  for (int w = 0; w < 3; ++w) {
    std::vector<float> uv{float(w + 1), 0, 0, 0, 0, float(w), 0};
    auto m = message(wire::sfbFactors(kFc, 0, 1), w, uv);
    s.onFactors(m);
  }
  EXPECT_TRUE(host.done.empty());  // the rebuild runs on the pool
  host.runTasks();
  ASSERT_EQ(seenU.size(), 3u);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(seenU[w], (std::vector<float>{float(w + 1), 0, 0, 0})) << w;
    EXPECT_EQ(seenV[w], (std::vector<float>{0, float(w), 0})) << w;
  }
  EXPECT_FLOAT_EQ(seenScale, 1.0f / 3);
  EXPECT_EQ(out, std::vector<float>(16, -1.0f));
  EXPECT_EQ(host.done, (std::vector<std::pair<int, int64_t>>{{kFc, 0}}));
}

TEST(Syncer, SchemeMismatchFailsTheJobWithTheReasonAndSendsNothing) {
  FakeHost host(makeBook(), 1);
  Syncer s(host, kFc);
  std::vector<float> uv(7, 1.0f);
  auto early = message(wire::sfbFactors(kFc, 0, 1), 0, uv);
  s.onFactors(early);  // worker 0 chose SFB
  std::vector<float> grad(16, 1.0f);
  s.submitDense(0, LayerBuffer::contiguous(grad.data(), 16), nullptr);  // this worker chose PS
  host.runTasks();
  EXPECT_TRUE(host.sent.empty());
  ASSERT_EQ(host.failures.size(), 1u);
  EXPECT_THAT(host.failure(), HasSubstr("layer 'fc' iteration 0: this rank chose ps but another worker sent sfb factors"));
  EXPECT_THAT(host.failure(), HasSubstr("workers must use the same batch size and scheme policy"));
  EXPECT_THROW(std::rethrow_exception(host.failures[0]), InvalidArgument);

  // And the other way round: our PS push is out, then factors arrive.
  FakeHost other(makeBook(), 1);
  Syncer t(other, kFc);
  t.submitDense(0, LayerBuffer::contiguous(grad.data(), 16), nullptr);
  auto factors = message(wire::sfbFactors(kFc, 0, 1), 2, uv);
  t.onFactors(factors);
  ASSERT_EQ(other.failures.size(), 1u);
  EXPECT_THAT(other.failure(), HasSubstr("rank 2 sent sfb factors (1 rows) but this rank chose ps"));
}

TEST(Syncer, MessagesThatDoNotFitAreProtocolErrorsAndChangeNothing) {
  FakeHost host(makeBook(), 1);
  Syncer s(host, kConv);
  auto beforePush = aggregate(host.book(), 0, 0, {1, 1, 1, 1});
  EXPECT_ERROR_CONTAINS(s.onAggregate(beforePush), ProtocolError, "which this worker has not pushed");
  std::vector<float> grad(6, 3.0f);
  s.submitDense(0, LayerBuffer::contiguous(grad.data(), 6), nullptr);
  host.runTasks();
  const int owner = host.book().shardRank(host.book().layout().pairsOf(kConv)[0].shard);
  auto wrongSender = message(wire::psAggregate(kConv, 0, 0), (owner + 1) % 3, {1, 1, 1, 1});
  EXPECT_ERROR_CONTAINS(s.onAggregate(wrongSender), ProtocolError, "which does not own that pair");
  auto noSuchPair = message(wire::psAggregate(kConv, 0, 7), owner, {1});
  EXPECT_ERROR_CONTAINS(s.onAggregate(noSuchPair), ProtocolError, "which does not exist");
  auto shortOne = aggregate(host.book(), 0, 0, {1, 1, 1});
  EXPECT_ERROR_CONTAINS(s.onAggregate(shortOne), ProtocolError, "has 12 bytes");
  auto farAhead = aggregate(host.book(), 0, 5, {1, 1, 1, 1});
  EXPECT_ERROR_CONTAINS(s.onAggregate(farAhead), ProtocolError, "iteration 5, which this worker has not pushed");
  auto factorsFarAhead = message(wire::sfbFactors(kFc, 5, 1), 0, std::vector<float>(7, 1.0f));
  Syncer fcAhead(host, kFc);
  EXPECT_ERROR_CONTAINS(fcAhead.onFactors(factorsFarAhead), ProtocolError, "outside the open window (0..1)");
  auto good = aggregate(host.book(), 0, 0, {3, 3, 3, 3});
  s.onAggregate(good);
  auto duplicate = aggregate(host.book(), 0, 0, {3, 3, 3, 3});
  EXPECT_ERROR_CONTAINS(s.onAggregate(duplicate), ProtocolError, "duplicate aggregate");
  EXPECT_TRUE(host.done.empty());
  auto last = aggregate(host.book(), 1, 0, {6, 6});
  s.onAggregate(last);
  EXPECT_EQ(grad, (std::vector<float>{1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(host.done.size(), 1u);
  EXPECT_TRUE(host.failures.empty());
  // The round is finished: a late aggregate for it is stale.
  auto stale = aggregate(host.book(), 1, 0, {6, 6});
  EXPECT_ERROR_CONTAINS(s.onAggregate(stale), ProtocolError, "has not pushed");
  // Factors for a non-FC layer, of the wrong size, and submitting a layer twice.
  auto convFactors = message(wire::sfbFactors(kConv, 0, 1), 0, {1, 2});
  EXPECT_ERROR_CONTAINS(s.onFactors(convFactors), ProtocolError, "non-fc layer");
  Syncer fc(host, kFc);
  auto badSize = message(wire::sfbFactors(kFc, 0, 2), 0, std::vector<float>(7, 1.0f));
  EXPECT_ERROR_CONTAINS(fc.onFactors(badSize), ProtocolError, "with 2 rows have 28 bytes, expected 56");
  EXPECT_ERROR_CONTAINS(s.submitDense(0, LayerBuffer::contiguous(grad.data(), 6), nullptr), InvalidArgument,
                        "layer 'conv' submitted twice in iteration 0");
  EXPECT_ERROR_CONTAINS(s.submitDense(1, LayerBuffer::contiguous(grad.data(), 5), nullptr), InvalidArgument,
                        "gradient has 5 floats, expected 6");
}

// While a pair of our push is being read, its result must not be written into
// that memory; and the receive thread must not wait for the send to finish.
TEST(Syncer, AResultArrivingDuringTheSendIsHeldNotWrittenIntoTheMemoryBeingSent) {
  for (int straggler : {0, 1}) {
    SCOPED_TRACE(straggler ? "straggler mode" : "normal mode");
    FakeHost host(makeBook(straggler), 1);
    Syncer s(host, kConv);
    const std::vector<bool> all{true, true, true};
    std::vector<float> grad{1, 2, 3, 4, 5, 6};
    bool delivered = false;
    host.duringSend = [&](int, const FrameHeader& h) {
      if (h.pair != 0 || delivered) return;
      delivered = true;
      // From another thread, as the receive loop would: it must not block on the sender.
      auto receiver = std::async(std::launch::async, [&] {
        auto a = aggregate(host.book(), 0, 0, {30, 30, 30, 30}, straggler ? all : std::vector<bool>{});
        s.onAggregate(a);
      });
      ASSERT_EQ(receiver.wait_for(std::chrono::seconds(30)), std::future_status::ready)
          << "the receive thread waited for the sender";
      receiver.get();
    };
    s.submitDense(0, LayerBuffer::contiguous(grad.data(), 6), nullptr);
    host.runTasks();
    ASSERT_TRUE(delivered);
    ASSERT_EQ(host.sent.size(), 2u);
    EXPECT_EQ(host.sent[0].floats, (std::vector<float>{1, 2, 3, 4}));  // our gradient, not the result
    EXPECT_EQ(grad, (std::vector<float>{10, 10, 10, 10, 5, 6}));      // the held result, written after the send
    EXPECT_TRUE(host.done.empty());
    auto a1 = aggregate(host.book(), 1, 0, {3, 3}, straggler ? all : std::vector<bool>{});
    s.onAggregate(a1);
    EXPECT_EQ(grad, (std::vector<float>{10, 10, 10, 10, 1, 1}));
    EXPECT_EQ(host.done.size(), 1u);
  }
}

TEST(Syncer, StragglerModeTakesResultsThatFinishedWithoutThisWorker) {
  FakeHost host(makeBook(1), 1);
  Syncer s(host, kConv);
  const std::vector<bool> without1{true, false, true};
  EXPECT_FALSE(s.completeWithoutMe(0));
  auto a0 = aggregate(host.book(), 0, 0, {2, 4, 6, 8}, without1);
  s.onAggregate(a0);
  EXPECT_FALSE(s.completeWithoutMe(0));  // one pair still open
  auto a1 = aggregate(host.book(), 1, 0, {10, 20}, without1);
  s.onAggregate(a1);
  EXPECT_TRUE(s.completeWithoutMe(0));
  EXPECT_TRUE(host.done.empty());  // nothing is done before this worker takes the round
  std::vector<float> out(6, 0.0f);
  s.submitSkipped(0, LayerBuffer::contiguous(out.data(), 6));
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 10}));  // divided by the 2 contributors
  EXPECT_EQ(host.done, (std::vector<std::pair<int, int64_t>>{{kConv, 0}}));
  EXPECT_TRUE(host.sent.empty());
  EXPECT_EQ(s.contributors(0), (std::vector<std::vector<bool>>{without1, without1}));
  EXPECT_EQ(s.droppedContributions(), 0);  // skipped, not dropped: it never contributed

  // A late submit after one pair finished without us pushes only the open pair.
  host.iteration = 1;
  auto b0 = aggregate(host.book(), 0, 1, {2, 2, 2, 2}, without1);
  s.onAggregate(b0);
  std::vector<float> grad{9, 9, 9, 9, 9, 9};
  s.submitDense(1, LayerBuffer::contiguous(grad.data(), 6), nullptr);
  host.runTasks();
  ASSERT_EQ(host.sent.size(), 1u);
  EXPECT_EQ(host.sent[0].header.pair, 1u);
  auto b1 = aggregate(host.book(), 1, 1, {27, 27}, {true, true, true});
  s.onAggregate(b1);
  EXPECT_EQ(grad, (std::vector<float>{1, 1, 1, 1, 9, 9}));
  EXPECT_EQ(s.droppedContributions(), 1);  // pair 0 of iteration 1 finished without our push
}

TEST(Syncer, StragglerModeSfbUsesExactlyTheKeepersDecision) {
  FakeHost host(makeBook(1), 1);
  Syncer s(host, kFc);
  std::vector<float> out(16, 0.0f);
  std::vector<float> uv{1, 1, 1, 1, 1, 2, 3};
  for (int w : {0, 2}) {
    auto m = message(wire::sfbFactors(kFc, 0, 1), w, uv);
    s.onFactors(m);
  }
  const int keeper = host.book().layerKeeperRank(kFc);
  auto decision = message(wire::sfbDecision(kFc, 0), keeper, {}, encodeMask({true, false, true}));
  s.onDecision(decision);
  EXPECT_TRUE(s.completeWithoutMe(0));
  s.submitSkipped(0, LayerBuffer::contiguous(out.data(), 16));
  host.runTasks();
  EXPECT_EQ(host.done.size(), 1u);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(out[j], uv[4 + j]);  // mean of two identical sets
  EXPECT_FLOAT_EQ(out[12], 1.0f);
  auto fromNonKeeper = message(wire::sfbDecision(kFc, 1), (keeper + 1) % 3, {}, encodeMask({true, true, true}));
  EXPECT_ERROR_CONTAINS(s.onDecision(fromNonKeeper), ProtocolError, "which does not keep it");
  // This worker's own late factors for iteration 0 are ignored, not an error.
  auto late = message(wire::sfbFactors(kFc, 0, 1), 1, uv);
  s.onFactors(late);
  EXPECT_TRUE(host.failures.empty());
}

TEST(Syncer, PendingNamesWhatIsMissingAndFromWhom) {
  FakeHost host(makeBook(), 1);
  Syncer conv(host, kConv), fc(host, kFc);
  EXPECT_THAT(conv.pending(0), HasSubstr("layer 'conv' was not submitted"));
  std::vector<float> grad(6, 1.0f), out(16, 0.0f), u(4, 1.0f), v(3, 1.0f);
  conv.submitDense(0, LayerBuffer::contiguous(grad.data(), 6), nullptr);
  fc.submitFactors(0, Scheme::kSFB, u.data(), v.data(), 1, LayerBuffer::contiguous(out.data(), 16), nullptr);
  host.runTasks();
  const auto& pairs = host.book().layout().pairsOf(kConv);
  EXPECT_THAT(conv.pending(0), HasSubstr(strCat("layer 'conv' (ps): aggregates of pairs 0,1 from server rank(s) ")));
  EXPECT_THAT(conv.pending(0), HasSubstr(std::to_string(host.book().shardRank(pairs[0].shard))));
  auto mine = message(wire::sfbFactors(kFc, 0, 1), 1, std::vector<float>(7, 1.0f));
  fc.onFactors(mine);
  EXPECT_EQ(fc.pending(0), "layer 'fc' (sfb): factors from worker rank(s) 0,2");
}

}  // namespace
}  // namespace poseidon
