"""Poseidon for PyTorch: data-parallel training over plain Ethernet.

    import poseidon
    model = poseidon.DistributedModel(model, batch=64)   # any torch.nn.Module; joins the job
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()          # each layer's sync starts as soon as its gradient is ready
        model.synchronize()      # the mean gradient over all ranks is in every .grad
        optimizer.step()
    model.finish()

Start the ranks with ``poseidon launch -n 4 -- /usr/bin/python3 train.py`` (or torchrun-style
variables, mpirun, Slurm). The runtime is the C++ library's (wait-free backpropagation, sufficient
factors of nn.Linear layers, the sharded parameter server, the coordinator, the job secret): see
docs/python.md.
"""

import atexit
import contextlib
import copy
import datetime
import faulthandler
import math
import numbers
import os
import sys
import traceback
import weakref

import torch

# Importing _poseidon installs a C++ stack report for native crashes (SIGSEGV and the like) where no
# handler is set. If Python's faulthandler is on (python -X faulthandler, PYTHONFAULTHANDLER), it is
# set aside for the import and enabled again on top, on standard error for every thread (its default:
# a file= given to an earlier enable() is not kept): a crash then prints the Python traceback, then the
# C++ stack. Nothing here can make the import fail.
_faulthandler_on = faulthandler.is_enabled()
if _faulthandler_on:
    faulthandler.disable()
try:
    from . import _poseidon  # noqa: E402
finally:
    if _faulthandler_on:
        try:
            faulthandler.enable()
        except (RuntimeError, ValueError, AttributeError, OSError):  # a standard error without a file descriptor
            pass
from ._poseidon import AbortedError, DivergenceError, Error, InvalidArgument, IoError, TimeoutError  # noqa: F401
from ._layers import _FcLoss, _describe, _tensors, local_device  # noqa: F401
from .checkpoint import _release_locks, load_checkpoint, save_checkpoint  # noqa: F401

__all__ = ["DistributedModel", "local_device", "save_checkpoint", "load_checkpoint", "InvalidArgument", "TimeoutError",
           "AbortedError", "IoError", "DivergenceError", "Error"]

_live = weakref.WeakSet()  # models whose runtime threads must stop before the interpreter does


def _timeout_ms(timeout):
    """timeout= in milliseconds: seconds (a number), or a datetime.timedelta as torch.distributed takes."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise InvalidArgument("timeout is seconds (a number) or a datetime.timedelta, got %r" % (timeout,))
    # Up to 1e12 s: beyond, the milliseconds no longer fit the runtime's 64-bit count.
    if not (math.isfinite(seconds) and 0 < seconds <= 1e12):
        raise InvalidArgument("timeout must be a positive finite number of seconds, got %r" % (timeout,))
    return max(1, int(round(seconds * 1000)))


def _integer(name, value, low=None, high=None, what=""):
    """An integer option: an int, or a float with nothing after the point (64.0); 2.7, "64" and True are
    refused by name, as are values outside [low, high] (`what` says what the bounds mean)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            (not isinstance(value, numbers.Integral) and not (math.isfinite(value) and float(value).is_integer())):
        raise InvalidArgument("%s must be an integer, got %r" % (name, value))
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = ("at least %d" % low if high is None else "at most %d" % high if low is None
                  else "in [%d, %d]" % (low, high))
        raise InvalidArgument("%s must be %s%s, got %d" % (name, bounds, what, value))
    return value


class DistributedModel(torch.nn.Module):
    """Wraps any ``torch.nn.Module`` for data-parallel training with Poseidon.

    batch: the per-rank batch size K (rows of each step's input), which BestScheme plans with.
        When None, the rank joins the job at its first training forward and takes K from the first
        tensor argument's first dimension.
    name: the model's name in the job (default: the module's class name).
    scheme: "auto" (BestScheme per layer), "ps" or "sfb" (force a scheme for Linear layers).
    overlap: wait-free backpropagation; False sends every layer after the whole backward.
    broadcast_buffers: rank 0's buffers (BatchNorm statistics) go to every rank after each step.
    The module's float32 parameters live on the CPU or on one CUDA device (one process per GPU:
        local_device() is this rank's); on a GPU each layer's gradient goes to page-locked host memory
        on a side stream as its backward ends, and the mean comes back before the optimizer
        (docs/gpu.md). stage_on_host: a CPU module takes that same path (for tests).
    check_finite: a step whose mean gradient is not finite (a NaN or an infinity: the training diverged)
        raises poseidon.DivergenceError from synchronize()/step(), before the optimizer runs, on every
        rank at that step (they hold the same mean; with overlap_forward at the end of the step, with
        compute groups at the step of a round whose pulled model is not finite). False: trains on.
    timeout: seconds (or a datetime.timedelta) any wait on other ranks may last before the job fails,
        naming what is missing.
    io_threads: ZeroMQ I/O threads of this rank (one per GB/s in or out; with a job secret they also
        encrypt; 0, the default: half the host's cores over the ranks on it, LOCAL_WORLD_SIZE, 2 to 16).
    sum_threads: threads of this rank that sum the pushes its KV shard receives, beside the receive loop
        (default 2; 0: on the receive loop).
    tcp_rcvbuf: TCP receive buffer per connection into this rank in bytes (0, the default: the send
        window and a third with send_window, seven eighths of it past 8 peers,
        else the OS's; -1: the OS's; a small one keeps many senders from overflowing a switch port).
    wire: what gradients travel as: "fp32" (exact), or "bf16" / "fp16" (half the bytes, summed in fp32;
        lossy, like DDP's fp16 compression hook). Every rank must pass the same.
    local_ranks: several ranks (GPUs) per machine, as the paper's nodes (docs/gpu.md): ranks r..r+L-1
        (r a multiple of L) first meet on rank r, their leader, which alone synchronizes with the other
        machines: the machine's PS update leaves it once, summed, and its SF sets once, stacked. L must
        divide the world size; every rank passes the same; not with compute groups. 1 (the default):
        every rank is its own node; 0: one node per host, found at rendezvous from the ranks' addresses.
    overlap_forward: step(optimizer) returns at once and the next forward applies each layer's update
        just before that layer runs, as its synchronized gradient lands (docs/scheduling.md); exact for
        optimizers that update each parameter from its own gradient and state (SGD, Adam, ...). The
        wrapper then owns the gradients: optimizer.zero_grad() is not needed and harmless (between step()
        and each layer's update the gradients are held by the wrapper and .grad is None; after the update
        it is cleared); no_sync() is not available; finish() and apply_pending() apply the last step.
    send_window: priority-scheduled links (docs/scheduling.md), for overlap_forward: each connection
        holds this many bytes in the kernel and larger messages go as fragments of it, so a lower
        layer's result passes the upper ones queued before it (the next forward needs it first).
        0 (the default): FIFO links. -1: the runtime's default for the job's size and host_queue, 1 MB,
        or 256 KB past 8 peers with host_queue="tos" (docs/scheduling.md). Not with compute groups.
    urgent_layers: with send_window, the synchronization data of the first K layers (the modules that
        own trainable parameters, in registration order: the next forward needs them first) go to each
        peer on a second connection whose packets are marked IP TOS low-delay. They wait behind none of
        the other layers' bytes in ZeroMQ and the kernel's send buffers, and a host queue that honours
        TOS sends them first (docs/scheduling.md). 0: one connection per peer. -1 (the default): the
        runtime's rule: with send_window and more than 16 peers, every layer below the model's FC stack
        with host_queue="tos" where the FC layers hold most of the parameters; otherwise K = 3 past 8
        peers, and one connection with fewer.
    host_queue: for urgent_layers=-1 and send_window=-1, this host's egress queue: "tos" (two bands, the
        marked one first, as the bench's: past 16 peers the layers below the FC stack go urgent, and past
        8 peers send_window=-1 is 256 KB), "fifo" or "auto" (the
        default; 3 layers: it reads the kernel's qdisc and logs it; on a NIC's own pfifo_fast the layers
        below the FC stack are unmeasured; docs/scheduling.md).
    groups: Omnivore's compute groups (docs/omnivore.md): 0 (the default) is BSP; G > 0 splits the ranks
        into G groups of consecutive ranks, synchronous inside a group and asynchronous across groups.
        The sharded parameter servers then hold the model and run SGD: each group's summed gradient is
        applied as it arrives, and each round's forward pulls the model as it stands. Needs optimizer=.
    optimizer: with groups, the torch.optim.SGD that names the update (its momentum, weight decay and
        learning rate; no nesterov, no dampening, every parameter group alike, exactly the module's
        trainable parameters). The shards keep the momentum; step(optimizer) does not call
        optimizer.step(). Each round uses the learning rate the optimizer has at that round's forward
        (a scheduler may change it); momentum and weight decay must not change.
    staleness: with groups, how many rounds a group may run ahead of the slowest (SSP); None: unbounded.
    merged_fc: with groups, Omnivore's merged FC (docs/omnivore.md): a pair (features, classifier) with
        module(x) == classifier(features(x)). `features` is a callable that returns a 2-D tensor (rows x
        features); `classifier` is a torch.nn.Module whose trainable parameters are module's (a submodule,
        or a module holding some of its layers). Only the other layers train in the compute groups: the
        classifier runs on one FC server (rank 0, its own thread), which takes every member's features each
        round, computes the cross-entropy loss, updates the classifier at once (staleness 0) and sends each
        rank the gradient of its loss. A training forward then returns the features; fc_loss(features,
        labels) gives the loss to call backward() on. An evaluation forward runs module(x), with the
        classifier as of the last pull_latest().
    The rank, world size, coordinator and job secret come from the launcher's environment.
    """

    def __init__(self, module, batch=None, *, name=None, scheme="auto", overlap=True, broadcast_buffers=True,
                 check_finite=True, timeout=30.0, sync_threads=2, pair_bytes=2 * 1024 * 1024, io_threads=0,
                 sum_threads=2, tcp_rcvbuf=0, wire="fp32", overlap_forward=False, send_window=0, urgent_layers=-1,
                 host_queue="auto", groups=0, optimizer=None,
                 staleness=None, merged_fc=None, stage_on_host=False, local_ranks=1):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError("DistributedModel wraps a torch.nn.Module, got %s" % type(module).__name__)
        self.module = module
        self._name = name or type(module).__name__.lower()
        options = _poseidon.options_from_environment()
        self.groups = _integer("groups", groups)
        options.update(scheme=scheme, overlap=bool(overlap), broadcast_buffers=bool(broadcast_buffers),
                       check_finite=bool(check_finite),
                       timeout_ms=_timeout_ms(timeout), sync_threads=_integer("sync_threads", sync_threads, 1, 1024),
                       pair_bytes=_integer("pair_bytes", pair_bytes, 4, 1 << 30, " bytes"),
                       io_threads=_integer("io_threads", io_threads), sum_threads=_integer("sum_threads", sum_threads),
                       tcp_rcvbuf=_integer("tcp_rcvbuf", tcp_rcvbuf),
                       wire=str(wire), send_window=_integer("send_window", send_window),
                       urgent_layers=_integer("urgent_layers", urgent_layers),
                       host_queue=str(host_queue), stage_on_host=bool(stage_on_host),
                       local_ranks=self._check_local_ranks(options, local_ranks, self.groups, scheme))
        self._group_optimizer = None
        # Plain attributes, not submodules: the wrapper's state_dict stays the module's.
        features, classifier = self._check_merged_fc(merged_fc)
        object.__setattr__(self, "_features", features)
        object.__setattr__(self, "_classifier", classifier)
        self._fc_round = False  # merged FC: a training forward ran and its fc_loss() has not
        if self.groups != 0 or optimizer is not None or staleness is not None or merged_fc is not None:
            self._check_groups(options, optimizer, staleness, overlap_forward)
            sgd = self._group_hyper(optimizer)
            options.update(groups=self.groups, staleness=-1 if staleness is None else _integer("staleness", staleness),
                           momentum=float(sgd["momentum"]), weight_decay=float(sgd["weight_decay"]),
                           learning_rate=float(sgd["lr"]))
            self._group_optimizer = optimizer
            self._group_sgd = sgd
        self._options = options
        self._overlap_forward = bool(overlap_forward)
        self._pending = None  # overlap_forward: the optimizer whose step the next forward applies
        self.updates_in_forward = 0  # overlap_forward: layer updates applied by a forward's gates (not flushed)
        self._impl = None
        self._batch = None
        if batch is not None:
            self._join(_integer("batch", batch, 1))
        self._pid = os.getpid()  # a forked child's copy is not its model: the exit hooks leave it alone
        _live.add(self)

    @staticmethod
    def _check_local_ranks(options, local_ranks, groups, scheme):
        """local_ranks, checked here in the Python names (the rendezvous would say --local-ranks)."""
        local = _integer("local_ranks", local_ranks, 0, None, " (0: one node per host)")
        world = options["world_size"]
        if local > 1 and world % local != 0:
            raise InvalidArgument("local_ranks=%d must divide the %d ranks of the job" % (local, world))
        if local > 1 and groups:
            raise InvalidArgument("local_ranks=%d cannot be combined with compute groups (groups=%s)" % (local, groups))
        if local > 1 and scheme == "adam":
            raise InvalidArgument("local_ranks=%d cannot be combined with scheme='adam'" % local)
        return local

    # ---- compute groups ---------------------------------------------------------------------------

    def _check_merged_fc(self, merged_fc):
        if merged_fc is None:
            return None, None
        if not (isinstance(merged_fc, (tuple, list)) and len(merged_fc) == 2):
            raise InvalidArgument("merged_fc is a pair (features, classifier) with module(x) == "
                                  "classifier(features(x)), got %s" % type(merged_fc).__name__)
        features, classifier = merged_fc
        if not callable(features):
            raise InvalidArgument("merged_fc: features must be callable (x -> a 2-D tensor of features)")
        if not isinstance(classifier, torch.nn.Module):
            raise InvalidArgument("merged_fc: the classifier must be a torch.nn.Module, got %s"
                                  % type(classifier).__name__)
        ours = {id(p) for p in self.module.parameters() if p.requires_grad}
        theirs = [p for p in classifier.parameters() if p.requires_grad]
        if not theirs:
            raise InvalidArgument("merged_fc: the classifier has no trainable parameters")
        if any(p.dtype != torch.float32 or not p.is_contiguous() for p in theirs):
            raise InvalidArgument("merged_fc: the classifier's parameters must be contiguous float32 tensors")
        if any(id(p) not in ours for p in theirs):
            raise InvalidArgument("merged_fc: the classifier's parameters must be the module's (a submodule, or "
                                  "a module holding some of its layers)")
        fc = {id(p) for p in theirs}
        layers, _, _ = _describe(self.module, self._name)
        for (name, _, _, params) in layers:
            inside = [id(p) in fc for p in params]
            if any(inside) and not all(inside):
                raise InvalidArgument("merged_fc: layer %s has parameters on both sides of the split; the "
                                      "classifier must hold whole layers" % name)
        if len(fc) == len(ours):
            raise InvalidArgument("merged_fc: every layer is in the classifier; the compute groups need the rest")
        return features, classifier

    def _split(self, layers):
        """Merged FC: the layers that train in the groups, and those on the FC server."""
        if self._classifier is None:
            return layers, []
        fc = {id(p) for p in self._classifier.parameters()}
        return ([l for l in layers if id(l[3][0]) not in fc], [l for l in layers if id(l[3][0]) in fc])

    def _check_groups(self, options, optimizer, staleness, overlap_forward):
        world = options["world_size"]
        if self.groups == 0 and self._classifier is not None:
            raise InvalidArgument("merged_fc runs the other layers in compute groups: give groups=G (G >= 1) "
                                  "and optimizer=")
        if self.groups < 1:
            raise InvalidArgument("optimizer= and staleness= are for compute groups: give groups=G (G >= 1)"
                                  if self.groups == 0 else "groups must be 0 (BSP) or at least 1, got %d" % self.groups)
        if world % self.groups != 0:
            raise InvalidArgument("groups=%d must divide the %d ranks of the job" % (self.groups, world))
        if staleness is not None and _integer("staleness", staleness) < 0:
            raise InvalidArgument("staleness must be None (unbounded) or >= 0 rounds, got %s" % staleness)
        if overlap_forward:
            raise InvalidArgument("overlap_forward is for BSP jobs: with compute groups each round's forward "
                                  "pulls the shards' model")
        if options["send_window"] != 0:
            raise InvalidArgument("send_window is for overlap_forward (BSP jobs), not for compute groups")
        if options["wire"] != "fp32":
            raise InvalidArgument("wire=%r: compute groups push and pull fp32 (the 16-bit wire is BSP's)"
                                  % options["wire"])
        if not isinstance(optimizer, torch.optim.SGD):
            raise InvalidArgument("compute groups: the shards run SGD; give optimizer=torch.optim.SGD(...) "
                                  "(got %s)" % ("nothing" if optimizer is None else type(optimizer).__name__))
        ours = [p for p in self.module.parameters() if p.requires_grad]
        theirs = [p for g in optimizer.param_groups for p in g["params"]]
        if {id(p) for p in ours} != {id(p) for p in theirs} or len(theirs) != len(ours):
            raise InvalidArgument("compute groups: the optimizer must hold exactly the module's %d trainable "
                                  "parameters (it holds %d); the shards update every one of them"
                                  % (len(ours), len(theirs)))

    @staticmethod
    def _group_hyper(optimizer):
        """The SGD the shards run: one set of hyperparameters for every parameter group."""
        keys = ("lr", "momentum", "weight_decay", "dampening", "nesterov", "maximize")
        first = {k: optimizer.param_groups[0].get(k, False if k in ("nesterov", "maximize") else 0.0)
                 for k in keys}
        for g in optimizer.param_groups[1:]:
            for k in keys:
                if g.get(k, first[k]) != first[k]:
                    raise InvalidArgument("compute groups: every parameter group must have the same %s "
                                          "(the shards run one SGD)" % k)
        if first["nesterov"] or first["dampening"] != 0 or first["maximize"]:
            raise InvalidArgument("compute groups: the shards run plain SGD with momentum; this optimizer has "
                                  + ", ".join(k for k in ("nesterov", "dampening", "maximize") if first[k]))
        lr = float(first["lr"])
        if not (lr >= 0 and math.isfinite(lr)):
            raise InvalidArgument("compute groups: the learning rate must be finite and >= 0, got %s" % first["lr"])
        if not 0 <= float(first["momentum"]) < 1:
            raise InvalidArgument("compute groups: momentum must be in [0, 1), got %s" % first["momentum"])
        return first

    def _group_round(self):
        """Before a round's forward: the learning rate the optimizer has now; momentum and weight decay as
        the job was started with."""
        now = self._group_hyper(self._group_optimizer)
        for k in ("momentum", "weight_decay"):
            if float(now[k]) != float(self._group_sgd[k]):
                raise InvalidArgument("compute groups: the optimizer's %s changed from %s to %s; the shards run "
                                      "the job's SGD (only the learning rate may follow a schedule)"
                                      % (k, self._group_sgd[k], now[k]))
        self._impl.set_group_lr(float(now["lr"]))
        self._round_lr = float(now["lr"])

    def _momentum(self, params):
        """The optimizer's momentum buffers for these parameters, where load_checkpoint() put a checkpoint's;
        [] when it has none (zeros, as a fresh SGD's)."""
        buffers = [self._group_optimizer.state.get(p, {}).get("momentum_buffer") for p in params]
        if all(b is None for b in buffers):
            return []
        # torch's SGD has no buffer for a parameter that never had a gradient; its next step starts the
        # buffer at the gradient, as a zero buffer on the shards does.
        return [(torch.zeros_like(p, dtype=torch.float32) if b is None
                 else b.detach().to(torch.float32).contiguous().clone().view(p.shape))
                for b, p in zip(buffers, params)]

    def _resume_groups(self, params):
        """The shards start from the module's parameters; their momentum and version clock come from the
        optimizer, where load_checkpoint() put a checkpoint's (none: zeros, as a fresh SGD's)."""
        buffers = self._momentum(params)
        if buffers:
            self._options["group_momentum"] = buffers
        self._options["group_version"] = int(getattr(self._group_optimizer, "_poseidon_group_version", 0))

    def group_state(self):
        """Compute groups, for a checkpoint (save_checkpoint calls it): every rank calls it at the same point,
        after step() and before the next forward. Returns (first worker?, momentum buffers in the order of
        the module's trainable parameters, version clock); the first worker's module then holds the
        shards' parameters, and no rank pushes before they were read."""
        if self._impl is None:  # not started: the module and the optimizer hold the whole state
            return self.rank == 0, None, int(getattr(self._group_optimizer, "_poseidon_group_version", 0))
        if self._impl.closed:
            raise InvalidArgument("a compute-group checkpoint after finish(): the shards that held the momentum "
                                  "are gone; save it before finish()")
        first, buffers, version, fc = self._impl.group_state()
        if self._classifier is None or not first:
            return first, buffers, version
        if self.rank != 0:  # the FC server's rank: its momentum is only there
            raise InvalidArgument("merged FC: rank 0 runs the FC server and must be the first worker")
        # The module's order: the groups' layers from the shards, the classifier's from the FC server.
        layers, _, _ = _describe(self.module, self._name)
        fc_ids = {id(p) for p in self._classifier.parameters()}
        shards, server, merged = iter(buffers), iter(fc), []
        for (_, _, _, params) in layers:
            merged.extend(next(server if id(p) in fc_ids else shards) for p in params)
        return first, merged, version

    def pull_latest(self):
        """Compute groups: every rank calls it at the same point (a barrier); then the module holds the model
        as it stands with every group's updates so far, e.g. to evaluate it. finish() does it last.
        Without groups every replica already holds the same model: nothing to do."""
        if self.groups and self._impl is not None and not self._impl.closed:
            self._impl.pull_latest()
            if self._classifier is not None:  # merged FC: the FC server's classifier to every rank
                self._impl.broadcast_classifier()

    def staleness(self):
        """Compute groups: this rank's shard's count of applied updates by staleness (rounds of other groups'
        updates since the model the update was computed on) and the largest lead of a group over the
        slowest it saw. allsum() the counts over the ranks for the job's. Updates still in flight are not
        counted yet: after pull_latest() (a barrier) every update sent before it is."""
        impl = self._runtime()
        return {"histogram": dict(impl.staleness_histogram()), "max_group_lead": impl.max_group_lead()}

    # ---- the job ----------------------------------------------------------------------------------

    def _join(self, batch):
        self._options["batch"] = batch
        layers, buffers, frozen = _describe(self.module, self._name)
        layers, fc_layers = self._split(layers)
        if self.groups:
            self._resume_groups([p for (_, _, _, params) in layers for p in params])
        self._impl = _poseidon.Model(self._name, layers, buffers, frozen, self._options)
        self._batch = batch
        if fc_layers:
            fc_params = [p for (_, _, _, params) in fc_layers for p in params]
            server, server_params = None, []
            if self.rank == 0:
                # The FC server trains a copy of its own: rank 0's module keeps the classifier as the last
                # pull_latest() left it, as every rank's does, whatever rank 0's program does meanwhile.
                server = copy.deepcopy(self._classifier)
                mine = {id(p): i for i, p in enumerate(self._classifier.parameters())}
                theirs = list(server.parameters())
                server_params = [theirs[mine[id(p)]] for p in fc_params]
            try:
                self._impl.start_merged_fc(server, fc_params, server_params, float(self._group_sgd["momentum"]),
                                           float(self._group_sgd["weight_decay"]), self._momentum(fc_params))
            except Exception:
                self._impl.close()  # no half-built job: its peers learn this rank left
                raise
        if self._overlap_forward:
            # One gate per layer module (the modules that own trainable parameters, in _describe's order).
            # A gate also finishes the layers below its module (a module may use a child's parameters
            # without calling it: nn.MultiheadAttention's out_proj), and runs before the module's other
            # pre-hooks (old-style weight_norm computes the weight from its parameters in one).
            self._layer_params = [params for (_, _, _, params) in layers]
            owners = [(path, m) for path, m in self.module.named_modules()
                      if any(p.requires_grad for p in m.parameters(recurse=False))]
            self._done = [True] * len(owners)
            for index, (path, owner) in enumerate(owners):
                below = [j for j, (other, _) in enumerate(owners)
                         if j == index or path == "" or other.startswith(path + ".")]
                handle = owner.register_forward_pre_hook(self._gate(below))
                owner._forward_pre_hooks.move_to_end(handle.id, last=False)

    # ---- the overlapped step (overlap_forward) ------------------------------------------------------

    def _gate(self, indices):
        def gate(module, inputs):
            if self._pending is None:
                return
            for index in indices:
                if not self._done[index]:
                    self._finish_layer(index)
                    self.updates_in_forward += 1
        return gate

    def _step_only(self, visible):
        """Runs the pending optimizer over the parameters whose ids are in `visible` (every other
        parameter it holds has its .grad hidden for the call), with the hyperparameters it had at step()."""
        opt = self._pending
        now = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        for g, then in zip(opt.param_groups, self._hyper):
            g.update(then)
        hidden = []
        try:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) not in visible and p.grad is not None:
                        hidden.append((p, p.grad))
                        p.grad = None
            opt.step()
        finally:
            for p, grad in hidden:
                p.grad = grad
            for g, current in zip(opt.param_groups, now):
                g.update(current)

    def _finish_layer(self, index):
        """Waits for the layer's mean gradient, runs the optimizer on that layer's parameters only, and
        clears the layer's .grad."""
        self._impl.finish_layer(index)
        params = self._layer_params[index]
        for p, grad in zip(params, self._grads[index]):
            # PS results are in the held tensor; an SFB result has just been put into a fresh .grad.
            if p.grad is None:
                p.grad = grad
        self._step_only({id(p) for p in params})
        for p in params:
            p.grad = None
        self._grads[index] = ()
        self._done[index] = True

    def _flush(self):
        """Applies what is left of a pending overlapped step (every layer's update is then in)."""
        if self._pending is None:
            return
        if self._impl is None or self._impl.closed:
            self._pending = None  # the job ended (an error): nothing more lands
            return
        for index in range(len(self._done)):
            if not self._done[index]:
                self._finish_layer(index)
        # Parameters the optimizer holds outside the wrapped module (a learnable loss): once, now.
        ours = {id(p) for params in self._layer_params for p in params}
        others = {id(p) for g in self._pending.param_groups for p in g["params"]} - ours
        if others:
            self._step_only(others)
        self._impl.finish_step()
        self._pending = None

    def apply_pending(self):
        """overlap_forward: applies a pending step now (before reading or saving the parameters or the
        optimizer's state between step() and the next forward). Does nothing otherwise."""
        self._flush()

    def _runtime(self):
        if self._impl is None:
            raise InvalidArgument("the model has not joined its job yet: give batch= or run a training forward first")
        return self._impl

    @property
    def rank(self):
        return self._options["rank"]

    @property
    def world_size(self):
        return self._options["world_size"]

    # ---- training ---------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            self._flush()  # an evaluation sees every update
            if self._impl is not None and not self._impl.closed:
                self._impl.note_evaluation_forward()  # a step() after it says to call train()
            return self.module(*args, **kwargs)
        if self._impl is None:
            first = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)), None)
            if first is None or first.dim() == 0:
                raise InvalidArgument("cannot tell the batch size from this forward's arguments: "
                                      "give DistributedModel(..., batch=K)")
            self._join(int(first.shape[0]))
        if self.groups:
            self._group_round()
        if self._classifier is not None:
            # Merged FC: this rank runs the features; the FC server runs the classifier (fc_loss).
            self._impl.begin_forward()
            out = self._features(*args, **kwargs)
            self._impl.end_forward(_tensors(out))
            self._fc_round = True
            return out
        if self._pending is not None:
            # Overlapped: the gates apply the last step layer by layer as this forward reaches them; the
            # step ends (and the next one begins) once the forward is through.
            out = self.module(*args, **kwargs)
            self._flush()
            self._impl.begin_forward()
            self._impl.end_forward(_tensors(out))
            return out
        self._impl.begin_forward()
        out = self.module(*args, **kwargs)
        self._impl.end_forward(_tensors(out))
        return out

    def fc_loss(self, features, labels):
        """Merged FC: the loss of this round (cross-entropy of the classifier's output, the mean over this
        rank's rows), computed by the FC server from `features` (this round's training forward's output)
        and `labels` (int64 classes, one per row). backward() on it runs the features' backward with the
        gradient the FC server sent; step(optimizer) then pushes the groups' layers."""
        if self._classifier is None:
            raise InvalidArgument("fc_loss() is for merged FC: give DistributedModel(..., merged_fc=(features, "
                                  "classifier))")
        if not self._fc_round:
            raise InvalidArgument("fc_loss() takes the features of this round's training forward, once; run "
                                  "model(x) first")
        loss = _FcLoss.apply(features, labels, self._impl, self._round_lr)
        self._fc_round = False  # only once it went through: a tensor refused may be given again correctly
        return loss

    def synchronize(self):
        """After loss.backward(): waits until every .grad holds the mean gradient over all ranks."""
        if self._pending is not None:
            raise InvalidArgument("synchronize() with overlap_forward: step(optimizer) synchronizes, and the "
                                  "next forward (or finish()) applies the update")
        self._runtime().synchronize()

    def step(self, optimizer):
        """synchronize(), then optimizer.step(). With overlap_forward: returns at once; the next forward
        applies the update layer by layer as the synchronized gradients land."""
        if self.groups:
            if optimizer is not self._group_optimizer:
                raise InvalidArgument("compute groups: step() takes the optimizer given as optimizer= (the shards "
                                      "run its SGD)")
            if self._fc_round:
                raise InvalidArgument("merged FC: step() before fc_loss() and its backward: the FC server has "
                                      "not seen this round")
            self.synchronize()  # this round's pushes are out; the shards apply them
            return
        if not self._overlap_forward:
            self.synchronize()
            optimizer.step()
            return
        if self._pending is not None:
            raise InvalidArgument("step() twice without a forward between them")
        self._runtime().submit_step()
        self._pending = optimizer
        # The hyperparameters as they are now (tensors copied: a scheduler may fill them in place), for
        # the deferred update: the barrier path would have run the optimizer before any scheduler step.
        self._hyper = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
                       for g in optimizer.param_groups]
        # The .grad tensors the runtime writes the mean gradients into, held here (not in .grad) until each
        # layer's update, so that a zero_grad() before the next forward (either kind) cannot touch them.
        self._grads = [tuple(p.grad for p in params) for params in self._layer_params]
        for params in self._layer_params:
            for p in params:
                p.grad = None
        self._done = [False] * len(self._done)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: forward/backward passes inside accumulate locally; the next pass outside
        synchronizes the accumulated gradients once (DDP's no_sync)."""
        impl = self._runtime()
        if self._overlap_forward:
            raise InvalidArgument("no_sync() is not available with overlap_forward")
        if self.groups:
            raise InvalidArgument("no_sync() is not available with compute groups: the shards apply every pass")
        impl.set_sync_enabled(False)
        try:
            yield
        finally:
            impl.set_sync_enabled(True)

    def finish(self):
        """Final barrier: every rank calls it when done; then the runtime's threads stop."""
        if self._impl is not None and not self._impl.closed:
            try:
                self._flush()
                self.pull_latest()  # compute groups: every rank ends holding the final model
                if self._classifier is not None:
                    self._impl.stop_merged_fc()  # every round was served (pull_latest's barrier)
                self._impl.finish()
            finally:
                self._impl.close()
        _release_locks(self)

    def close(self):
        """Stops the runtime without the final barrier (after an error); peers are told this rank left."""
        if self._impl is not None:
            self._impl.close()
        _release_locks(self)

    def _fail_job(self, reason):
        """Fails the job with `reason`: every peer stops at once and says it (an uncaught exception here)."""
        if self._impl is not None and not self._impl.closed:
            self._impl.fail_job(reason)

    # ---- introspection ----------------------------------------------------------------------------

    def allsum(self, values):
        """Sums a few numbers (counts, losses) over all ranks; every rank calls it alike."""
        return self._runtime().allsum([float(v) for v in values])

    def plan(self):
        """Per layer: name, type, shape, BestScheme's choice, the scheme the last step used, Table 1 floats."""
        return self._runtime().plan(self._batch)

    def fc_updates(self):
        """Merged FC: the updates the FC server applied (one per group round); None on other ranks."""
        n = self._runtime().fc_updates
        return None if n < 0 else n

    def summary(self):
        """A dict for logs and JSON: the plan and the bytes this rank sent by scheme (ps, sfb; and of
        those, urgent: on the urgent connections, urgent_layers)."""
        impl = self._runtime()
        return {"rank": impl.rank, "workers": impl.workers, "batch": self._batch, "layers": self.plan(),
                "bytes_sent": impl.bytes_sent()}


_previous_excepthook = sys.excepthook


def _own_live_models():
    # The live models this process made: a child forked from a training process (os.fork, a fork-started
    # worker that exits normally) holds copies of its parent's, whose sockets are the parent's to use.
    pid = os.getpid()
    return [m for m in list(_live) if getattr(m, "_pid", pid) == pid]


def _fail_jobs_on_uncaught(kind, value, tb):
    # An uncaught exception ends this rank: its peers stop at once with what it died of ("rank 1 failed
    # (at its iteration 3): its program raised ValueError: bad label 7"), not "left the job before
    # finish()", and the launcher's closing line can name it. Then Python's own report, as always.
    what = traceback.format_exception_only(kind, value)
    last = "".join(what).strip().splitlines()
    reason = "its program raised " + (last[-1] if last else kind.__name__)
    for model in _own_live_models():
        try:
            model._fail_job(reason)
        except Exception:  # noqa: BLE001 - the report below must still happen
            pass
    _previous_excepthook(kind, value, tb)


sys.excepthook = _fail_jobs_on_uncaught


@atexit.register
def _close_all():
    # The runtime's threads must be gone before the interpreter tears itself down. A model that did
    # not finish() tells its peers why it left, so they stop at once instead of timing out: its program
    # exited (sys.exit, or the script's end), as a C++ rank's exit() says; an uncaught exception has
    # told them already (the hook above: the first reason stands). A world of one has nobody to tell.
    for model in _own_live_models():
        if model._impl is not None and not model._impl.closed and model.world_size > 1:
            try:
                model._fail_job("rank %d left the job before finish() (its program exited)" % model.rank)
            except Exception:  # noqa: BLE001 - the close below must still happen
                pass
        model.close()
