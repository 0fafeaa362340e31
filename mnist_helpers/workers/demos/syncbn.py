"""BatchNorm under DDP, with and without synchronisation (06_ddp_fundamentals, article section 6).

``NetBN`` trains a few DDP steps on each rank's own images. Plain ``BatchNorm2d`` normalises with
the statistics of the local batch only and keeps per-rank running statistics: they differ between
ranks (DDP's ``broadcast_buffers`` copies rank 0's at the start of every forward, but each rank's
forward then updates them from its own batch). Synchronised BatchNorm computes the statistics over
the whole global batch: the running statistics agree on every rank, and one forward step gives
exactly what a single process gets from the global batch.

``nn.SyncBatchNorm`` only runs on GPUs (on CPU its forward raises ``ValueError``; this demo
records the message). On CPU the demo therefore uses ``CpuSyncBatchNorm`` below, which does the
same arithmetic with plain collectives: all-reduce each channel's sum, sum of squares and count.

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.demos.syncbn
"""
from __future__ import annotations

import sys

import torch
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.data import load_mnist
from mnist_helpers.distributed import gather_objects
from mnist_helpers.models import build_model
from mnist_helpers.train import train_step


class CpuSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics span every rank (what nn.SyncBatchNorm computes on GPUs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        C = x.size(1)
        local = torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)),
                           torch.tensor([x.numel() / C], dtype=x.dtype, device=x.device)])
        total = dist_fn.all_reduce(local)  # differentiable: the backward all-reduces the gradients too
        n = total[-1]
        mean = total[:C] / n
        var = total[C:2 * C] / n - mean * mean  # biased, used to normalise (as BatchNorm does)
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(var.detach() * n / (n - 1), self.momentum)  # unbiased, as BatchNorm keeps
        shape = (1, C, 1, 1)
        x_hat = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        return x_hat * self.weight.view(shape) + self.bias.view(shape)


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

    # One forward step from identical weights: rank r sees X[r*B:(r+1)*B]; one process sees X[:ws*B].
    reference = fresh(args.seed, dev).train()
    reference(X[:ws * B])
    plain, sync = fresh(args.seed, dev).train(), synced(fresh(args.seed, dev), dev).train()
    plain(X[r * B:(r + 1) * B])
    sync(X[r * B:(r + 1) * B])
    vs_single = {"plain": float((running_stats(plain) - running_stats(reference)).abs().max()),
                 "sync": float((running_stats(sync) - running_stats(reference)).abs().max())}

    error = None
    if dev.type == "cpu":  # what nn.SyncBatchNorm itself does on CPU
        try:
            nn.SyncBatchNorm.convert_sync_batchnorm(fresh(args.seed, dev)).train()(X[:2])
        except ValueError as e:
            error = f"ValueError: {e}"
    return {"rank": r, "images_per_step": B, "steps": args.steps, "plain_spread": local_spread,
            "sync_spread": sync_spread, "plain_vs_single_process": vs_single["plain"],
            "sync_vs_single_process": vs_single["sync"],
            "sync_impl": "nn.SyncBatchNorm" if dev.type == "cuda" else "CpuSyncBatchNorm (nn.SyncBatchNorm needs GPUs)",
            "nn_syncbatchnorm_on_cpu": error}


def summarize(ranks: list[dict]) -> dict:
    return {"world_size": len(ranks), "steps": ranks[0]["steps"], "sync_impl": ranks[0]["sync_impl"],
            "running_stats_spread_plain": ranks[0]["plain_spread"],
            "running_stats_spread_sync": ranks[0]["sync_spread"],
            "plain_vs_single_process": max(r["plain_vs_single_process"] for r in ranks),
            "sync_vs_single_process": max(r["sync_vs_single_process"] for r in ranks),
            "nn_syncbatchnorm_on_cpu": ranks[0]["nn_syncbatchnorm_on_cpu"]}


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("syncbn",)))
