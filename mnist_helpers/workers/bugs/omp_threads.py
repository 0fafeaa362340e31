"""What torchrun does to threads: ``OMP_NUM_THREADS=1`` in every worker (notebook 08_troubleshooting).

When ``OMP_NUM_THREADS`` is not set and ``--nproc-per-node`` is above 1, torchrun sets it to 1 for every worker
process (and prints a warning
"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"), so a CPU job that ran
with all cores under plain ``python`` runs each process on one thread under torchrun: a 2-process job on a
16-core machine then uses 2 cores. The fix is to say what you want: ``OMP_NUM_THREADS=<cores / processes>``
in front of torchrun (what ``mnist_helpers.launch.torchrun`` does, and shows), or ``--fix`` here, which calls
``torch.set_num_threads(cores // LOCAL_WORLD_SIZE)`` in the worker.

    env -u OMP_NUM_THREADS python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.omp_threads                # 1 thread per process
    OMP_NUM_THREADS=4 python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m mnist_helpers.workers.bugs.omp_threads                # what you asked for
    python -m mnist_helpers.workers.bugs.omp_threads             # plain Python: torch's default (all cores)
"""
from __future__ import annotations

import os
import sys

import torch

from mnist_helpers.worker import entry, finish, parser


@entry  # torchrun's @record + the series' error boundary (an expected error: one message with the fix, exit 2)
def cli(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__.splitlines()[0])
    ap.add_argument("--fix", action="store_true", help="torch.set_num_threads(cores // LOCAL_WORLD_SIZE)")
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.fix:
        torch.set_num_threads(max(1, cores // local))
    summary = {"rank": int(os.environ.get("RANK", "0")), "local_world_size": local, "cores": cores,
               "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
               "under_torchrun": "TORCHELASTIC_RUN_ID" in os.environ, "fix": args.fix}
    print(f"[rank {summary['rank']}] OMP_NUM_THREADS={summary['omp_num_threads_env']} -> torch uses "
          f"{summary['torch_threads']} of {cores} cores", flush=True)
    finish(summary["rank"] == 0, summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
