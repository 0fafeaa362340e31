"""Seeding under DDP (12_ddp_in_depth, article section 6 "seeds").

The article seeds every process alike "so the replicas match". Two measurements:

1. Weights: each rank seeds *differently* (``seed + rank``, as if it forgot to seed) and builds
   ``Net``: the initial weights differ. Wrapping it in ``DistributedDataParallel`` broadcasts rank
   0's parameters and buffers, so afterwards every rank holds rank 0's weights, whatever its seed.
2. Augmentation: random augmentation parameters (here: a pixel shift per image, as a random crop
   would draw) from a generator seeded alike on every rank are *identical* on every rank: each
   rank's k-th image gets the same shift, correlated across the global batch. Seeding with
   ``seed + rank`` gives each rank its own stream.

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.demos.seeding
"""
from __future__ import annotations

import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.distributed import params_digest
from mnist_helpers.models import build_model


def shifts(seed: int, n: int = 8) -> list[list[int]]:
    """(dx, dy) in -2..2 for n images, as an augmentation would draw them."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (n, 2), generator=g).tolist()


def run(ctx, args) -> dict:
    dev = ctx.device  # cuda:LOCAL_RANK under nccl (which broadcasts GPU tensors only), the CPU under gloo
    torch.manual_seed(args.seed + 1000 * ctx.rank)  # a different seed per rank
    model = build_model("net").to(dev)
    before = params_digest(model)
    # constructing DDP broadcasts rank 0's parameters and buffers to every rank
    DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    return {"rank": ctx.rank, "params_before_ddp": before, "params_after_ddp": params_digest(model),
            "shifts_same_seed": shifts(args.seed), "shifts_per_rank_seed": shifts(args.seed + ctx.rank)}


def summarize(ranks: list[dict]) -> dict:
    def distinct(key):
        return len({str(r[key]) for r in ranks})
    return {"world_size": len(ranks), "distinct_weights_before_ddp": distinct("params_before_ddp"),
            "distinct_weights_after_ddp": distinct("params_after_ddp"),
            "after_ddp_equals_rank0_before": all(r["params_after_ddp"] == ranks[0]["params_before_ddp"] for r in ranks),
            "distinct_augmentation_same_seed": distinct("shifts_same_seed"),
            "distinct_augmentation_per_rank_seed": distinct("shifts_per_rank_seed")}


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("seeding",)))
