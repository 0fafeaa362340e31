"""Validation under DDP: three ways, timed and counted (12_ddp_in_depth, article section 6).

The ranks first train a small ``FastNet(width=8)`` together for ``--train-steps`` DDP steps, so there is
something worth scoring. Then, on the 10,000 test images:

1. **rank 0 only** (the common first attempt): rank 0 evaluates everything while the others wait
   at the next collective (here a barrier). Each rank's busy and waiting seconds are timed; that the others
   wait is true by construction, so the question is the wall time of the whole validation step against 3.
2. **DistributedSampler on the test set** (the article's advice): each rank scores
   ``ceil(10,000 / world_size)`` images and the counts are all-reduced. When the world size does
   not divide 10,000 the sampler pads with repeated images: with 3 ranks, 3 x 3,334 = 10,002.
3. **exact** (``mnist_helpers.distributed.evaluate_exact``): disjoint slices that cover the set,
   sums all-reduced: 10,000 images, and the same number of correct answers as rank 0 alone.

1 and 3 run in ``--eval-repeats`` interleaved rounds, each from a common barrier to the next.

    torchrun --standalone --nproc-per-node=3 -m mnist_helpers.workers.demos.validation
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from mnist_helpers.data import TensorBatches, load_mnist
from mnist_helpers.distributed import all_reduce_sum, evaluate_exact
from mnist_helpers.models import build_model
from mnist_helpers.train import evaluate, train_step

EVAL_BATCH = 1000


@torch.no_grad()
def evaluate_with_sampler(model, X, y, ctx) -> dict:
    sampler = DistributedSampler(TensorDataset(X, y), num_replicas=ctx.world_size, rank=ctx.rank, shuffle=False)
    loader = DataLoader(TensorDataset(X, y), batch_size=EVAL_BATCH, sampler=sampler)
    model.eval()
    correct = count = 0
    for Xb, yb in loader:
        correct += int((model(Xb).argmax(1) == yb).sum())
        count += len(yb)
    total_correct, total_count = all_reduce_sum([correct, count], X.device)
    return {"local_count": count, "correct": int(total_correct), "count": int(total_count),
            "acc": total_correct / total_count}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(ctx, args) -> dict:
    dev = ctx.device
    X_train, y_train, X_test, y_test = load_mnist(args.data_root, device=dev,
                                                  subset=(64 * ctx.world_size * args.train_steps, 10_000))
    torch.manual_seed(args.seed)
    model = build_model("fastnet", width=8).to(dev)  # small: the lesson is in the counting and the waiting
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for Xb, yb in TensorBatches(X_train, y_train, 64, seed=args.seed, rank=ctx.rank, world_size=ctx.world_size):
        train_step(ddp, opt, Xb, yb)

    # FastNet has BatchNorm: after the last step each rank's running statistics came from its own batch
    # (see syncbn.py). Give every rank rank 0's, so that all three methods score the same model.
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)

    # 1. rank 0 evaluates everything; the others reach the barrier at once and wait there. 3. the exact method.
    # Both are timed as wall time of the whole validation step (from a common barrier to the next), in
    # interleaved rounds: that the others *wait* is true by construction; whether it costs time is the question.
    rank0_total, rank0_busy, exact_total = [], [], []
    for _ in range(args.eval_repeats):
        dist.barrier()
        t0 = time.perf_counter()
        rank0 = evaluate(model, X_test, y_test, EVAL_BATCH) if ctx.is_main else None
        rank0_busy.append(time.perf_counter() - t0)
        dist.barrier()
        rank0_total.append(time.perf_counter() - t0)
        dist.barrier()
        exact, exact_s = timed(lambda: evaluate_exact(model, X_test, y_test, ctx, EVAL_BATCH))
        dist.barrier()
        exact_total.append(exact_s)
    # 2. DistributedSampler on the test set
    dist.barrier()
    padded, padded_s = timed(lambda: evaluate_with_sampler(model, X_test, y_test, ctx))
    busy, total = statistics.median(rank0_busy), statistics.median(rank0_total)
    return {"rank": ctx.rank, "rank0_only_busy_s": busy, "rank0_only_wait_s": total - busy,
            "rank0_only_total_s": total, "rank0_only_total_rounds_s": rank0_total, "rank0_only": rank0,
            "sampler_local_count": padded["local_count"], "sampler_count": padded["count"],
            "sampler_correct": padded["correct"], "sampler_acc": padded["acc"], "sampler_s": padded_s,
            "exact_count": exact["count"], "exact_correct": exact["correct"], "exact_acc": exact["acc"],
            "exact_s": statistics.median(exact_total), "exact_rounds_s": exact_total}


def summarize(ranks: list[dict]) -> dict:
    single = ranks[0]["rank0_only"]
    others = ranks[1:] or ranks
    return {"world_size": len(ranks), "test_images": single["count"],
            "single_process_correct": single["correct"], "single_process_acc": single["acc"],
            "rank0_only_busy_s": ranks[0]["rank0_only_busy_s"],
            "others_wait_s": max(r["rank0_only_wait_s"] for r in others),
            "others_wait_fraction": max(r["rank0_only_wait_s"] / r["rank0_only_total_s"] for r in others),
            "sampler_per_rank": [r["sampler_local_count"] for r in ranks],
            "sampler_count": ranks[0]["sampler_count"], "sampler_acc": ranks[0]["sampler_acc"],
            "sampler_s": max(r["sampler_s"] for r in ranks),
            "exact_count": ranks[0]["exact_count"], "exact_correct": ranks[0]["exact_correct"],
            "exact_acc": ranks[0]["exact_acc"], "exact_s": max(r["exact_s"] for r in ranks),
            # wall time of the validation step, per round (the slowest rank's clock: the step ends when it does)
            "rank0_only_rounds_s": [max(x) for x in zip(*(r["rank0_only_total_rounds_s"] for r in ranks))],
            "exact_rounds_s": [max(x) for x in zip(*(r["exact_rounds_s"] for r in ranks))],
            "exact_equals_single": ranks[0]["exact_correct"] == single["correct"]}


if __name__ == "__main__":
    from mnist_helpers.workers.demos.common import cli

    sys.exit(cli(default=("validation",)))
