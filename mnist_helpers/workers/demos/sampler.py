"""DistributedSampler: disjoint shards, and why ``set_epoch`` matters (12_ddp_in_depth, 4 and 5.2).

Every rank builds ``DistributedSampler(range(60_000), num_replicas=world_size, rank=rank,
shuffle=True)`` (a sampler only needs the dataset's length) and lists its indices for three
epochs, once never calling ``set_epoch`` and once calling it every epoch. The ranks' shards of one
epoch are gathered and checked: disjoint, and together the whole training set. The order is
compared between epochs: the fraction of positions holding the same index. The series' own
in-memory ``TensorBatches`` (what the workers use) is checked the same way.

    torchrun --standalone --nproc-per-node=3 -m mnist_helpers.workers.demos.sampler
"""
from __future__ import annotations

import sys

import torch
from torch.utils.data import DistributedSampler

from mnist_helpers.data import TensorBatches
from mnist_helpers.distributed import gather_objects

N_TRAIN = 60_000
EPOCHS = 3


def same_position_fraction(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def epochs_of(sampler, set_epoch: bool) -> list[list[int]]:
    out = []
    if not set_epoch:
        # [bug]
        for epoch in range(EPOCHS):
            out.append([int(i) for i in sampler])  # the same shuffle (seed) every epoch
        # [/bug]
    else:
        # [fix]
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)               # the shuffle's seed becomes seed + epoch
            out.append([int(i) for i in sampler])
        # [/fix]
    return out


def run(ctx, args) -> dict:
    ws, r = ctx.world_size, ctx.rank
    sampler = DistributedSampler(range(N_TRAIN), num_replicas=ws, rank=r, shuffle=True, seed=args.seed)
    without = epochs_of(sampler, set_epoch=False)
    sampler = DistributedSampler(range(N_TRAIN), num_replicas=ws, rank=r, shuffle=True, seed=args.seed)
    with_set = epochs_of(sampler, set_epoch=True)
    shards = gather_objects(with_set[0])  # every rank's shard of epoch 0, to check them against each other

    X = torch.arange(N_TRAIN, dtype=torch.float32)  # stands in for the images: the value is the index
    batches = TensorBatches(X, torch.zeros(N_TRAIN, dtype=torch.long), 1000, seed=args.seed, rank=r, world_size=ws)
    tb = []
    for epoch in (1, 2):
        batches.set_epoch(epoch)
        tb.append([int(v) for Xb, _ in batches for v in Xb])
    tb_shards = gather_objects(tb[0])

    def union_and_overlap(parts):
        seen = [set(p) for p in parts]
        overlap = sum(len(seen[i] & seen[j]) for i in range(ws) for j in range(i + 1, ws))
        return len(set().union(*seen)), overlap

    union, overlap = union_and_overlap(shards)
    tb_union, tb_overlap = union_and_overlap(tb_shards)
    return {"rank": r, "shard_size": len(with_set[0]), "first_indices_without_set_epoch": [e[:6] for e in without],
            "first_indices_with_set_epoch": [e[:6] for e in with_set],
            "same_order_without_set_epoch": [same_position_fraction(without[0], e) for e in without[1:]],
            "same_order_with_set_epoch": [same_position_fraction(with_set[0], e) for e in with_set[1:]],
            "union": union, "overlap": overlap, "tensorbatches_union": tb_union, "tensorbatches_overlap": tb_overlap,
            "tensorbatches_same_order": same_position_fraction(tb[0], tb[1])}


def summarize(ranks: list[dict]) -> dict:
    return {"world_size": len(ranks), "dataset": N_TRAIN, "shard_sizes": [r["shard_size"] for r in ranks],
            "covered": ranks[0]["union"], "overlapping": ranks[0]["overlap"],
            "same_order_without_set_epoch": min(min(r["same_order_without_set_epoch"]) for r in ranks),
            "same_order_with_set_epoch": max(max(r["same_order_with_set_epoch"]) for r in ranks),
            "tensorbatches_covered": ranks[0]["tensorbatches_union"],
            "tensorbatches_overlapping": ranks[0]["tensorbatches_overlap"],
            "tensorbatches_same_order": max(r["tensorbatches_same_order"] for r in ranks)}


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("sampler",)))
