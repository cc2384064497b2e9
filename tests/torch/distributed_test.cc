// DistributedModel with several ranks as threads of one process (each with
// its own node and sockets); the CLI tests run the same code as processes.
#include "poseidon/torch/distributed.h"

#include <gtest/gtest.h>

#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "poseidon/launch/env.h"
#include "poseidon/torch/compat.h"
#include "poseidon/torch/device_staging.h"
#include "rank_options.h"

namespace poseidon::pt {
namespace {

struct TwoBranch : torch::nn::Module {
  TwoBranch() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(5, 4).bias(false)));
    unused = register_module("unused", torch::nn::Linear(3, 3));
    seq = register_module("seq", torch::nn::Linear(5, 2));
    twice = register_module("twice", torch::nn::Linear(5, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc1->forward(x));
    auto a = fc2->forward(h);
    // seq sees a 3-D input: at::linear does not use addmm, so no factors.
    auto b = seq->forward(h.unsqueeze(1).expand({h.size(0), 2, 5}).contiguous());
    // twice's weight is used by two nodes: its factors would be incomplete.
    auto c = twice->forward(twice->forward(h));
    return a.sum(1) + b.sum({1, 2}) + c.sum(1);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr}, seq{nullptr}, twice{nullptr};
};

torch::Tensor inputFor(int rank, int64_t rows) {
  torch::manual_seed(100 + rank);
  return torch::randn({rows, 6});
}

// Mean over ranks of the local gradients, computed on one reference module.
std::vector<torch::Tensor> referenceGrads(std::shared_ptr<TwoBranch> ref, int ranks, int64_t rows) {
  std::vector<torch::Tensor> sum;
  for (int r = 0; r < ranks; ++r) {
    ref->zero_grad();
    ref->forward(inputFor(r, rows)).pow(2).mean().backward();
    auto params = ref->parameters();
    if (sum.empty()) {
      for (auto& p : params) sum.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    } else {
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].grad().defined()) sum[i] += params[i].grad();
    }
  }
  for (auto& s : sum) s /= ranks;
  return sum;
}

// One of `ranks` ranks of a job on this machine, as threads of this process.
using testing::threadRankOptions;

void runRanks(int ranks, SchemePolicy policy, bool overlap, bool staged = false) {
  const int64_t rows = 4;
  int port = freePort("127.0.0.1");
  torch::manual_seed(1);
  auto reference = std::make_shared<TwoBranch>();
  // LibTorch's default generator is process-wide: build every rank's module
  // and input here, in order, not in the rank threads.
  std::vector<std::shared_ptr<TwoBranch>> nets;
  std::vector<torch::Tensor> inputs;
  for (int r = 0; r < ranks; ++r) {
    torch::manual_seed(1000 + r);  // different init per rank: the broadcast must fix it
    nets.push_back(std::make_shared<TwoBranch>());
    inputs.push_back(inputFor(r, rows));
  }
  std::vector<std::future<std::vector<torch::Tensor>>> futures;
  for (int r = 0; r < ranks; ++r) {
    futures.push_back(std::async(std::launch::async, [=] {
      auto net = nets[r];
      DistributedOptions o = threadRankOptions(r, ranks, port, rows);
      o.node.settings.policy = policy;
      o.overlap = overlap;
      o.stageOnHost = staged;
      DistributedModel dist(net, "twobranch", o, [net](torch::Tensor x) { return net->forward(x); });
      EXPECT_TRUE(dist.device().is_cpu());
      EXPECT_EQ(dist.description().layers.size(), 5u);
      net->zero_grad();
      dist.forward(inputs[r]).pow(2).mean().backward();
      dist.synchronize();
      EXPECT_TRUE(dist.factorsCaptured(0));   // fc1 (addmm)
      EXPECT_TRUE(dist.factorsCaptured(1));   // fc2 (mm, no bias)
      EXPECT_FALSE(dist.factorsCaptured(4));  // twice (weight used twice)
      std::vector<torch::Tensor> grads, params;
      for (auto& p : net->parameters()) {
        grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
        params.push_back(p.detach().clone());
      }
      dist.finish();
      grads.insert(grads.end(), params.begin(), params.end());
      return grads;
    }));
  }
  // Rank 0's parameters (seed 1000) became everyone's.
  torch::manual_seed(1000);
  auto rank0 = std::make_shared<TwoBranch>();
  torch::NoGradGuard guard;
  {
    auto src = rank0->parameters(), dst = reference->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::GradMode::set_enabled(true);
  auto expect = referenceGrads(reference, ranks, rows);
  const size_t n = expect.size();
  for (auto& f : futures) {
    auto got = f.get();
    ASSERT_EQ(got.size(), 2 * n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(got[i].defined()) << "param " << i;
      double scale = std::max(1e-6, expect[i].abs().max().item<double>());
      EXPECT_LT((got[i] - expect[i]).abs().max().item<double>() / scale, 1e-5) << "param " << i;
      EXPECT_TRUE(torch::equal(got[n + i], rank0->parameters()[i].detach())) << "param " << i;
    }
    // The unused layer's gradient is the (zero) mean of zero contributions.
    EXPECT_EQ(got[4].abs().max().item<float>(), 0.f);
  }
}

TEST(DistributedModel, AutoSchemeMatchesReferenceMean) { runRanks(3, SchemePolicy::kAuto, true); }
TEST(DistributedModel, ForcedSfbMatchesReferenceMean) { runRanks(2, SchemePolicy::kSFB, true); }
TEST(DistributedModel, ForcedPsMatchesReferenceMean) { runRanks(2, SchemePolicy::kPS, true); }
TEST(DistributedModel, NoOverlapMatchesReferenceMean) { runRanks(2, SchemePolicy::kSFB, false); }
// A CUDA model's data path (host buffers, the staging thread), run on the CPU.
TEST(DistributedModel, StagedOnHostAutoMatchesReferenceMean) { runRanks(3, SchemePolicy::kAuto, true, true); }
TEST(DistributedModel, StagedOnHostPsMatchesReferenceMean) { runRanks(2, SchemePolicy::kPS, true, true); }
TEST(DistributedModel, StagedOnHostNoOverlapMatchesReferenceMean) { runRanks(2, SchemePolicy::kSFB, false, true); }

// The overlapped step on a torch::nn::Sequential (forwardOverlapped / stepOverlapped) gives the
// parameters of forward / backward / step bit for bit, with SGD's momentum, an SFB layer and a
// learning rate changed after every step, and applies every layer's update just before the child
// that needs it.
TEST(DistributedModel, OverlappedSequentialStepEqualsTheBarrierPathBitForBit) {
  const int ranks = 2, steps = 6;
  const int64_t rows = 4;
  std::vector<std::vector<torch::Tensor>> inputs(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (int s = 0; s < steps; ++s) {
      torch::manual_seed(200 + 10 * r + s);
      inputs[r].push_back(torch::randn({rows, 6}));
    }
  }
  auto run = [&](bool overlapped, bool staged) {
    std::vector<torch::nn::Sequential> nets;
    for (int r = 0; r < ranks; ++r) {
      torch::manual_seed(7 + r);  // different on each rank: the broadcast makes them one
      nets.emplace_back(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 8), torch::nn::Tanh(),
                        torch::nn::Linear(8, 3));
    }
    const int port = freePort("127.0.0.1");
    std::vector<std::future<std::vector<torch::Tensor>>> futures;
    for (int r = 0; r < ranks; ++r) {
      futures.push_back(std::async(std::launch::async, [&, r] {
        torch::nn::Sequential net = nets[r];
        DistributedOptions o = threadRankOptions(r, ranks, port, rows);
        o.stageOnHost = staged;
        DistributedModel dist(net.ptr(), "seq", o, [net](torch::Tensor x) mutable { return net->forward(x); });
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        // Held across steps, as a scheduler holds it: the overlapped path must keep this object valid.
        auto& options = static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options());
        for (int s = 0; s < steps; ++s) {
          if (overlapped) {
            dist.forwardOverlapped(net, inputs[r][s]).pow(2).mean().backward();
            dist.stepOverlapped(opt);
            if (s == 0) {  // the plain forward and step refuse while the step is pending
              EXPECT_THROW(dist.forward(inputs[r][s]), InvalidArgument);
              EXPECT_THROW(dist.step(opt), InvalidArgument);
            }
          } else {
            opt.zero_grad();
            dist.forward(inputs[r][s]).pow(2).mean().backward();
            dist.step(opt);
          }
          // A scheduler between steps: the pending step must still use the learning rate it was
          // submitted with (the overlapped path applies it in the next forward, after this line).
          options.lr(0.1 / (s + 2));
        }
        EXPECT_EQ(dist.lastSchemes()[1], Scheme::kSFB);  // the middle Linear: by its factors
        if (overlapped) {  // an evaluation forward applies the pending step first
          torch::NoGradGuard evaluating;
          dist.forwardOverlapped(net, inputs[r][0]);
          EXPECT_FALSE(dist.stepPending());
        }
        dist.applyPending();  // nothing left
        EXPECT_EQ(&opt.param_groups()[0].options(), &options);
        EXPECT_DOUBLE_EQ(options.lr(), 0.1 / (steps + 1));  // the scheduler's last value, restored
        EXPECT_EQ(dist.updatesInForward(), overlapped ? (steps - 1) * 3 : 0);
        std::vector<torch::Tensor> params;
        for (auto& p : net->parameters()) params.push_back(p.detach().clone());
        dist.finish();
        return params;
      }));
    }
    std::vector<std::vector<torch::Tensor>> out;
    for (auto& f : futures) out.push_back(f.get());
    return out;
  };
  const auto barrier = run(false, false), overlap = run(true, false);
  // A CUDA model's data path, run on the CPU: the same bits on both step paths.
  const auto barrierStaged = run(false, true), overlapStaged = run(true, true);
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(barrier[r].size(), overlap[r].size());
    for (size_t i = 0; i < barrier[r].size(); ++i) {
      EXPECT_TRUE(torch::equal(barrier[r][i], overlap[r][i])) << "rank " << r << " param " << i;
      EXPECT_TRUE(torch::equal(overlap[r][i], overlap[0][i])) << "rank " << r << " param " << i;
      EXPECT_TRUE(torch::equal(barrier[r][i], barrierStaged[r][i])) << "staged, rank " << r << " param " << i;
      EXPECT_TRUE(torch::equal(barrier[r][i], overlapStaged[r][i])) << "staged, rank " << r << " param " << i;
    }
  }
}

// Divergence: one rank's NaN input at the third step makes that step's mean gradient NaN on every
// rank (the SFB layer's factors and the PS layers' sums alike), so every rank throws DivergenceError
// for step 3 from step() before the optimizer runs: the parameters stay those after step 2, the same
// on every rank, and the job finishes cleanly. The overlapped step finds it when the next forward
// applies it, after the step has ended. With checkFinite off the NaN trains on.
TEST(DistributedModel, ANonFiniteMeanGradientThrowsDivergenceOnEveryRankAtThatStep) {
  const int ranks = 3, steps = 5, bad = 2;  // step index 2 (the third step), rank 1's input
  const int64_t rows = 4;
  struct Outcome {
    long long step = -1;     // DivergenceError::step(); -1: none thrown
    std::string what;
    std::vector<torch::Tensor> params, afterTwo;  // at the end; after the second step
  };
  auto run = [&](bool overlapped, bool check) {
    const int port = freePort("127.0.0.1");
    std::vector<torch::nn::Sequential> nets;
    for (int r = 0; r < ranks; ++r) {
      torch::manual_seed(11);
      nets.emplace_back(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 8), torch::nn::Tanh(),
                        torch::nn::Linear(8, 3));
    }
    std::vector<std::future<Outcome>> futures;
    for (int r = 0; r < ranks; ++r) {
      futures.push_back(std::async(std::launch::async, [&, r] {
        torch::nn::Sequential net = nets[r];
        DistributedOptions o = threadRankOptions(r, ranks, port, rows);
        o.checkFinite = check;
        DistributedModel dist(net.ptr(), "seq", o, [net](torch::Tensor x) mutable { return net->forward(x); });
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        Outcome out;
        auto snapshot = [&] {
          std::vector<torch::Tensor> v;
          for (auto& p : net->parameters()) v.push_back(p.detach().clone());
          return v;
        };
        try {
          for (int s = 0; s < steps; ++s) {
            torch::Tensor x = torch::full({rows, 6}, 0.1 * (r + 1) + 0.01 * s);
            if (s == bad && r == 1) x[0][0] = std::numeric_limits<float>::quiet_NaN();
            if (overlapped) {
              dist.forwardOverlapped(net, x).pow(2).mean().backward();
              dist.stepOverlapped(opt);
            } else {
              opt.zero_grad();
              dist.forward(x).pow(2).mean().backward();
              dist.step(opt);
            }
            if (s == 1) out.afterTwo = snapshot();
          }
          dist.applyPending();
        } catch (const DivergenceError& e) {
          out.step = e.step();
          out.what = e.what();
        }
        out.params = snapshot();
        dist.finish();
        return out;
      }));
    }
    std::vector<Outcome> outs;
    for (auto& f : futures) outs.push_back(f.get());
    return outs;
  };
  for (bool overlapped : {false, true}) {
    const auto outs = run(overlapped, true);
    for (int r = 0; r < ranks; ++r) {
      const Outcome& o = outs[r];
      EXPECT_EQ(o.step, bad + 1) << "rank " << r << " overlapped " << overlapped;
      EXPECT_NE(o.what.find("step 3: the mean gradient of layer '"), std::string::npos) << o.what;
      EXPECT_NE(o.what.find("is not finite (a NaN or an infinity): the training diverged"), std::string::npos)
          << o.what;
      ASSERT_EQ(o.params.size(), outs[0].params.size());
      for (size_t i = 0; i < o.params.size(); ++i) {
        // (The overlapped step applied the NaN update layer by layer before it found it: NaN == NaN here.)
        EXPECT_TRUE(torch::allclose(o.params[i], outs[0].params[i], 0, 0, /*equal_nan=*/true))
            << "rank " << r << " param " << i;
        // The barrier path never applied the NaN step: the model is the one after step 2.
        if (!overlapped) {
          EXPECT_TRUE(torch::equal(o.params[i], o.afterTwo[i])) << "rank " << r << " param " << i;
        }
      }
    }
  }
  const auto unchecked = run(false, false);
  for (const Outcome& o : unchecked) {
    EXPECT_EQ(o.step, -1);
    EXPECT_FALSE(torch::isfinite(o.params[0]).all().item<bool>());  // the NaN trained on
  }
}

TEST(DistributedModel, RejectsNonFloatParameters) {
  auto net = std::make_shared<torch::nn::LinearImpl>(2, 2);
  net->to(torch::kFloat64);
  DistributedOptions o;
  o.node.masterPort = freePort("127.0.0.1");
  try {
    DistributedModel dist(net, "double", o);
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Poseidon synchronizes float32 parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a Double parameter on cpu (layer"), std::string::npos) << e.what();
  }
}

// Out-of-range settings and an empty parameter are refused by name before the rendezvous: the
// coordinator refused them as "malformed join message: group settings out of range" (or "layer 0 has
// a bad dimension 0"), a plain Error that read like a protocol fault.
TEST(DistributedModel, SettingsOutOfRangeAreNamedBeforeTheRendezvous) {
  auto refusal = [](const std::function<void(DistributedOptions&)>& set, std::shared_ptr<torch::nn::Module> net) {
    DistributedOptions o;
    o.node.masterPort = freePort("127.0.0.1");
    o.node.settings.batch = 2;
    set(o);
    try {
      DistributedModel dist(net, "lin", o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("not InvalidArgument: ") + e.what();
    }
    return std::string("(accepted)");
  };
  const auto lin = torch::nn::Linear(3, 2).ptr();
  EXPECT_EQ(refusal([](DistributedOptions& o) { o.node.settings.groups = -1; }, lin),
            "groups must be 0 (BSP) or in [1, 65536], got -1");
  EXPECT_EQ(refusal([](DistributedOptions& o) { o.node.settings.dropStragglers = -2; }, lin),
            "dropStragglers must be in [0, 65536], got -2");
  EXPECT_EQ(refusal([](DistributedOptions& o) { o.node.settings.staleness = -5; }, lin),
            "staleness must be -1 (unbounded) or >= 0, got -5");
  EXPECT_EQ(refusal([](DistributedOptions& o) { o.node.settings.localRanks = -3; }, lin),
            "localRanks must be 0 (one node per host) or in [1, 4096], got -3");
  EXPECT_EQ(refusal([](DistributedOptions& o) { o.node.heartbeat = std::chrono::milliseconds(-5); }, lin),
            "heartbeat must be 0 (automatic) or a positive number of ms, got -5");
  EXPECT_EQ(refusal([](DistributedOptions& o) { o.node.settings.pairBytes = 3; }, lin),
            "the KV pair size must be in [4, 1073741824] bytes, got 3");
  // Settings that exclude each other, before the rendezvous too (JobSettings::conflictError).
  EXPECT_EQ(refusal(
                [](DistributedOptions& o) {
                  o.node.settings.policy = SchemePolicy::kAdam;
                  o.node.settings.wire = WirePrecision::kBf16;
                },
                lin),
            "--wire bf16 does not apply to the adam baseline (use --wire fp32)");
  auto empty = std::make_shared<torch::nn::Module>();
  empty->register_parameter("weight", torch::zeros({2, 0}));
  EXPECT_EQ(refusal([](DistributedOptions&) {}, empty),
            "model 'lin' has a parameter with no elements (shape [2, 0], layer 'lin'): freeze it (requires_grad "
            "false) or drop it");
}

// The device check's exactness (scripts/device-check.sh runs it on a GPU): 4 ranks x 16 rows against
// one process x 64 rows on the CPU, 10 steps of SGD with momentum, for an MLP (SFB), a model with a
// never-called SFB layer, and a conv net with BatchNorm (per-rank batch statistics: against the same 4
// ranks on the CPU in place). The ranks run on this machine's GPU, sharing it; without one (CI) on the
// CPU through the GPU's data path (stageOnHost).
struct DeviceNet : torch::nn::Module {
  explicit DeviceNet(const std::string& kind) : kind(kind) {
    if (kind == "bnconv") {
      conv = register_module("conv", torch::nn::Conv2d(1, 4, 3));
      bn = register_module("bn", torch::nn::BatchNorm2d(4));
      out = register_module("out", torch::nn::Linear(4 * 6 * 6, 10));
      return;
    }
    fc1 = register_module("fc1", torch::nn::Linear(512, 256));
    if (kind == "unused") spare = register_module("spare", torch::nn::Linear(512, 256));
    out = register_module("out", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (kind == "bnconv")
      return out->forward(torch::relu(bn->forward(conv->forward(x.view({-1, 1, 8, 8})))).flatten(1));
    return out->forward(torch::relu(fc1->forward(x)));
  }
  std::string kind;
  torch::nn::Linear fc1{nullptr}, spare{nullptr}, out{nullptr};
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};

// Rank 0's parameters and buffers (on the CPU) after `steps` steps of `ranks` x (64 / ranks) rows.
std::vector<torch::Tensor> deviceJob(const std::string& kind, int ranks, c10::Device device, bool staged,
                                     int localRanks = 1) {
  constexpr int64_t kGlobal = 64;
  constexpr int kSteps = 10;
  const int64_t rows = kGlobal / ranks, width = kind == "bnconv" ? 64 : 512;
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    torch::manual_seed(1000 + s);
    xs.push_back(torch::randn({kGlobal, width}));
    ys.push_back(torch::randint(0, 10, {kGlobal}));
  }
  std::vector<std::shared_ptr<DeviceNet>> nets;
  for (int r = 0; r < ranks; ++r) {
    torch::manual_seed(1);
    nets.push_back(std::make_shared<DeviceNet>(kind));
    nets.back()->to(device);
  }
  const int port = freePort("127.0.0.1");
  std::vector<std::future<std::vector<torch::Tensor>>> futures;
  for (int r = 0; r < ranks; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r] {
      auto net = nets[r];
      DistributedOptions o = threadRankOptions(r, ranks, port, rows);
      o.stageOnHost = staged;
      o.node.settings.localRanks = localRanks;
      DistributedModel dist(net, kind, o, [net](torch::Tensor x) { return net->forward(x); });
      EXPECT_EQ(dist.device(), device);
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        auto x = xs[s].narrow(0, r * rows, rows).to(device), y = ys[s].narrow(0, r * rows, rows).to(device);
        torch::nn::functional::cross_entropy(dist.forward(x), y).backward();
        dist.step(opt);
      }
      if (ranks > 1 && kind != "bnconv") {
        EXPECT_EQ(dist.lastSchemes()[0], Scheme::kSFB) << kind;
      }
      std::vector<torch::Tensor> out;
      for (auto& p : net->parameters()) out.push_back(p.detach().to(torch::kCPU).clone());
      for (auto& b : net->buffers()) out.push_back(b.detach().to(torch::kCPU).clone());
      dist.finish();
      return out;
    }));
  }
  std::vector<std::vector<torch::Tensor>> all;
  for (auto& f : futures) all.push_back(f.get());
  for (int r = 1; r < ranks; ++r)  // every replica alike (parameters by the same mean, buffers by broadcast)
    for (size_t i = 0; i < all[0].size(); ++i) EXPECT_TRUE(torch::equal(all[r][i], all[0][i])) << r << " " << i;
  return all[0];
}

// max |got - want| / max |want| over the floating tensors; the others (num_batches_tracked) equal.
double maxRelDiff(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                  const std::string& kind) {
  EXPECT_EQ(got.size(), want.size()) << kind;
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!got[i].is_floating_point()) {
      EXPECT_TRUE(torch::equal(got[i], want[i])) << kind << " tensor " << i;
      continue;
    }
    const double scale = std::max(1e-6, want[i].abs().max().item<double>());
    worst = std::max(worst, (got[i] - want[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

TEST(DeviceExactness, FourRanksOnTheDeviceEqualOneProcessOnTheCpu) {
  const bool gpu = torch::cuda::device_count() > 0;
  const c10::Device device = gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  for (const std::string kind : {"mlp", "unused", "bnconv"}) {
    const auto got = deviceJob(kind, 4, device, !gpu);
    const auto want = kind == "bnconv" ? deviceJob(kind, 4, c10::Device(c10::kCPU), false)
                                       : deviceJob(kind, 1, c10::Device(c10::kCPU), false);
    ASSERT_EQ(got.size(), want.size());
    const double worst = maxRelDiff(got, want, kind);
    std::cout << "device-exactness " << kind << " on " << device << ": max rel diff " << worst << "\n";
    EXPECT_LE(worst, 1e-4) << kind;
    if (kind == "unused") {
      EXPECT_TRUE(torch::equal(got[2], want[2]));  // spare.weight: where it started
    }
  }
}

// Two machines of two ranks (JobSettings::localRanks, client/local_group.h): each machine's leader
// sums (PS) or stacks (SFB) its ranks' updates and sends the machine's mean to its member. The same
// models and steps as above, against one process; staged on the host as a CUDA model would be, and not.
// On the GPU where there is one (the device check runs this test there too).
TEST(LocalRanks, TwoMachinesOfTwoRanksEqualOneProcess) {
  const bool gpu = torch::cuda::device_count() > 0;
  const c10::Device device = gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  for (const bool staged : gpu ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
    for (const std::string kind : {"mlp", "unused", "bnconv"}) {
      const auto got = deviceJob(kind, 4, device, staged, 2);
      const auto want = kind == "bnconv" ? deviceJob(kind, 4, c10::Device(c10::kCPU), false)
                                         : deviceJob(kind, 1, c10::Device(c10::kCPU), false);
      ASSERT_EQ(got.size(), want.size());
      const double worst = maxRelDiff(got, want, kind);
      std::cout << "local-ranks 2 " << kind << " on " << device << (staged ? " staged" : "") << ": max rel diff "
                << worst << "\n";
      EXPECT_LE(worst, 1e-4) << kind;
    }
  }
}

// A CUDA layer's SFB rebuild (one GEMM through LibTorch on the device) gives the host's Eigen GEMM's
// mean gradient: the same stacked factors, the same scale. On the GPU where there is one, else the CPU.
TEST(DeviceStaging, RebuildsTheMeanGradientAsTheHostGemmDoes) {
  const c10::Device device = torch::cuda::device_count() > 0 ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  DeviceStaging staging(device, nullptr);
  const int64_t m = 5, n = 7;
  torch::manual_seed(4);
  std::vector<torch::Tensor> us, vs;
  std::vector<FactorView> views;
  for (int64_t rows : {2, 3, 1}) {
    us.push_back(torch::randn({rows, m}));
    vs.push_back(torch::randn({rows, n}));
    views.push_back({us.back().data_ptr<float>(), vs.back().data_ptr<float>(), rows});
  }
  DeviceRebuild into;
  into.result = torch::empty({m * n + m}, torch::TensorOptions().device(device));
  staging.rebuild(views, m, n, /*bias=*/true, 1.0f / 3, into);
  EXPECT_TRUE(into.fresh);
  std::vector<float> w(static_cast<size_t>(m * n)), b(static_cast<size_t>(m));
  FactorScratch scratch;
  reconstructGradient(views, m, n, 1.0f / 3, w.data(), b.data(), &scratch);
  std::vector<torch::Tensor> grads{torch::zeros({m, n}, torch::TensorOptions().device(device)),
                                   torch::zeros({m}, torch::TensorOptions().device(device))};
  DeviceStaging::takeRebuilt(into, grads);
  EXPECT_FALSE(into.fresh);
  EXPECT_TRUE(torch::allclose(grads[0].cpu(), torch::from_blob(w.data(), {m, n}), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(grads[1].cpu(), torch::from_blob(b.data(), {m}), 1e-5, 1e-6));
}

// A hand-off to the node that throws (the job failed) fails the job once, skips the later ones, and
// drain() rethrows it; the copies themselves were made.
TEST(DeviceStaging, AFailingHandOffFailsTheJobAndDrainSaysWhy) {
  std::exception_ptr seen;
  DeviceStaging staging(c10::Device(c10::kCPU), [&](std::exception_ptr e) { seen = e; });
  torch::Tensor src = torch::arange(4, torch::kFloat32), dst = torch::zeros({4});
  int ran = 0;
  staging.toHost({src}, {dst}, [&] { ++ran; });
  staging.toHost({src}, {dst}, [] { throw IoError("the node is gone"); });
  staging.toHost({src}, {dst}, [&] { ++ran; });
  try {
    staging.drain();
    FAIL() << "expected the hand-off's error";
  } catch (const IoError& e) {
    EXPECT_STREQ(e.what(), "the node is gone");
  }
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(seen);
  EXPECT_TRUE(torch::equal(dst, src));
}

// torch/compat.h's branches for the other LibTorch line compile and do what that line needs: the
// state key as the TensorImpl pointer (2.x), a blocking wait where the event has synchronize() (2.x),
// a poll where it has only query() (1.13).
struct PolledEvent {
  mutable int queries = 0;
  bool query() const { return ++queries >= 3; }
};
struct BlockingEvent {
  mutable bool waited = false;
  bool query() const { return false; }
  void synchronize() const { waited = true; }
};

TEST(TorchCompat, BothLinesStateKeysAndEventWaits) {
  torch::Tensor p = torch::zeros({2});
  EXPECT_EQ(optimizerStateKey<c10::TensorImpl*>(p), p.unsafeGetTensorImpl());
  std::ostringstream printed;
  printed << p.unsafeGetTensorImpl();
  EXPECT_EQ(optimizerStateKey<std::string>(p), printed.str());
  // This build's key finds what this build's SGD stores.
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1).momentum(0.9));
  p.mutable_grad() = torch::ones({2});
  sgd.step();
  EXPECT_TRUE(sgd.state().count(optimizerStateKey(p)));
  EXPECT_TRUE(torch::equal(sgdMomentumBuffers(sgd)[0], torch::ones({2})));
  PolledEvent polled;
  eventSynchronize(polled);
  EXPECT_EQ(polled.queries, 3);
  BlockingEvent blocking;
  eventSynchronize(blocking);
  EXPECT_TRUE(blocking.waited);
}

// One process per GPU: the launcher's local rank (torchrun's LOCAL_RANK, Slurm's SLURM_LOCALID, ...)
// picks cuda:LOCAL_RANK; ranks beyond the node's GPUs share them round-robin.
TEST(Devices, TheLocalRankPicksTheGpu) {
  auto envOf = [](std::map<std::string, std::string> vars) {
    return rankFromEnvironment([vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  };
  const RankEnv torchrun = envOf({{"RANK", "11"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "3"}, {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(selectDevice("cuda", torchrun.localRank, 8), c10::Device(c10::kCUDA, 3));
  const RankEnv slurm = envOf({{"SLURM_PROCID", "5"},
                               {"SLURM_NTASKS", "8"},
                               {"SLURM_LOCALID", "5"},
                               {"SLURM_STEP_ID", "0"},
                               {"MASTER_ADDR", "h0"}});
  EXPECT_EQ(selectDevice("cuda", slurm.localRank, 4), c10::Device(c10::kCUDA, 1));  // local rank 5 of 4 GPUs
  EXPECT_EQ(selectDevice("auto", slurm.localRank, 4), c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(selectDevice("auto", slurm.localRank, 0), c10::Device(c10::kCPU));
  EXPECT_EQ(selectDevice("cpu", slurm.localRank, 4), c10::Device(c10::kCPU));
  try {
    selectDevice("cuda", 0, 0);
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "--device cuda: LibTorch sees no CUDA device here (a CPU-only build, or no GPU visible); use --device "
              "cpu");
  }
  EXPECT_THROW(selectDevice("gpu", 0, 1), InvalidArgument);
  // This process's count: a CPU-only LibTorch (CI) has none, so auto is the CPU there.
  EXPECT_EQ(selectDevice("auto", 0).is_cuda(), torch::cuda::device_count() > 0);
}

}  // namespace
}  // namespace poseidon::pt
