"""Memory per rank and correctness of DDP, ZeRO-1 and FSDP2 (introduced in 11_beyond_data_parallel).

Every strategy trains the same ``ResMLP`` (``common.py``, same seed) for ``--steps`` AdamW steps; rank r takes
slice r of each global batch of ``--batch-size`` x world size images. Rank 0 also trains a plain one-process copy on
the whole global batch, and each strategy's final weights (all-gathered where sharded) are compared with it.
On the last step each rank counts the bytes it holds for parameters, gradients and optimizer state (tensor by
tensor; a DTensor counts its local shard) and, with ``--measure``, the step's peak tensor memory: the state held
before the step plus the highest rise of the profiler's allocation events during it (``common.step_peak``); peak
minus what persists after the step is the transient part (activations, gathered parameters, temporaries).

Strategies (``wrap`` below is the whole difference between them):
    ddp               every rank holds everything; gradients all-reduced
    zero1             DDP + ``ZeroRedundancyOptimizer``: each rank keeps the AdamW state of 1/N of the parameters
    fsdp2_zero2       ``fully_shard(reshard_after_forward=False)``: params, grads, state sharded; params stay gathered
                      from forward to backward (ZeRO-2-like)
    fsdp2_zero3       ``fully_shard(reshard_after_forward=True)``: params re-sharded after each block's forward and
                      gathered again in backward (ZeRO-3)
    fsdp2_zero3_ckpt  the same with activation checkpointing of every block

    # from a notebook
    mnist_helpers.launch.torchrun("mnist_helpers.workers.beyond.sharding", ["--width", "256", "--steps", "3"], nproc=2, device="cpu")
    # by hand
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.beyond.sharding --width 256 --blocks 2 --measure --out r.json
    python -m mnist_helpers.workers.beyond.sharding --width 256 --strategies ddp,fsdp2_zero3   # a world of one
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mnist_helpers.data import load_mnist
from mnist_helpers.resources import machine_info
from mnist_helpers.worker import entry, finish, parser, process_group
from mnist_helpers.workers.beyond.common import build, full_params, global_batch, state_bytes, step_peak

STRATEGIES = ("ddp", "zero1", "fsdp2_zero2", "fsdp2_zero3", "fsdp2_zero3_ckpt")


def wrap(strategy: str, model, lr: float):
    """(wrapped model, optimizer) for one strategy: the only lines that differ between them."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    if strategy == "ddp":
        model = DDP(model, gradient_as_bucket_view=True)  # the gradients live in DDP's buckets: no second copy
        return model, torch.optim.AdamW(model.parameters(), lr=lr)
    if strategy == "zero1":
        model = DDP(model, gradient_as_bucket_view=True)  # gradients all-reduced in full, as in DDP
        # NEW: each rank keeps (and updates) the AdamW state of its 1/N of the parameters, then broadcasts them
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)
    if strategy.startswith("fsdp2"):
        reshard = strategy != "fsdp2_zero2"  # True: ZeRO-3 (free gathered params after forward); False: ZeRO-2-like
        for block in model.blocks:  # one all-gather / reduce-scatter unit per block, then the rest at the root
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        return model, torch.optim.AdamW(model.parameters(), lr=lr)  # built after sharding: its state is sharded too
    raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def train_step(model, optimizer, X, y, precision: str = "fp32") -> dict:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = F.nll_loss(model(X), y)
    loss.backward()
    held = state_bytes(model, optimizer)  # gradients exist now; the optimizer state from the previous step
    optimizer.step()
    return held


def main(width: int = 256, blocks: int = 2, batch_size: int = 64, steps: int = 3, lr: float = 1e-3,
         strategies=STRATEGIES, precision: str = "fp32", measure: bool = False, data_root=None,
         threads: int | None = None, checkpointing: bool = False, out: str | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    with process_group("gloo", always_group=True) as ctx:
        world, rank = ctx.world_size, ctx.rank
        X, y, _, _ = load_mnist(data_root, subset=(batch_size * world * steps, 1))
        batches = [global_batch(X, y, s, batch_size, world) for s in range(steps)]
        mine = [(Xg[rank * batch_size:(rank + 1) * batch_size], yg[rank * batch_size:(rank + 1) * batch_size])
                for Xg, yg in batches]
        reference = None
        if rank == 0:  # one process, the whole global batch: what every strategy should reproduce
            ref = build(width, blocks)
            opt = torch.optim.AdamW(ref.parameters(), lr=lr)
            for Xg, yg in batches:
                train_step(ref, opt, Xg, yg, precision)
            reference = full_params(ref)
            n_params = sum(p.numel() for p in ref.parameters())
            del ref, opt
        rows = []
        for strategy in strategies:
            dist.barrier()
            ckpt = checkpointing or strategy.endswith("_ckpt")
            model, optimizer = wrap(strategy, build(width, blocks, checkpointing=ckpt), lr)
            seconds, held, report = [], None, None
            for s, (Xs, ys) in enumerate(mine):
                last = s == steps - 1
                if last and measure:
                    before = sum(state_bytes(model, optimizer).values())  # includes the previous step's grads
                    box = {}
                    report = step_peak(lambda m=model, o=optimizer: box.update(train_step(m, o, Xs, ys, precision)))
                    report.update(peak=before + report["rise"], transient=report["rise"] - report["net"])
                    held = box
                else:
                    t0 = time.perf_counter()
                    held = train_step(model, optimizer, Xs, ys, precision)
                    seconds.append(time.perf_counter() - t0)
            params = full_params(model)  # every rank takes part in the all-gather
            row = {"strategy": strategy, "world_size": world, "rank": rank, "checkpointing": ckpt, **held,
                   "step_s": statistics.median(seconds[1:] or seconds) if seconds else None}
            if report is not None:
                row.update(peak=report["peak"], transient=report["transient"])
            if rank == 0:
                row["max_param_diff"] = max(float(v.sub(
                    reference[k.removeprefix("module.")]).abs().max()) for k, v in params.items())
            rows.append(row)
            del model, optimizer, params
        gathered = [None] * world
        if dist.is_initialized():
            dist.all_gather_object(gathered, rows)
        else:
            gathered = [rows]
        result = {"world_size": world, "backend": ctx.backend, "width": width, "blocks": blocks,
                  "batch_size": batch_size, "steps": steps, "precision": precision, "n_params": None,
                  "rows": [r for per_rank in gathered for r in per_rank], "machine": machine_info()}
        lines = []  # rank 0 only: its rows carry the difference from the one-process reference
        if rank == 0:
            result["n_params"] = n_params
            lines = [f"{r['strategy']}: params {r['params'] / 2**20:.1f} MiB, grads {r['grads'] / 2**20:.1f}, "
                     f"optimizer {r['optimizer_state'] / 2**20:.1f}"
                     + (f", peak {r['peak'] / 2**20:.1f}" if 'peak' in r else "")
                     + f"; max param diff vs one process {r['max_param_diff']:.1e}" for r in rows]
        return finish(rank == 0, result, out, *lines)


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--width", type=int, default=256, help="ResMLP width (1024: 34M parameters with 4 blocks)")
    ap.add_argument("--blocks", type=int, default=2, help="residual MLP blocks")
    ap.add_argument("--batch-size", type=int, default=64, help="images per process per step")
    ap.add_argument("--steps", type=int, default=3, help="AdamW steps (the last one is measured)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated: " + ", ".join(STRATEGIES))
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast on the CPU")
    ap.add_argument("--measure", action="store_true", help="measure the last step's peak with the profiler")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing in every strategy")
    ap.add_argument("--data-root", default=None, help="MNIST folder (default: the series' data/)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process")
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    args = ap.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad or not strategies:
        ap.error(f"unknown strategies {bad}; choose from {', '.join(STRATEGIES)}")
    if min(args.width, args.blocks, args.batch_size, args.steps) < 1:
        ap.error("--width, --blocks, --batch-size and --steps must be positive integers")
    main(args.width, args.blocks, args.batch_size, args.steps, args.lr, strategies, args.precision, args.measure,
         args.data_root, args.threads, args.checkpointing, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
