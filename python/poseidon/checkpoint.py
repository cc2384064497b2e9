"""Checkpoints of a Poseidon job from Python, with the C++ trainer's guarantees (docs/reliability.md):

- DIR/step-000000120/{model.pt, optimizer.pt, meta.json}, written into step-....tmp, every file
  flushed, fsync'd and closed (each checked), then renamed: a checkpoint that looks complete is complete.
- meta.json holds the iteration, the world size, your own fields, and the size and CRC-32 of each file;
  load_checkpoint() checks them and refuses a damaged checkpoint by name, falling back to the newest
  intact one.
- A full disk is one clear OSError naming the checkpoint, the file and "No space left on device"; the
  half-written step-....tmp is removed and older checkpoints stay.

Rank 0 writes (every replica holds the same state); every rank reads, so DIR must be visible to all.
"""

import io
import json
import os
import shutil
import sys
import zlib

import torch

_PREFIX = "step-"
_FILES = ("model.pt", "optimizer.pt")


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

    `model` may be the DistributedModel or the module it wraps. Returns the checkpoint's path. With
    overlap_forward, a pending step is applied first (give the DistributedModel, not the module).
    """
    _refuse_groups(model, "save_checkpoint")
    _apply_pending(model)
    rank = getattr(model, "rank", 0)
    if rank != 0:
        return None
    final = os.path.join(directory, "%s%09d" % (_PREFIX, iteration))
    tmp = final + ".tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        entries = {}
        for name, state in (("model.pt", _module(model).state_dict()), ("optimizer.pt", optimizer.state_dict())):
            buf = io.BytesIO()
            torch.save(state, buf)
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
    return final


def _refuse_groups(model, what):
    # With compute groups the shards hold the model's momentum and version clock, which model.pt and
    # optimizer.pt do not: such a checkpoint would resume a different job. The C++ trainer has them
    # (poseidon train --groups --checkpoint); the Python package does not yet.
    from . import DistributedModel, _live
    from ._poseidon import InvalidArgument
    # The wrapper, or the module a live group wrapper holds (torchvision's ResNet and nn.Conv2d have a
    # `groups` attribute of their own: only a DistributedModel's counts).
    if isinstance(model, DistributedModel):
        grouped = model.groups
    else:
        grouped = any(m.groups and m.module is model for m in list(_live))
    if grouped:
        raise InvalidArgument("%s: a job with compute groups keeps its momentum on the shards, which this "
                              "checkpoint would not hold; use poseidon train --groups --checkpoint" % what)


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
        files = meta["files"]
        iteration = int(meta["iteration"])
    except (OSError, ValueError, KeyError, TypeError) as e:
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

    Returns its meta dict (with "iteration"), or None when there is no checkpoint. A damaged one is
    refused by name (a warning on stderr) and the next older is tried; when none is intact, raises
    CheckpointDamaged naming them.
    """
    _refuse_groups(model, "load_checkpoint")
    refused = []
    for _, path in reversed(_complete(directory)):
        try:
            meta, _, blobs = _verified(path)
        except CheckpointDamaged as e:
            refused.append(str(e))
            print("poseidon: warning: %s; trying an older one" % e, file=sys.stderr, flush=True)
            continue
        _apply_pending(model)  # a pending update must not land on the loaded parameters
        _module(model).load_state_dict(torch.load(io.BytesIO(blobs["model.pt"])))
        optimizer.load_state_dict(torch.load(io.BytesIO(blobs["optimizer.pt"])))
        return meta
    if refused:
        raise CheckpointDamaged("no intact checkpoint in %s: %s" % (directory, "; ".join(refused)))
    return None
