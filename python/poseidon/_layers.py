"""What DistributedModel reads from torch: this rank's device, a module's layers (the modules that
own trainable parameters), a forward's output tensors, and merged FC's loss function."""
import os

import torch

from ._poseidon import InvalidArgument

_CONV = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def local_device(device="auto"):
    """This rank's device, one process per GPU: cuda:LOCAL_RANK (poseidon launch, torchrun; Slurm's
    SLURM_LOCALID), ranks beyond the node's GPUs sharing them round-robin; the CPU where torch sees no
    GPU. device: "auto", "cuda" (an error without a GPU) or "cpu"."""
    if device not in ("auto", "cuda", "cpu"):
        raise InvalidArgument("device must be auto, cuda or cpu, got %r" % (device,))
    if device == "cpu":
        return torch.device("cpu")
    # The launcher's local rank, checked wherever it would choose a GPU (here too when there is none:
    # a broken launcher environment is found on the first machine, not on the first GPU one).
    name = next((v for v in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID") if os.environ.get(v)), None)
    local = 0
    if name is not None:
        value = os.environ[name]
        if not (value.isascii() and value.isdigit()):
            raise InvalidArgument("environment variable %s=%r is not an integer >= 0" % (name, value))
        local = int(value)
    count = torch.cuda.device_count()
    if device == "cuda" and count == 0:
        raise InvalidArgument("device cuda: torch sees no CUDA device here; use device='cpu'")
    if count == 0:
        return torch.device("cpu")
    return torch.device("cuda", local % count)


def _kind(module):
    if isinstance(module, torch.nn.Linear):
        return "fc"
    if isinstance(module, _CONV):
        return "conv"
    return "other"


def _describe(module, name):
    """Layers (modules that own trainable parameters, in registration order), buffers, frozen parameters."""
    layers, frozen = [], []
    for path, m in module.named_modules():
        names, params = [], []
        for pname, p in m.named_parameters(recurse=False):
            if p.requires_grad:
                names.append(pname)
                params.append(p)
            else:
                frozen.append(p)
        if params:
            layers.append((path or name, _kind(m), names, params))
    return layers, list(module.buffers()), frozen


def _tensors(out):
    """The tensors of a forward's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


class _FcLoss(torch.autograd.Function):
    """Merged FC's loss: the FC server computes it and its gradient with respect to the features."""

    @staticmethod
    def forward(ctx, features, labels, impl, lr):
        loss, grad = impl.fc_exchange(features.detach(), labels, lr)
        ctx.save_for_backward(grad)
        return torch.tensor(loss, dtype=features.dtype, device=features.device)

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None, None
