"""Profiling, auto-configuration and the experience library (lesson module of 09_profiling_and_autotune).

The article's last section in three parts: "automate with torch.profiler, torch.utils.benchmark and torchrun",
"tune in the order batch size & workers > LR & optimizer > AMP & accumulation > distribution", and "record
every experiment to build your own knowledge base".

1. Where does a training step spend its time?
   - ``torch.profiler``: :func:`profile_training` runs labelled steps (``data`` / ``forward`` / ``backward`` /
     ``all-reduce`` / ``optimizer`` via ``record_function``, see :func:`labelled_step`) under a wait / warm-up /
     active schedule, writes a Chrome/Perfetto trace (open it at https://ui.perfetto.dev or chrome://tracing)
     and returns the profiler's top-operator table; :func:`time_breakdown` sums the labels into data wait,
     compute and communication, :func:`bottleneck` reads it in one line. The DDP worker
     ``mnist_helpers/workers/bench/profile_ddp.py`` runs the same loop in 2 processes.
   - ``torch.utils.benchmark.Timer``: :func:`timer_compare` times one training step (``train.train_step``)
     under several settings (threads, channels_last, batch size) and reports median and IQR of many runs.

2. Pick a configuration for *this* machine by measuring, under a time budget: :func:`autotune` runs the
   article's order as a search (threads, batch size, data feed, AMP dtype, processes per node), each candidate
   timed on real training steps (:func:`measure_steps`: median of repeats after a warm-up); what the budget did
   not allow is recorded as skipped, never guessed. :func:`evidence_table` is its evidence as a DataFrame;
   :func:`lr_optimizer_gain` measures the lever autotune does not touch (LR & optimizer) in steps to accuracy.

3. The experience library: every run the series logged (``mnist_helpers.experiments``), compared across
   notebooks and machines (:func:`overview`, :func:`runs_table`: DataFrames), the fastest configuration per
   machine, each tuning lever's measured gain (:func:`lever_gains`) and a computed verdict on the article's
   priority order (:func:`priority_verdict`), a CSV export and a small dashboard. Every function accepts an
   empty log (a fresh clone).

    from mnist_helpers.display import show
    from mnist_helpers.lessons.l09_profiling import autotune, evidence_table, profile_training, time_breakdown
    res = profile_training(model="net", batch_size=128, trace_path="results/09_trace.json")
    print(res["table"]); show(time_breakdown(res["events"], res["steps"]))
    tuned = autotune(budget_s=60); show(evidence_table(tuned["evidence"]))
"""
from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, record_function
from torch.utils import benchmark
from torch.utils.data import Subset

from mnist_helpers.data import TensorBatches, load_mnist, make_loader, mnist_datasets
from mnist_helpers.display import show, table
from mnist_helpers.experiments import query, to_csv
from mnist_helpers.launch import torchrun
from mnist_helpers.live import ipython_kernel_active
from mnist_helpers.memory import is_oom
from mnist_helpers.models import build_model
from mnist_helpers.resources import usable_cores
from mnist_helpers.train import (AMP_DTYPES, TrainConfig, check_amp, evaluate, make_train_batches, select_device,
                                 train_step)

# --------------------------------------------------------------------------- 1. torch.profiler

LABELS = ("data", "forward", "backward", "all-reduce", "optimizer")
CATEGORIES = {"data wait": ("data",), "compute": ("forward", "backward", "optimizer"),
              "communication": ("all-reduce",)}
# op names that are communication even when nobody labelled them (DDP all-reduces inside backward)
COMM_MARKERS = ("allreduce", "all_reduce", "broadcast", "allgather", "all_gather", "reduce_scatter")


def activities(device: torch.device | str) -> list:
    """CPU always; CUDA too when the run is on a GPU (kernels then show on their own stream rows)."""
    acts = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def _check_schedule(wait: int, warmup: int, active: int) -> None:
    for name, v in (("wait", wait), ("warmup", warmup)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0 (steps skipped before recording), got {v!r}")
    if not isinstance(active, int) or active < 1:
        raise ValueError(f"active must be a positive integer (steps recorded), got {active!r}")


# Not train.train_step: this step puts each phase (and an explicit all-reduce) under its own profiler label.
def labelled_step(model, opt, batches_iter, device, *, allreduce: Callable[[], None] | None = None,
                  channels_last: bool = False) -> int:
    """One training step with every phase under its ``record_function`` label. Returns the batch size.

    ``allreduce`` (e.g. :func:`allreduce_gradients`) runs between backward and the optimizer, the way DDP
    does without overlap, so communication gets its own label. On a GPU each label ends with a synchronize, so its
    CPU time includes the kernels it launched (otherwise they would run, unlabelled, after the step).
    """
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with record_function("data"):
        X, y = next(batches_iter)
        X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        sync()
    with record_function("forward"):
        loss = F.nll_loss(model(X), y)
        sync()
    opt.zero_grad(set_to_none=True)
    with record_function("backward"):
        loss.backward()
        sync()
    if allreduce is not None:
        with record_function("all-reduce"):
            allreduce()
            sync()
    with record_function("optimizer"):
        opt.step()
        sync()
    return len(X)


def allreduce_gradients(model: torch.nn.Module) -> Callable[[], None]:
    """Average the gradients over all ranks in one flat bucket (what DDP does, minus the overlap)."""
    def run():
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return run


def _cycle(batches: Iterable):
    while True:
        yielded = False
        for b in batches:
            yielded = True
            yield b
        if not yielded:
            raise ValueError("the batches are empty: give at least one batch (a larger subset or smaller batch_size)")


def make_batches(loader: str = "tensor", batch_size: int = 128, subset: int = 2048, num_workers: int = 0,
                 rank: int = 0, world_size: int = 1, root=None):
    """Training batches from in-memory tensors (``loader="tensor"``) or a torchvision DataLoader."""
    cfg = TrainConfig(batch_size=batch_size, subset=subset, loader=loader, num_workers=num_workers,
                      data_root=None if root is None else str(root))
    return make_train_batches(cfg, torch.device("cpu"), rank=rank, world_size=world_size)


def profile_training(model: str | torch.nn.Module = "net", *, batches=None, batch_size: int = 128,
                     loader: str = "tensor", num_workers: int = 0, subset: int = 2048, device=None,
                     wait: int = 1, warmup: int = 1, active: int = 3, trace_path: str | Path | None = None,
                     allreduce: Callable | None = None, channels_last: bool = False, row_limit: int = 12,
                     lr: float = 1e-3, seed: int = 0) -> dict:
    """Profile ``wait + warmup + active`` real training steps and return what was recorded.

    Returns ``{"table": top-operator text table, "events": [{name, cpu_us, device_us, count}] per name
    (averaged over the active steps' events), "steps": active, "trace_path": Path or None,
    "wall_s_per_step": plain wall time per active step, "images_per_step"}``.
    """
    _check_schedule(wait, warmup, active)
    device = select_device("auto" if device is None else str(device))
    torch.manual_seed(seed)
    net = build_model(model) if isinstance(model, str) else model
    net = net.to(device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    if batches is None:
        batches = make_batches(loader, batch_size, subset, num_workers)
    it = _cycle(batches)
    if allreduce is not None and not callable(allreduce):
        raise ValueError("allreduce must be a callable that averages gradients, e.g. allreduce_gradients(model)")
    reduce_fn = allreduce(net) if allreduce is not None else None
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    total = wait + warmup + active
    active_wall, images = 0.0, 0
    net.train()
    with torch.profiler.profile(activities=activities(device), schedule=schedule) as prof:
        for step in range(total):
            t0 = time.perf_counter()
            n = labelled_step(net, opt, it, device, allreduce=reduce_fn, channels_last=channels_last)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step >= wait + warmup:
                active_wall += time.perf_counter() - t0
                images = n
            prof.step()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=row_limit)
    path = None
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    return {"table": table, "events": summarise_events(prof), "steps": active, "trace_path": path,
            "wall_s_per_step": active_wall / active, "images_per_step": images, "device": str(device)}


def summarise_events(prof) -> list[dict]:
    """Per event name: total CPU time and device time (microseconds) and call count over the active steps."""
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0) or 0
        rows.append({"name": e.key, "cpu_us": float(e.cpu_time_total), "self_cpu_us": float(e.self_cpu_time_total),
                     "device_us": float(dev), "count": int(e.count)})
    return rows


def time_breakdown(events: list[dict], steps: int | None = None) -> list[dict]:
    """Data wait / compute / communication / other, as time and share of the profiled steps.

    ``events`` is :func:`summarise_events` output. Step time is the sum of ``ProfilerStep*`` events
    (falling back to the labels' sum); ``communication`` is the ``all-reduce`` label or, when nothing is
    labelled so (DDP all-reduces inside backward), the self time of collective ops. Shares add up to 1.
    """
    if not events:
        raise ValueError("no profiler events: profile at least one active step first")
    by = {}
    for e in events:
        by[e["name"]] = by.get(e["name"], 0.0) + e["cpu_us"]
    step_us = sum(v for k, v in by.items() if k.startswith("ProfilerStep"))
    label_us = {k: by.get(k, 0.0) for k in LABELS}
    out = {cat: sum(label_us[lab] for lab in labs) for cat, labs in CATEGORIES.items()}
    if label_us["all-reduce"] == 0.0:
        comm = sum(e["self_cpu_us"] for e in events if any(m in e["name"].lower() for m in COMM_MARKERS))
        out["communication"] = comm
        out["compute"] = max(out["compute"] - comm, 0.0)  # those ops ran inside the backward label
    total = step_us if step_us > 0 else sum(out.values())
    out["other"] = max(total - sum(out.values()), 0.0)
    total = max(total, sum(out.values()))
    n = steps or 1
    return [{"part": k, "ms_per_step": v / 1000 / n, "share": v / total if total else 0.0} for k, v in out.items()]


def bottleneck(breakdown: list[dict]) -> str:
    """A one-line reading of :func:`time_breakdown`: which part dominates and what to try."""
    top = max(breakdown, key=lambda r: r["share"])
    advice = {"data wait": "feed faster: more num_workers, in-memory tensors, pin_memory, prefetch",
              "compute": "the model is the bottleneck: threads, AMP, channels_last, a bigger batch, a GPU",
              "communication": "gradients cost more to share than to compute: bigger batch per process, "
                               "gradient accumulation with no_sync, fewer processes, a faster link",
              "other": "time outside the labels (Python overhead, kernel launches): bigger batches, torch.compile"}
    return f"{top['part']} dominates ({top['share']:.0%} of the step): {advice[top['part']]}"


# --------------------------------------------------------------------------- torch.utils.benchmark

STEP_STMT = "train_step(net, opt, X, y)"  # what the Timer runs: the series' one training step


def _step_stmt_globals(model_name: str, batch_size: int, channels_last: bool, device) -> dict:
    """The names :data:`STEP_STMT` needs: a seeded model, its Adam, one random batch; warmed up once."""
    torch.manual_seed(0)
    net = build_model(model_name).to(device)
    X = torch.randn(batch_size, 1, 28, 28, device=device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        X = X.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch_size,), device=device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    train_step(net, opt, X, y)  # warm-up: the first call allocates optimizer state and picks kernels
    return {"train_step": train_step, "net": net, "opt": opt, "X": X, "y": y}


def time_step(model: str = "net", *, batch_size: int = 128, threads: int | None = None, channels_last: bool = False,
              device=None, min_run_time: float = 1.0, min_runs: int = 5, label: str = "train step",
              sub_label: str = "", description: str = ""):
    """One ``torch.utils.benchmark.Measurement`` of a full training step (forward, backward, Adam), with at
    least ``min_runs`` timed runs so that its median and IQR mean something even when a step is slow."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive seconds, got {min_run_time!r}")
    device = select_device("cpu" if device is None else str(device))
    g = _step_stmt_globals(model, batch_size, channels_last, device)
    timer = benchmark.Timer(stmt=STEP_STMT, globals=g, num_threads=threads or torch.get_num_threads(),
                            label=label, sub_label=sub_label, description=description)
    m = timer.blocked_autorange(min_run_time=min_run_time)
    while len(m.times) < min_runs:
        m = benchmark.Measurement.merge([m, timer.timeit(number=1)])[0]
    return m


def timer_compare(model: str = "net", *, threads: Iterable[int] = (1, 2), channels_last: Iterable[bool] = (False, True),
                  batch_sizes: Iterable[int] = (64, 128, 256), base_batch: int = 128, base_threads: int | None = None,
                  device=None, min_run_time: float = 1.0, min_runs: int = 5) -> dict:
    """Time a training step while changing one thing at a time (threads, channels_last, batch size).

    Returns ``{"rows": [{comparison, setting, median_ms, iqr_ms, runs, images_per_s, relative}], "text":
    benchmark.Compare's table}``; ``relative`` is images/s over the first setting of the same comparison.
    """
    base_threads = base_threads or torch.get_num_threads()
    plan = [("threads", t, dict(threads=t, batch_size=base_batch)) for t in threads]
    plan += [("channels_last", c, dict(channels_last=c, threads=base_threads, batch_size=base_batch))
             for c in channels_last]
    plan += [("batch_size", b, dict(batch_size=b, threads=base_threads)) for b in batch_sizes]
    if not plan:
        raise ValueError("nothing to compare: give at least one of threads, channels_last, batch_sizes")
    rows, measurements, first = [], [], {}
    for comparison, setting, kw in plan:
        m = time_step(model, device=device, min_run_time=min_run_time, min_runs=min_runs, label=f"{model} train step",
                      sub_label=comparison, description=f"{comparison}={setting}", **kw)
        measurements.append(m)
        b = kw["batch_size"]
        ips = b / m.median
        first.setdefault(comparison, ips)
        rows.append({"comparison": comparison, "setting": setting, "median_ms": m.median * 1e3,
                     "iqr_ms": m.iqr * 1e3, "runs": len(m.times), "images_per_s": ips,
                     "relative": ips / first[comparison]})
    return {"rows": rows, "text": str(benchmark.Compare(measurements))}


# --------------------------------------------------------------------------- 2. autotune

STAGES = ("threads", "batch_size", "loader", "amp", "nproc")
SHARES = {"threads": 0.15, "batch_size": 0.3, "loader": 0.2, "amp": 0.15, "nproc": 0.2}
ARTICLE_DEFAULTS = {"batch_size": 128, "loader": "dataloader", "num_workers": 4, "pin_memory": True,
                    "amp": "none", "threads": None}


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def measure_steps(model: str, batch_size: int, *, device, amp: str = "none", threads: int | None = None,
                  steps: int = 3, repeats: int = 3, batches=None, seed: int = 0) -> dict:
    """Training throughput: one warm-up step, then ``repeats`` timings of ``steps`` steps each.

    ``batches``: an iterable of (X, y) (a DataLoader, so data wait counts); default: one random batch
    reused (pure compute). Returns ``{images_per_s (median), iqr_images_per_s, repeats}``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    device = select_device(str(device))
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        net = build_model(model).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
        if batches is None:
            X = torch.randn(batch_size, 1, 28, 28, device=device)
            y = torch.randint(0, 10, (batch_size,), device=device)

            def data():
                while True:
                    yield X, y
            it = data()
        else:
            def data():
                while True:
                    yield from batches
            it = data()

        def step() -> int:
            Xb, yb = next(it)
            Xb, yb = Xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            train_step(net, opt, Xb, yb, amp=amp, scaler=scaler)
            return len(Xb)

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        step()
        sync()
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            n = sum(step() for _ in range(steps))
            sync()
            rates.append(n / (time.perf_counter() - t0))
        lo, hi = _quartiles(rates)
        return {"images_per_s": statistics.median(rates), "iqr_images_per_s": hi - lo, "repeats": repeats}
    finally:
        torch.set_num_threads(old_threads)


class _Budget:
    """A global deadline, shared out between stages; unused time rolls over to the next stage."""

    def __init__(self, budget_s: float, stages):
        self.t0, self.total, self.stages = time.monotonic(), budget_s, list(stages)
        self.stage_end = self.t0

    def start(self, stage: str) -> None:
        left = max(self.total - self.elapsed(), 0.0)
        rest = self.stages[self.stages.index(stage):]
        share = SHARES[stage] / sum(SHARES[s] for s in rest)
        self.stage_end = time.monotonic() + left * share

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def allows(self, cost_s: float = 0.0) -> bool:
        return time.monotonic() + cost_s <= self.stage_end


def _candidates_batch(max_batch_size: int, start: int = 128, smallest: int = 32) -> list[int]:
    """The article's 128 first (the baseline), then doubling up to ``max_batch_size``, then halving down."""
    start = min(start, max_batch_size)
    up, b = [], start * 2
    while b <= max_batch_size:
        up.append(b)
        b *= 2
    down, b = [], start // 2
    while b >= min(smallest, start // 2) and b >= 1:
        down.append(b)
        b //= 2
    return [start] + up + down


def autotune(budget_s: float = 60.0, device=None, *, model: str = "net", max_batch_size: int = 1024,
             threads: list[int] | None = None, num_workers: list[int] | None = None, amp: list[str] | None = None,
             nproc: list[int] | None = None, subset: int = 2048, steps: int = 3, repeats: int = 3,
             launch_cost_s: float = 25.0, log: Callable[[str], None] | None = print) -> dict:
    """Search threads, batch size, data feed, AMP dtype and processes per node within ``budget_s`` seconds.

    Each stage starts from the article's choice (torch's threads, batch 128, a DataLoader with 4 workers,
    fp32, one process), so "best over first candidate" is the gain over the article's defaults.

    The first candidate of every stage is always measured (so the result is a measured configuration even
    on a tiny budget); later candidates run only while the stage's share of the budget lasts, and are
    recorded with ``status="skipped (budget)"`` otherwise. ``nproc`` candidates above 1 are measured with a
    real torchrun launch of ``workers.profile_ddp`` (start-up excluded), when ``launch_cost_s`` fits.

    Returns ``{"config": TrainConfig kwargs, "nproc", "evidence": [rows], "elapsed_s", "budget_s", "device"}``.
    """
    if not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
    dev = select_device("auto" if device is None else str(device))
    say = log or (lambda s: None)
    cores = usable_cores()
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    if threads is None:
        threads = sorted({cores, max(cores // 2, 1), 1}, reverse=True) if dev.type == "cpu" else [torch.get_num_threads()]
    if num_workers is None:
        num_workers = sorted({0, 1, min(2, cores), 4})
    if amp is None:
        amp = ["none", "bf16"] + (["fp16"] if dev.type == "cuda" else [])
    if nproc is None:
        nproc = [1] + ([gpus] if gpus > 1 else []) + ([2] if dev.type == "cpu" and cores >= 2 else [])
    for name, vals in (("threads", threads), ("nproc", nproc)):
        if not vals or any(not isinstance(v, int) or v < 1 for v in vals):
            raise ValueError(f"{name} must list positive integers, got {vals!r}")
    if not num_workers or any(not isinstance(v, int) or v < 0 for v in num_workers):
        raise ValueError(f"num_workers must list integers >= 0, got {num_workers!r}")
    bad = [a for a in amp if a not in AMP_DTYPES]
    if not amp or bad:
        raise ValueError(f"amp must list values among {', '.join(AMP_DTYPES)}; got {amp!r}")

    budget = _Budget(budget_s, STAGES)
    evidence: list[dict] = []
    chosen = {"threads": threads[0], "batch_size": min(128, max_batch_size), "loader": "tensor", "num_workers": 0, "amp": "none"}

    def record(stage, setting, status, result=None, **extra):
        row = {"stage": stage, "setting": setting, "status": status,
               "images_per_s": result["images_per_s"] if result else None,
               "iqr_images_per_s": result["iqr_images_per_s"] if result else None, "chosen": False, **extra}
        evidence.append(row)
        if result:
            say(f"  {stage} {setting}: {row['images_per_s']:,.0f} img/s (IQR {row['iqr_images_per_s']:,.0f})")
        else:
            say(f"  {stage} {setting}: {status}")
        return row

    def pick(stage):
        rows = [r for r in evidence if r["stage"] == stage and r["images_per_s"] is not None]
        best = max(rows, key=lambda r: r["images_per_s"])
        best["chosen"] = True
        return best

    def measure(batch_size=None, **kw):
        args = dict(device=dev, amp=chosen["amp"], threads=chosen["threads"] if dev.type == "cpu" else None,
                    steps=steps, repeats=repeats)
        args.update(kw)
        return measure_steps(model, batch_size or chosen["batch_size"], **args)

    say(f"autotune on {dev} ({cores} cores{f', {gpus} GPU(s)' if gpus else ''}), budget {budget_s:.0f} s")
    # 1. threads (CPU): intra-op threads for one process
    budget.start("threads")
    for i, t in enumerate(threads):
        if i and not budget.allows():
            record("threads", t, "skipped (budget)")
            continue
        record("threads", t, "measured", measure(threads=t, batch_size=chosen["batch_size"]))
    chosen["threads"] = pick("threads")["setting"]

    # 2. batch size: double until out of memory or out of budget; keep the fastest
    budget.start("batch_size")
    largest = None
    too_big = None
    for i, b in enumerate(_candidates_batch(max_batch_size)):
        if too_big is not None and b >= too_big:
            record("batch_size", b, "not tried (a smaller size ran out of memory)")
            continue
        if i and not budget.allows():
            record("batch_size", b, "skipped (budget)")
            continue
        try:
            res = measure(batch_size=b)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is expected here
            if not is_oom(exc):
                raise
            record("batch_size", b, "out of memory")
            too_big = b
            continue
        largest = max(largest or 0, b)
        record("batch_size", b, "measured", res)
    best_b = pick("batch_size")
    chosen["batch_size"] = best_b["setting"]
    best_b["note"] = f"largest measured that fit: {largest}"

    # 3. the data feed: in-memory tensors, or a DataLoader with num_workers
    budget.start("loader")
    X, y, _, _ = load_mnist(subset=(subset, 1))
    # the article's feed first (a DataLoader with the most workers asked for: 4 by default), then fewer, then tensors
    feeds = [("dataloader", w) for w in sorted(num_workers, reverse=True)] + [("tensor", 0)]
    for i, (kind, w) in enumerate(feeds):
        setting = "tensor (in memory)" if kind == "tensor" else f"dataloader, {w} workers"
        if i and not budget.allows():
            record("loader", setting, "skipped (budget)", loader=kind, num_workers=w)
            continue
        if kind == "tensor":
            batches = TensorBatches(X, y, chosen["batch_size"], shuffle=True, drop_last=True)
        else:
            ds = Subset(mnist_datasets()[0], range(subset))
            batches = make_loader(ds, chosen["batch_size"], num_workers=w, pin_memory=dev.type == "cuda",
                                  persistent_workers=w > 0)
        record("loader", setting, "measured", measure(batches=batches), loader=kind, num_workers=w)
        del batches
    best_l = pick("loader")
    chosen["loader"], chosen["num_workers"] = best_l["loader"], best_l["num_workers"]

    # 4. mixed precision
    budget.start("amp")
    for i, a in enumerate(amp):
        if i and not budget.allows():
            record("amp", a, "skipped (budget)")
            continue
        try:
            check_amp(a, dev)
        except ValueError as e:
            record("amp", a, f"unsupported: {e}")
            continue
        record("amp", a, "measured", measure(amp=a))
    chosen["amp"] = pick("amp")["setting"]

    # 5. processes per node: 1 is what we measured in-process; more need a real launch
    budget.start("nproc")
    base = max(r["images_per_s"] for r in evidence if r["stage"] == "amp" and r["images_per_s"])
    best_row = next(r for r in evidence if r["stage"] == "amp" and r["chosen"])
    for n in nproc:
        if n == 1:
            record("nproc", 1, "measured", {"images_per_s": base, "iqr_images_per_s": best_row["iqr_images_per_s"]})
            continue
        if not budget.allows(launch_cost_s):
            record("nproc", n, f"skipped (budget: a launch takes ~{launch_cost_s:.0f} s)")
            continue
        record("nproc", n, "measured", measure_processes(n, model=model, batch_size=chosen["batch_size"],
                                                          threads=max(cores // n, 1) if dev.type == "cpu" else None,
                                                          active=max(steps * repeats, 3)))
    n_best = pick("nproc")["setting"]
    config = {"model": model, "batch_size": chosen["batch_size"], "loader": chosen["loader"],
              "num_workers": chosen["num_workers"], "pin_memory": dev.type == "cuda" and chosen["loader"] == "dataloader",
              "amp": chosen["amp"], "threads": chosen["threads"] if dev.type == "cpu" else None}
    if n_best > 1 and config["threads"]:
        config["threads"] = max(cores // n_best, 1)
    elapsed = budget.elapsed()
    say(f"chosen: {config}, nproc={n_best} ({elapsed:.0f} s of {budget_s:.0f} s)")
    return {"config": config, "nproc": n_best, "evidence": evidence, "elapsed_s": elapsed, "budget_s": budget_s,
            "device": str(dev)}


def measure_processes(nproc: int, *, model: str = "net", batch_size: int = 128, threads: int | None = None,
                      active: int = 6, timeout: float = 180) -> dict:
    """Steady-state images/s of ``nproc`` data-parallel processes (DDP, profiled steps, launch excluded)."""
    args = ["--model", model, "--batch-size", batch_size, "--subset", max(batch_size * nproc * 4, 512),
            "--wait", 1, "--warmup", 1, "--active", active, "--ddp"]
    if threads:
        args += ["--threads", threads]
    res = torchrun("mnist_helpers.workers.bench.profile_ddp", args, nproc=nproc, timeout=timeout,
                   threads_per_proc=threads, echo=False)
    per_step = [r["wall_s_per_step"] for r in res["ranks"]]
    slowest = max(per_step)  # a step ends when the slowest rank's all-reduce does
    return {"images_per_s": batch_size * nproc / slowest, "iqr_images_per_s": 0.0}


def evidence_table(evidence: list[dict]) -> pd.DataFrame:
    """The evidence rows as a DataFrame: stage, setting, images_per_s, iqr_images_per_s, chosen, status
    (with the row's note, if any). Unmeasured candidates have no images/s."""
    rows = [{"stage": r["stage"], "setting": str(r["setting"]), "images_per_s": r["images_per_s"],
             "iqr_images_per_s": r["iqr_images_per_s"], "chosen": r["chosen"],
             "status": r["status"] + (f"; {r['note']}" if r.get("note") else "")} for r in evidence]
    return table(rows, ["stage", "setting", "images_per_s", "iqr_images_per_s", "chosen", "status"])


def stage_gains(evidence: list[dict]) -> dict:
    """Per stage: best measured images/s over the first candidate's (the gain that stage's tuning bought)."""
    out = {}
    for stage in STAGES:
        rows = [r for r in evidence if r["stage"] == stage and r["images_per_s"]]
        if rows:
            out[stage] = max(r["images_per_s"] for r in rows) / rows[0]["images_per_s"]
    return out


# --------------------------------------------------------------------------- LR & optimizer

def lr_optimizer_gain(data, *, candidates=(("adam", 1e-3), ("adam", 3e-3), ("sgd", 0.05)), model: str = "fastnet",
                      batch_size: int = 128, steps: int = 60, eval_every: int = 10, seed: int = 0,
                      device="cpu") -> dict:
    """How much sooner (in optimizer steps) each (optimizer, lr) reaches the first candidate's final accuracy.

    ``data``: ``(X, y, X_test, y_test)``. Every candidate trains the same seeded model on the same batches.
    Returns ``{"rows": [{optimizer, lr, final_acc, steps_to_target}], "target", "gain"}``, where gain is
    the first candidate's steps over the best candidate's steps to the target (a time-to-accuracy speedup;
    steps cost the same whatever the LR).
    """
    X, y, X_test, y_test = data
    if steps < eval_every or eval_every < 1:
        raise ValueError(f"steps ({steps}) must be >= eval_every ({eval_every}) >= 1")
    if not candidates:
        raise ValueError("candidates must list at least one (optimizer, lr) pair, the first being the default")
    curves = []
    for opt_name, lr in candidates:
        if opt_name not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be adam or sgd, got {opt_name!r}")
        torch.manual_seed(seed)
        net = build_model(model).to(device)
        opt = (torch.optim.Adam(net.parameters(), lr=lr) if opt_name == "adam"
               else torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, nesterov=True))
        batches = TensorBatches(X, y, batch_size, shuffle=True, seed=seed)
        curve, done = [], 0
        while done < steps:
            for Xb, yb in batches:
                net.train()  # evaluate() below leaves the model in eval mode
                train_step(net, opt, Xb, yb)
                done += 1
                if done % eval_every == 0:
                    curve.append((done, evaluate(net, X_test, y_test, 1024)["acc"]))
                if done >= steps:
                    break
        curves.append(curve)
    target = curves[0][-1][1]
    rows = []
    for (opt_name, lr), curve in zip(candidates, curves):
        hit = next((s for s, acc in curve if acc >= target), None)
        rows.append({"optimizer": opt_name, "lr": lr, "final_acc": curve[-1][1], "steps_to_target": hit})
    reached = [r["steps_to_target"] for r in rows if r["steps_to_target"]]
    gain = rows[0]["steps_to_target"] / min(reached)
    return {"rows": rows, "target": target, "gain": gain}


# --------------------------------------------------------------------------- 3. the experience library

THROUGHPUT_KEYS = ("images_per_s", "median_images_per_s")
ACCURACY_KEYS = ("final_test_acc", "test_acc")
LEVERS = {1: "batch size & workers", 2: "LR & optimizer", 3: "AMP & accumulation", 4: "distribution"}
PRIORITY_TAG = "priority"
EMPTY_LOG = "the experiment log is empty: run notebooks 01-08 (any profile) to fill it"
NO_THROUGHPUT = "no run in the log has a throughput yet"


def load(path=None, **filters) -> list[dict]:
    """Flat rows of the log (``experiments.query``), oldest first; filters as in ``query``."""
    return query(path, **filters)


def _number(row: dict, keys) -> float | None:
    for k in keys:
        v = row.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def throughput(row: dict) -> float | None:
    """Training images/s of a run, whatever the notebook called it (None if it logged no single number)."""
    return _number(row, THROUGHPUT_KEYS)


def accuracy(row: dict) -> float | None:
    return _number(row, ACCURACY_KEYS)


def machines(rows: list[dict]) -> list[str]:
    return sorted({r.get("machine") or "?" for r in rows})


def overview(rows: list[dict]) -> pd.DataFrame:
    """How many runs each notebook logged on each machine: notebook, machine, runs (no rows for an empty log,
    where :data:`EMPTY_LOG` says what to do)."""
    counts = defaultdict(int)
    for r in rows:
        counts[(r.get("notebook"), r.get("machine"))] += 1
    out = [{"notebook": nb, "machine": m, "runs": n} for (nb, m), n in sorted(counts.items(), key=lambda kv: str(kv[0]))]
    return table(out, ["notebook", "machine", "runs"])


def comparable(rows: list[dict]) -> list[dict]:
    """Rows with a single throughput number, with ``throughput`` and ``accuracy`` columns added."""
    out = []
    for r in rows:
        ips = throughput(r)
        if ips is not None:
            out.append({**r, "throughput": ips, "accuracy": accuracy(r)})
    return out


RUN_COLUMNS = ["notebook", "name", "throughput", "accuracy", "config.batch_size", "config.num_workers",
               "config.amp", "config.loader", "machine"]


RUN_FORMATS = {"throughput": "{:,.0f}", "accuracy": "{:.2%}", "config.batch_size": "{:.0f}",
               "config.num_workers": "{:.0f}"}


def runs_table(rows: list[dict], columns: list[str] | None = None, last: int | None = None) -> pd.DataFrame:
    """Throughput (images/s) and accuracy of every run that logged them (or of the ``last`` N), across
    notebooks and machines, as a DataFrame (no rows when no run logged a throughput)."""
    shown = comparable(rows)
    if last:
        shown = shown[-last:]
    return table(shown, columns or RUN_COLUMNS)


def show_runs(rows: list[dict], last: int | None = None) -> None:
    """Display :func:`runs_table` with :data:`RUN_FORMATS` and a caption that says how many runs it shows;
    say so when no run has a throughput."""
    total = len(comparable(rows))
    if not total:
        print(NO_THROUGHPUT)
        return
    df = runs_table(rows, last=last)
    caption = (f"the last {len(df)} of {total} runs with a throughput" if len(df) < total
               else f"{total} run{'s' if total > 1 else ''} with a throughput")
    show(df, formats=RUN_FORMATS, caption=caption)


def best_per_machine(rows: list[dict], min_accuracy: float | None = None) -> list[dict]:
    """The fastest run per machine (optionally among runs reaching ``min_accuracy``), with its configuration."""
    best: dict[str, dict] = {}
    for r in comparable(rows):
        if min_accuracy is not None and (r["accuracy"] is None or r["accuracy"] < min_accuracy):
            continue
        m = r.get("machine") or "?"
        if m not in best or r["throughput"] > best[m]["throughput"]:
            best[m] = r
    out = []
    for m, r in sorted(best.items()):
        config = {k[len("config."):]: v for k, v in r.items() if k.startswith("config.") and v is not None}
        out.append({"machine": m, "notebook": r["notebook"], "name": r["name"], "throughput": r["throughput"],
                    "accuracy": r["accuracy"], "config": config})
    return out


# --------------------------------------------------------------------------- the article's priority order

def _by_machine_name(rows, notebook):
    out = defaultdict(dict)
    for r in rows:
        if r.get("notebook") == notebook:
            out[r.get("machine")][r.get("name")] = r
    return out


def lever_gains(rows: list[dict]) -> list[dict]:
    """Measured speed-ups per tuning lever, from every notebook that measured one.

    A gain is "how many times sooner training gets to the same point": a throughput ratio, or for
    LR & optimizer a ratio of steps to the same accuracy. Sources: rows tagged ``priority`` (metrics
    ``lever`` 1-4 and ``gain``, logged by 09), 02's tensor vs DataLoader feed (lever 1), 05's bf16
    speed-up (lever 3), 06's 2-process vs 1-process throughput (lever 4).
    """
    gains = []

    def add(lever, gain, r, how):
        if isinstance(gain, (int, float)) and gain > 0:
            gains.append({"lever": lever, "lever_name": LEVERS[lever], "gain": float(gain), "how": how,
                          "notebook": r.get("notebook"), "name": r.get("name"), "machine": r.get("machine"),
                          "time": r.get("time")})

    for r in rows:
        if PRIORITY_TAG in (r.get("tags") or "").split(",") and r.get("lever") in LEVERS:
            add(r["lever"], r.get("gain"), r, r.get("how") or r.get("name"))
        if r.get("notebook") == "05" and isinstance(r.get("bf16_speedup"), (int, float)):
            add(3, r["bf16_speedup"], r, "bf16 over fp32 images/s (05)")
    for m, runs in _by_machine_name(rows, "02").items():
        t, d = runs.get("baseline-tensor"), runs.get("baseline-dataloader")
        if t and d and throughput(t) and throughput(d):
            add(1, throughput(t) / throughput(d), t, "in-memory tensors over DataLoader images/s (02)")
    by_ws = defaultdict(dict)
    for r in rows:
        if r.get("notebook") == "06" and isinstance(r.get("world_size"), int) and throughput(r):
            by_ws[r.get("machine")].setdefault(r["world_size"], r)  # first of each world size
    for m, ws in by_ws.items():
        if 1 in ws and 2 in ws:
            add(4, throughput(ws[2]) / throughput(ws[1]), ws[2], "2 processes over 1, images/s (06)")
    return gains


def priority_verdict(gains: list[dict], machine: str | None = None, tolerance: float = 0.05) -> dict:
    """Check the article's order (1 batch & workers, 2 LR & optimizer, 3 AMP & accumulation, 4 distribution).

    Per lever, the median of its measured gains (on ``machine``, or on all machines). ``holds`` when the gains fall
    in the article's order (within ``tolerance``), ``partly holds`` when lever 1 has the largest gain,
    ``does not hold here`` otherwise, ``not enough evidence`` with fewer than two levers measured.
    """
    per: dict[int, list[dict]] = defaultdict(list)
    for g in gains:
        if machine is None or g["machine"] == machine:
            per[g["lever"]].append(g)
    # the median over every measurement of a lever: one lucky (or unlucky) run on a busy machine cannot decide
    best = {k: {"gain": statistics.median(g["gain"] for g in gs), "n": len(gs),
                "how": "; ".join(sorted({g["how"] for g in gs})),
                "source": ", ".join(sorted({f"{g['notebook']}/{g['name']}" for g in gs}))} for k, gs in per.items()}
    levers = sorted(best)
    per_lever = [{"lever": k, "lever_name": LEVERS[k], "median_gain": best[k]["gain"], "measurements": best[k]["n"],
                  "how": best[k]["how"], "source": best[k]["source"]} for k in levers]
    measured_order = [k for k in sorted(levers, key=lambda k: -best[k]["gain"])]
    if len(levers) < 2:
        verdict = "not enough evidence"
    elif all(best[a]["gain"] * (1 + tolerance) >= best[b]["gain"] for a, b in zip(levers, levers[1:])):
        verdict = "holds"
    elif measured_order[0] == levers[0] == 1:
        verdict = "partly holds"
    else:
        verdict = "does not hold here"
    return {"verdict": verdict, "levers": per_lever, "measured_order": measured_order,
            "missing": [k for k in LEVERS if k not in best]}


# --------------------------------------------------------------------------- output

def export_csv(rows: list[dict], path) -> Path:
    """Every row to CSV (nested values such as histories become their JSON-ish text)."""
    flat = [{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()} for r in rows]
    if not flat:
        flat = [{"notebook": None, "name": None}]  # a header, so the file is still a valid (empty) table
    return to_csv(flat, path)


def plot_runs(rows: list[dict], ax=None, title: str | None = None):
    """Horizontal bars: images/s of every comparable run, coloured by notebook, accuracy written at the end."""
    rows = comparable(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, max(2.0, 0.35 * len(rows) + 1)))
    if not rows:
        ax.text(0.5, 0.5, "no run with a throughput in the log yet", ha="center", va="center")
        ax.set_axis_off()
        return ax
    notebooks = sorted({r["notebook"] for r in rows})
    colors = {nb: plt.cm.tab10(i % 10) for i, nb in enumerate(notebooks)}
    labels = [f"{r['notebook']} {r['name']}"[:40] for r in rows]
    ax.barh(range(len(rows)), [r["throughput"] for r in rows], color=[colors[r["notebook"]] for r in rows])
    for i, r in enumerate(rows):
        if r["accuracy"] is not None:
            ax.text(r["throughput"], i, f" {100 * r['accuracy']:.1f}%", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("training images/s (text: test accuracy)")
    ax.set_title(title or f"{len(rows)} logged runs on {len(machines(rows))} machine(s)")
    return ax


def plot_gains(verdict: dict, ax=None):
    """Bars of the median measured gain per lever, in the article's order."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    levers = verdict["levers"]
    if not levers:
        ax.text(0.5, 0.5, "no lever measured yet", ha="center", va="center")
        ax.set_axis_off()
        return ax
    ax.bar([f"{v['lever']}. {v['lever_name']}" for v in levers], [v["median_gain"] for v in levers], color="tab:blue")
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_ylabel("median measured gain (x)")
    ax.set_title(f"article's priority order: {verdict['verdict']}")
    ax.tick_params(axis="x", labelsize=8)
    return ax


def filter_rows(rows: list[dict], notebook: str = "all", machine: str = "all", text: str = "") -> list[dict]:
    """Rows of one notebook / one machine / whose name contains ``text`` ("all" keeps everything)."""
    return [r for r in rows if (notebook == "all" or r.get("notebook") == notebook)
            and (machine == "all" or r.get("machine") == machine)
            and (not text or text.lower() in str(r.get("name", "")).lower())]


def dashboard(rows: list[dict], interactive: bool | None = None, last: int | None = 20):
    """Filter the log by notebook, machine and name, and see the table and the plot update.

    Shows the runs table (a DataFrame, :func:`show_runs`) and draws the plot first (what a saved or
    CI-executed notebook shows), then, when ipywidgets and a live kernel are there, returns the widgets that
    redraw both on every change.
    """
    show_runs(rows, last=last)
    plot_runs(comparable(rows)[-last:] if last else rows)
    plt.show()
    if interactive is None:
        interactive = ipython_kernel_active()
    if not interactive:
        return None
    try:
        import ipywidgets as w  # optional: without it the static view is the dashboard
    except ImportError:
        print("(ipywidgets is not installed: the static view above is all there is)")
        return None
    nb = w.Dropdown(options=["all"] + sorted({str(r.get("notebook")) for r in rows}), description="notebook")
    mc = w.Dropdown(options=["all"] + machines(rows), description="machine")
    tx = w.Text(value="", description="name has")
    out = w.Output()

    def redraw(*_):
        out.clear_output(wait=True)
        with out:
            chosen = filter_rows(rows, nb.value, mc.value, tx.value)
            show_runs(chosen, last=last)
            plot_runs(comparable(chosen)[-last:] if last else chosen)
            plt.show()

    for control in (nb, mc, tx):
        control.observe(redraw, names="value")
    return w.VBox([w.HBox([nb, mc, tx]), out])
