#!/usr/bin/python3
"""What the lossy DDP baselines cost in accuracy: a short real training run per DDP variant.

`poseidon bench` measures ddp-powersgd1/4 and ddp-fp16 on the emulated cluster, where only time
counts. PowerSGD (and, less so, fp16) changes the gradient, so its speed is not comparable with
exact systems without knowing what it does to training. This script trains Caffe's LeNet (the
main job's model) on Fashion-MNIST with 4 DDP ranks (Gloo, localhost), identical data order,
initial weights and hyper-parameters as `poseidon train` (batch 64 per rank, SGD lr 0.05,
momentum 0.9), for every variant, and reports the training loss it reaches and the test accuracy.

Run with Debian's python3 (python3-torch):  /usr/bin/python3 bench/powersgd_loss.py
Writes --json and --markdown (defaults under bench/results/). About 6 minutes on 2 cores.
"""
import argparse
import datetime
import gzip
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VARIANTS = ["ddp", "ddp-fp16", "ddp-powersgd1", "ddp-powersgd4"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(magic & 0xFF)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)  # pixels in [0, 1]
    return x, torch.from_numpy(y.astype(np.int64))


class LeNet(torch.nn.Module):
    """Caffe's LeNet: conv 20@5x5, pool, conv 50@5x5, pool, ip1 500, ReLU, ip2 10 (431K params)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 20, 5)
        self.conv2 = torch.nn.Conv2d(20, 50, 5)
        self.ip1 = torch.nn.Linear(800, 500)
        self.ip2 = torch.nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(self.conv1(x), 2)
        x = F.max_pool2d(self.conv2(x), 2)
        x = F.relu(self.ip1(x.flatten(1)))
        return self.ip2(x)


def rank_main(rank, a, variant, port, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.workers,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(a.seed)  # identical initial weights in every variant (DDP broadcasts rank 0's)
    # One bucket for the whole model (1.7 MB): with DDP's default 1 MB first bucket, LeNet has two,
    # and python3-torch 1.13's PowerSGD hook over Gloo then issues the second bucket's all-reduce and
    # the first one's P/Q all-reduces (from a completion callback) in a different order on
    # different ranks, which aborts in gloo ("op.preamble.length <= op.nbytes"). The emulated bench
    # does not hit it because its layer waits space the buckets out.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 << 20
    model = DDP(LeNet(), bucket_cap_mb=64)
    if variant == "ddp-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif variant.startswith("ddp-powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(  # the settings of the bench's ddp-powersgd systems
            process_group=None, matrix_approximation_rank=int(variant[-1]),
            start_powerSGD_iter=2, min_compression_rate=1)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)

    x, y = load(a.data, "train")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(a.seed))
    mine = order[rank::a.workers]  # a distributed sampler's shard, the same for every variant
    losses = []
    t0 = time.perf_counter()
    for step in range(a.steps):
        idx = mine[(step * a.batch) % (len(mine) - a.batch):][:a.batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the global mean loss, outside the gradient path
        losses.append(mean.item() / a.workers)
        if rank == 0 and (step + 1) % 50 == 0:
            print(f"  {variant}: step {step + 1}/{a.steps} loss {losses[-1]:.4f}", flush=True)
    seconds = time.perf_counter() - t0
    if rank == 0:
        tx, ty = load(a.data, "test")
        with torch.no_grad():
            pred = model.module(tx).argmax(1)
        acc = (pred == ty).float().mean().item()
        tail = losses[-a.tail:]
        diverged = next((i + 1 for i, v in enumerate(losses) if not math.isfinite(v)), None)
        with open(out, "w") as f:
            json.dump({"variant": variant, "steps": a.steps, "final_loss": sum(tail) / len(tail),
                       "diverged_at_step": diverged, "loss_curve": losses,
                       "test_accuracy": acc, "seconds": seconds}, f)
    dist.barrier()
    dist.destroy_process_group()


def loss_text(r):
    if r["diverged_at_step"]:
        return f"diverged (loss not finite from step {r['diverged_at_step']})"
    return f"{r['final_loss']:.4f}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300, help="SGD steps (300 x 4 x 64 = 1.3 epochs)")
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tail", type=int, default=50, help="final loss = mean over the last TAIL steps")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--json", default=os.path.join(here, "results", "powersgd_loss.json"))
    p.add_argument("--markdown", default=os.path.join(here, "results", "powersgd_loss.md"))
    a = p.parse_args()
    if not os.path.exists(os.path.join(a.data, "train-images-idx3-ubyte.gz")):
        sys.exit(f"powersgd_loss: no Fashion-MNIST under {a.data} (apt-get install dataset-fashion-mnist)")
    variants = a.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"powersgd_loss: unknown variant '{v}' (choose from {', '.join(VARIANTS)})")

    results = []
    for v in variants:
        out = f"/tmp/powersgd_loss.{os.getpid()}.{v}.json"
        print(f"{v}: {a.workers} ranks x batch {a.batch}, {a.steps} steps", flush=True)
        mp.spawn(rank_main, args=(a, v, free_port(), out), nprocs=a.workers, join=True)
        with open(out) as f:
            results.append(json.load(f))
        os.unlink(out)
        r = results[-1]
        print(f"{v}: final loss {loss_text(r)}, test accuracy {100 * r['test_accuracy']:.2f}%, "
              f"{r['seconds']:.0f} s", flush=True)

    exact = next((r for r in results if r["variant"] == "ddp"), None)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"model": "lenet", "dataset": "fashion-mnist", "workers": a.workers,
                   "batch": a.batch, "lr": a.lr, "momentum": a.momentum, "seed": a.seed,
                   "tail": a.tail, "command": " ".join(sys.argv), "results": results}, f, indent=1)
    with open(a.markdown, "w") as f:
        f.write(f"LeNet on Fashion-MNIST, {a.workers} DDP ranks x batch {a.batch}, SGD lr {a.lr} "
                f"momentum {a.momentum}, {a.steps} steps, same data order and initial weights.\n\n"
                f"| variant | final loss (mean of last {a.tail} steps) | vs ddp | test accuracy |\n"
                "|---|---|---|---|\n")
        for r in results:
            ok = exact and not r["diverged_at_step"] and not exact["diverged_at_step"]
            rel = f"{r['final_loss'] / exact['final_loss']:.3f}x" if ok else "-"
            f.write(f"| {r['variant']} | {loss_text(r)} | {rel} | "
                    f"{100 * r['test_accuracy']:.2f}% |\n")
    print(f"wrote {a.json} and {a.markdown}")


if __name__ == "__main__":
    main()
