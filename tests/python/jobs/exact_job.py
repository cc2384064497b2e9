#!/usr/bin/python3
"""One rank of an exactness run: MODEL for STEPS steps of SGD with momentum on a global batch of 64 rows per
step, split evenly over the ranks; rank 0 writes the final parameters and the plan to OUT (torch.save).
With --checkpoint DIR it saves after every --every steps and resumes from the newest checkpoint there;
--fail-at RANK:STEP raises an error on that rank at that step (lifecycle tests)."""
import argparse

import torch
import torch.nn.functional as F

import poseidon
from poseidon.zoo import LeNet

GLOBAL = 64


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Sequence(torch.nn.Module):
    """A Linear on a 3-D input (batch, 7, 256): LibTorch folds it into one addmm over batch x 7 rows, whose
    factors (7 rows per sample) are captured: SFB."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(256, 512)
        self.out = torch.nn.Linear(512, 10)

    def forward(self, x):
        h = F.relu(self.proj(x.view(x.size(0), 7, 256)))
        return self.out(h.mean(1))


class Tied(torch.nn.Module):
    """One Linear applied twice: its weight gradient is the sum of two products, which one set of factors
    cannot carry, so the layer goes by PS whatever BestScheme says."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(784, 256)
        self.twice = torch.nn.Linear(256, 256)
        self.out = torch.nn.Linear(256, 10)

    def forward(self, x):
        h = F.relu(self.inp(x.flatten(1)))
        return self.out(F.relu(self.twice(F.relu(self.twice(h)))))


class Attention(torch.nn.Module):
    """nn.MultiheadAttention uses its out_proj's parameters without calling out_proj: an overlapped step
    must update out_proj before the attention runs, not after the forward."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 2)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = x.view(x.size(0), 7, 16).transpose(0, 1)
        a, _ = self.attn(h, h, h)
        return self.out(a.mean(0))


class BnConv(torch.nn.Module):
    """A conv net with BatchNorm: its buffers go from rank 0 to every rank after each step. The batch
    statistics are per rank, so its reference is the same ranks on another device, not one process."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 5)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 12 * 12, 10)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


class Unused(torch.nn.Module):
    """A Linear that goes by SFB and is never called: every rank contributes zero factors for it."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.spare = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODELS = {"mlp": (Mlp, (1, 28, 28)), "attention": (Attention, (7 * 16,)), "lenet": (LeNet, (1, 28, 28)),
          "sequence": (Sequence, (7 * 256,)), "bnconv": (BnConv, (1, 28, 28)), "unused": (Unused, (1, 28, 28)),
          "tied": (Tied, (1, 28, 28))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--checkpoint")
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--save-module", action="store_true",
                   help="give save_checkpoint the wrapped module, not the DistributedModel")
    p.add_argument("--fail-at")
    p.add_argument("--schedule", action="store_true", help="halve the learning rate every 3 steps")
    p.add_argument("--zero-grad", action="store_true",
                   help="with --overlap-forward: zero_grad() before each forward, as the usual loop does")
    p.add_argument("--overlap-forward", action="store_true",
                   help="step(opt) returns at once; the next forward applies the update layer by layer")
    p.add_argument("--send-window", type=int, default=0, help="priority-scheduled links with this window")
    p.add_argument("--urgent-layers", type=int, default=0,
                   help="with --send-window: the first K layers on a second, TOS-marked connection per peer")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds any wait on other ranks may last")
    p.add_argument("--local-ranks", type=int, default=1,
                   help="ranks per machine, meeting on a leader before the network (local_ranks=)")
    p.add_argument("--device", choices=["cpu", "cuda", "staged"], default="cpu",
                   help="the model on cpu, on this rank's GPU (poseidon.local_device), or on the CPU through the "
                        "GPU's host-staged data path")
    a = p.parse_args()
    make, shape = MODELS[a.model]
    torch.manual_seed(1)
    net = make()
    device = poseidon.local_device("cuda") if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        # Full float32 on the GPU, as the CPU reference computes: PyTorch's default TF32 convolutions
        # (10-bit mantissa) alone moved the conv net's weights 6e-3 from the CPU's in 10 steps on an H200.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    net.to(device)
    # The sequence models join at their first forward, taking K from the input (the lazy form).
    model = poseidon.DistributedModel(net, batch=None if a.model.startswith("sequence") else GLOBAL // 4,
                                      overlap_forward=a.overlap_forward, send_window=a.send_window,
                                      urgent_layers=a.urgent_layers,
                                      timeout=a.timeout, stage_on_host=a.device == "staged",
                                      local_ranks=a.local_ranks)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # A learning-rate schedule stepped after every step: the overlapped step must use the rate it had.
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if a.schedule else None
    start = 0
    if a.checkpoint:
        meta = poseidon.load_checkpoint(a.checkpoint, model, opt)
        start = meta["iteration"] if meta else 0
    fail_rank, fail_step = map(int, a.fail_at.split(":")) if a.fail_at else (-1, -1)
    for step in range(start, a.steps):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn((GLOBAL,) + shape, generator=g)
        y = torch.randint(0, 10, (GLOBAL,), generator=g)
        rows = GLOBAL // model.world_size
        mine = slice(model.rank * rows, (model.rank + 1) * rows)
        x, y = x.to(device), y.to(device)
        if model.rank == fail_rank and step == fail_step:
            raise RuntimeError("rank %d fails at step %d on purpose" % (fail_rank, fail_step))
        if a.overlap_forward:  # the wrapper owns the gradients; a zero_grad() (to None) is undone
            if a.zero_grad:
                opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            model.step(opt)
        else:
            opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            model.synchronize()
            opt.step()
        if schedule:
            schedule.step()
        if a.checkpoint and (step + 1) % a.every == 0:
            poseidon.save_checkpoint(a.checkpoint, model.module if a.save_module else model, opt, step + 1)
    plan = model.plan()
    network_workers = model.summary()["workers"]  # the workers on the network (leaders, with --local-ranks)
    if a.overlap_forward:
        print("updates applied in the forward: %d" % model.updates_in_forward)
    sent = model.summary()["bytes_sent"]
    print("urgent bytes: %s of %d" % ("some" if sent["urgent"] > 0 else "none", sent["ps"] + sent["sfb"]))
    model.finish()  # with overlap_forward, this applies the last step
    if model.rank == 0:
        torch.save({"params": [t.detach().cpu().clone() for t in net.parameters()],
                    "buffers": [t.detach().cpu().clone() for t in net.buffers()], "plan": plan,
                    "workers": model.world_size, "network_workers": network_workers}, a.out)


if __name__ == "__main__":
    main()
