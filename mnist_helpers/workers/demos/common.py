"""Run the demo workers of 12_ddp_in_depth (08 reuses them), one or several per torchrun launch.

Each ``mnist_helpers/workers/demos/<name>.py`` shows one point about DDP and has
``run(ctx, args) -> dict`` (this rank's measurements) and ``summarize(ranks) -> dict`` (the verdicts,
computed on rank 0 from every rank's dict). Starting torch in every process costs seconds, so one
launch can run several demos in the same process group:

    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.demos \\
        --demos sampler,seeding --out results/demos.json
    # or one demo alone, e.g.
    torchrun --standalone --nproc-per-node=3 -m mnist_helpers.workers.demos.validation

Rank 0 writes ``{"world_size", "backend", "demos": {name: {"ranks": [...], "summary": {...},
"seconds"}}, "machine"}`` to ``--out``. From a notebook: ``mnist_helpers.launch.torchrun(...)``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

from mnist_helpers.io import write_json
from mnist_helpers.distributed import cleanup, gather_objects, init_distributed
from mnist_helpers.resources import machine_info
from mnist_helpers.worker import entry, parser

DEMOS = ("manual_allreduce", "local_rank_bug", "sampler", "seeding", "syncbn", "validation")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    ap.add_argument("--batch-size", type=int, default=32, help="images per process per step")
    ap.add_argument("--steps", type=int, default=3, help="training steps in the demos that train")
    ap.add_argument("--train-steps", type=int, default=40, help="steps to train the model the validation demo scores")
    ap.add_argument("--eval-repeats", type=int, default=3,
                    help="interleaved rounds of the validation demo's rank-0-only and exact evaluations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-root", default=None, help="folder holding MNIST/raw (default: the project's)")
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    ap.add_argument("--timeout", type=float, default=120, help="seconds before a stuck collective fails")


def run_demos(names: list[str], args: argparse.Namespace) -> dict:
    ctx = init_distributed(args.backend, args.timeout)
    try:
        demos = {}
        for name in names:
            module = importlib.import_module(f"mnist_helpers.workers.demos.{name}")
            t0 = time.perf_counter()
            ranks = gather_objects(module.run(ctx, args))
            summary = module.summarize(ranks)
            demos[name] = {"ranks": ranks, "summary": summary, "seconds": time.perf_counter() - t0}
            if ctx.is_main:
                print(f"[rank 0] {name}: " + ", ".join(f"{k}={v}" for k, v in summary.items()
                                                       if not isinstance(v, (list, dict))), flush=True)
        result = {"world_size": ctx.world_size, "backend": ctx.backend, "demos": demos, "machine": machine_info()}
        if ctx.is_main and args.out:
            write_json(args.out, result)
        return result
    finally:
        cleanup()


@entry  # torchrun's @record + the series' error boundary: the one entry point of every demo
def cli(argv: list[str] | None = None, default: tuple[str, ...] = DEMOS) -> int:
    ap = parser("__main__", __doc__)  # prog: the module the launch ran (the package, or one demo's module)
    ap.add_argument("--demos", default=",".join(default), help=f"comma-separated, from: {', '.join(DEMOS)}")
    add_arguments(ap)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.demos.split(",") if n.strip()]
    unknown = sorted(set(names) - set(DEMOS))
    if unknown or not names:
        ap.error(f"unknown demo(s) {unknown or names}; choose from {', '.join(DEMOS)}")
    run_demos(names, args)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
