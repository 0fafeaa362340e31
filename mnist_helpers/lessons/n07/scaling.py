"""The measurement harness of notebook 07 (07_scaling_and_multinode), shared by the lesson
(``mnist_helpers/lessons/n07/lesson.py``) and ``scripts/bench_scaling.py``, ``scripts/bench_allreduce.py`` and
``scripts/bench_restarts.py``: the scaling sweeps, the all-reduce sweeps and the ring model, the restart trials, and
the verdicts the notebook and those scripts share.

**Weak and strong scaling without the loader.** Each point (:func:`measure_step`) runs the benchmark worker
``mnist_helpers.workers.bench.allreduce ddp``: DDP steps on synthetic MNIST-shaped batches, timed against the same
step under ``no_sync()``, so every row carries the share of the step spent communicating, per timed block
(:func:`comm_fractions`). :func:`weak_scaling` (same batch per process) and :func:`strong_scaling` (same global
batch) alternate rounds and take medians. :func:`comm_verdict` is the one function that decides whether
communication is "negligible" (``NEGLIGIBLE_SHARE`` of a step, judged on the quartiles of the blocks). On CPU the
threads per process are set explicitly, so "2 processes" means 2 x 1 thread against 1 x 1 thread: a CPU stand-in
(gloo), not a GPU measurement.

**2 against 1** (5.4). :func:`round_ratios` takes each round's 2-vs-1 ratio from its own pair (the lesson's
``paired_ratios`` does the same for its article comparison); :func:`speedup_verdict` judges the article's "1.7-1.9x"
(``ARTICLE_SPEEDUP``) on the spread of those ratios (inside, above, below, or straddling the range), from at least
``MIN_ROUNDS`` of them.

**What an all-reduce costs** (4.4). "Ring AllReduce communication volume grows linearly with the number of GPUs"
reads two ways: each rank sends ``2(N-1)/N`` times the message (flat in N), while the total over all links
``2(N-1) S`` and the step count ``2(N-1)`` grow linearly. :func:`ring_model` gives the model,
:func:`ring_volume_verdict` judges the sentence both ways ("holds with nuance"), :func:`allreduce_sweep` measures
gloo/NCCL all-reduce time per message size and world size, :func:`measured_growth` compares it with the model;
:func:`ddp_variants` times DDP steps per ``bucket_cap_mb`` and compression hook.

**Restarts** (7.2). :func:`restart_trial` runs a plain-torch worker (``RESTART_WORKER``) whose rank 1 kills itself
under ``torchrun --max-restarts``; :func:`restart_rates` repeats it per configuration of ``RESTART_CONFIGS``
(``--standalone`` or a c10d endpoint, with or without ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``);
:func:`record_restarts` writes claim ``07.restarts`` (tests/workers/test_bugs_restart_kill.py).

Rows are lists of dicts; ``SCALING_TABLE``, ``ALLREDUCE_TABLE``, ``DDP_VARIANTS_TABLE`` and ``RESTARTS_TABLE`` are
the columns and formats to show them with (``display.show(rows, **SCALING_TABLE)``).

    from mnist_helpers.lessons.n07.scaling import allreduce_sweep, strong_scaling
    rows = strong_scaling([1, 2], global_batch_size=128, threads_per_proc=1)
    rows = allreduce_sweep([4096, 4 * 2**20], world_sizes=[2, 3, 4])
"""
from __future__ import annotations

import json
import statistics

from mnist_helpers.launch import torchrun

WORKER = "mnist_helpers.workers.bench.allreduce"

# How the notebook and the scripts show each kind of row: ``display.show(rows, **SCALING_TABLE)``.
SCALING_TABLE = {"columns": ["kind", "device", "world_size", "batch_size", "global_batch_size", "images_per_s",
                             "speedup", "efficiency", "comm_fraction"],
                 "formats": {"images_per_s": "{:,.0f}", "speedup": "{:.2f}x", "efficiency": "{:.2f}",
                             "comm_fraction": "{:.1%}"}}
ALLREDUCE_TABLE = {"columns": ["world_size", "bytes", "latency_us", "algbw_gbps", "busbw_gbps", "ring_factor",
                               "backend", "device"],
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
    return _launch(args, nproc, threads_per_proc, timeout, device, echo)[0]


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
                     "comm_fractions": [f for r in pick for f in comm_fractions(r)],
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


def round_ratios(rows: list[dict], n: int, base_n: int = 1) -> list[float]:
    """Per round, images/s at ``n`` processes over images/s at ``base_n``, both measured in that round."""
    a = next(r for r in rows if r["world_size"] == n)["images_per_s_runs"]
    b = next(r for r in rows if r["world_size"] == base_n)["images_per_s_runs"]
    return [x / y for x, y in zip(a, b)]


# --------------------------------------------------------------------------- the verdicts: 2 against 1, communication

# The article's range for "2 GPUs are 1.7-1.9x faster than 1" (section 5.4).
ARTICLE_SPEEDUP = (1.7, 1.9)
# "Negligible" communication: under this share of a DDP step. The verdict needs the measured spread (quartiles of
# the timed blocks) wholly on one side of it; a spread that straddles it is "inconclusive".
NEGLIGIBLE_SHARE = 0.05


# The fewest rounds a 2-vs-1 verdict is read from: fewer give a spread too narrow to trust.
MIN_ROUNDS = 3


def speedup_verdict(ratios, low: float = ARTICLE_SPEEDUP[0], high: float = ARTICLE_SPEEDUP[1]) -> str:
    """The article's "2 devices give 1.7-1.9x", judged on repeated 2-vs-1 speedups (one per round, each measured
    side by side), with the thresholds outside the whole measured spread: "holds" when every ratio lies inside
    [low, high], "holds with nuance" when every one lies above (faster than claimed), "does not hold here" when
    every one lies below, else "inconclusive" (the spread straddles a bound), and "inconclusive" with fewer than
    ``MIN_ROUNDS`` ratios."""
    xs = [float(x) for x in (ratios if hasattr(ratios, "__iter__") else [ratios])]
    if len(xs) < MIN_ROUNDS:
        return "inconclusive"
    if min(xs) >= low and max(xs) <= high:
        return "holds"
    if min(xs) > high:
        return "holds with nuance"
    if max(xs) < low:
        return "does not hold here"
    return "inconclusive"


def comm_fractions(row: dict) -> list[float]:
    """Per timed block of a ``measure_step`` row: ``1 - t(no_sync) / t(step)``, the share of the step spent
    communicating (blocks are paired: each step block is followed by its no-sync block). A sweep row (medians over
    rounds) carries them already as ``comm_fractions``."""
    if row.get("comm_fractions"):
        return list(row["comm_fractions"])
    if "no_sync_step_s_all" not in row and "no_sync_step_s" not in row:
        return [row["comm_fraction"]]
    steps, quiet = row.get("step_s_all") or [row["step_s"]], row.get("no_sync_step_s_all") or [row["no_sync_step_s"]]
    return [1 - q / s for s, q in zip(steps, quiet)]


def comm_verdict(fractions, threshold: float = NEGLIGIBLE_SHARE) -> str:
    """"Communication is negligible for MNIST", judged on repeated measurements of the communication share of a
    step (``comm_fractions``): "holds" when the upper quartile is under ``threshold``, "does not hold here" when
    the lower quartile is over it, else "inconclusive". The one function that decides "negligible": the notebook,
    ``scripts/bench_scaling.py`` and the README row (generated from the result file) all use its word."""
    from mnist_helpers.course.claims import spread

    s = spread(fractions if hasattr(fractions, "__iter__") else [fractions])
    if s["q3"] < threshold:
        return "holds"
    if s["q1"] > threshold:
        return "does not hold here"
    return "inconclusive"


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


def ring_growth(world_sizes=(2, 4, 8, 16, 64)) -> dict:
    """The ring model between the smallest and largest N: how much the *per-rank* bytes (``2(N-1)/N``), the *total*
    bytes on all links (``2(N-1) * S``) and the number of steps (``2(N-1)``) grow, next to linear growth (N_max /
    N_min)."""
    lo, hi = min(world_sizes), max(world_sizes)
    if lo < 2:
        raise ValueError(f"world sizes must be >= 2 (one process sends nothing), got {world_sizes!r}")
    return {"n_min": lo, "n_max": hi,
            "per_rank_bytes_growth": ring_model(1, hi)["ring_factor"] / ring_model(1, lo)["ring_factor"],
            "total_bytes_growth": (hi - 1) / (lo - 1),
            "steps_growth": ring_model(1, hi)["steps"] / ring_model(1, lo)["steps"], "linear_would_be": hi / lo}


def ring_volume_verdict(world_sizes=(2, 4, 8, 16, 64), growth: dict | None = None) -> dict:
    """The sentence "ring AllReduce communication volume grows linearly with the number of GPUs" read both ways,
    from :func:`ring_growth` (or ``growth``, the same keys): *per-rank* bytes grow by ``2(N-1)/N`` (at most 2x:
    flat, not linear), while the *total* bytes on all links and the number of steps grow linearly. "holds with
    nuance" when both readings come out so (total linear, per rank not), "holds" when the per-rank volume were
    linear too, "wrong" when neither grows linearly."""
    g = dict(growth) if growth is not None else ring_growth(world_sizes)
    per_rank_linear = g["per_rank_bytes_growth"] >= 0.9 * g["linear_would_be"]
    total_linear = g["total_bytes_growth"] >= 0.9 * g["linear_would_be"]
    verdict = ("holds" if per_rank_linear else "holds with nuance" if total_linear else "wrong")
    return {**g, "verdict": verdict}


def measured_growth(rows: list[dict]) -> dict:
    """From an ``allreduce_sweep``: for the smallest message (latency-bound) and the largest (bandwidth-bound), the
    all-reduce time at the largest world size over the smallest, next to what the ring model predicts for each
    term (steps for latency, per-rank bytes for bandwidth)."""
    worlds = sorted({r["world_size"] for r in rows})
    small, big = min(r["bytes"] for r in rows), max(r["bytes"] for r in rows)
    t = {(r["world_size"], r["bytes"]): r["latency_us"] for r in rows}
    lo, hi = worlds[0], worlds[-1]
    return {"n_min": lo, "n_max": hi, "small_bytes": small, "big_bytes": big,
            "small_time_growth": t[(hi, small)] / t[(lo, small)], "big_time_growth": t[(hi, big)] / t[(lo, big)],
            "model_steps_growth": (hi - 1) / (lo - 1),
            "model_per_rank_bytes_growth": ring_model(1, hi)["ring_factor"] / ring_model(1, lo)["ring_factor"],
            "linear_would_be": hi / lo}


# --------------------------------------------------------------------------- restarts: torchrun --max-restarts, measured

RESTART_WORKER = "mnist_helpers.workers.bugs.restart_kill"
# (name, rendezvous, TORCH_DISABLE_SHARE_RDZV_TCP_STORE or None for torch's default)
RESTART_CONFIGS = (
    ("standalone, torch default", "standalone", None),
    ("standalone, store sharing off (the launcher)", "standalone", "1"),
    ("c10d endpoint, torch default", "c10d", None),
    ("c10d endpoint, store sharing off", "c10d", "1"),
)
RESTARTS_TABLE = {"columns": ["config", "trials", "succeeded", "success_rate", "failures", "median_s"],
                  "formats": {"success_rate": "{:.0%}", "median_s": "{:.1f}"}}


def restart_command(rendezvous: str, nproc: int = 2, max_restarts: int = 2, port: int | None = None,
                    out: str | None = None) -> list[str]:
    """The plain torchrun command of one restart trial (``rendezvous``: "standalone" or "c10d")."""
    import sys

    from mnist_helpers.ports import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if rendezvous == "standalone":
        cmd.append("--standalone")
    elif rendezvous == "c10d":
        cmd += ["--nnodes", "1", "--rdzv-backend", "c10d", f"--rdzv-endpoint=127.0.0.1:{port or free_port()}",
                "--rdzv-id", "restart-trial"]
    else:
        raise ValueError(f"rendezvous must be 'standalone' or 'c10d', got {rendezvous!r}")
    cmd += ["--nproc-per-node", str(nproc), f"--max-restarts={max_restarts}", "--monitor-interval", "0.5",
            "-m", RESTART_WORKER]
    return cmd + (["--out", str(out)] if out else [])


def restart_trial(rendezvous: str, share_off: str | None, *, nproc: int = 2, timeout: float = 90) -> dict:
    """Run one job whose rank 1 kills itself with SIGKILL on the first attempt, under ``--max-restarts=2``.
    Returns {"ok", "seconds", "restart_count", "failure"}: ok when rank 0 finished on a restarted attempt."""
    import os
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    from mnist_helpers.launch import popen_guarded, stop_tree

    with tempfile.TemporaryDirectory(prefix="mnist_restart_") as tmp:
        out = Path(tmp) / "out.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PET_LOG_DIR": tmp}
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        if share_off is not None:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = share_off
        cmd = restart_command(rendezvous, nproc, out=str(out))
        t0 = time.monotonic()
        proc = popen_guarded(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            text, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            text, code = (proc.stdout.read() if proc.stdout else ""), "timeout"
        seconds = time.monotonic() - t0
        result = json.loads(out.read_text()) if out.is_file() else None
    ok = code == 0 and result is not None and result["restart_count"] >= 1
    return {"ok": ok, "seconds": seconds, "restart_count": result and result["restart_count"],
            "failure": None if ok else _restart_failure(code, text), "exit": code}


def _restart_failure(code, text: str) -> str:
    """One short phrase for why a restart trial failed (what a learner would search for)."""
    if code == "timeout":
        return "hang (timed out)"
    for needle in ("connectFullMesh", "Address already in use", "DistStoreError", "RendezvousTimeoutError",
                   "Connection refused", "Connection reset", "Timed out", "SIGKILL"):
        if needle in text:
            return f"{needle} (exit {code})"
    return f"exit {code}"


def restart_rates(trials: int = 5, configs=RESTART_CONFIGS, *, timeout: float = 90, progress=None) -> list[dict]:
    """Every configuration ``trials`` times, interleaved; rows: config, trials, succeeded, success_rate, failures,
    median_s, runs."""
    runs = {name: [] for name, _, _ in configs}
    for _ in range(trials):
        for name, rdzv, share in configs:
            runs[name].append(restart_trial(rdzv, share, timeout=timeout))
            if progress is not None:
                progress.update(1)
    rows = []
    for name, rdzv, share in configs:
        rs = runs[name]
        fails = sorted({r["failure"] for r in rs if not r["ok"]})
        rows.append({"config": name, "rendezvous": rdzv, "share_store_off": share, "trials": len(rs),
                     "succeeded": sum(r["ok"] for r in rs), "success_rate": sum(r["ok"] for r in rs) / len(rs),
                     "failures": "; ".join(fails) or "-", "median_s": statistics.median(r["seconds"] for r in rs),
                     "runs": rs})
    return rows


RESTARTS_CLAIM = ("torchrun --max-restarts brings a DDP group back after a worker is killed (kill -9), "
                  "with the launcher's settings")


def launcher_restart_config() -> str:
    """The name (in ``RESTART_CONFIGS``) of what ``mnist_helpers.launch.torchrun`` runs on one node with
    ``LaunchOptions(max_restarts=N)``."""
    return "standalone, store sharing off (the launcher)"


def restarts_verdict(rows: list[dict]) -> str:
    """"holds" when the launcher's configuration succeeded in every trial, "does not hold here" otherwise."""
    mine = next(r for r in rows if r["config"] == launcher_restart_config())
    return "holds" if mine["succeeded"] == mine["trials"] else "does not hold here"


def record_restarts(rows: list[dict], res, contention=None) -> dict:
    """Add the 07.restarts claim (the series' own) to a ``claims.ResultFile``: the success rate per configuration."""
    mine = next(r for r in rows if r["config"] == launcher_restart_config())
    numbers = {f"{r['rendezvous']}_{'share_off' if r['share_store_off'] else 'default'}_rate": r["success_rate"]
               for r in rows}
    numbers.update({"trials_per_config": mine["trials"], "launcher_succeeded": mine["succeeded"]})
    parts = [f"{r['config']}: {r['succeeded']}/{r['trials']}" for r in rows]
    evidence = "; ".join(parts)
    numbers.update({f"{r['rendezvous']}_{'share_off' if r['share_store_off'] else 'default'}_succeeded":
                    r["succeeded"] for r in rows})
    return res.claim("07.restarts", claim=RESTARTS_CLAIM, section="ours", verdict=restarts_verdict(rows),
                     evidence=evidence, numbers=numbers,
                     regime=(f"plain torch worker (restart_kill), 2 gloo processes, rank 1 SIGKILLs itself on the "
                             f"first attempt, --max-restarts=2, {mine['trials']} trials per configuration, "
                             "interleaved; CPU"),
                     contention=contention)
