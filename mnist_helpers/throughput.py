"""Training-step throughput under different framework settings (introduced in 01_resource_inspection).

The article claims that on the same hardware, framework configuration alone can change utilisation
about 2x. ``threads_sweep()`` measures it: the same training step (model, Adam, one batch of synthetic
MNIST-shaped data) at ``torch.set_num_threads(1..N)`` and beyond. ``framework_sweep(configs)`` does the
same for any settings (on a GPU: TF32 on/off, ``cudnn.benchmark``).

Each point runs in a fresh subprocess (``python -m mnist_helpers.throughput --threads 2 ...`` prints
one JSON line): thread pools are per process, and a fresh process keeps one setting from leaking into
the next. Rounds are interleaved (1, 2, 4, 1, 2, 4, ...) so that a burst of load from other jobs on a
shared machine hits every setting alike; each point is the median over every timed block.

Reported per point: ``images_per_s`` and ``cpu_cores_busy`` (process CPU time / wall time during the
timed blocks: the utilisation the claim is about).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTING_KEYS = ("threads", "device", "channels_last", "tf32", "cudnn_benchmark", "amp")


def step_throughput(*, model: str = "net", batch_size: int = 128, threads: int | None = None,
                    device: str = "cpu", channels_last: bool = False, tf32: bool | None = None,
                    cudnn_benchmark: bool | None = None, amp: str = "none", steps: int = 10,
                    warmup: int = 3, repeats: int = 3, seed: int = 0) -> dict:
    """Time ``repeats`` blocks of ``steps`` training steps in this process, after ``warmup`` steps.

    Returns ``{"images_per_s": [per block], "cpu_cores_busy": [per block], ...settings}``.
    Changes this process's thread count and backend flags: run it in a subprocess (``measure``).
    """
    import torch
    import torch.nn.functional as F

    from .models import build_model
    from .train import AMP_DTYPES, check_amp, select_device

    for name, v in (("batch_size", batch_size), ("steps", steps), ("repeats", repeats)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        torch.set_num_threads(threads)
    dev = select_device(device)
    check_amp(amp, dev)
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
    torch.manual_seed(seed)
    net = build_model(model).to(dev)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    X = torch.randn(batch_size, 1, 28, 28, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (batch_size,), device=dev)
    dtype = AMP_DTYPES[amp]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            loss = F.nll_loss(net(X).float(), y)
        loss.backward()
        opt.step()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        step()
    sync()
    ips, busy = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = time.perf_counter() - t0
        ips.append(steps * batch_size / wall)
        busy.append((time.process_time() - c0) / wall)
    return {"model": model, "batch_size": batch_size, "threads": torch.get_num_threads(), "device": str(dev),
            "channels_last": channels_last, "tf32": tf32, "cudnn_benchmark": cudnn_benchmark, "amp": amp,
            "images_per_s": ips, "cpu_cores_busy": busy}


def _command(settings: dict) -> list[str]:
    return [sys.executable, "-m", "mnist_helpers.throughput", "--json", json.dumps(settings)]


def measure(settings: dict, *, timeout: float = 300.0) -> dict:
    """``step_throughput(**settings)`` in a fresh Python process (its own thread pool); returns its dict."""
    unknown = set(settings) - set(SETTING_KEYS) - {"model", "batch_size", "steps", "warmup", "repeats", "seed"}
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; allowed: {', '.join(SETTING_KEYS)}, model, "
                         "batch_size, steps, warmup, repeats, seed")
    env = dict(os.environ)
    if settings.get("threads"):  # the OpenMP/MKL pools read these before torch.set_num_threads runs
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(settings["threads"])
    res = subprocess.run(_command(settings), capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"throughput measurement {settings} failed (exit {res.returncode}):\n{tail}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def framework_sweep(configs: list[dict], *, rounds: int = 3, common: dict | None = None,
                    timeout: float = 300.0, echo: bool = True) -> list[dict]:
    """Measure each settings dict in ``configs`` ``rounds`` times, interleaved, each in a subprocess.

    Returns one row per config: its settings, ``images_per_s`` (median over all timed blocks), ``spread``
    ((max - min) / median), ``cpu_cores_busy`` (median), ``blocks``, and ``vs_best`` (images_per_s / best).
    """
    if not configs or not all(isinstance(c, dict) for c in configs):
        raise ValueError("configs must be a non-empty list of settings dicts, e.g. [{'threads': 1}, {'threads': 2}]")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    common = dict(common or {})
    samples = [{"ips": [], "busy": [], "result": None} for _ in configs]
    for r in range(rounds):
        for i, cfg in enumerate(configs):
            res = measure({**common, **cfg}, timeout=timeout)
            samples[i]["ips"] += res["images_per_s"]
            samples[i]["busy"] += res["cpu_cores_busy"]
            samples[i]["result"] = res
            if echo:
                print(f"round {r + 1}/{rounds} {label(cfg):<28} {statistics.median(res['images_per_s']):>8,.0f} img/s",
                      flush=True)
    rows = []
    for cfg, s in zip(configs, samples):
        med = statistics.median(s["ips"])
        rows.append({"label": label(cfg), **{k: s["result"][k] for k in SETTING_KEYS},
                     "images_per_s": med, "spread": (max(s["ips"]) - min(s["ips"])) / med,
                     "cpu_cores_busy": statistics.median(s["busy"]), "blocks": len(s["ips"])})
    best = max(r["images_per_s"] for r in rows)
    for r in rows:
        r["vs_best"] = r["images_per_s"] / best
    return rows


def label(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def thread_counts(max_threads: int | None = None, oversubscribe: bool = True) -> list[int]:
    """1, 2, 4, ... up to the usable cores (always including that number), plus twice it if ``oversubscribe``."""
    n = max_threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    counts = sorted({1, n} | {2**k for k in range(1, 8) if 2**k < n})
    return counts + [2 * n] if oversubscribe else counts


def threads_sweep(threads: list[int] | None = None, *, rounds: int = 3, echo: bool = True, **common) -> list[dict]:
    """``framework_sweep`` over ``torch.set_num_threads(n)`` for n in ``threads`` (default ``thread_counts()``)."""
    threads = threads or thread_counts()
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in threads):
        raise ValueError(f"threads must be positive integers, got {threads!r}")
    return framework_sweep([{"threads": t} for t in threads], rounds=rounds, common=common, echo=echo)


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'setting':<32} {'img/s':>8} {'spread':>7} {'cores busy':>10} {'vs best':>8}"]
    for r in rows:
        lines.append(f"{r['label']:<32} {r['images_per_s']:>8,.0f} {r['spread']:>7.0%} "
                     f"{r['cpu_cores_busy']:>10.2f} {r['vs_best']:>8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Time training steps; prints one JSON line.")
    ap.add_argument("--json", default="{}", help='settings for step_throughput, e.g. \'{"threads": 2}\'')
    args = ap.parse_args(argv)
    print(json.dumps(step_throughput(**json.loads(args.json))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
