"""Scaling and communication for 07_scaling_and_multinode: weak and strong scaling, all-reduce sweeps, the ring model.

Every measurement is a torchrun launch (through ``mnist_helpers.launch``) of the benchmark worker
``mnist_helpers.workers.bench.allreduce``; this module builds the launches, takes medians and turns the
rows into the article's verdicts.

**Weak and strong scaling** (article 5.4). *Weak scaling* keeps the batch per process fixed (more
processes -> a bigger global batch); *strong scaling* keeps the global batch fixed (more processes -> a
smaller batch each). Each point (:func:`measure_step`) runs the worker's ``ddp`` mode: DDP steps on
synthetic MNIST-shaped batches, timed against the same step under ``no_sync()``, so every row also
carries the fraction of the step spent in communication. On CPU the threads per process are set
explicitly (``threads_per_proc``), so that "2 processes" means 2 x 1 thread against 1 x 1 thread.
:func:`weak_scaling` and :func:`strong_scaling` alternate rounds over the world sizes and take medians;
:func:`speedup_verdict` and :func:`comm_verdict` judge "2 GPUs give 1.7-1.9x" and "communication is
negligible".

**What an all-reduce costs** (article 4.4). The article says ring AllReduce "communication volume grows
linearly with the number of GPUs". The ring algorithm sends ``2(N-1)/N`` times the message per rank
(reduce-scatter then all-gather), which tends to 2x, not N x; what grows with N is the number of steps
(latency term ``2(N-1) * alpha``). :func:`allreduce_sweep` measures latency and bus bandwidth per message
size and world size (gloo on CPU, NCCL on GPUs); :func:`ring_model` gives the model to compare with,
:func:`latency_growth` and :func:`ring_volume_verdict` the comparison; :func:`ddp_variants` times DDP
steps per ``bucket_cap_mb`` and compression hook (fp16/bf16).

Rows are lists of dicts; ``SCALING_TABLE``, ``ALLREDUCE_TABLE`` and ``DDP_VARIANTS_TABLE`` are the
columns and number formats to show them with (``mnist_helpers.display.show(rows, **SCALING_TABLE)``).

    from mnist_helpers.lessons.l07_scaling import allreduce_sweep, ring_model, weak_scaling
    rows = weak_scaling([1, 2], batch_size=128, threads_per_proc=1)
    rows = allreduce_sweep([4096, 4 * 2**20], world_sizes=[2, 4])
"""
from __future__ import annotations

import statistics

from mnist_helpers.launch import torchrun

WORKER = "mnist_helpers.workers.bench.allreduce"

# How the notebook and the scripts show each kind of row: ``display.show(rows, **SCALING_TABLE)``.
SCALING_TABLE = {"columns": ["kind", "world_size", "batch_size", "global_batch_size", "images_per_s", "speedup",
                             "efficiency", "comm_fraction"],
                 "formats": {"images_per_s": "{:,.0f}", "speedup": "{:.2f}x", "efficiency": "{:.2f}",
                             "comm_fraction": "{:.1%}"}}
ALLREDUCE_TABLE = {"columns": ["world_size", "bytes", "latency_us", "algbw_gbps", "busbw_gbps", "ring_factor",
                               "backend"],
                   "formats": {"bytes": "{:,}", "latency_us": "{:,.0f}", "algbw_gbps": "{:.3f}",
                               "busbw_gbps": "{:.3f}", "ring_factor": "{:.2f}"}}
DDP_VARIANTS_TABLE = {"columns": ["bucket_cap_mb", "hook", "step_s", "no_sync_step_s", "comm_fraction",
                                  "speedup_vs_first"],
                      "formats": {"bucket_cap_mb": "{:g}", "step_s": lambda v: f"{1e3 * v:.1f} ms",
                                  "no_sync_step_s": lambda v: f"{1e3 * v:.1f} ms", "comm_fraction": "{:.1%}",
                                  "speedup_vs_first": "{:.2f}x"}}


def _launch(args: list[str], nproc: int, threads_per_proc: int, timeout: float, device: str, echo: bool) -> list[dict]:
    """One torchrun launch of the benchmark worker; the rows rank 0 wrote."""
    res = torchrun(WORKER, args, nproc=nproc, threads_per_proc=threads_per_proc, timeout=timeout,
                   provision=False, device=device, echo=echo)
    return res["rows"]


# --------------------------------------------------------------------------- weak and strong scaling

def measure_step(nproc: int, batch_size: int, *, model: str = "net", threads_per_proc: int = 1,
                 steps: int = 3, repeats: int = 5, warmup: int = 2, bucket_cap_mb: float = 25,
                 hook: str = "none", device: str = "cpu", timeout: float = 300, echo: bool = False) -> dict:
    """One launch: ``nproc`` processes, ``batch_size`` images per process per step. Returns the row
    (images_per_s, step_s, no_sync_step_s, comm_fraction, ...)."""
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    args = ["ddp", "--model", model, "--batch-size", batch_size, "--variants", f"{bucket_cap_mb:g}:{hook}",
            "--steps", steps, "--repeats", repeats, "--warmup", warmup, "--threads", threads_per_proc]
    row = _launch(args, nproc, threads_per_proc, timeout, device, echo)[0]
    return {k: v for k, v in row.items() if not k.endswith("_all")}


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


# --------------------------------------------------------------------------- the ring model and all-reduce sweeps

def ring_model(nbytes: int, world_size: int, alpha_s: float = 0.0, link_bytes_per_s: float | None = None) -> dict:
    """Ring all-reduce: bytes each rank sends, number of steps, and (with alpha/bandwidth) the time.

    ``bytes_per_rank = 2 (N-1)/N * nbytes`` (reduce-scatter + all-gather), ``steps = 2 (N-1)``,
    ``seconds = steps * alpha + bytes_per_rank / link_bytes_per_s``.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    factor = 2 * (world_size - 1) / world_size
    out = {"world_size": world_size, "bytes": nbytes, "ring_factor": factor,
           "bytes_per_rank": factor * nbytes, "steps": 2 * (world_size - 1)}
    if link_bytes_per_s:
        out["seconds"] = out["steps"] * alpha_s + out["bytes_per_rank"] / link_bytes_per_s
    return out


def allreduce_sweep(sizes: list[int], world_sizes=(2,), *, iters: int = 10, repeats: int = 5, warmup: int = 2,
                    threads_per_proc: int = 1, device: str = "cpu", timeout: float = 180,
                    echo: bool = False) -> list[dict]:
    """Latency and bandwidth of ``all_reduce`` for every (world size, message size): one launch per
    world size. Rows: world_size, bytes, latency_us, algbw_gbps, busbw_gbps, ring_factor,
    ring_bytes_per_rank, backend, device."""
    if not sizes or any(int(s) < 4 for s in sizes):
        raise ValueError(f"sizes must be message sizes in bytes, each >= 4; got {sizes!r}")
    if any(int(n) < 2 for n in world_sizes):
        raise ValueError(f"world_sizes must be >= 2 (an all-reduce of one process moves nothing), got {world_sizes!r}")
    rows = []
    for n in world_sizes:
        args = ["allreduce", "--sizes", ",".join(str(int(s)) for s in sizes), "--iters", iters,
                "--repeats", repeats, "--warmup", warmup]
        for r in _launch(args, int(n), threads_per_proc, timeout, device, echo):
            model = ring_model(r["bytes"], r["world_size"])
            rows.append({**{k: v for k, v in r.items() if k != "seconds_all"},
                         "ring_factor": model["ring_factor"], "ring_bytes_per_rank": model["bytes_per_rank"]})
    return rows


def ddp_variants(variants=((25, "none"), (1, "none"), (25, "fp16"), (25, "bf16")), *, nproc: int = 2,
                 model: str = "net", batch_size: int = 128, steps: int = 3, repeats: int = 5, warmup: int = 2,
                 threads_per_proc: int = 1, device: str = "cpu", timeout: float = 300,
                 echo: bool = False) -> list[dict]:
    """DDP step time per (bucket_cap_mb, hook), interleaved in one process group, each against the
    same step without all-reduce (``no_sync``). Rows: bucket_cap_mb, hook, step_s, no_sync_step_s,
    images_per_s, comm_fraction, speedup_vs_first (step time of the first variant / this one)."""
    if not variants:
        raise ValueError("variants must list at least one (bucket_cap_mb, hook) pair, e.g. [(25, 'none')]")
    spec = ",".join(f"{float(mb):g}:{hook}" for mb, hook in variants)
    rows = _launch(["ddp", "--model", model, "--batch-size", batch_size, "--variants", spec, "--steps", steps,
                    "--repeats", repeats, "--warmup", warmup], nproc, threads_per_proc, timeout, device, echo)
    base = rows[0]["step_s"]
    return [{**{k: v for k, v in r.items() if not k.endswith("_all")}, "speedup_vs_first": base / r["step_s"]}
            for r in rows]


def latency_growth(rows: list[dict], nbytes: int | None = None) -> list[dict]:
    """For one message size (the largest by default): per world size the measured latency, the
    ring factor, and both relative to the smallest world size; shows what grows with N."""
    if not rows:
        raise ValueError("rows is empty: run allreduce_sweep first")
    nbytes = nbytes or max(r["bytes"] for r in rows)
    pick = sorted((r for r in rows if r["bytes"] == nbytes), key=lambda r: r["world_size"])
    if not pick:
        raise ValueError(f"no rows with bytes={nbytes}; sizes measured: {sorted({r['bytes'] for r in rows})}")
    first = pick[0]
    return [{"world_size": r["world_size"], "bytes": nbytes, "latency_us": r["latency_us"],
             "latency_vs_first": r["latency_us"] / first["latency_us"], "ring_factor": r["ring_factor"],
             "ring_bytes_vs_first": r["ring_factor"] / first["ring_factor"],
             "n_vs_first": r["world_size"] / first["world_size"]} for r in pick]


def ring_volume_verdict(world_sizes=(2, 4, 8, 16, 64)) -> dict:
    """The claim "ring volume grows linearly with N" against the model: per-rank bytes at the
    largest N relative to the smallest (a linear law would give N_max/N_min)."""
    lo, hi = min(world_sizes), max(world_sizes)
    growth = ring_model(1, hi)["ring_factor"] / ring_model(1, lo)["ring_factor"]
    return {"n_min": lo, "n_max": hi, "per_rank_bytes_growth": growth, "linear_would_be": hi / lo,
            "verdict": "holds" if growth >= 0.9 * hi / lo else "does not hold (per-rank volume is nearly constant)"}
