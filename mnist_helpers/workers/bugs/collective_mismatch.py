"""Reproduce a collective mismatch: one rank skips an ``all_reduce`` (notebook 08_troubleshooting).

Every collective must be called by every rank, in the same order, with the same shapes. The bug
here is a common one: the loss is averaged over ranks for the log line *inside* ``if rank == 0``,
so rank 0 waits in an ``all_reduce`` of 2 numbers while rank 1 has moved on to the next step's
gradient ``all_reduce``. Nothing fails by itself: the ranks wait for each other until the process
group's ``timeout`` runs out (30 min by default for gloo, 10 min for nccl). Three ways to read it:

- a short ``--timeout`` (``init_process_group(timeout=timedelta(seconds=5))``) turns the hang
  into an error within seconds;
- ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks every collective's op and shapes across ranks first
  and names the mismatch ("Rank 0 is running collective ... but Rank 1 is running ...");
- ``--fix`` makes every rank join the log ``all_reduce``, and the run passes.

The broken lines and their fix sit between ``# [bug]`` and ``# [fix]`` marker comments (notebook 08 shows them and
their diff: ``l08.fix_diff``).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.collective_mismatch --timeout 5                 # the bug
    TORCH_DISTRIBUTED_DEBUG=DETAIL python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.collective_mismatch --timeout 5                 # names it
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.collective_mismatch --fix                       # the fix

It also serves as the small healthy worker for the backend-error demo (``GLOO_SOCKET_IFNAME``).
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from mnist_helpers.worker import entry, finish, parser, process_group

NUM_GRADS = 1000  # stands in for a model's gradients


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__.splitlines()[0])
    ap.add_argument("--fix", action="store_true", help="every rank joins the log all_reduce")
    ap.add_argument("--where", choices=("loop", "end"), default="loop",
                    help="loop: the log all_reduce inside the training loop (shapes differ: gloo aborts); "
                         "end: a final rank-0-only all_reduce while rank 1 waits in barrier() (a hang)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds before a waiting collective fails")
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    args = ap.parse_args(argv)
    # plain Python: a world of one; leaving, all ranks meet first (a bare destroy can abort a peer's gloo threads)
    with process_group("gloo", args.timeout, always_group=True) as ctx:
        rank, world_size = ctx.rank, ctx.world_size
        grads = torch.full((NUM_GRADS,), float(rank + 1))
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            dist.all_reduce(grads)                          # what DDP does in backward()
            grads /= world_size
            if args.where == "loop" and step % args.log_every == 0:
                loss = torch.tensor([1.0 / step, float(rank)])
                if args.fix or rank == 0:                   # the bug: only rank 0 reduces the log values
                    dist.all_reduce(loss)
                if rank == 0:
                    print(f"[rank 0] step {step} | loss {loss[0].item() / world_size:.4f}", flush=True)
        total = torch.tensor([float(args.steps)])
        if args.where == "end" and not args.fix:
            # [bug]
            if rank == 0:                                    # the bug: final metrics reduced on rank 0 only
                dist.all_reduce(total)
            # [/bug]
        elif args.where == "end":
            # [fix]
            dist.all_reduce(total)                           # the fix: every rank calls every collective
            # [/fix]
        dist.barrier()                                       # "wait for everyone before exiting"
        summary = {"world_size": world_size, "steps": args.steps, "seconds": time.perf_counter() - start,
                   "debug": os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF"),
                   "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
        finish(rank == 0, summary, args.out)
        return 0


if __name__ == "__main__":
    sys.exit(cli())
