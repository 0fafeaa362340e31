"""``torch.compile`` with DDP: wrap first, then compile (introduced in 11_beyond_data_parallel).

DDP's gradient hooks must see the compiled graph's parameters, and TorchDynamo splits the compiled graph at
DDP's bucket boundaries (its ``DDPOptimizer``) so that all-reduces can still overlap the backward pass; so the
order is ``torch.compile(DDP(model))``. This worker trains ``ResMLP`` both ways side by side (eager DDP and compiled
DDP, same weights, same batches), times the first compiled step (compilation) apart from the steady steps, and
checks that both end with the same weights.

    # from a notebook
    mnist_helpers.launch.torchrun("mnist_helpers.workers.beyond.compile_ddp", ["--steps", "10"], nproc=2, device="cpu")
    # by hand
    torchrun --standalone --nproc-per-node=2 -m mnist_helpers.workers.beyond.compile_ddp --width 256 --steps 10 --out c.json
    python -m mnist_helpers.workers.beyond.compile_ddp --steps 5   # a world of one
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.data import load_mnist
from mnist_helpers.resources import machine_info
from mnist_helpers.worker import entry, finish, parser, process_group
from mnist_helpers.workers.beyond.common import build, global_batch


def main(width: int = 256, blocks: int = 2, batch_size: int = 64, steps: int = 10, data_root=None,
         out: str | None = None) -> dict:
    with process_group("gloo", always_group=True) as ctx:
        rank, world = ctx.rank, ctx.world_size
        X, y, _, _ = load_mnist(data_root, subset=(batch_size * world * steps, 1))
        runs = {}
        for name in ("eager", "compiled"):
            model = DDP(build(width, blocks))             # 1. wrap in DDP
            if name == "compiled":
                model = torch.compile(model)              # 2. then compile the wrapped model
            runs[name] = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.05), "seconds": []}
        for s in range(steps):  # interleaved: a busy machine slows both alike
            Xg, yg = global_batch(X, y, s, batch_size, world)
            Xr, yr = Xg[rank::world], yg[rank::world]
            for run in runs.values():
                t0 = time.perf_counter()
                run["opt"].zero_grad(set_to_none=True)
                F.nll_loss(run["model"](Xr), yr).backward()
                run["opt"].step()
                run["seconds"].append(time.perf_counter() - t0)
        a, b = (list(r["model"].parameters()) for r in runs.values())
        result = {"world_size": world, "width": width, "blocks": blocks, "batch_size": batch_size, "steps": steps,
                  "first_step_s": {k: r["seconds"][0] for k, r in runs.items()},
                  "step_s": {k: statistics.median(r["seconds"][1:]) for k, r in runs.items()},
                  "max_param_diff": max(float((p - q).abs().max()) for p, q in zip(a, b)),
                  "machine": machine_info()}
        return finish(ctx.is_main, result, out,
                      f"step eager {result['step_s']['eager'] * 1e3:.1f} ms, compiled "
                      f"{result['step_s']['compiled'] * 1e3:.1f} ms; first compiled step "
                      f"{result['first_step_s']['compiled']:.1f} s")


@entry  # expected errors: one message with the fix, exit code 2
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="images per process per step")
    ap.add_argument("--steps", type=int, default=10, help="steps per mode (the first one compiles)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=None, help="rank 0 writes the results JSON here")
    args = ap.parse_args(argv)
    if min(args.width, args.blocks, args.batch_size) < 1 or args.steps < 2:
        ap.error("sizes must be positive and --steps at least 2 (the first step compiles)")
    main(args.width, args.blocks, args.batch_size, args.steps, args.data_root, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
