"""What the workers of 11_beyond_data_parallel share: a wide residual MLP for MNIST, exact per-rank byte counts
of parameters, gradients and optimizer state (sharded or not), and the global batch every rank takes a slice of.

``ResMLP(width, blocks)``: flatten 784 -> Linear(784, width) -> ``blocks`` x [x + Linear(4w, w)(GELU(Linear(w, 4w)(x)))]
-> Linear(width, 10). A transformer's MLP block without attention: 8 w^2 parameters per block, so width 1024 with 4
blocks is 34 million parameters (134 MiB in fp32) and memory, not compute, is what the lesson is about. Each block
saves 9 x batch x width activations for backward (its input, the 4w pre-GELU and the 4w post-GELU); checkpointed
(``torch.utils.checkpoint``, ``use_reentrant=False``) it keeps only its input and recomputes the rest in backward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class ResMLP(nn.Module):
    def __init__(self, width: int = 1024, blocks: int = 4, checkpointing: bool = False):
        super().__init__()
        self.inp = nn.Linear(784, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 10)
        self.checkpointing = checkpointing

    def forward(self, x):
        x = self.inp(torch.flatten(x, 1))
        for block in self.blocks:
            # NEW (activation checkpointing): keep the block's input only, recompute the rest during backward
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return F.log_softmax(self.head(x), dim=1)


def build(width: int, blocks: int, checkpointing: bool = False, seed: int = 0) -> ResMLP:
    torch.manual_seed(seed)  # same seed everywhere: every rank and the one-process reference start equal
    return ResMLP(width, blocks, checkpointing)


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank holds: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)


def state_bytes(model: nn.Module, optimizer) -> dict:
    """Bytes this rank holds for parameters, gradients and optimizer state (counted tensor by tensor).

    ZeroRedundancyOptimizer keeps state only for its own partition of the parameters, so counting
    ``optimizer.optim.state`` (the local optimizer) gives this rank's share."""
    inner = getattr(optimizer, "optim", optimizer)
    opt = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"params": nbytes(model.parameters()), "grads": nbytes(p.grad for p in model.parameters()),
            "optimizer_state": nbytes(opt)}


def global_batch(X: torch.Tensor, y: torch.Tensor, step: int, batch_size: int, world_size: int):
    """The step's global batch (``batch_size`` x ``world_size`` images, cycling through X)."""
    n = batch_size * world_size
    idx = (torch.arange(n) + step * n) % len(X)
    return X[idx], y[idx]


def full_params(model: nn.Module) -> dict:
    """Every parameter as a whole tensor (a DTensor is all-gathered: call on every rank)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.named_parameters()}


def step_peak(fn) -> dict:
    """Run ``fn()`` under the profiler and replay its raw allocation events (+bytes when a tensor is allocated,
    -bytes when it is freed) in time order: ``rise`` is the highest the running total got above where it
    started, ``net`` where it ended. Counts every CPU allocation, whatever made it.

    Why not ``mnist_helpers.memory.peak_memory``: its categorised replay (the profiler's private
    ``_memory_profiler``) fails on some FSDP2 steps in torch 2.14.1 ("AssertionError: version mismatch")."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:  # every allocation and free in the event tree, wherever it happened
        e = stack.pop()
        if e.typed[0] == _EventType.Allocation:
            events.append((e.start_time_ns, e.typed[1].alloc_size))
        stack.extend(e.children)
    total = rise = 0
    for _, change in sorted(events):
        total += change
        rise = max(rise, total)
    return {"rise": rise, "net": total}
