#!/usr/bin/python3
"""The main job from Python: Caffe's LeNet on Fashion-MNIST with Poseidon, as `poseidon train` runs it in C++.

    poseidon launch -n 4 -- /usr/bin/python3 examples/python/train_lenet.py     # 4 workers x batch 64
    /usr/bin/python3 examples/python/train_lenet.py --batch 256                 # one process, same global batch

Same model (431,080 parameters; ip1 goes by SFB, the rest by PS), data order (each rank a strided shard of
a per-epoch permutation from --seed), optimizer (SGD, momentum 0.9, the learning rate 0.025 x min(1,
sqrt(global batch / 256)) warmed up over 50 steps: docs/hyperparameters.md) and schedule (5 epochs) as
the C++ job. Prints progress, the test accuracy per epoch, and a JSON summary with --summary FILE.
A diverged training (poseidon.DivergenceError, raised on every rank at the same step) ends the job with
one line from rank 0 and exit status 3, as `poseidon train` does.
"""

import argparse
import json
import math
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

import poseidon
from poseidon.zoo import LeNet, fashion_mnist, shard


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="per-rank batch K")
    p.add_argument("--lr", type=float, default=None,
                   help="SGD learning rate (default: 0.025 x min(1, sqrt(workers x batch / 256)))")
    p.add_argument("--warmup-steps", type=int, default=50,
                   help="raise the learning rate linearly from LR/N to LR over the first N steps (0: none)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after N steps (smoke runs)")
    p.add_argument("--summary", help="write a JSON summary to FILE")
    a = p.parse_args()
    if a.epochs < 1 or a.batch < 1 or (a.lr is not None and not a.lr > 0) or not 0 <= a.momentum < 1 \
            or a.warmup_steps < 0:
        p.error("--epochs and --batch must be >= 1, --lr > 0, --momentum in [0, 1), --warmup-steps >= 0")

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    torch.manual_seed(a.seed)
    train_x, train_y = fashion_mnist("train")
    test_x, test_y = fashion_mnist("test")
    net = LeNet()
    model = poseidon.DistributedModel(net, batch=a.batch, name="lenet")
    rank, world = model.rank, model.world_size
    lr = a.lr if a.lr is not None else 0.025 * min(1.0, math.sqrt(world * a.batch / 256))  # as poseidon train's
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum)
    lead = rank == 0
    if lead:
        params = sum(t.numel() for t in net.parameters())
        print("train_lenet.py: lenet (%d params) on Fashion-MNIST, %d worker%s x batch %d, %d epochs, lr %g%s, "
              "momentum %g" % (params, world, "s" if world > 1 else "", a.batch, a.epochs, lr,
                               ", warmed up over %d steps" % a.warmup_steps if a.warmup_steps else "", a.momentum),
              flush=True)
        for layer in model.plan():
            print("  %-6s %-5s %-10s %s" % (layer["name"], layer["type"], layer["shape"],
                                            layer["scheme"] if world > 1 else "local"))

    def evaluate():
        net.eval()
        with torch.no_grad():
            mine = torch.arange(rank, test_x.size(0), world)
            correct = (net(test_x[mine]).argmax(1) == test_y[mine]).sum().item()
        net.train()
        return correct, len(mine)

    start = time.time()
    steps, epochs, accuracy, diverged = 0, [], 0.0, None
    per_rank = (train_x.size(0) + world - 1) // world
    steps_per_epoch = (per_rank + a.batch - 1) // a.batch
    for epoch in range(a.epochs):
        idx = shard(train_x.size(0), world, rank, a.seed, epoch)
        t0, loss_sum = time.time(), 0.0
        for s in range(steps_per_epoch):
            b = idx[s * a.batch:(s + 1) * a.batch]
            for group in opt.param_groups:  # the warm-up, from the job's step
                group["lr"] = lr * min(1.0, (steps + 1) / a.warmup_steps) if a.warmup_steps else lr
            opt.zero_grad()
            loss = F.cross_entropy(model(train_x[b]), train_y[b])
            loss.backward()
            loss_sum += loss.item()
            steps += 1
            try:
                model.synchronize()  # every rank holds the same mean gradient: all raise at this step, or none
            except poseidon.DivergenceError as e:
                diverged = {"step": steps, "lr": opt.param_groups[0]["lr"], "what": str(e)}
                break
            opt.step()
            if lead and (s + 1) % max(1, steps_per_epoch // 5) == 0:
                print("epoch %d/%d %3d%%  loss %.4f  %.0f img/s" % (epoch + 1, a.epochs, 100 * (s + 1) // steps_per_epoch,
                      loss_sum / (s + 1), (s + 1) * a.batch * world / (time.time() - t0)), flush=True)
            if 0 < a.max_steps <= steps:
                break
        if diverged:
            break
        # Test accuracy over all ranks' shares of the test set (summed through one tiny all-reduce).
        correct, seen = evaluate()
        accuracy = correct / max(seen, 1)
        if world > 1:
            counts = model.allsum([correct, seen])
            accuracy = counts[0] / counts[1]
        epochs.append({"epoch": epoch + 1, "train_loss": loss_sum / max(s + 1, 1), "test_accuracy": accuracy,
                       "seconds": time.time() - t0})
        if lead:
            print("epoch %d/%d done in %.1f s: train loss %.4f, test accuracy %.2f%%"
                  % (epoch + 1, a.epochs, epochs[-1]["seconds"], epochs[-1]["train_loss"], 100 * accuracy), flush=True)
        if 0 < a.max_steps <= steps:
            break
    elapsed = time.time() - start
    summary = model.summary()
    if lead:
        print("final test accuracy %.2f%%, %.1f s" % (100 * accuracy, elapsed), flush=True)
        if a.summary:
            with open(a.summary, "w") as f:
                json.dump({"test_accuracy": accuracy, "seconds": elapsed, "steps": steps, "workers": world,
                           "batch": a.batch, "lr": lr, "warmup_steps": a.warmup_steps, "epochs_run": epochs,
                           "diverged": diverged is not None, "diverged_at_step": diverged and diverged["step"],
                           "layers": summary["layers"]}, f, indent=2)
        if diverged:
            found = re.search(r": (.*) is not finite", diverged["what"])
            print("train_lenet.py: error: the training diverged at step %d (found by every rank: %s is not finite) at "
                  "learning rate %g; try a lower --lr (e.g. %g) or a longer --warmup-steps"
                  % (diverged["step"], found.group(1) if found else "a mean gradient", diverged["lr"], lr / 4),
                  file=sys.stderr, flush=True)
    # The final barrier after rank 0's output: a launcher that stops the other ranks when one exits with an
    # error (poseidon launch) finds it written.
    model.finish()
    if diverged:
        sys.exit(3)

if __name__ == "__main__":
    try:
        main()
    except poseidon.Error as e:
        print("train_lenet.py: error: %s" % e, file=sys.stderr)
        sys.exit(1)
