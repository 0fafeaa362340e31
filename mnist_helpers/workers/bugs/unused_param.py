"""Reproduce "Expected to have finished reduction in the prior iteration" (notebook 08_troubleshooting).

DDP all-reduces each parameter's gradient as soon as it is ready in ``backward()``. A parameter that
the forward pass never used never gets a gradient, so the reduction of its bucket never finishes and
the *next* iteration fails (on every rank, also in a world of one). The model here has an auxiliary
head that ``forward`` forgets to call. Fixes, each selected with ``--fix``:

- ``use``: call the branch in ``forward`` (the aux loss is added with weight 0.1);
- ``freeze``: ``requires_grad_(False)`` on the branch: DDP then ignores it;
- ``find_unused``: ``DDP(..., find_unused_parameters=True)``: DDP walks the autograd graph after
  every forward to find the unused parameters; that walk costs time on *every* step;
- ``all``: time ``freeze`` against ``find_unused`` on the same model, same data, side by side
  (median of ``--steps`` timed steps after ``--warmup`` steps, the fixes interleaved step by step), plus ``use``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.unused_param                      # the bug
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.unused_param --fix all --out r.json   # the fixes, timed

The broken ``forward`` and the fixes sit between ``# [bug]`` / ``# [fix]`` / ``# [fix:other]`` marker comments
(notebook 08 shows them and their diff). Data are random MNIST-shaped batches: the step cost does not depend on
the pixel values.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.models import build_model
from mnist_helpers.train import train_step
from mnist_helpers.worker import entry, finish, parser, process_group

FIXES = ("none", "use", "freeze", "find_unused")


# [model]
class WithAuxHead(nn.Module):
    """``FastNet`` plus an auxiliary classifier on the input pixels, which ``forward`` forgets to call (the bug)."""

    def __init__(self):
        super().__init__()
        self.body = build_model("fastnet")
        self.aux = nn.Linear(28 * 28, 10)  # a parameter DDP registers, waits for, and never gets a gradient of

    # [bug]
    def forward(self, x):
        return self.body(x)
    # [/bug]
# [/model]


class UsesAuxHead(WithAuxHead):
    """The fix ``use``: ``forward`` calls the branch, so every parameter takes part in the loss."""

    # [fix]
    def forward(self, x):
        return self.body(x) + 0.1 * F.log_softmax(self.aux(torch.flatten(x, 1)), dim=1)
    # [/fix]


def make_ddp(fix: str) -> DDP:
    torch.manual_seed(0)
    model = UsesAuxHead() if fix == "use" else WithAuxHead()
    # [fix:other]
    if fix == "freeze":
        model.aux.requires_grad_(False)  # DDP registers no hook for parameters without grad
    return DDP(model, find_unused_parameters=fix == "find_unused")  # or: DDP searches the graph every step
    # [/fix:other]


def run_steps(fixes: list[str], steps: int, warmup: int, batch_size: int, rank: int) -> dict[str, list[float]]:
    """Train each fix's model ``warmup + steps`` steps, interleaved step by step so that the machine's
    load hits every fix alike; return each fix's timed step seconds (ranks aligned by a barrier)."""
    runners = {}
    for fix in fixes:
        ddp = make_ddp(fix)
        runners[fix] = (ddp, torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=0.01))
    gen = torch.Generator().manual_seed(rank)
    X = torch.randn(batch_size, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (batch_size,), generator=gen)
    times = {fix: [] for fix in fixes}
    for i in range(warmup + steps):
        for fix, (ddp, opt) in runners.items():
            if dist.get_world_size() > 1:
                dist.barrier()
            t0 = time.perf_counter()
            train_step(ddp, opt, X, y)  # the bug surfaces in the 2nd iteration's forward
            if i >= warmup:
                times[fix].append(time.perf_counter() - t0)
    return times


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__.splitlines()[0])
    ap.add_argument("--fix", choices=(*FIXES, "all"), default="none")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per fix")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64, help="per process")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # plain Python: a world of one; leaving, all ranks meet first (a bare destroy can abort a peer's gloo threads)
    with process_group("gloo", args.timeout, always_group=True) as ctx:
        rank = ctx.rank
        fixes = ["freeze", "find_unused", "use"] if args.fix == "all" else [args.fix]
        rows = []
        for fix, times in run_steps(fixes, args.steps, args.warmup, args.batch_size, rank).items():
            rows.append({"fix": fix, "median_step_ms": 1000 * statistics.median(times), "steps": len(times)})
        summary = {"world_size": dist.get_world_size(), "batch_size": args.batch_size, "rows": rows}
        finish(rank == 0, summary, args.out, *(
            f"fix={r['fix']}: {r['steps']} steps, median {r['median_step_ms']:.2f} ms/step" for r in rows))
        return 0


if __name__ == "__main__":
    sys.exit(cli())
