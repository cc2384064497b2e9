#!/usr/bin/python3
"""One rank of a compute-group run from Python: LeNet for STEPS steps of SGD (momentum 0.9, lr 0.05 halved
every 3 steps by a scheduler) on a global batch of 64 rows per step, split evenly over the ranks, with
--groups G (0: BSP, every layer by PS so that one group must give its parameters bit for bit); --momentum
sets the explicit momentum (asynchronous groups add an implicit one: 4 groups at 0.9 diverge). Every rank
writes its final parameters and its shard's staleness counts to OUT.rankR (torch.save).
--checkpoint DIR --save-at N: every rank calls save_checkpoint after step N; --resume first loads DIR's
newest checkpoint into the module and the optimizer, before wrapping it, and goes on from its step. Runs
with --checkpoint set the same schedule's rate by hand each step (a StepLR does not resume by itself).
--merged-fc trains LeNet's ip1 and ip2 on the FC server (rank 0) and the conv layers in the groups; rank 0
also writes the FC server's update count.
--misuse runs alone and prints each refusal of the package's group checks, one per line."""
import argparse
import tempfile

import torch
import torch.nn.functional as F

import poseidon
from poseidon.zoo import LeNet

GLOBAL = 64


def refusals():
    """Each misuse of compute groups, refused with its message (one rank, one group)."""
    torch.manual_seed(1)
    net = LeNet()
    sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def refused(what, make):
        try:
            make()
        except poseidon.InvalidArgument as e:
            print("refused %s: %s" % (what, e))
        else:
            print("accepted %s" % what)

    refused("two groups on one rank", lambda: poseidon.DistributedModel(net, 16, groups=2, optimizer=sgd))
    refused("adam", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=torch.optim.Adam(net.parameters())))
    refused("nesterov", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True)))
    refused("a partial optimizer", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=torch.optim.SGD(net.conv1.parameters(), lr=0.1)))
    refused("overlap_forward", lambda: poseidon.DistributedModel(net, 16, groups=1, optimizer=sgd,
                                                                 overlap_forward=True))
    refused("optimizer without groups", lambda: poseidon.DistributedModel(net, 16, optimizer=sgd))
    refused("merged_fc without groups", lambda: poseidon.DistributedModel(net, 16, merged_fc=net.merged_fc()))
    refused("merged_fc with a foreign classifier", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=sgd, merged_fc=(net.features, torch.nn.Linear(800, 10))))
    refused("merged_fc splitting a layer", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=sgd, merged_fc=(net.features, torch.nn.ParameterList([net.ip1.weight]))))
    refused("merged_fc of the whole model", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=sgd, merged_fc=(lambda x: x.flatten(1), net)))
    refused("merged_fc not a pair", lambda: poseidon.DistributedModel(
        net, 16, groups=1, optimizer=sgd, merged_fc=net.features))
    model = poseidon.DistributedModel(net, 16, groups=1, optimizer=sgd)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    F.cross_entropy(model(x), y).backward()
    refused("another optimizer at step", lambda: model.step(torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)))
    model.step(sgd)
    ck = tempfile.mkdtemp(prefix="poseidon-group-ck-")
    refused("load_checkpoint into a started job", lambda: poseidon.load_checkpoint(ck, model, sgd))
    refused("load_checkpoint into the module of a started job", lambda: poseidon.load_checkpoint(ck, net, sgd))
    loss = F.cross_entropy(model(x), y)
    refused("save_checkpoint between a forward and its step", lambda: poseidon.save_checkpoint(ck, model, sgd, 1))
    loss.backward()
    model.step(sgd)
    refused("no_sync", lambda: model.no_sync().__enter__())
    refused("fc_loss without merged FC", lambda: model.fc_loss(x, y))
    # A warm-up may start at lr 0: the round is applied (the momentum buffer is not zero) and moves nothing.
    model.pull_latest()
    before = [p.detach().clone() for p in net.parameters()]
    sgd.param_groups[0]["lr"] = 0.0
    F.cross_entropy(model(x), y).backward()
    model.step(sgd)
    model.pull_latest()
    print("a round at lr 0 moved the model: %s" % any(not torch.equal(a, p) for a, p in zip(before, net.parameters())))
    sgd.param_groups[0]["lr"] = 0.05
    sgd.param_groups[0]["momentum"] = 0.5
    refused("a changed momentum", lambda: model(x))
    sgd.param_groups[0]["momentum"] = 0.9
    model(x)  # a loop that ends after a forward: finish() must not wait for a round that was not pushed
    model.finish()
    print("finished after a forward without its step")
    refused("save_checkpoint after finish", lambda: poseidon.save_checkpoint(ck, model, sgd, 2))
    # The job is over: its module may be loaded again, for the next job (the directory has no checkpoint).
    print("load_checkpoint into the module after finish: %s" % poseidon.load_checkpoint(ck, net, sgd))
    merged = poseidon.DistributedModel(net, 16, groups=1, optimizer=sgd, merged_fc=net.merged_fc())
    refused("fc_loss before the forward", lambda: merged.fc_loss(torch.zeros(16, 800), y))
    h = merged(x)
    refused("step before fc_loss", lambda: merged.step(sgd))
    refused("fc_loss of a 4-D tensor", lambda: merged.fc_loss(x, y))
    merged.fc_loss(h, y).backward()
    refused("fc_loss twice", lambda: merged.fc_loss(h, y))
    merged.step(sgd)
    print("the FC server's updates: %s" % merged.fc_updates())
    merged.finish()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--groups", type=int, default=0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--misuse", action="store_true")
    p.add_argument("--checkpoint")
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--merged-fc", action="store_true")
    p.add_argument("--stage-on-host", action="store_true", help="the GPU's host-staged data path, on the CPU")
    a = p.parse_args()
    if a.misuse:
        refusals()
        return
    torch.manual_seed(1)
    net = LeNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=a.momentum)
    first = 0
    if a.resume:
        first = poseidon.load_checkpoint(a.checkpoint, net, opt)["iteration"]
    if a.groups:
        model = poseidon.DistributedModel(net, batch=GLOBAL // 4, groups=a.groups, optimizer=opt,
                                          merged_fc=net.merged_fc() if a.merged_fc else None,
                                          stage_on_host=a.stage_on_host)
    else:
        model = poseidon.DistributedModel(net, batch=GLOBAL // 4, scheme="ps")
    schedule = None if a.checkpoint else torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    start = [t.detach().clone() for t in net.parameters()]
    for step in range(first, a.steps):
        if schedule is None:
            for group in opt.param_groups:
                group["lr"] = 0.05 * 0.5 ** (step // 3)
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn((GLOBAL, 1, 28, 28), generator=g)
        y = torch.randint(0, 10, (GLOBAL,), generator=g)
        rows = GLOBAL // model.world_size
        mine = slice(model.rank * rows, (model.rank + 1) * rows)
        opt.zero_grad()
        if a.merged_fc:
            model.fc_loss(model(x[mine]), y[mine]).backward()  # the FC server's loss; the conv backward here
        else:
            F.cross_entropy(model(x[mine]), y[mine]).backward()
        model.step(opt)  # BSP: synchronize() and opt.step(); groups: the shards apply the round
        if schedule is not None:
            schedule.step()
        if a.save_at == step + 1:
            poseidon.save_checkpoint(a.checkpoint, model, opt, step + 1)
    stats = None
    if a.groups:
        model.pull_latest()  # a barrier: every shard has applied every round, and counted it
        stats = model.staleness()
    fc_updates = model.fc_updates() if a.merged_fc else None
    model.finish()  # with groups: every rank holds the latest model (finish() pulls it too)
    torch.save({"params": [t.detach().clone() for t in net.parameters()], "start": start, "staleness": stats,
                "workers": model.world_size, "fc_updates": fc_updates}, "%s.rank%d" % (a.out, model.rank))


if __name__ == "__main__":
    main()
