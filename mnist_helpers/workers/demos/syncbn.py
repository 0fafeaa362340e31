"""BatchNorm under DDP, with and without synchronisation (12_ddp_in_depth, article section 6).

``NetBN`` trains a few DDP steps on each rank's own images. Plain ``BatchNorm2d`` normalises with
the statistics of the local batch only and keeps per-rank running statistics: they differ between
ranks (DDP's ``broadcast_buffers`` copies rank 0's at the start of every forward, but each rank's
forward then updates them from its own batch). Synchronised BatchNorm normalises with the statistics of
the whole global batch: the running statistics agree on every rank.

Then one step is compared, forward *and* backward, with a single process that sees the whole global batch
(the same weights; rank r holds images r*B .. (r+1)*B-1 of it): the model's outputs for this rank's images, the
gradient of the loss with respect to those input images, every parameter's gradient after DDP's all-reduce
(BatchNorm's weight and bias included) and the running statistics after the step. Each rank's loss is the mean
over its own B images, the single process's the mean over all world_size * B, so a rank's input gradient is
world_size times the single process's (DDP's average of the weight gradients undoes the same factor); the demo
compares ``input grad / world_size``. This comparison runs in float64, so that float32 rounding does not blur it.

What ``nn.SyncBatchNorm`` communicates (torch/nn/modules/_functions.py): in the forward each rank computes its
per-channel mean and inverse standard deviation (invstd) and its element count, and the ranks **all-gather**
those three; every rank combines them into the global mean and variance (``batch_norm_gather_stats_with_counts``).
Its backward has its own collective: each rank sums, per channel, the output gradient and the output gradient times
(x - mean), and those two sums are **all-reduced**; from them every rank computes its input gradient. The weight and
bias gradients stay local and DDP all-reduces them with the other parameters.

``nn.SyncBatchNorm`` only runs on GPUs (on CPU its forward raises ``ValueError``; this demo records the message).
On CPU the demo therefore uses ``CpuSyncBatchNorm`` below: the same two collectives, written with
``torch.distributed`` on CPU tensors (``all_gather`` of mean, invstd and count in the forward, ``all_reduce`` of the
two gradient sums in the backward), in a ``torch.autograd.Function``.

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.demos.syncbn
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.data import load_mnist
from mnist_helpers.distributed import gather_objects
from mnist_helpers.models import build_model
from mnist_helpers.train import train_step


class _SyncBNFunction(torch.autograd.Function):
    """nn.SyncBatchNorm's communication pattern on CPU tensors: all-gather (mean, invstd, count) forward,
    all-reduce (sum_dy, sum_dy_xmu) backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        C = x.size(1)
        count = torch.tensor([x.numel() / C], dtype=x.dtype, device=x.device)
        mean = x.mean((0, 2, 3))
        invstd = torch.rsqrt(x.var((0, 2, 3), unbiased=False) + eps)
        local = torch.cat([mean, invstd, count])
        every = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(every, local)                       # per-rank mean, invstd and count, gathered
        every = torch.stack(every)
        means, invstds, counts = every[:, :C], every[:, C:2 * C], every[:, 2 * C:]
        n = counts.sum()
        g_mean = (means * counts).sum(0) / n
        g_var = ((1 / invstds ** 2 - eps + (means - g_mean) ** 2) * counts).sum(0) / n  # biased, like BatchNorm
        g_invstd = torch.rsqrt(g_var + eps)
        shape = (1, C, 1, 1)
        x_hat = (x - g_mean.view(shape)) * g_invstd.view(shape)
        ctx.save_for_backward(x_hat, weight, g_invstd)
        ctx.n = n
        return x_hat * weight.view(shape) + bias.view(shape), g_mean, g_var, n

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dn):
        x_hat, weight, invstd = ctx.saved_tensors
        C = dy.size(1)
        shape = (1, C, 1, 1)
        sum_dy = dy.sum((0, 2, 3))
        sum_dy_xhat = (dy * x_hat).sum((0, 2, 3))          # = sum(dy * (x - mean)) * invstd
        grad_weight, grad_bias = sum_dy_xhat.clone(), sum_dy.clone()  # local: DDP all-reduces them
        sums = torch.cat([sum_dy, sum_dy_xhat])
        dist.all_reduce(sums)                               # the backward's own collective: the two sums, summed
        mean_dy, mean_dy_xhat = (sums[:C] / ctx.n).view(shape), (sums[C:] / ctx.n).view(shape)
        dx = (weight * invstd).view(shape) * (dy - mean_dy - x_hat * mean_dy_xhat)
        return dx, grad_weight, grad_bias, None


class CpuSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics span every rank, with nn.SyncBatchNorm's collectives, on CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        y, mean, var, n = _SyncBNFunction.apply(x, self.weight, self.bias, self.eps)
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1), self.momentum)  # unbiased, as BatchNorm keeps
        return y


def convert_cpu_sync(module: nn.Module) -> nn.Module:
    """Like nn.SyncBatchNorm.convert_sync_batchnorm, with CpuSyncBatchNorm."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            new = CpuSyncBatchNorm(child.num_features, child.eps, child.momentum, child.affine,
                                   child.track_running_stats).to(child.weight.device)
            new.load_state_dict(child.state_dict())
            setattr(module, name, new)
        else:
            convert_cpu_sync(child)
    return module


def synced(model: nn.Module, device: torch.device) -> nn.Module:
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_cpu_sync(model)


def fresh(seed: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("netbn").to(device)


COMPARED = ("output", "input_grad", "param_grads", "bn_param_grads", "running_stats")


def one_step(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> dict:
    """One forward and backward (mean NLL over X): outputs, input gradient, every parameter's gradient."""
    X = X.clone().requires_grad_(True)
    out = model(X)
    F.nll_loss(out, y).backward()
    module = getattr(model, "module", model)
    bn = [p for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in (m.weight, m.bias)]
    return {"output": out.detach(), "input_grad": X.grad.detach(),
            "param_grads": [p.grad.detach().clone() for p in module.parameters()],
            "bn_grads": [p.grad.detach().clone() for p in bn]}


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, relative to the reference's largest magnitude (over all the values compared:
    a convolution's bias right before BatchNorm has a gradient of ~0, which a per-tensor scale would blow up)."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def running_stats(model: nn.Module) -> torch.Tensor:
    return torch.cat([torch.cat([m.running_mean, m.running_var]) for m in model.modules()
                      if isinstance(m, nn.modules.batchnorm._BatchNorm)]).cpu()


def spread(stats: torch.Tensor) -> float:
    """Largest difference between any rank's running statistics and rank 0's."""
    every = torch.stack([torch.tensor(s) for s in gather_objects(stats.tolist())])
    return float((every - every[0]).abs().max())


def run(ctx, args) -> dict:
    B, ws, r, dev = args.batch_size, ctx.world_size, ctx.rank, ctx.device
    X, y, _, _ = load_mnist(args.data_root, device=dev, subset=(B * ws * args.steps, 1))
    ids = [dev.index] if dev.type == "cuda" else None

    def train(model):
        ddp = DDP(model, device_ids=ids)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(args.steps):
            i = (step * ws + r) * B  # this rank's slice of the step's global batch
            train_step(ddp, opt, X[i:i + B], y[i:i + B])
        return running_stats(model)

    local_spread = spread(train(fresh(args.seed, dev)))
    sync_spread = spread(train(synced(fresh(args.seed, dev), dev)))

    # One step, forward and backward, from identical weights: rank r sees X[r*B:(r+1)*B]; one process sees X[:ws*B].
    # In float64: in float32 the weight gradients of the first convolution differ by rounding (~1e-4 relative; each
    # rank's partial sums are large and cancel in DDP's average), which would blur the comparison.
    X64 = X.double()
    reference = fresh(args.seed, dev).double().train()
    ref = one_step(reference, X64[:ws * B], y[:ws * B])
    mine = slice(r * B, (r + 1) * B)
    vs_single = {}
    for kind, model in (("plain", fresh(args.seed, dev)), ("sync", synced(fresh(args.seed, dev), dev))):
        got = one_step(DDP(model.double().train(), device_ids=ids), X64[mine], y[mine])
        vs_single[kind] = {"output": diff(got["output"], ref["output"][mine]),
                           "input_grad": diff(got["input_grad"] / ws, ref["input_grad"][mine]),
                           "param_grads": diff(flat(got["param_grads"]), flat(ref["param_grads"])),
                           "bn_param_grads": diff(flat(got["bn_grads"]), flat(ref["bn_grads"])),
                           "running_stats": diff(running_stats(model), running_stats(reference))}

    error = None
    if dev.type == "cpu":  # what nn.SyncBatchNorm itself does on CPU
        try:
            nn.SyncBatchNorm.convert_sync_batchnorm(fresh(args.seed, dev)).train()(X[:2])
        except ValueError as e:
            error = f"ValueError: {e}"
    return {"rank": r, "images_per_step": B, "steps": args.steps, "plain_spread": local_spread,
            "sync_spread": sync_spread, "vs_single": vs_single,
            "sync_impl": "nn.SyncBatchNorm" if dev.type == "cuda" else
            "CpuSyncBatchNorm (nn.SyncBatchNorm's collectives on CPU tensors; nn.SyncBatchNorm needs GPUs)",
            "nn_syncbatchnorm_on_cpu": error}


def summarize(ranks: list[dict]) -> dict:
    out = {"world_size": len(ranks), "steps": ranks[0]["steps"], "images_per_rank": ranks[0]["images_per_step"],
           "sync_impl": ranks[0]["sync_impl"],
           "running_stats_spread_plain": ranks[0]["plain_spread"], "running_stats_spread_sync": ranks[0]["sync_spread"],
           "nn_syncbatchnorm_on_cpu": ranks[0]["nn_syncbatchnorm_on_cpu"]}
    for kind in ("plain", "sync"):  # the largest difference from one process on the global batch, over all ranks
        for what in COMPARED:
            out[f"{kind}_vs_single_{what}"] = max(r["vs_single"][kind][what] for r in ranks)
        out[f"{kind}_vs_single_process"] = max(out[f"{kind}_vs_single_{what}"] for what in COMPARED)
    return out


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("syncbn",)))
