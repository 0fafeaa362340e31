"""Data parallelism by hand, then with DDP's hooks (06_ddp_fundamentals, article section 4).

Every rank builds the article's ``Net`` from the same seed, takes its own ``batch_size`` images,
and runs forward and backward. The gradients differ (different data). One explicit
``dist.all_reduce`` per parameter, divided by the world size, makes them identical, and equal to
the gradient one process would get from the whole global batch; the same optimizer step then
leaves identical parameters. Without the reduce, one step already makes the replicas differ.
Then the same with ``DistributedDataParallel``, whose autograd hooks run the all-reduce during
``backward()``, bucket by bucket.

Every tensor lives on this process's device (``ctx.device``: ``cuda:LOCAL_RANK`` under nccl, the CPU under
gloo): nccl all-reduces only GPU tensors, gloo CPU ones.

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.demos.manual_allreduce
"""
from __future__ import annotations

import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.data import load_mnist
from mnist_helpers.distributed import params_digest
from mnist_helpers.models import build_model


def grads_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.grad.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def max_grad_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((p.grad - q.grad).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def fresh_net(seed: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(seed)  # the same seed on every rank: identical replicas to start from
    return build_model("net").to(device)


def run(ctx, args) -> dict:
    B, ws, r, dev = args.batch_size, ctx.world_size, ctx.rank, ctx.device
    X, y, _, _ = load_mnist(args.data_root, device=dev, subset=(B * ws, 1))  # on this rank's device
    X_r, y_r = X[r * B:(r + 1) * B], y[r * B:(r + 1) * B]  # this rank's share of the global batch

    # Not train.train_step: the lesson is what happens between backward() and step(), so they are apart.
    model = fresh_net(args.seed, dev)
    initial = params_digest(model)
    F.nll_loss(model(X_r), y_r).backward()
    local_grads = grads_digest(model)

    # What happens if nobody reduces: each replica steps with its own gradient.
    alone = fresh_net(args.seed, dev)
    alone.load_state_dict(model.state_dict())
    for p, q in zip(alone.parameters(), model.parameters()):
        p.grad = q.grad.clone()
    torch.optim.SGD(alone.parameters(), lr=0.1).step()

    for p in model.parameters():  # the whole of data parallelism: average the gradients
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= ws
    reduced_grads = grads_digest(model)

    reference = fresh_net(args.seed, dev)  # one process, the whole global batch
    F.nll_loss(reference(X), y).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()

    ddp_module = fresh_net(args.seed, dev)
    # DDP broadcasts rank 0's weights and registers one hook per parameter; on a GPU, device_ids names this rank's
    ddp = DDP(ddp_module, device_ids=[dev.index] if dev.type == "cuda" else None)
    F.nll_loss(ddp(X_r), y_r).backward()  # the hooks all-reduce (average) the gradients here
    ddp_grads = grads_digest(ddp_module)
    ddp_vs_manual = max_grad_diff(ddp_module, model)
    torch.optim.SGD(ddp_module.parameters(), lr=0.1).step()
    return {"rank": r, "images": len(X_r), "initial_params": initial, "grads_before_reduce": local_grads,
            "params_after_step_without_reduce": params_digest(alone), "grads_after_reduce": reduced_grads,
            "params_after_step": params_digest(model),
            "max_diff_vs_global_batch": max_grad_diff(model, reference),
            "ddp_grads": ddp_grads, "ddp_max_diff_vs_manual": ddp_vs_manual,
            "ddp_params_after_step": params_digest(ddp_module),
            "ddp_vs_manual_params": float(max((p - q).abs().max() for p, q in
                                              zip(ddp_module.parameters(), model.parameters())))}


def summarize(ranks: list[dict]) -> dict:
    def distinct(key):
        return len({r[key] for r in ranks})
    return {"world_size": len(ranks), "global_batch": sum(r["images"] for r in ranks),
            "distinct_initial_params": distinct("initial_params"),
            "distinct_grads_before_reduce": distinct("grads_before_reduce"),
            "distinct_params_without_reduce": distinct("params_after_step_without_reduce"),
            "distinct_grads_after_reduce": distinct("grads_after_reduce"),
            "distinct_params_after_step": distinct("params_after_step"),
            "max_diff_vs_global_batch": max(r["max_diff_vs_global_batch"] for r in ranks),
            "distinct_ddp_grads": distinct("ddp_grads"),
            "ddp_max_diff_vs_manual": max(r["ddp_max_diff_vs_manual"] for r in ranks),
            "distinct_ddp_params_after_step": distinct("ddp_params_after_step"),
            "ddp_vs_manual_params": max(r["ddp_vs_manual_params"] for r in ranks)}


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("manual_allreduce",)))
