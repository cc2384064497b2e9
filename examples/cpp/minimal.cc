// A complete Poseidon program: a 2-layer MLP on synthetic data, each rank training on its own shard.
// Alone it is a world of one; `poseidon launch -n 4 -- ./minimal` runs 4 ranks.
#include <torch/torch.h>

#include <iostream>

#include "poseidon/torch/distributed.h"

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(32, 128))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(128, 4))};
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
};
TORCH_MODULE(Mlp);

int main() try {
  // Rank, world size, coordinator and job secret from poseidon launch, torchrun, mpirun or Slurm.
  auto options = poseidon::pt::DistributedOptions::fromEnvironment();
  const int rank = options.node.rank, world = options.node.worldSize;
  const int64_t batch = 16;                // per rank
  options.node.settings.batch = batch;     // what BestScheme plans for

  torch::manual_seed(0);                   // the same data set on every rank
  auto x = torch::randn({4096, 32});
  auto y = x.slice(1, 0, 4).argmax(1);     // a class the MLP can learn
  auto mine = torch::arange(rank, x.size(0), world);  // this rank's shard
  x = x.index_select(0, mine);
  y = y.index_select(0, mine);

  Mlp net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  poseidon::pt::DistributedModel dist(net, "mlp", options);  // joins the job; rank 0's weights win
  for (int64_t step = 0; step < 100; ++step) {
    int64_t b = step * batch % (x.size(0) - batch);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(dist.forward(x.slice(0, b, b + batch)),
                                                     y.slice(0, b, b + batch));
    loss.backward();                       // each layer's sync starts as soon as its gradient is ready
    dist.step(opt);                        // waits for the mean gradient over all ranks, then opt.step()
    if ((step + 1) % 25 == 0) {
      std::cout << "rank " << rank << ": step " << step + 1 << " loss " << loss.item<float>() << std::endl;
    }
  }
  dist.finish();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "minimal: " << e.what() << std::endl;
  return 1;
}
