"""Weak and strong scaling through the launcher (introduced in 07_scaling_and_multinode).

*Weak scaling* keeps the batch per process fixed (more processes -> a bigger global batch);
*strong scaling* keeps the global batch fixed (more processes -> a smaller batch each). Each point is
one torchrun launch of ``mnist_helpers.workers.allreduce_bench ddp``: DDP steps on synthetic
MNIST-shaped batches, timed against the same step under ``no_sync()``, so every row also carries the
fraction of the step spent in communication. On CPU the threads per process are set explicitly
(``threads_per_proc``), so that "2 processes" means 2 x 1 thread against 1 x 1 thread.

    from mnist_helpers.scaling import weak_scaling
    rows = weak_scaling([1, 2], batch_size=128, threads_per_proc=1)
"""
from __future__ import annotations

import statistics

from .comm_bench import WORKER


def measure_step(nproc: int, batch_size: int, *, model: str = "net", threads_per_proc: int = 1,
                 steps: int = 3, repeats: int = 5, warmup: int = 2, bucket_cap_mb: float = 25,
                 hook: str = "none", device: str = "cpu", timeout: float = 300, echo: bool = False) -> dict:
    """One launch: ``nproc`` processes, ``batch_size`` images per process per step. Returns the row
    (images_per_s, step_s, no_sync_step_s, comm_fraction, ...)."""
    from .launch import torchrun

    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    args = ["ddp", "--model", model, "--batch-size", batch_size, "--variants", f"{bucket_cap_mb:g}:{hook}",
            "--steps", steps, "--repeats", repeats, "--warmup", warmup, "--threads", threads_per_proc]
    res = torchrun(WORKER, args, nproc=nproc, threads_per_proc=threads_per_proc, timeout=timeout,
                   provision=False, device=device, echo=echo)
    return {k: v for k, v in res["rows"][0].items() if not k.endswith("_all")}


def _sweep(world_sizes, batch_for, rounds: int, kind: str, reuse=(), **kw) -> list[dict]:
    world_sizes = [int(n) for n in world_sizes]
    if not world_sizes or min(world_sizes) < 1:
        raise ValueError(f"world_sizes must be positive integers, got {world_sizes!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    runs = {n: [] for n in world_sizes}
    for r in reuse:  # points another sweep measured with the same processes and batch (e.g. N=1)
        if r["world_size"] in runs and r["batch_size"] == batch_for(r["world_size"]):
            runs[r["world_size"]] = [{**r, "images_per_s": v} for v in r["images_per_s_runs"]]
    for _ in range(rounds):  # rounds interleave the sizes: drift on a shared machine hits all alike
        for n in world_sizes:
            if not any(r["world_size"] == n and r["batch_size"] == batch_for(n) for r in reuse):
                runs[n].append(measure_step(n, batch_for(n), **kw))
    base_n = min(world_sizes)
    rows = []
    for n in world_sizes:
        pick = runs[n]
        ips = statistics.median(r["images_per_s"] for r in pick)
        rows.append({"kind": kind, "world_size": n, "batch_size": batch_for(n), "global_batch_size": batch_for(n) * n,
                     "threads_per_proc": kw.get("threads_per_proc", 1), "images_per_s": ips,
                     "images_per_s_runs": [r["images_per_s"] for r in pick],
                     "step_s": statistics.median(r["step_s"] for r in pick),
                     "comm_fraction": statistics.median(r["comm_fraction"] for r in pick),
                     "backend": pick[0]["backend"], "device": pick[0]["device"]})
    base = next(r["images_per_s"] for r in rows if r["world_size"] == base_n)
    for r in rows:
        r["speedup"] = r["images_per_s"] / base
        r["efficiency"] = r["speedup"] / (r["world_size"] / base_n)
    return rows


def weak_scaling(world_sizes=(1, 2), batch_size: int = 128, *, rounds: int = 1, **kw) -> list[dict]:
    """Same batch per process at every world size. ``speedup`` is images/s relative to the smallest
    world size, ``efficiency`` = speedup / (N / N_min) (1.0 = perfect). ``reuse=rows`` takes the points
    of an earlier sweep with the same world size and batch per process instead of measuring them again."""
    return _sweep(world_sizes, lambda n: batch_size, rounds, "weak", **kw)


def strong_scaling(world_sizes=(1, 2), global_batch_size: int = 128, *, rounds: int = 1, **kw) -> list[dict]:
    """Same global batch at every world size (``global_batch_size`` must divide by each N)."""
    bad = [n for n in world_sizes if global_batch_size % int(n)]
    if bad:
        raise ValueError(f"global_batch_size {global_batch_size} must divide by every world size; not by {bad}")
    return _sweep(world_sizes, lambda n: global_batch_size // int(n), rounds, "strong", **kw)


def speedup_verdict(speedup: float, low: float = 1.7, high: float = 1.9) -> str:
    """The article's "2 devices give 1.7-1.9x", judged on a measured 2-vs-1 speedup."""
    if speedup >= low:
        return "holds" if speedup <= high + 0.05 else "holds (even better than claimed)"
    return f"does not hold here ({speedup:.2f}x < {low}x)"


def comm_verdict(fraction: float, threshold: float = 0.05) -> str:
    """"Communication is negligible for MNIST": negligible here means under ``threshold`` of the step."""
    return "holds" if fraction < threshold else f"does not hold here ({100 * fraction:.0f}% of the step)"
