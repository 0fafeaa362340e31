"""AllReduce micro-benchmark and DDP communication settings (introduced in 07_scaling_and_multinode).

The article says ring AllReduce "communication volume grows linearly with the number of GPUs". The
ring algorithm sends ``2(N-1)/N`` times the message per rank (reduce-scatter then all-gather), which
tends to 2x, not N x; what grows with N is the number of steps (latency term ``2(N-1) * alpha``).
:func:`allreduce_sweep` measures latency and bus bandwidth per message size and world size (gloo on
CPU, NCCL on GPUs) through the launcher; :func:`ring_model` gives the model to compare with;
:func:`ddp_variants` times DDP steps per ``bucket_cap_mb`` and compression hook (fp16/bf16).

    from mnist_helpers.comm_bench import allreduce_sweep, ring_model
    rows = allreduce_sweep([4096, 4 * 2**20], world_sizes=[2, 4])
"""
from __future__ import annotations

WORKER = "mnist_helpers.workers.allreduce_bench"


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


def _launch(args: list[str], nproc: int, threads_per_proc: int, timeout: float, device: str, echo: bool) -> list[dict]:
    from .launch import torchrun

    res = torchrun(WORKER, args, nproc=nproc, threads_per_proc=threads_per_proc, timeout=timeout,
                   provision=False, device=device, echo=echo)
    return res["rows"]


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
