#!/usr/bin/python3
# A complete Poseidon program in Python: a 2-layer MLP on synthetic data, each rank training on its own
# shard. Alone it is a world of one; `poseidon launch -n 4 -- /usr/bin/python3 minimal.py` runs 4 ranks.
import torch

import poseidon

torch.manual_seed(0)                                # the same data set on every rank
x = torch.randn(4096, 32)
y = x[:, :4].argmax(1)                              # a class the MLP can learn
net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
model = poseidon.DistributedModel(net, batch=16)    # joins the job; rank 0's weights win
x, y = x[model.rank::model.world_size], y[model.rank::model.world_size]  # this rank's shard
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(100):
    b = step * 16 % (len(x) - 16)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x[b:b + 16]), y[b:b + 16])
    loss.backward()                                 # each layer's sync starts as soon as its gradient is ready
    model.synchronize()                             # every .grad now holds the mean over all ranks
    optimizer.step()
    if (step + 1) % 25 == 0:
        print(f"rank {model.rank}: step {step + 1} loss {loss.item():.4f}")
model.finish()
