// Straggler dropping through a device model's data path (docs/gpu.md): the gradients and the means go
// through host buffers, and a rank that fell behind takes the step's mean from them (skipIfBehind).
// The ranks are threads of this process, sharing the GPU where there is one; without one (CI) the same
// path runs on the CPU (stageOnHost).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "poseidon/launch/env.h"
#include "poseidon/torch/distributed.h"
#include "rank_options.h"

namespace poseidon::pt {
namespace {

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct Outcome {
  std::vector<std::vector<torch::Tensor>> params;  // per rank, after the last step
  int64_t skipped = 0;                             // the straggler's skipped iterations
  int64_t droppedByOthers = 0;                     // contributions of ranks 0-2 left out of a round
};

// 4 ranks, D = 1. Rank 3 never keeps up: before each step it waits until ranks 0-2 have finished that
// step (their rounds complete without it once the straggler timeout has passed), then takes the
// step's mean with skipIfBehind, as the trainer does before each forward.
Outcome runWithAStraggler(bool staged) {
  const c10::Device device =
      staged && torch::cuda::device_count() > 0 ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  constexpr int kRanks = 4, kSteps = 4;
  constexpr int64_t kRows = 8;
  const int port = freePort("127.0.0.1");
  std::mutex mutex;
  std::condition_variable stepDone;
  std::vector<int> finished(kRanks, 0);
  // Every rank's batches, made here: LibTorch's generator is one for the whole process.
  std::vector<std::vector<torch::Tensor>> xs(kSteps), ys(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      torch::manual_seed(1000 + 10 * s + r);
      xs[s].push_back(torch::randn({kRows, 16}));
      ys[s].push_back(torch::randint(0, 4, {kRows}));
    }
  }
  torch::manual_seed(1);
  const Mlp initial;  // every rank starts from these weights (rank 0's, broadcast)
  Outcome out;
  out.params.resize(kRanks);
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto net = std::make_shared<Mlp>();
      {
        torch::NoGradGuard noGrad;
        for (size_t i = 0; i < net->parameters().size(); ++i) net->parameters()[i].copy_(initial.parameters()[i]);
      }
      net->to(device);
      DistributedOptions o = testing::threadRankOptions(r, kRanks, port, kRows);
      o.node.settings.dropStragglers = 1;
      o.node.settings.stragglerTimeoutMs = 50;
      o.stageOnHost = staged && device.is_cpu();
      DistributedModel dist(net, "mlp", o, [net](torch::Tensor x) { return net->forward(x); });
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      const auto deadline = std::chrono::steady_clock::now() + o.node.timeout;
      for (int s = 0; s < kSteps; ++s) {
        if (r == kRanks - 1) {
          {
            std::unique_lock<std::mutex> lock(mutex);
            const bool others = stepDone.wait_until(lock, deadline, [&] {
              for (int q = 0; q < kRanks - 1; ++q)
                if (finished[q] <= s) return false;
              return true;
            });
            if (!others) ADD_FAILURE() << "ranks 0-2 did not finish step " << s << " without rank 3";
          }
          // Their round is over; its result reaches this rank's node, then the step is skipped.
          while (!dist.skipIfBehind(opt)) {
            if (std::chrono::steady_clock::now() > deadline) {
              ADD_FAILURE() << "rank 3 never saw step " << s << " complete without it";
              break;
            }
            std::this_thread::yield();
          }
        } else {
          opt.zero_grad();
          torch::nn::functional::cross_entropy(dist.forward(xs[s][r].to(device)), ys[s][r].to(device)).backward();
          dist.step(opt);
        }
        {
          std::lock_guard<std::mutex> lock(mutex);
          finished[r] = s + 1;
        }
        stepDone.notify_all();
      }
      dist.finish();
      std::lock_guard<std::mutex> lock(mutex);
      if (r == kRanks - 1)
        out.skipped = dist.node().skippedIterations();
      else
        out.droppedByOthers += dist.node().droppedContributions();
      for (auto& p : net->parameters()) out.params[r].push_back(p.detach().to(torch::kCPU).clone());
    }));
  }
  for (auto& f : ranks) f.get();
  return out;
}

TEST(DeviceStragglers, ARankThatFellBehindTakesTheMeanThroughHostBuffersAsInPlace) {
  const Outcome staged = runWithAStraggler(/*staged=*/true);
  const Outcome inPlace = runWithAStraggler(/*staged=*/false);
  for (const Outcome* o : {&staged, &inPlace}) {
    EXPECT_EQ(o->skipped, 4) << "rank 3 skips every step";
    EXPECT_EQ(o->droppedByOthers, 0) << "with D = 1 and rank 3 out, every round waits for ranks 0-2";
    ASSERT_EQ(o->params[0].size(), 4u);
    // Every replica alike: rank 3 applied the same means, written into host buffers and copied up.
    for (int r = 1; r < 4; ++r)
      for (size_t i = 0; i < o->params[0].size(); ++i)
        EXPECT_TRUE(torch::equal(o->params[r][i], o->params[0][i])) << "rank " << r << " tensor " << i;
  }
  // The same model as the in-place path: the same three contributors each round, summed alike (on the
  // CPU the same bits; on a GPU its float rounding; a mean over the wrong ranks is off by 5e-2 and more).
  for (size_t i = 0; i < staged.params[0].size(); ++i) {
    const double scale = std::max(1e-6, inPlace.params[0][i].abs().max().item<double>());
    EXPECT_LE((staged.params[0][i] - inPlace.params[0][i]).abs().max().item<double>() / scale, 1e-5) << i;
  }
  // And not the model it started from.
  torch::manual_seed(1);
  const Mlp initial;
  EXPECT_FALSE(torch::equal(staged.params[0][0], initial.parameters()[0]));
}

}  // namespace
}  // namespace poseidon::pt
