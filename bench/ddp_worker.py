#!/usr/bin/python3
"""One rank of `poseidon bench`'s PyTorch DDP baselines.

Run by the harness with Debian's own /usr/bin/python3 (python3-torch 1.13; `bench --ddp-python` names
another interpreter, e.g. a pip torch's) inside a node's network namespace, with MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE set by hand (torchrun's launcher crashes on Python 3.11) and
GLOO_SOCKET_IFNAME pointing at the node's interface.

The model is the same emulated layer table as Poseidon's bench-worker: every layer keeps its real
(scaled) parameter shapes, and its forward and backward are waits of the layer's emulated time,
against absolute deadlines, exactly as on the Poseidon side. Gradients are fixed random tensors
of the right shapes, so DDP's reducer buckets and all-reduces real bytes.

Variants: ddp (default 25 MB buckets), ddp-fp16 (fp16 compression hook), ddp-powersgd1 and
ddp-powersgd4 (PowerSGD hook, matrix approximation rank 1 or 4).
"""
import argparse
import datetime
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Clock:
    """Absolute deadlines for the emulated GPU, reset at the start of each iteration; every wait
    `dilation` times longer under `poseidon bench --time-dilation` (bench/emulation.h)."""

    deadline = 0.0
    dilation = 1.0

    @classmethod
    def wait(cls, seconds):
        cls.deadline += seconds * cls.dilation
        delay = cls.deadline - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class WaitLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layer, *params):
        ctx.layer = layer
        Clock.wait(layer.forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        layer = ctx.layer
        Clock.wait(layer.backward_s)
        return (grad, None) + tuple(layer.grads)


class EmulatedLayer(torch.nn.Module):
    def __init__(self, spec, generator):
        super().__init__()
        self.forward_s = spec["forward_s"]
        self.backward_s = spec["backward_s"]
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(shape)) for shape in spec["params"]])
        self.grads = [torch.randn(shape, generator=generator) * 1e-3 for shape in spec["params"]]

    def forward(self, x):
        return WaitLayer.apply(x, self, *self.weights)


class EmulatedModel(torch.nn.Module):
    def __init__(self, table, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layers = torch.nn.ModuleList([EmulatedLayer(s, g) for s in table["layers"]])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def read_counter(iface, which):
    if not iface:
        return 0
    with open(f"/sys/class/net/{iface}/statistics/{which}") as f:
        return int(f.read())


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return u.ru_utime + u.ru_stime


def timer_slack_ns():
    """This process's timer slack (poseidon bench sets it for every rank, bench/ranks.h); -1 if unreadable."""
    try:
        with open("/proc/self/timerslack_ns") as f:
            return int(f.read())
    except (OSError, ValueError):
        return -1


def host_jiffies():
    """(busy, total) jiffies of the whole host (/proc/stat's cpu line): kernel time included (the
    shaped links' softirqs, the loopback copies), which no process's rusage shows."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user .. steal (guest is inside user and nice)
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return sum(v) - idle, sum(v)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-json", required=True)
    p.add_argument("--variant", default="ddp",
                   choices=["ddp", "ddp-fp16", "ddp-powersgd1", "ddp-powersgd4"])
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--iface", default="")
    p.add_argument("--timeout", type=float, default=120.0)
    # DDP's bucket caps (its defaults are 25 MB and a 1 MB first bucket); the bench scales them by s^2
    # like Poseidon's KV pairs, so a scaled model is bucketed as the full-width one would be.
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float, default=1.0)
    # The harness's --time-dilation F: the emulated compute F times longer, as its links are F times
    # slower; the times reported divided by F (DDP's own work, Gloo's sums, is not dilated, as
    # Poseidon's uncharged work is not).
    p.add_argument("--time-dilation", type=float, default=1.0)
    a = p.parse_args()
    if not 1.0 <= a.time_dilation <= 32.0:
        raise ValueError(f"--time-dilation must be in [1, 32], got {a.time_dilation}")
    Clock.dilation = a.time_dilation

    torch.set_num_threads(1)
    with open(a.model_json) as f:
        table = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_mb * 1024 * 1024)  # read by DDP's constructor
    model = DDP(EmulatedModel(table, seed=rank + 1), bucket_cap_mb=a.bucket_mb)
    if a.variant == "ddp-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.variant.startswith("ddp-powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(a.variant[-1]),
            start_powerSGD_iter=2, min_compression_rate=1)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    x = torch.zeros(1)
    times = []
    tx0 = rx0 = 0
    cpu0 = 0.0
    host0 = (0, 0)
    for it in range(a.warmup + a.iterations):
        if it == a.warmup:
            tx0, rx0 = read_counter(a.iface, "tx_bytes"), read_counter(a.iface, "rx_bytes")
            cpu0 = cpu_seconds()
            host0 = host_jiffies()
        t0 = time.perf_counter()
        Clock.deadline = t0
        model(x).sum().backward()  # DDP's reducer waits for every bucket before backward returns
        times.append(time.perf_counter() - t0)
    host1 = host_jiffies()
    result = {
        "rank": rank, "system": a.variant, "model": table["name"], "batch": table["batch"],
        "iteration_seconds": [t / a.time_dilation for t in times], "warmup": a.warmup,
        "cpu_seconds": cpu_seconds() - cpu0,
        "host_busy_jiffies": host1[0] - host0[0], "host_total_jiffies": host1[1] - host0[1],
        "bucket_mb": a.bucket_mb, "first_bucket_mb": a.first_bucket_mb,
        "tx_bytes": read_counter(a.iface, "tx_bytes") - tx0,
        "rx_bytes": read_counter(a.iface, "rx_bytes") - rx0,
        "timer_slack_ns": timer_slack_ns(),
    }
    dist.barrier()
    dist.destroy_process_group()
    with open(a.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line, as every Poseidon tool reports errors
        print(f"ddp_worker: error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
