"""Checkpoints of a Poseidon job from Python, with the C++ trainer's guarantees (docs/reliability.md):

- DIR/step-000000120/{model.pt, optimizer.pt, meta.json}, written into step-....tmp, every file
  flushed, fsync'd and closed (each checked), then renamed: a checkpoint that looks complete is complete.
- meta.json holds the iteration, the world size, your own fields, and the size and CRC-32 of each file;
  load_checkpoint() checks them and refuses a damaged checkpoint by name, falling back to the newest
  intact one.
- A full disk is one clear OSError naming the checkpoint, the file and "No space left on device"; the
  half-written step-....tmp is removed and older checkpoints stay.

Rank 0 writes (every replica holds the same state); every rank reads, so DIR must be visible to all.
With compute groups the shards hold the model and its momentum: every rank calls save_checkpoint at the
same round and the first worker writes what it fetched from them; load_checkpoint goes before the job
starts (into the module before wrapping it), and the shards then start from what it loaded.
"""

import fcntl
import io
import json
import os
import shutil
import socket
import sys
import time
import weakref
import zlib

import torch

_PREFIX = "step-"
_FILES = ("model.pt", "optimizer.pt")
_LOCK = ".poseidon.lock"  # the C++ DirectoryLock's file (poseidon train): the two exclude each other
_held = {}  # realpath of a directory -> {"fd": its lock, "owners": weakrefs to the running models that saved there}


class CheckpointDamaged(Exception):
    """A checkpoint whose files do not match the sizes and checksums in its meta.json."""


def _write(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete(directory):
    out = []
    if not os.path.isdir(directory):
        return out
    for name in os.listdir(directory):
        if not name.startswith(_PREFIX) or name.endswith(".tmp"):
            continue
        try:
            iteration = int(name[len(_PREFIX):])
        except ValueError:
            continue
        if os.path.exists(os.path.join(directory, name, "meta.json")):
            out.append((iteration, os.path.join(directory, name)))
    return sorted(out)


def save_checkpoint(directory, model, optimizer, iteration, keep=2, **extra):
    """Saves model and optimizer state after `iteration` steps (rank 0 only; other ranks return None).

    `model` may be the DistributedModel or the module it wraps (its live wrapper then says the rank).
    Returns the checkpoint's path. With overlap_forward, a pending step is applied first.
    With compute groups every rank calls it at the same round (after step(), before the next forward):
    the shards hold the model and its momentum, which the first worker fetches into model.pt and
    optimizer.pt (meta.json: groups, group_version); the other ranks return None.
    """
    group = _group_model(model)
    state = None
    if group is not None:
        lead, buffers, version = group.group_state()
        if not lead:
            return None
        state = _with_momentum(optimizer, group, buffers)
        extra = dict(extra, groups=group.groups, group_version=int(version))
    else:
        model = _wrapper_of(model)  # the module given: its live wrapper knows the rank and a pending step
        _apply_pending(model)
        if getattr(model, "rank", 0) != 0:
            return None
    if state is None:
        state = optimizer.state_dict()
    owner = group if group is not None else model
    took = _lock(directory, owner)
    final = os.path.join(directory, "%s%09d" % (_PREFIX, iteration))
    tmp = final + ".tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        entries = {}
        for name, blob in (("model.pt", _module(model).state_dict()), ("optimizer.pt", state)):
            buf = io.BytesIO()
            torch.save(blob, buf)
            data = buf.getvalue()
            _write(os.path.join(tmp, name), data)
            entries[name] = {"bytes": len(data), "crc32": "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)}
        meta = {"iteration": int(iteration), "world_size": int(getattr(model, "world_size", 1)), "files": entries}
        meta.update(extra)
        _write(os.path.join(tmp, "meta.json"), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(directory)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(e.errno, "cannot write checkpoint %s: %s (the checkpoints already in %s are untouched)"
                      % (final, e.strerror or e, directory)) from None
    for _, path in _complete(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
    if took and hasattr(owner, "finish") and not _running(owner):
        _unlock(os.path.realpath(directory))  # a finished job's last save: nothing of it writes there again
    return final


def _lock(directory, owner=None):
    """Holds DIRECTORY/.poseidon.lock (flock), as rank 0 of poseidon train does: a second job given the same
    directory is refused, naming the holder, instead of the two jobs overwriting, pruning and resuming from
    each other's checkpoints. Taken by the writer's load_checkpoint (before its job can resume from another
    job's model) or first save_checkpoint; held until the last running DistributedModel that saved there
    (`owner`) finishes or closes, else (a load with no save after it, a bare module) until this process
    exits. The kernel drops it when the process exits however it exits. Returns whether this call took it."""
    key = os.path.realpath(directory)
    entry = _held.get(key)
    took = entry is None
    if took:
        entry = _held[key] = {"fd": _acquire(directory), "owners": []}
    if owner is not None and _running(owner) and not any(r() is owner for r in entry["owners"]):
        entry["owners"].append(weakref.ref(owner))
    return took


def _acquire(directory):
    path = os.path.join(directory, _LOCK)
    try:
        os.makedirs(directory, exist_ok=True)
        try:  # 0666 less the umask; a lock file another user made read-only to us still locks
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, "cannot lock checkpoint directory %s: %s" % (directory, e.strerror or e)) from None
    for attempt in range(21):  # 200 ms: a passing holder (poseidon train's launcher probing it) goes by
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt < 20:
                time.sleep(0.01)
    else:
        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        from ._poseidon import InvalidArgument
        raise InvalidArgument("checkpoint directory %s is in use by %s (it holds %s): two jobs writing one "
                              "directory would resume from and delete each other's files; give each job its own "
                              "directory, or wait for that one to end" % (directory, holder, path)) from None
    line = "poseidon checkpoints of %s, pid %d on %s since %s\n" % (
        os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python", os.getpid(), socket.gethostname(),
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode(), 0)
    except OSError:
        pass  # best effort (a read-only lock file): the line only explains a refusal
    return fd


def _running(model):
    impl = getattr(model, "_impl", None)
    return impl is not None and not impl.closed


def _unlock(key):
    fd = _held.pop(key)["fd"]
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)  # the open file's lock, even where a forked child (DataLoader) shares it
    finally:
        os.close(fd)


def _release_locks(owner):
    """`owner` (a DistributedModel) ends: the directories it saved into that no other running model owns are free."""
    for key, entry in list(_held.items()):
        if any(r() is owner for r in entry["owners"]):
            entry["owners"] = [r for r in entry["owners"] if r() is not None and r() is not owner]
            if not entry["owners"]:
                _unlock(key)


def _writes_checkpoints():
    """Whether this process is the job's writer (rank 0; RANK unset: a world of one), for load_checkpoint's lock
    (the model is not wrapped yet: the environment says the rank)."""
    try:
        return int(os.environ.get("RANK") or 0) == 0
    except ValueError:
        return False  # the DistributedModel refuses it by name


def _live_wrapper(model, wanted):
    """The DistributedModel satisfying `wanted` that `model` is or that wraps it: of the live wrappers of a
    module (one may have been wrapped before: a finished job, then a new one), the running one first."""
    from . import DistributedModel, _live
    if isinstance(model, DistributedModel):
        return model if wanted(model) else None
    wrappers = [m for m in list(_live) if wanted(m) and m.module is model]
    running = [m for m in wrappers if m._impl is not None and not m._impl.closed]
    return (running or wrappers or [None])[0]


def _group_model(model):
    """The live DistributedModel with compute groups that `model` is or wraps; None for BSP jobs. (The
    wrapper's own count: torchvision's ResNet and nn.Conv2d have a `groups` attribute of their own.)"""
    return _live_wrapper(model, lambda m: m.groups)


def _wrapper_of(model):
    """The DistributedModel that `model` is or that wraps it; else `model`, a module no wrapper holds (a
    job of one process, or before any)."""
    wrapper = _live_wrapper(model, lambda m: True)
    return model if wrapper is None else wrapper


def _with_momentum(optimizer, group, buffers):
    """The optimizer's state_dict with the shards' momentum buffers as torch's SGD keeps them, so that the
    checkpoint resumes a BSP job (torch's SGD) or a group job (the shards) alike. `buffers` is None for
    a job that has not started (the optimizer holds the state) and one per trainable parameter, in the
    order of _describe's layers, otherwise."""
    state = optimizer.state_dict()
    if buffers is None or not optimizer.param_groups[0].get("momentum", 0):
        return state  # momentum 0: torch's SGD keeps no buffer either
    from . import _describe
    params = [p for (_, _, _, ps) in _describe(group.module, "")[0] for p in ps]
    index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    if len(buffers) != len(params):
        raise RuntimeError("the shards returned %d momentum buffers for %d parameters" % (len(buffers), len(params)))
    state["state"] = {index[id(p)]: {"momentum_buffer": b.view(p.shape).clone()} for p, b in zip(params, buffers)}
    return state


def _module(model):
    return getattr(model, "module", model)


def _apply_pending(model):
    # overlap_forward: the update of the last step() lands at the next forward; a checkpoint holds it.
    if hasattr(model, "apply_pending"):
        model.apply_pending()


def _verified(path):
    try:
        with open(os.path.join(path, "meta.json"), "rb") as f:
            meta = json.loads(f.read().decode())
    except (OSError, ValueError) as e:
        raise CheckpointDamaged("checkpoint %s is damaged: meta.json is unreadable (%s)" % (path, e)) from None
    # poseidon train's format (meta_crc32; before checksums, "workers" without "world_size"): LibTorch
    # archives of its own models, named as such before their files are checked.
    if isinstance(meta, dict) and ("meta_crc32" in meta or ("workers" in meta and "world_size" not in meta)):
        from ._poseidon import InvalidArgument
        raise InvalidArgument("load_checkpoint: %s was written by poseidon train (the CLI), not by "
                              "save_checkpoint; it cannot be loaded into a Python module" % path)
    try:
        files = meta["files"]
        iteration = int(meta["iteration"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointDamaged("checkpoint %s is damaged: meta.json is unreadable (%s)" % (path, e)) from None
    blobs = {}
    for name in _FILES:
        try:
            with open(os.path.join(path, name), "rb") as f:
                data = f.read()
        except OSError as e:
            raise CheckpointDamaged("checkpoint %s is damaged: %s: %s" % (path, name, e.strerror)) from None
        want = files.get(name, {})
        crc = "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)
        if len(data) != want.get("bytes") or crc != want.get("crc32"):
            raise CheckpointDamaged("checkpoint %s is damaged: %s does not match its checksum in meta.json "
                                    "(CRC-32 %s, expected %s)" % (path, name, crc, want.get("crc32")))
        blobs[name] = data
    return meta, iteration, blobs


def load_checkpoint(directory, model, optimizer):
    """Loads the newest intact checkpoint in `directory` into model and optimizer.

    Returns its meta dict (with "iteration"), or None when there is no checkpoint (`directory` missing or
    empty: a first run; a file there raises InvalidArgument). A damaged one is
    refused by name (a warning on stderr) and the next older is tried; when none is intact, raises
    CheckpointDamaged naming them.
    """
    group = _group_model(model)
    if group is not None and group._impl is not None and not group._impl.closed:
        from ._poseidon import InvalidArgument
        raise InvalidArgument("load_checkpoint: this compute-group job has started, and its shards hold the model; "
                              "load the checkpoint into the module and the optimizer before wrapping it")
    if os.path.exists(directory) and not os.path.isdir(directory):
        from ._poseidon import InvalidArgument
        raise InvalidArgument("load_checkpoint: %s is a file, not a checkpoint directory" % directory)
    if _writes_checkpoints():
        try:
            _lock(directory)  # before anything of another job's can be loaded
        except OSError:
            pass  # a directory this process cannot write (a read-only copy to evaluate) is no job's to share
    refused = []
    for _, path in reversed(_complete(directory)):
        try:
            meta, _, blobs = _verified(path)
        except CheckpointDamaged as e:
            refused.append(str(e))
            print("poseidon: warning: %s; trying an older one" % e, file=sys.stderr, flush=True)
            continue
        _apply_pending(_wrapper_of(model))  # a pending update must not land on the loaded parameters
        # Through the host: a GPU job's checkpoint resumes on a host without one, no rank first builds rank
        # 0's tensors on cuda:0, and load_state_dict puts each tensor where its parameter (or, for the
        # optimizer, the state torch keeps on the CPU, such as Adam's step) lives.
        _module(model).load_state_dict(torch.load(io.BytesIO(blobs["model.pt"]), map_location="cpu"))
        optimizer.load_state_dict(torch.load(io.BytesIO(blobs["optimizer.pt"]), map_location="cpu"))
        # A compute-group job started after this takes the momentum buffers and this version clock into
        # its shards (DistributedModel._resume_groups).
        optimizer._poseidon_group_version = int(meta.get("group_version", 0))
        return meta
    if refused:
        raise CheckpointDamaged("no intact checkpoint in %s: %s" % (directory, "; ".join(refused)))
    return None
