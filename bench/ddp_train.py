#!/usr/bin/python3
"""One rank of `poseidon bench --accuracy`'s PyTorch DDP baseline: real training, padded compute.

Run by the harness with Debian's /usr/bin/python3 (python3-torch; `bench --accuracy --ddp-python` names
another) inside a node's network namespace, with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and
GLOO_SOCKET_IFNAME set by hand, as bench/ddp_worker.py is. It trains what `poseidon train --pad-ms P --curve-every N` trains, the same
way:

- the model (Caffe's LeNet, python/poseidon/zoo.py), the data (Fashion-MNIST, each rank a strided
  shard of one permutation per epoch from --seed, the C++ rule) and the optimizer (SGD with
  momentum, mean gradient over all ranks); the initial weights come from PyTorch's initializers,
  not LibTorch's, so the two curves start from different random points;
- the modeled device: each step's forward + backward is padded to --pad-ms milliseconds by a wait
  between forward and backward (backward's length estimated by the previous step's), so that no
  system's communication overlaps the pad, and a step whose real compute took longer is counted as
  an overrun; --pad-jitter-ms adds an exponential wait to each pad;
- the training clock: seconds spent in training steps; every --curve-every steps rank 0 keeps a copy
  of the model and the mean loss of its batches since the last copy, and after the run tests each
  copy on the whole test set.

Writes rank 0's JSON (--out) with the fields of `poseidon train --summary` that the harness reads.
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def load_zoo():
    """python/poseidon/zoo.py without importing the package (its C++ extension is not needed here)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "python", "poseidon", "zoo.py")
    spec = importlib.util.spec_from_file_location("poseidon_zoo", path)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    return zoo


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32, help="per-rank batch K")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, required=True, help="training steps")
    p.add_argument("--pad-ms", type=float, default=0)
    p.add_argument("--pad-jitter-ms", type=float, default=0,
                   help="add to each pad an exponential wait of this mean (per rank, from --seed)")
    p.add_argument("--curve-every", type=int, default=10)
    p.add_argument("--bucket-mb", type=float, default=25, help="DDP's bucket_cap_mb")
    p.add_argument("--data", default=None, help="Fashion-MNIST directory")
    p.add_argument("--timeout", type=int, default=300, help="seconds for the process group's operations")
    p.add_argument("--out", required=True, help="rank 0's JSON result")
    a = p.parse_args()
    if a.batch < 1 or a.steps < 1 or not a.lr > 0 or not 0 <= a.momentum < 1 or a.pad_ms < 0 or a.curve_every < 1 \
            or a.pad_jitter_ms < 0:
        p.error("--batch, --steps and --curve-every must be >= 1, --lr > 0, --momentum in [0, 1), "
                "--pad-ms and --pad-jitter-ms >= 0")

    torch.set_num_threads(1)
    zoo = load_zoo()
    data = {"directory": a.data} if a.data else {}
    train_x, train_y = zoo.fashion_mnist("train", **data)
    test_x, test_y = zoo.fashion_mnist("test", **data)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    net = zoo.LeNet()
    model = DDP(net, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    last_gradient = [0.0]

    def gradient_done(grad):
        last_gradient[0] = time.perf_counter()
        return grad

    for t in net.parameters():
        t.register_hook(gradient_done)

    jitter_random = random.Random(a.seed * 1000003 + rank)
    per_rank = (train_x.size(0) + world - 1) // world
    steps_per_epoch = (per_rank + a.batch - 1) // a.batch
    clock, overruns, max_ms, sum_ms, backward_ms = 0.0, 0, 0.0, 0.0, 0.0
    curve, loss_sum, loss_count = [], 0.0, 0
    step, diverged_at = 0, None
    while step < a.steps and diverged_at is None:
        epoch = step // steps_per_epoch
        idx = zoo.shard(train_x.size(0), world, rank, a.seed, epoch)
        for s in range(step % steps_per_epoch, steps_per_epoch):
            begin = time.perf_counter()
            b = idx[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(train_x[b]), train_y[b])
            forward_ms = 1000 * (time.perf_counter() - begin)
            jitter = jitter_random.expovariate(1 / a.pad_jitter_ms) if a.pad_jitter_ms > 0 else 0
            if a.pad_ms > 0 and a.pad_ms + jitter - forward_ms - backward_ms > 0:
                time.sleep((a.pad_ms + jitter - forward_ms - backward_ms) / 1000)  # as poseidon train pads
            backward_begin = time.perf_counter()
            loss.backward()  # DDP's all-reduce starts here, bucket by bucket, and is awaited at its end
            # Backward's compute ends with the last parameter's gradient (not with the all-reduce's wait).
            backward_ms = 1000 * (last_gradient[0] - backward_begin)
            compute_ms = forward_ms + backward_ms
            max_ms, sum_ms = max(max_ms, compute_ms), sum_ms + compute_ms
            overruns += a.pad_ms > 0 and compute_ms > a.pad_ms
            # Divergence, as poseidon train finds it: every rank holds the same mean gradient, so every rank
            # stops at this step, before the update; the curve ends with the model before it.
            if not all(bool(torch.isfinite(t.grad).all()) for t in net.parameters() if t.grad is not None):
                diverged_at = step + 1
                loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1
                clock += time.perf_counter() - begin
                step += 1
                if rank == 0:
                    curve.append({"step": step, "seconds": clock, "train_loss": loss_sum / loss_count,
                                  "params": [t.detach().clone() for t in net.parameters()]})
                break
            opt.step()
            loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1
            clock += time.perf_counter() - begin
            step += 1
            if rank == 0 and step % a.curve_every == 0:
                curve.append({"step": step, "seconds": clock, "train_loss": loss_sum / loss_count,
                              "params": [t.detach().clone() for t in net.parameters()]})
                loss_sum, loss_count = 0.0, 0
            if step >= a.steps:
                break
    # Every rank's overruns and largest compute; then rank 0 tests its copies (no one waits on it).
    stats = torch.zeros(3 * world + 1, dtype=torch.float64)
    stats[rank], stats[world + rank], stats[2 * world + rank], stats[3 * world] = overruns, max_ms, sum_ms, step
    dist.all_reduce(stats)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return
    net.eval()
    with torch.no_grad():
        for point in curve:
            for t, saved in zip(net.parameters(), point.pop("params")):
                t.copy_(saved)
            correct = sum((net(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum().item()
                          for i in range(0, test_x.size(0), 1000))
            point["test_accuracy"] = correct / test_x.size(0)
    s = stats.tolist()
    result = {"model": "lenet", "workers": world, "batch": a.batch, "steps": step, "lr": a.lr, "momentum": a.momentum,
              "pad_ms": a.pad_ms, "pad_jitter_ms": a.pad_jitter_ms, "pad_overruns_per_rank": s[:world], "max_compute_ms_per_rank": s[world:2 * world],
              "mean_compute_ms": sum(s[2 * world:3 * world]) / max(s[3 * world], 1), "train_clock_seconds": clock,
              "bucket_cap_mb": a.bucket_mb, "diverged": diverged_at is not None, "diverged_at_step": diverged_at,
              "curve": curve}
    for point in curve:  # a diverged run's NaN or infinite loss: JSON's null, as poseidon train writes it
        point["train_loss"] = point["train_loss"] if math.isfinite(point["train_loss"]) else None
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2, allow_nan=False)


if __name__ == "__main__":
    try:
        main()
    except (OSError, RuntimeError, ValueError) as e:
        print("ddp_train.py: error: %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)
