"""The smallest worker that tests ``torchrun --max-restarts`` (notebook 07_scaling_and_multinode, tests/workers/test_bugs_restart_kill.py).

Plain torch, nothing of the series: join the gloo process group that torchrun prepared, all-reduce, and on the
first attempt (``TORCHELASTIC_RESTART_COUNT == 0``) let rank ``--die-rank`` send itself SIGKILL (``kill -9``)
after ``--die-after`` all-reduces. torchrun sees the dead worker, stops the others and, with ``--max-restarts``,
starts the whole group again; the second attempt must form a new process group and finish. Rank 0 writes
``{"restart_count": ..., "sum": ...}`` to ``--out`` when it does.

    # what the launcher runs (--standalone; the launcher adds TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        --max-restarts 2 -m mnist_helpers.workers.bugs.restart_kill --out /tmp/r.json
    # the same job at an explicit c10d endpoint (how several nodes meet)
    python -m torch.distributed.run --nnodes 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29411 \\
        --nproc-per-node 2 --max-restarts 2 -m mnist_helpers.workers.bugs.restart_kill --out /tmp/r.json

The success rates over many such jobs (every configuration of ``mnist_helpers.lessons.n07.scaling.RESTART_CONFIGS``, N trials
each): ``python scripts/bench_restarts.py --trials 5``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def worker(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--die-rank", type=int, default=1, help="the rank that kills itself on the first attempt")
    ap.add_argument("--die-after", type=int, default=3, help="all-reduces before the kill")
    ap.add_argument("--steps", type=int, default=6, help="all-reduces per attempt")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="keep all-reducing this long (elastic membership: time for another agent to join)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds for the store and collectives")
    ap.add_argument("--out", default=None, help="rank 0 writes a JSON summary here when the job finishes")
    args = ap.parse_args(argv)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        print(f"[rank {rank}] attempt {attempt}: process group up, world size {world}", flush=True)
        x = torch.ones(1024)
        for step in range(args.steps):
            dist.all_reduce(x)
            if attempt == 0 and rank == args.die_rank and step + 1 == args.die_after:
                print(f"[rank {rank}] attempt {attempt}: kill -9 myself after {step + 1} all-reduces", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            dist.all_reduce(x)
            x.fill_(1.0)
            time.sleep(0.05)
        if rank == 0:
            print(f"[rank 0] attempt {attempt}: {args.steps} all-reduces done, world size {world}", flush=True)
            if args.out:
                tmp = f"{args.out}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"restart_count": attempt, "world_size": world, "sum": float(x[0])}, f)
                os.replace(tmp, args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker())
