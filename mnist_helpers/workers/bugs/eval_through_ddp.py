"""Reproduce the hang of evaluating on rank 0 *through the DDP wrapper* (notebook 08_troubleshooting, article 6.4).

The article evaluates on rank 0 only (``if rank == 0: evaluate(model)``) and shows no barrier; this worker has
the other ranks wait at ``dist.barrier()`` meanwhile (a real job meets the same mismatch at its next collective,
e.g. the next step's gradient all-reduce). With a model that has buffers (BatchNorm's running mean and variance) and DDP's default
``broadcast_buffers=True``, calling the *wrapper* ``model(X)`` is not a local computation: DDP's forward first
broadcasts rank 0's buffers to every rank, a collective. After a training step that broadcast happens even
under ``torch.no_grad()`` and ``model.eval()`` (DDP decides from the previous forward). Rank 0 then waits in a
broadcast that the other ranks, already in ``barrier()``, never join: the two collectives do not match, and the
job hangs until the process group's timeout (30 min by default for gloo, 10 for NCCL), or gloo aborts on the
mismatch. The worker uses a short ``--timeout`` so the hang becomes an error within seconds.

Two fixes (``--fix``):

- ``module`` (the default fix): evaluate the bare model, ``model.module`` (no DDP forward, no collective);
- ``all``: every rank evaluates through the wrapper (each joins the broadcast), e.g. on its own shard.

    # the bug: rank 0 evaluates through DDP, rank 1 waits in barrier() (times out after 5 s)
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.eval_through_ddp --timeout 5
    # the fixes
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.eval_through_ddp --fix module
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.eval_through_ddp --fix all

The broken lines and the fixes sit between ``# [bug]`` / ``# [fix]`` / ``# [fix:all]`` marker comments (notebook
08 shows them and their diff). A model without buffers (``--model net``) does not hang: nothing to broadcast.
That is why the bug hides until a BatchNorm layer appears.
"""
from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mnist_helpers.models import build_model
from mnist_helpers.worker import entry, finish, parser, process_group


def evaluate(model, X, y) -> float:
    model.eval()
    with torch.no_grad():
        acc = (model(X).argmax(1) == y).float().mean().item()
    model.train()
    return acc


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__.splitlines()[0])
    ap.add_argument("--fix", choices=("none", "module", "all"), default="none",
                    help="module: rank 0 evaluates model.module; all: every rank evaluates through the wrapper")
    ap.add_argument("--model", default="netbn", help="netbn (BatchNorm: the hang) or net (no buffers: no hang)")
    ap.add_argument("--steps", type=int, default=3, help="training steps before the evaluation")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds before a waiting collective fails")
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    args = ap.parse_args(argv)
    # plain Python: a world of one; leaving, all ranks meet first (a bare destroy can abort a peer's gloo threads)
    with process_group("gloo", args.timeout, always_group=True) as ctx:
        rank, world_size = ctx.rank, ctx.world_size
        torch.manual_seed(0)
        model = DDP(build_model(args.model))               # broadcast_buffers=True, DDP's default
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        X, y = torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
        for _ in range(args.steps):
            opt.zero_grad()
            F.cross_entropy(model(X), y).backward()
            opt.step()
        Xt, yt = torch.randn(256, 1, 28, 28, generator=g), torch.randint(0, 10, (256,), generator=g)
        start = time.perf_counter()
        acc = None
        if args.fix == "none":
            # [bug]
            if rank == 0:
                acc = evaluate(model, Xt, yt)               # the bug: the wrapper (DDP's forward broadcasts buffers)
            # [/bug]
        elif args.fix == "module":
            # [fix]
            if rank == 0:
                acc = evaluate(model.module, Xt, yt)        # the fix: the bare model, no collective
            # [/fix]
        else:
            # [fix:all]
            acc = evaluate(model, Xt, yt)                   # every rank joins DDP's buffer broadcast
            # [/fix:all]
        if rank == 0:
            print(f"[rank 0] evaluated ({'model.module' if args.fix == 'module' else 'DDP wrapper'}) "
                  f"in {time.perf_counter() - start:.2f} s", flush=True)
        dist.barrier()                                       # "everyone waits for rank 0's evaluation"
        summary = {"world_size": world_size, "fix": args.fix, "model": args.model, "acc": acc,
                   "buffers": sum(1 for _ in model.module.buffers()),
                   "seconds": time.perf_counter() - start}
        finish(rank == 0, summary, args.out, f"all ranks passed the barrier ({args.fix=})")
        return 0


if __name__ == "__main__":
    sys.exit(cli())
