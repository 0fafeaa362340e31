"""Profile data-parallel training steps in every process; rank 0 writes its Chrome/Perfetto trace.

Introduced in 09_profiling_and_autotune. Each process runs ``mnist_helpers.lessons.n09.profiling.profile_training``
on its own shard of MNIST. By default the gradients are averaged by an explicit, labelled all-reduce
between backward and the optimizer (what DDP does, minus the overlap), so communication shows up as
its own ``all-reduce`` block in the trace; ``--ddp`` wraps the model in DistributedDataParallel
instead, whose all-reduce runs *inside* backward (found in the profile by the collective ops' names).

Launch from a notebook with
``mnist_helpers.launch.torchrun("mnist_helpers.workers.bench.profile_ddp", ["--trace", "results/t.json"], nproc=2)``,
or by hand:

    # a world of one (no process group, no communication)
    python -m mnist_helpers.workers.bench.profile_ddp --trace results/09_trace_1proc.json --out results/p1.json
    # one node, 2 processes (gloo on CPU, nccl on GPUs)
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.bench.profile_ddp \\
        --trace results/09_trace_ddp_rank0.json --out results/p2.json

Rank 0 writes ``--out`` (JSON: world_size, backend, every rank's time breakdown, rank 0's top-operator table).

``--time-to-accuracy TARGET`` trains instead of profiling: DistributedDataParallel, the same loop as the notebook's
one-process runs (``mnist_helpers.lessons.n09.profiling.time_to_accuracy``: the clock stops while every rank evaluates the same
test subset, every ``--eval-every-images`` images counted over all processes), until the test accuracy reaches TARGET.
09's tuning-priority check launches it as the distribution lever:

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.bench.profile_ddp --time-to-accuracy 0.97 \\
        --batch-size 64 --loader dataloader --num-workers 4 --subset 60000 --out results/tta.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mnist_helpers.io import write_json
from mnist_helpers.distributed import cleanup, gather_objects, init_distributed
from mnist_helpers.models import build_model
from mnist_helpers.lessons.n09.profiling import (allreduce_gradients, make_batches, profile_training, time_breakdown,
                                     time_to_accuracy)
from mnist_helpers.train import TrainConfig
from mnist_helpers.worker import entry, parser


def train_to_accuracy(args: argparse.Namespace, ctx) -> dict:
    """``--time-to-accuracy``: DDP training until the test accuracy reaches the target (mnist_helpers.lessons.n09.profiling.time_to_accuracy)."""
    from mnist_helpers.data import load_mnist

    cfg = TrainConfig(model=args.model, batch_size=args.batch_size, loader=args.loader, num_workers=args.num_workers,
                      optimizer=args.optimizer, lr=args.lr, amp=args.amp, seed=args.seed,
                      subset=None if args.subset >= 60000 else args.subset)
    _, _, X_test, y_test = load_mnist(subset=(1, args.test_subset))
    res = time_to_accuracy(cfg, X_test, y_test, args.time_to_accuracy, eval_every_images=args.eval_every_images,
                           max_images=args.max_images, ctx=ctx)
    if ctx.is_main:
        took = f"{res['seconds']:.1f} s" if res["reached"] else "not reached"
        print(f"[rank 0] {ctx.world_size} processes: {args.time_to_accuracy:.2%} test accuracy after "
              f"{res['images']:,} images, {took}", flush=True)
    return {"world_size": ctx.world_size, "backend": ctx.backend, "device": str(ctx.device),
            "mode": "time to accuracy", "batch_size": args.batch_size, "time_to_accuracy": res}


def main(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = init_distributed(args.backend, args.timeout)
    try:
        if args.time_to_accuracy is not None:
            result = train_to_accuracy(args, ctx)
            if ctx.is_main and args.out:
                write_json(args.out, result)
            return result
        batches = make_batches(args.loader, args.batch_size, args.subset, args.num_workers,
                               rank=ctx.rank, world_size=ctx.world_size)
        torch.manual_seed(args.seed)
        model = build_model(args.model).to(ctx.device)
        allreduce = None
        if ctx.distributed:
            if args.ddp:
                from torch.nn.parallel import DistributedDataParallel as DDP
                ids = [ctx.device.index] if ctx.device.type == "cuda" else None
                model = DDP(model, device_ids=ids)
            else:
                for p in model.parameters():  # the same starting weights everywhere, as DDP would
                    torch.distributed.broadcast(p.data, src=0)
                allreduce = allreduce_gradients
        trace = Path(args.trace) if (args.trace and ctx.is_main) else None
        res = profile_training(model, batches=batches, device=ctx.device, wait=args.wait, warmup=args.warmup,
                               active=args.active, trace_path=trace, allreduce=allreduce, seed=args.seed)
        breakdown = time_breakdown(res["events"], res["steps"])
        everyone = gather_objects({"rank": ctx.rank, "breakdown": breakdown, "wall_s_per_step": res["wall_s_per_step"]})
        result = {"world_size": ctx.world_size, "backend": ctx.backend, "device": str(ctx.device),
                  "mode": "ddp" if args.ddp else ("explicit all-reduce" if ctx.distributed else "single process"),
                  "batch_size": args.batch_size, "steps": res["steps"], "ranks": everyone,
                  "table": res["table"], "trace_path": str(trace) if trace else None}
        if ctx.is_main:
            for r in everyone:
                parts = " | ".join(f"{b['part']} {b['share']:.0%}" for b in r["breakdown"])
                print(f"[rank 0] rank {r['rank']}: {r['wall_s_per_step'] * 1e3:.1f} ms/step | {parts}", flush=True)
            if args.out:
                write_json(args.out, result)
        return result
    finally:
        cleanup()


def parse(argv=None) -> argparse.Namespace:
    ap = parser(__name__, __doc__)
    ap.add_argument("--model", default="net", help="net, netbn or fastnet")
    ap.add_argument("--batch-size", type=int, default=64, help="images per step, per process")
    ap.add_argument("--subset", type=int, default=2048, help="training images shared out between the ranks")
    ap.add_argument("--loader", default="tensor", choices=["tensor", "dataloader"])
    ap.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (loader=dataloader)")
    ap.add_argument("--wait", type=int, default=1, help="profiler schedule: steps skipped")
    ap.add_argument("--warmup", type=int, default=1, help="profiler schedule: steps traced but discarded")
    ap.add_argument("--active", type=int, default=3, help="profiler schedule: steps recorded")
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of the labelled all-reduce")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", default=None, help="rank 0 writes its Chrome/Perfetto trace here")
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    ap.add_argument("--time-to-accuracy", type=float, default=None, metavar="TARGET",
                    help="train with DDP until this test accuracy (e.g. 0.97) instead of profiling")
    ap.add_argument("--test-subset", type=int, default=2000, help="test images the accuracy is measured on")
    ap.add_argument("--eval-every-images", type=int, default=2560, help="evaluate every N training images")
    ap.add_argument("--max-images", type=int, default=180_000, help="give up after N training images")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    ap.add_argument("--timeout", type=float, default=120, help="seconds before a stuck collective fails")
    args = ap.parse_args(argv)
    if args.time_to_accuracy is not None and not 0 < args.time_to_accuracy < 1:
        ap.error(f"--time-to-accuracy must be an accuracy between 0 and 1, got {args.time_to_accuracy}")
    for name in ("batch_size", "subset", "active", "test_subset", "eval_every_images", "max_images"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    return args


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    main(parse(argv))
    return 0


if __name__ == "__main__":
    from mnist_helpers.distributed import exit_now

    exit_now(cli())  # past an intermittent profiler abort at interpreter shutdown (see exit_now)
