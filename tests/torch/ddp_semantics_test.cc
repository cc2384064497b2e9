// DDP's semantics, which a user holds us to: unused parameters at any step and
// on any subset of ranks, BatchNorm buffers, gradient accumulation (no_sync),
// and misuse on one rank reaching every rank. Ranks are threads of one process,
// each with its own node and sockets, as in distributed_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "poseidon/launch/env.h"
#include "poseidon/torch/distributed.h"
#include "rank_options.h"

namespace poseidon::pt {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 4;

// trunk (SFB at 2 workers x 4 rows: 64x64) -> head; a side branch of an SFB
// layer (48x64) and a PS layer (3x48, too small for SFB) that a step may skip.
struct Branchy : torch::nn::Module {
  Branchy() {
    trunk = register_module("trunk", torch::nn::Linear(64, 64));
    sideBig = register_module("sideBig", torch::nn::Linear(64, 48));
    sideSmall = register_module("sideSmall", torch::nn::Linear(48, 3));
    head = register_module("head", torch::nn::Linear(64, 3));
  }
  torch::Tensor forward(torch::Tensor x, bool side) {
    auto h = torch::tanh(trunk->forward(x));
    auto y = head->forward(h);
    if (side) y = y + sideSmall->forward(torch::tanh(sideBig->forward(h)));
    return y;
  }
  torch::nn::Linear trunk{nullptr}, sideBig{nullptr}, sideSmall{nullptr}, head{nullptr};
};

torch::Tensor dataFor(int rank, int step, int64_t rows, int64_t cols = 64) {
  return torch::randn({rows, cols}, torch::TensorOptions().dtype(torch::kFloat32))
      .mul(0.5)
      .add(0.01 * (7 * rank + step));  // deterministic per (rank, step), distinct across ranks
}

DistributedOptions optionsFor(int rank, int ranks, int port, int64_t batch) {
  return testing::threadRankOptions(rank, ranks, port, batch, std::chrono::milliseconds(60000));
}

// Runs fn(rank) on `ranks` threads and returns their results in rank order.
template <typename Fn>
auto onRanks(int ranks, Fn fn) {
  std::vector<std::future<decltype(fn(0))>> futures;
  for (int r = 0; r < ranks; ++r) futures.push_back(std::async(std::launch::async, fn, r));
  std::vector<decltype(fn(0))> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

std::vector<torch::Tensor> paramsOf(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

double maxRelDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = std::max(1e-6, b[i].abs().max().item<double>());
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// Which ranks use the side branch at a step: all of them, none (step 3), or all but rank 1 (step 4).
bool sideUsed(int rank, int step) { return step == 3 ? false : step == 4 ? rank != 1 : true; }

// In place (the node reads and writes .grad()) and staged through host buffers (a CUDA model's data
// path, DistributedOptions::stageOnHost): the same outcomes.
class DdpSemanticsStaged : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(InPlaceAndStaged, DdpSemanticsStaged, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "StagedOnHost" : "InPlace"; });

TEST_P(DdpSemanticsStaged, LayersUnusedAtAnyStepOnAnyRanksAreExactAndNeverStall) {
  const int ranks = 2, steps = 6;
  // Each rank's data, drawn here in order (LibTorch's generator is process-wide).
  torch::manual_seed(7);
  std::vector<std::vector<torch::Tensor>> xs(ranks);
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < ranks; ++r) xs[r].push_back(dataFor(r, s, kRows));
  torch::manual_seed(1);
  auto init = std::make_shared<Branchy>();
  std::vector<std::shared_ptr<Branchy>> nets;
  for (int r = 0; r < ranks; ++r) {
    nets.push_back(std::make_shared<Branchy>());
    torch::NoGradGuard g;
    auto src = init->parameters(), dst = nets[r]->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  const int port = freePort("127.0.0.1");
  auto got = onRanks(ranks, [&](int r) {
    auto net = nets[r];
    auto o = optionsFor(r, ranks, port, kRows);
    o.stageOnHost = GetParam();
    DistributedModel dist(net, "branchy", o);
    EXPECT_EQ(dist.node().schemeFor(0), Scheme::kSFB);  // trunk
    EXPECT_EQ(dist.node().schemeFor(1), Scheme::kSFB);  // sideBig
    EXPECT_EQ(dist.node().schemeFor(2), Scheme::kPS);   // sideSmall
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      const bool side = sideUsed(r, s);
      dist.forwardWith([&] { return net->forward(xs[r][s], side); }).pow(2).mean().backward();
      dist.step(opt);
    }
    auto p = paramsOf(*net);
    dist.finish();
    return p;
  });
  // Reference: one process, the mean of the ranks' gradients (zero for a rank that skipped the branch).
  auto ref = std::make_shared<Branchy>();
  {
    torch::NoGradGuard g;
    auto src = init->parameters(), dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> mean;
    for (auto& p : ref->parameters()) mean.push_back(torch::zeros_like(p));
    for (int r = 0; r < ranks; ++r) {
      ref->zero_grad();
      ref->forward(xs[r][s], sideUsed(r, s)).pow(2).mean().backward();
      auto ps = ref->parameters();
      for (size_t i = 0; i < ps.size(); ++i)
        if (ps[i].grad().defined()) mean[i] += ps[i].grad() / ranks;
    }
    auto ps = ref->parameters();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = mean[i];
    opt.step();
  }
  auto expect = paramsOf(*ref);
  for (int r = 0; r < ranks; ++r) {
    double d = maxRelDiff(got[r], expect);
    std::cout << "rank " << r << ": max |param - reference| / max |reference| = " << d << "\n";
    EXPECT_LT(d, 1e-5) << "rank " << r;
  }
}

// A Linear whose factors can be captured at some steps (2-D input: SFB) and not at others
// (3-D input: at::linear takes matmul, so the layer goes by PS that step): the shards must
// take the PS round after the stretch of SFB rounds as the pair's next one.
struct Flippy : torch::nn::Module {
  Flippy() { fc = register_module("fc", torch::nn::Linear(64, 64)); }
  torch::Tensor forward(torch::Tensor x, bool threeD) {
    return threeD ? fc->forward(x.unsqueeze(1)).squeeze(1) : fc->forward(x);
  }
  torch::nn::Linear fc{nullptr};
};

TEST(DdpSemantics, ALayerThatLosesItsFactorsForAStepGoesByPsThatStepAndStaysExact) {
  const int ranks = 2, steps = 7;
  auto threeD = [](int step) { return step == 3 || step == 6; };
  torch::manual_seed(17);
  std::vector<std::vector<torch::Tensor>> xs(ranks);
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < ranks; ++r) xs[r].push_back(dataFor(r, s, kRows));
  torch::manual_seed(4);
  auto init = std::make_shared<Flippy>();
  auto copyInit = [&](Flippy& to) {
    torch::NoGradGuard g;
    auto src = init->parameters(), dst = to.parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  };
  const int port = freePort("127.0.0.1");
  auto got = onRanks(ranks, [&](int r) {
    auto net = std::make_shared<Flippy>();
    copyInit(*net);
    DistributedModel dist(net, "flippy", optionsFor(r, ranks, port, kRows));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    std::vector<Scheme> used;
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      dist.forwardWith([&] { return net->forward(xs[r][s], threeD(s)); }).pow(2).mean().backward();
      dist.step(opt);
      used.push_back(dist.lastSchemes()[0]);
    }
    EXPECT_EQ(used, (std::vector<Scheme>{Scheme::kSFB, Scheme::kSFB, Scheme::kSFB, Scheme::kPS, Scheme::kSFB,
                                         Scheme::kSFB, Scheme::kPS}));
    auto p = paramsOf(*net);
    dist.finish();
    return p;
  });
  auto ref = std::make_shared<Flippy>();
  copyInit(*ref);
  torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> mean;
    for (auto& p : ref->parameters()) mean.push_back(torch::zeros_like(p));
    for (int r = 0; r < ranks; ++r) {
      ref->zero_grad();
      ref->forward(xs[r][s], threeD(s)).pow(2).mean().backward();
      auto ps = ref->parameters();
      for (size_t i = 0; i < ps.size(); ++i) mean[i] += ps[i].grad() / ranks;
    }
    auto ps = ref->parameters();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = mean[i];
    opt.step();
  }
  for (int r = 0; r < ranks; ++r) EXPECT_LT(maxRelDiff(got[r], paramsOf(*ref)), 1e-5) << "rank " << r;
}

struct WithBatchNorm : torch::nn::Module {
  WithBatchNorm() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::relu(bn->forward(fc1->forward(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

// Rank 0's buffers after 10 steps, and whether every rank holds exactly them.
std::vector<std::vector<torch::Tensor>> batchNormRun(bool broadcast, bool staged = false) {
  const int ranks = 3;
  torch::manual_seed(3);
  std::vector<std::shared_ptr<WithBatchNorm>> nets;
  std::vector<std::vector<torch::Tensor>> xs(ranks);
  for (int r = 0; r < ranks; ++r) {
    nets.push_back(std::make_shared<WithBatchNorm>());
    for (int s = 0; s < 10; ++s) xs[r].push_back(dataFor(r, s, 6, 8) * (1 + r));
  }
  const int port = freePort("127.0.0.1");
  return onRanks(ranks, [&](int r) {
    auto net = nets[r];
    auto o = optionsFor(r, ranks, port, 6);
    o.broadcastBuffers = broadcast;
    o.stageOnHost = staged;
    DistributedModel dist(net, "bn", o);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
    for (int s = 0; s < 10; ++s) {
      opt.zero_grad();
      dist.forwardWith([&] { return net->forward(xs[r][s]); }).pow(2).mean().backward();
      dist.step(opt);
    }
    std::vector<torch::Tensor> buffers;
    for (auto& b : net->buffers()) buffers.push_back(b.clone());
    dist.finish();
    return buffers;
  });
}

TEST_P(DdpSemanticsStaged, BatchNormBuffersAreEqualOnAllRanks) {
  auto bufs = batchNormRun(true, GetParam());
  ASSERT_EQ(bufs[0].size(), 3u);  // running_mean, running_var, num_batches_tracked
  EXPECT_EQ(bufs[0][2].item<int64_t>(), 10);
  for (size_t r = 1; r < bufs.size(); ++r)
    for (size_t i = 0; i < bufs[r].size(); ++i) EXPECT_TRUE(torch::equal(bufs[r][i], bufs[0][i])) << r << " " << i;
  // Without the broadcast (the option off) the running statistics drift apart: the data differ per rank.
  auto apart = batchNormRun(false, GetParam());
  EXPECT_FALSE(torch::equal(apart[1][0], apart[0][0]));
  if (GetParam()) {  // through host copies, the same bits as in place
    auto inPlace = batchNormRun(true, false);
    for (size_t i = 0; i < bufs[0].size(); ++i) EXPECT_TRUE(torch::equal(bufs[0][i], inPlace[0][i])) << i;
  }
}

// Buffers whose bytes are not whole floats (3 uint8, 5 bool) are rank 0's on every rank, at the start
// and after each step, in place and staged: they were left out without a word.
TEST_P(DdpSemanticsStaged, BuffersOfAnySizeAreRankZeros) {
  struct Flags : torch::nn::Module {
    Flags(int rank) {
      fc = register_module("fc", torch::nn::Linear(4, 2));
      flag = register_buffer("flag", torch::full({3}, rank + 1, torch::kUInt8));
      mask = register_buffer("mask", torch::full({5}, rank == 0, torch::kBool));
    }
    torch::nn::Linear fc{nullptr};
    torch::Tensor flag, mask;
  };
  const int port = freePort("127.0.0.1");
  const auto seen = onRanks(2, [&](int r) {
    auto net = std::make_shared<Flags>(r);
    auto o = optionsFor(r, 2, port, kRows);
    o.stageOnHost = GetParam();
    DistributedModel dist(net, "flags", o);
    std::vector<int64_t> out{net->flag.sum().item<int64_t>(), net->mask.sum().item<int64_t>()};
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    {
      torch::NoGradGuard g;
      net->flag.fill_(7 + r);  // each rank changes its own during the step
    }
    dist.forwardWith([&] { return net->fc->forward(torch::randn({kRows, 4})); }).sum().backward();
    dist.step(opt);
    out.push_back(net->flag.sum().item<int64_t>());
    dist.finish();
    return out;
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(seen[r], (std::vector<int64_t>{3, 5, 21})) << "rank " << r;
}

// One step as 4 micro-batches (3 under noSync) equals one step with the 4x batch.
TEST_P(DdpSemanticsStaged, GradientAccumulationEqualsOneStepWithTheLargerBatch) {
  const int ranks = 2, steps = 3, micro = 4;
  torch::manual_seed(11);
  std::vector<std::vector<torch::Tensor>> xs(ranks);
  for (int r = 0; r < ranks; ++r)
    for (int s = 0; s < steps; ++s) xs[r].push_back(dataFor(r, s, micro * kRows));
  torch::manual_seed(2);
  auto init = std::make_shared<Branchy>();
  auto run = [&](bool accumulate) {
    const int port = freePort("127.0.0.1");
    return onRanks(ranks, [&](int r) {
      auto net = std::make_shared<Branchy>();
      {
        torch::NoGradGuard g;
        auto src = init->parameters(), dst = net->parameters();
        for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
      }
      // K is the rows one synchronized step carries in both runs, so BestScheme agrees.
      auto o = optionsFor(r, ranks, port, micro * kRows);
      o.stageOnHost = GetParam();
      DistributedModel dist(net, "branchy", o);
      EXPECT_EQ(dist.node().schemeFor(0), Scheme::kSFB);
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto loss = [&](const torch::Tensor& x) {
        return dist.forwardWith([&] { return net->forward(x, true); }).pow(2).sum() / (micro * kRows);
      };
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        if (accumulate) {
          auto parts = xs[r][s].chunk(micro, 0);
          {
            auto guard = dist.noSync();
            for (int m = 0; m + 1 < micro; ++m) loss(parts[m]).backward();
          }
          loss(parts[micro - 1]).backward();
        } else {
          loss(xs[r][s]).backward();
        }
        dist.step(opt);
      }
      auto p = paramsOf(*net);
      dist.finish();
      return p;
    });
  };
  auto accumulated = run(true), whole = run(false);
  for (int r = 0; r < ranks; ++r) {
    double d = maxRelDiff(accumulated[r], whole[r]);
    std::cout << "rank " << r << ": accumulated vs one large batch, max rel diff " << d << "\n";
    EXPECT_LT(d, 1e-5) << "rank " << r;
  }
}

// Rank 1 misuses the API; every rank must stop with its reason, long before the 60 s timeout.
void expectMisuseReachesEveryRank(const std::function<void(DistributedModel&, Branchy&, torch::Tensor)>& misuse,
                                  const std::string& reason) {
  const int ranks = 3;
  torch::manual_seed(5);
  std::vector<std::shared_ptr<Branchy>> nets;
  std::vector<torch::Tensor> xs;
  for (int r = 0; r < ranks; ++r) {
    nets.push_back(std::make_shared<Branchy>());
    xs.push_back(dataFor(r, 0, kRows));
  }
  const int port = freePort("127.0.0.1");
  using Clock = std::chrono::steady_clock;
  struct Outcome {
    std::string what;
    bool aborted = false, invalid = false;
    double seconds = 0;
  };
  Clock::time_point misusedAt;
  std::atomic<bool> misused{false};
  auto outcomes = onRanks(ranks, [&](int r) {
    Outcome o;
    auto net = nets[r];
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    try {
      // Inside the try: the abort may reach a rank still in the constructor's broadcast.
      DistributedModel dist(net, "branchy", optionsFor(r, ranks, port, kRows));
      if (r == 1) {
        misusedAt = Clock::now();
        misused = true;
        misuse(dist, *net, xs[r]);
      } else {
        dist.forwardWith([&] { return net->forward(xs[r], true); }).pow(2).mean().backward();
        dist.step(opt);
        dist.finish();
      }
    } catch (const InvalidArgument& e) {
      o.what = e.what();
      o.invalid = true;
    } catch (const AbortedError& e) {
      o.what = e.what();
      o.aborted = true;
    } catch (const std::exception& e) {
      o.what = std::string("unexpected: ") + e.what();
    }
    if (misused) o.seconds = std::chrono::duration<double>(Clock::now() - misusedAt).count();
    return o;
  });
  EXPECT_TRUE(outcomes[1].invalid) << outcomes[1].what;
  EXPECT_THAT(outcomes[1].what, HasSubstr(reason));
  for (int r : {0, 2}) {
    EXPECT_TRUE(outcomes[r].aborted) << r << ": " << outcomes[r].what;
    EXPECT_THAT(outcomes[r].what, HasSubstr("rank 1 failed"));
    EXPECT_THAT(outcomes[r].what, HasSubstr(reason));
    EXPECT_THAT(outcomes[r].what, ::testing::Not(HasSubstr("same batch size and scheme policy")));
    std::cout << "rank " << r << " stopped " << outcomes[r].seconds << " s after rank 1's misuse\n";
    EXPECT_LT(outcomes[r].seconds, 30.0);  // half the configured timeout: it did not wait for it
  }
}

TEST(DdpSemantics, ForwardTwiceOnOneRankStopsEveryRankWithItsReason) {
  expectMisuseReachesEveryRank(
      [](DistributedModel& dist, Branchy& net, torch::Tensor x) {
        dist.forwardWith([&] { return net.forward(x, true); });
        dist.forwardWith([&] { return net.forward(x, true); });
      },
      "forward() twice before step()");
}

TEST(DdpSemantics, StepWithoutBackwardOnOneRankStopsEveryRankWithItsReason) {
  expectMisuseReachesEveryRank(
      [](DistributedModel& dist, Branchy& net, torch::Tensor x) {
        dist.forwardWith([&] { return net.forward(x, true); });
        dist.synchronize();
      },
      "without loss.backward()");
}

TEST(DdpSemantics, OneWorkerChecksTheSameMisuse) {
  auto net = std::make_shared<Branchy>();
  auto o = optionsFor(0, 1, freePort("127.0.0.1"), kRows);
  torch::manual_seed(9);
  auto x = dataFor(0, 0, kRows);
  {
    DistributedModel dist(net, "branchy", o);
    dist.forwardWith([&] { return net->forward(x, true); });
    EXPECT_THROW(dist.forwardWith([&] { return net->forward(x, true); }), InvalidArgument);
  }
  o.node.masterPort = freePort("127.0.0.1");
  {
    DistributedModel dist(net, "branchy", o);
    dist.forwardWith([&] { return net->forward(x, true); });
    try {
      dist.synchronize();
      FAIL() << "expected an error";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("without loss.backward()"));
    }
  }
  o.node.masterPort = freePort("127.0.0.1");
  {
    DistributedModel dist(net, "branchy", o);
    EXPECT_THROW(dist.synchronize(), InvalidArgument);  // no forward at all
  }
}

// After finish() the job is over: a training forward, a step, and a backward of a forward from before
// it are refused by name (the backward's hook reached the pool finish() had freed: a segfault).
TEST(DdpSemantics, AfterFinishTrainingIsRefusedNotACrash) {
  const int port = freePort("127.0.0.1");
  const auto said = onRanks(2, [&](int r) {
    auto net = std::make_shared<Branchy>();
    DistributedModel dist(net, "branchy", optionsFor(r, 2, port, kRows));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    dist.forwardWith([&] { return net->forward(dataFor(r, 0, kRows), true); }).sum().backward();
    dist.step(opt);
    const torch::Tensor late = dist.forwardWith([&] { return net->forward(dataFor(r, 1, kRows), false); });
    dist.finish();
    std::vector<std::string> out;
    auto catchIt = [&](const std::function<void()>& f) {
      try {
        f();
        out.push_back("(accepted)");
      } catch (const std::exception& e) {
        out.push_back(e.what());
      }
    };
    catchIt([&] { late.sum().backward(); });
    catchIt([&] { dist.forwardWith([&] { return net->forward(dataFor(r, 2, kRows), false); }); });
    catchIt([&] { dist.step(opt); });
    {
      torch::NoGradGuard evaluation;  // still runs
      const torch::Tensor y = dist.forwardWith([&] { return net->forward(dataFor(r, 3, kRows), false); });
      out.push_back(strCat("evaluated ", y.size(0)));
    }
    return out;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(said[r].size(), 4u);
    EXPECT_THAT(said[r][0], HasSubstr(strCat(" after finish(): rank ", r, "'s job is over")));  // submitDense or -Factors
    EXPECT_EQ(said[r][1], "a training forward after finish(): this rank's job is over (an evaluation forward, in eval "
                          "mode or under no_grad, still runs)");
    EXPECT_EQ(said[r][2], "synchronize()/step() after finish(): this rank's job is over");
    EXPECT_EQ(said[r][3], "evaluated 4");
  }
}

// Two models in one program (a GAN's generator and discriminator): each rank's second live model
// joins a job of its own at MASTER_PORT + 1, and both train exactly (it failed with "Address already
// in use" and the launcher restarted the job). The ranks end with the same parameters in both.
TEST(DdpSemantics, TwoModelsInOneProgramEachTrainInAJobOfTheirOwn) {
  const int port = freePort("127.0.0.1");
  const auto params = onRanks(2, [&](int r) {
    auto a = std::make_shared<Branchy>(), b = std::make_shared<Branchy>();
    DistributedModel first(a, "first", optionsFor(r, 2, port, kRows));
    DistributedModel second(b, "second", optionsFor(r, 2, port, kRows));
    torch::optim::SGD oa(a->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ob(b->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 2; ++step) {
      first.forwardWith([&] { return a->forward(dataFor(r, step, kRows), true); }).sum().backward();
      second.forwardWith([&] { return b->forward(dataFor(r, step + 5, kRows), false); }).sum().backward();
      first.step(oa);
      second.step(ob);
    }
    first.finish();
    second.finish();
    std::vector<torch::Tensor> all = paramsOf(*a), more = paramsOf(*b);
    all.insert(all.end(), more.begin(), more.end());
    return all;
  });
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i) EXPECT_TRUE(torch::equal(params[0][i], params[1][i])) << i;
}

// A rank whose program throws out of the model's scope: its peers learn that it threw (and it prints
// no "left the job" line of its own ahead of its program's report of the exception).
TEST(DdpSemantics, ARankThatThrowsOutOfItsModelTellsItsPeersSo) {
  const int port = freePort("127.0.0.1");
  const auto said = onRanks(2, [&](int r) -> std::string {
    auto net = std::make_shared<Branchy>();
    try {
      DistributedModel dist(net, "branchy", optionsFor(r, 2, port, kRows));
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
      dist.forwardWith([&] { return net->forward(dataFor(r, 0, kRows), true); }).sum().backward();
      dist.step(opt);
      if (r == 1) throw std::runtime_error("rank 1's own bug");
      dist.forwardWith([&] { return net->forward(dataFor(r, 1, kRows), true); }).sum().backward();
      dist.step(opt);
      dist.finish();
      return "finished";
    } catch (const std::exception& e) {
      return e.what();
    }
  });
  EXPECT_EQ(said[1], "rank 1's own bug");
  EXPECT_THAT(said[0], HasSubstr("rank 1 left the job before finish() (its program threw an error)"));
}

// A sparse gradient (Embedding with sparse=True) is refused by name at its backward (it crashed with
// LibTorch's "Cannot access data pointer of Tensor that doesn't have storage" and a backtrace).
TEST(DdpSemantics, ASparseGradientIsRefusedByName) {
  auto emb = torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  DistributedOptions o = optionsFor(0, 1, freePort("127.0.0.1"), kRows);
  DistributedModel dist(emb, "emb", o);
  std::string said = "(accepted)";
  try {
    dist.forward(torch::tensor({1, 2, 3, 4}, torch::kLong)).sum().backward();
  } catch (const std::exception& e) {
    said = e.what();
  }
  EXPECT_THAT(said, HasSubstr("layer 'emb' has a sparse gradient (an Embedding with sparse=True?): Poseidon "
                              "synchronizes dense gradients; build it with sparse=False"));
}

}  // namespace
}  // namespace poseidon::pt
