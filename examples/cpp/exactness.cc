// Exactness check, run by tests/package/run.sh: Poseidon's data parallelism must give the parameters of one
// process that sees the whole batch. Every step has a global batch of 64 rows; with WORLD_SIZE W each rank
// trains on its own 64/W of them, so `poseidon launch -n 4 -- ./exactness p4.bin` and `./exactness p1.bin`
// must end with the same parameters up to float rounding.
//
// The model is not from Poseidon's zoo and covers both schemes at 4 workers x 16 rows: fc1 (256 x 128) is
// large enough that BestScheme sends it as sufficient factors (SFB), the conv and fc2 go by the parameter
// server (PS). The program fails if fc1 did not actually go by SFB, so the comparison tests that path.
//
// Usage: exactness OUT.bin   (rank 0 writes every parameter, in registration order, as raw float32)
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include "poseidon/torch/distributed.h"

struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv{register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)))};
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(4 * 8 * 8, 128))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(128, 10))};
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv(x)).flatten(1);
    return fc2(torch::relu(fc1(x)));
  }
};
TORCH_MODULE(Net);

constexpr int64_t kGlobalBatch = 64;
constexpr int kSteps = 10;

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::cerr << "usage: exactness OUT.bin" << std::endl;
    return 2;
  }
  auto options = poseidon::pt::DistributedOptions::fromEnvironment();
  const int rank = options.node.rank, world = options.node.worldSize;
  if (kGlobalBatch % world != 0) throw std::invalid_argument("WORLD_SIZE must divide the global batch of 64");
  const int64_t batch = kGlobalBatch / world;
  options.node.settings.batch = batch;
  // One intra-op thread per rank: the test runs 4 ranks on a small machine, and the result must not depend
  // on how many cores there are.
  torch::set_num_threads(1);

  // The same initial weights and data in every run, whatever the world size.
  torch::manual_seed(42);
  Net net;
  auto x = torch::randn({kSteps * kGlobalBatch, 1, 8, 8});
  auto y = torch::randint(0, 10, {kSteps * kGlobalBatch});

  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  poseidon::pt::DistributedModel dist(net, "exactness", options);
  if (rank == 0 && world > 1) {  // alone there is nothing to synchronize, so no plan
    for (const auto& p : dist.plan(batch)) {
      std::cout << "plan: " << p.name << " " << p.shape << " " << poseidon::schemeName(p.scheme) << std::endl;
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    const int64_t b = step * kGlobalBatch + rank * batch;  // this rank's rows of the step's global batch
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(dist.forward(x.slice(0, b, b + batch)), y.slice(0, b, b + batch));
    loss.backward();
    dist.step(opt);
    if (rank == 0) std::cout << "step " << step + 1 << " loss " << loss.item<float>() << std::endl;
  }
  // fc1 is layer 1 (registration order). Alone nothing is synchronized, so there is no scheme to check.
  if (world > 1 && (!dist.factorsCaptured(1) || dist.lastSchemes().at(1) != poseidon::Scheme::kSFB)) {
    throw std::runtime_error("fc1 did not go by SFB; this run would not test sufficient factors");
  }
  dist.finish();

  if (rank == 0) {
    std::ofstream out(argv[1], std::ios::binary);
    int64_t floats = 0;
    for (const auto& p : net->parameters()) {
      auto c = p.detach().contiguous();
      out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
      floats += c.numel();
    }
    out.close();
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[1]);
    std::cout << "wrote " << floats << " parameters to " << argv[1] << std::endl;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "exactness: " << e.what() << std::endl;
  return 1;
}
