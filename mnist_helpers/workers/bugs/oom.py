"""Reproduce an out-of-memory error and fix it by halving the batch (notebook 08_troubleshooting).

The worker caps its own memory first (``mnist_helpers.memory.limit_memory``): on CUDA with
``torch.cuda.set_per_process_memory_fraction``, on CPU with ``RLIMIT_AS`` (address space; see that
module and lessons/n08/lesson for what this does and does not measure). Then:

- the bug: one training step of the article's ``Net`` at ``--batch-size`` does not fit: CUDA raises
  ``torch.OutOfMemoryError``, the CPU allocator ``RuntimeError: ... can't allocate memory``;
- ``--fix find``: halve until a step fits (``find_batch_size``), then train ``--steps`` steps at that
  micro-batch with gradient accumulation, so the *effective* batch stays ``--batch-size``
  (accumulation lowers memory for a given batch; it does not multiply it).

    export MALLOC_MMAP_THRESHOLD_=1048576   # see mnist_helpers.memory.MALLOC_ENV
    python -m torch.distributed.run --standalone --nproc-per-node 1 \\
        -m mnist_helpers.workers.bugs.oom --batch-size 4096 --budget-mib 600            # the bug
    python -m torch.distributed.run --standalone --nproc-per-node 1 \\
        -m mnist_helpers.workers.bugs.oom --batch-size 4096 --budget-mib 600 --fix find  # the fix
"""
from __future__ import annotations

import math
import os
import sys

import torch

from mnist_helpers.io import MiB, write_json
from mnist_helpers.memory import find_batch_size, limit_memory, train_step_probe
from mnist_helpers.train import select_device, train_step
from mnist_helpers.worker import entry, parser


def train_accumulated(net, opt, batch_size: int, micro_batch_size: int, steps: int, device) -> list[float]:
    """``steps`` optimizer steps of ``batch_size`` images, each split into micro-batches of at most
    ``micro_batch_size`` (``train_step``'s ``grad_accum``); returns the losses."""
    grad_accum = math.ceil(batch_size / micro_batch_size)
    losses = []
    for _ in range(steps):
        X = torch.randn(batch_size, 1, 28, 28, device=device)
        y = torch.randint(0, 10, (batch_size,), device=device)
        losses.append(float(train_step(net, opt, X, y, grad_accum=grad_accum)))
    return losses


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__.splitlines()[0])
    ap.add_argument("--fix", choices=("none", "find"), default="none")
    ap.add_argument("--model", default="net")
    ap.add_argument("--batch-size", type=int, default=4096, help="the batch that does not fit")
    ap.add_argument("--budget-mib", type=int, default=600, help="memory this process may add (MiB)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps after the fix")
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    args = ap.parse_args(argv)
    device = select_device("auto", int(os.environ.get("LOCAL_RANK", "0")))
    fits = train_step_probe(args.model, device)  # model + optimizer state exist before the cap
    limit = limit_memory(args.budget_mib * MiB, device)
    print(f"[rank 0] memory capped: {limit}", flush=True)
    if args.fix == "none":
        loss = fits(args.batch_size)  # raises the out-of-memory error
        return 0
    search = find_batch_size(fits, args.batch_size)
    if search["batch_size"] is None:
        raise SystemExit(f"not even batch 1 fits in {args.budget_mib} MiB: raise --budget-mib")
    losses = train_accumulated(fits.model, fits.optimizer, args.batch_size, search["batch_size"], args.steps, device)
    summary = {"device": str(device), "limit": limit, "budget_mib": args.budget_mib, "batch_size": args.batch_size,
               "micro_batch_size": search["batch_size"], "grad_accum": math.ceil(args.batch_size / search["batch_size"]),
               "tried": search["tried"], "losses": losses}
    print(f"[rank 0] batch {args.batch_size} = {summary['grad_accum']} x {search['batch_size']} (accumulated); "
          f"losses {', '.join(f'{x:.4f}' for x in losses)}", flush=True)
    if args.out:
        write_json(args.out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
