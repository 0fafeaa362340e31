"""Profiling, auto-configuration, the article's tuning priority and the experience library (lesson module of
09_profiling_and_autotune).

The article's last section: "automate with torch.profiler, torch.utils.benchmark and torchrun", "tune in the order
batch size & workers > LR & optimizer > AMP & accumulation > distribution", "record every experiment to build your
own knowledge base". The notebook writes the profiler and Timer calls out in its cells; this module holds what they
share with the 2-process worker and the measurement harness.

1. ``torch.profiler`` for the 2-process worker ``mnist_helpers/workers/bench/profile_ddp.py`` (beside this module,
   ``mnist_helpers.lessons.n09.profiling``, which the worker and notebook 09 import): :func:`profile_training` runs
   labelled steps (``data`` / ``forward`` / ``backward`` / ``all-reduce`` / ``optimizer`` via
   ``record_function``, :func:`labelled_step`) under a wait / warm-up / active schedule; :func:`time_breakdown`
   sums the labels into data wait, compute and communication, :func:`bottleneck` reads it.

2. :func:`autotune`: a measured search of threads, batch size, data feed, AMP dtype and processes per node under a
   time budget; every stage runs the same loop (:func:`search_stage`), each candidate timed on real training steps
   (:func:`measure_steps`); what the budget did not allow is recorded as skipped, never guessed.

3. The tuning priority, measured: :func:`time_to_accuracy` (in ``mnist_helpers.lessons.n09.profiling``: training time to a
   target test accuracy, the one currency every lever is paid in), :func:`lever_plan` (the article's baseline and each lever applied alone),
   :func:`side_by_side` (seeds interleaved; the distribution lever through torchrun), :func:`priority_verdict`
   (the gains' order against the article's, with their spread).

4. The experience library: every run the series logged (``mnist_helpers.course.experiments``), compared across notebooks
   and machines (:func:`overview`, :func:`runs_table`: DataFrames), the fastest configuration per machine, a CSV
   export and a small dashboard. Every function accepts an empty log (a fresh clone).

What runs where: :func:`plan` picks one device for every run of each comparison (``distributed.comparison_device``):
the GPUs with nccl when each process of the 2-process runs gets one, else the CPU with gloo for all of them, or, with
a single GPU, the GPU compared with itself (the distribution lever not testable there).

    from mnist_helpers.lessons.n09.lesson import ARTICLE_BASELINE, lever_plan, priority_verdict, side_by_side
    runs = lever_plan(ARTICLE_BASELINE, {1: {"loader": "tensor", "num_workers": 0}, 3: {"amp": "bf16"}})
    rows = side_by_side(runs, target=0.97, seeds=(0, 1, 2))
    print(priority_verdict(rows)["verdict"])
"""
from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch.utils.data import Subset

from mnist_helpers import distributed
from mnist_helpers.course.display import show, table
from mnist_helpers.course.experiments import query, to_csv
from mnist_helpers.course.live import widgets
from mnist_helpers.data import TensorBatches, load_mnist, make_loader, mnist_datasets
from mnist_helpers.distributed import comparison_device
from mnist_helpers.launch import torchrun
from mnist_helpers.memory import is_oom
from mnist_helpers.models import build_model
# the profiling harness and the time-to-accuracy clock live beside this module (the profile_ddp worker runs them too):
# mnist_helpers.lessons.n09.profiling (profile_training, time_breakdown, ...), imported from there by notebook 09 and the tests
from mnist_helpers.lessons.n09.profiling import time_to_accuracy
from mnist_helpers.resources import usable_cores
from mnist_helpers.train import AMP_DTYPES, TrainConfig, check_amp, select_device, train_step

# --------------------------------------------------------------------------- what runs where

PROFILE_NPROC = 2  # processes of section 2's data-parallel profile


def plan(gpus: int | None = None, cores: int | None = None, nproc: int = 2) -> dict:
    """The device and world sizes of notebook 09's comparisons, from what this machine has.

    Section 1's profiles, autotune (section 4) and the tuning-priority runs (section 5) set one process against
    ``nproc`` (the distribution lever, autotune's process stage); all their runs share ``device``:

    - ``nproc`` CUDA GPUs or more: ``"cuda"``, world sizes ``(1, nproc)``, one GPU per process (nccl);
    - no CUDA GPU: ``"cpu"``, world sizes ``(1, nproc)`` with 2 cores or more (the CPU stand-in, gloo), else ``(1,)``;
    - fewer GPUs than ``nproc`` (one GPU): ``"cuda"``, world sizes ``(1,)``: the GPU compared with itself, the
      distribution lever not testable (nccl needs a GPU per process). Moving every run to the CPU instead would
      tune a device the learner does not train on.

    Section 2's 2-process profile is a run of its own (its ranks are compared with each other):
    ``profile_ddp_device`` is ``"cuda"`` when each of its processes gets a GPU, else ``"cpu"``. ``gpus`` defaults to
    ``distributed.cuda_gpus()``, ``cores`` to ``resources.usable_cores()``. Returns ``{"device", "world_sizes",
    "distributed" (is the distribution lever measured), "dist_note", "profile_ddp_device", "note"}``.
    """
    gpus = distributed.cuda_gpus() if gpus is None else int(gpus)
    cores = usable_cores() if cores is None else int(cores)
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"nproc must be an integer >= 2 (the distribution lever's processes), got {nproc!r}")
    if gpus >= nproc:
        worlds, dist_note = (1, nproc), f"{nproc} GPUs, one process each (nccl)"
    elif gpus:
        worlds = (1,)
        dist_note = (f"not testable here: {gpus} GPU{'s' if gpus > 1 else ''} for {nproc} processes, and nccl needs "
                     "a GPU per process (the other runs stay on the GPU)")
    elif cores >= 2:
        worlds, dist_note = (1, nproc), f"CPU stand-in (gloo): on one {cores}-core CPU the processes share the cores"
    else:
        worlds, dist_note = (1,), "not testable here: one core cannot host two training processes side by side"
    device = comparison_device(max(worlds), gpus)
    ddp_device = comparison_device(PROFILE_NPROC, gpus)
    note = (f"the comparisons run on {device}, every run of each on the same device; world sizes "
            f"{', '.join(map(str, worlds))}; distribution lever: {dist_note}")
    if ddp_device != device:
        note += f"; section 2's {PROFILE_NPROC}-process profile runs on {ddp_device} (gloo), a run of its own"
    return {"device": device, "world_sizes": worlds, "distributed": max(worlds) > 1, "dist_note": dist_note,
            "profile_ddp_device": ddp_device, "note": note}


# --------------------------------------------------------------------------- 1. torch.profiler
# (profile_training, time_breakdown and their helpers: mnist_helpers.lessons.n09.profiling, imported above)

def bottleneck(breakdown: list[dict]) -> str:
    """A one-line reading of :func:`time_breakdown`: which part dominates and what to try."""
    top = max(breakdown, key=lambda r: r["share"])
    advice = {"data wait": "feed faster: more num_workers, in-memory tensors, pin_memory, prefetch",
              "compute": "the model is the bottleneck: threads, AMP, channels_last, a bigger batch, a GPU",
              "communication": "gradients cost more to share than to compute: bigger batch per process, "
                               "gradient accumulation with no_sync, fewer processes, a faster link",
              "other": "time outside the labels (Python overhead, kernel launches): bigger batches, torch.compile"}
    return f"{top['part']} dominates ({top['share']:.0%} of the step): {advice[top['part']]}"


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


class Budget:
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


class NotMeasured(Exception):
    """A candidate that cannot run here (out of memory, an unsupported dtype): recorded with the reason, never
    guessed."""


def search_stage(stage: str, candidates: list, measure: Callable, budget: Budget, record: Callable, *,
                 cost_s: float = 0.0) -> dict:
    """The loop every stage of :func:`autotune` runs. ``candidates`` start with the article's choice;
    ``measure(setting)`` times one on real training steps (:func:`measure_steps`) and raises :class:`NotMeasured`
    when it cannot run here; ``record(stage, setting, status, result)`` adds an evidence row and returns it.
    Returns the fastest measured row, marked ``chosen``."""
    rows = []
    for i, setting in enumerate(candidates):
        if i and not budget.allows(cost_s):  # the first candidate is always measured; the rest while time is left
            why = f": a launch takes ~{cost_s:.0f} s" if cost_s else ""
            rows.append(record(stage, setting, f"skipped (budget{why})"))
            continue
        try:
            result = measure(setting)
        except NotMeasured as why:
            rows.append(record(stage, setting, str(why)))
            continue
        rows.append(record(stage, setting, "measured", result))
    measured = [r for r in rows if r["images_per_s"] is not None]
    if not measured:
        raise RuntimeError(f"autotune: no {stage} candidate could be measured here ({rows[0]['status']}); "
                           f"give other candidates for {stage}")
    best = max(measured, key=lambda r: r["images_per_s"])
    best["chosen"] = True
    return best


def _autotune_candidates(dev, cores: int, gpus: int, threads, num_workers, amp, nproc) -> tuple:
    """autotune's candidates per stage: the ones given, checked, or this machine's defaults."""
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
    return threads, num_workers, amp, nproc


def autotune(budget_s: float = 60.0, device=None, *, model: str = "net", max_batch_size: int = 1024,
             threads: list[int] | None = None, num_workers: list[int] | None = None, amp: list[str] | None = None,
             nproc: list[int] | None = None, subset: int = 2048, steps: int = 3, repeats: int = 3,
             launch_cost_s: float = 25.0, log: Callable[[str], None] | None = print) -> dict:
    """Search threads, batch size, data feed, AMP dtype and processes per node within ``budget_s`` seconds.

    Each stage starts from the article's choice (torch's threads, batch 128, a DataLoader with 4 workers,
    fp32, one process), so "best over first candidate" is the gain over the article's defaults. Every stage runs
    :func:`search_stage`: the first candidate is always measured (so the result is a measured configuration even
    on a tiny budget); later candidates run only while the stage's share of the budget lasts, and are recorded
    with ``status="skipped (budget)"`` otherwise. ``nproc`` candidates above 1 are measured with a real torchrun
    launch of ``workers.bench.profile_ddp`` (start-up excluded), when ``launch_cost_s`` fits.

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
    threads, num_workers, amp, nproc = _autotune_candidates(dev, cores, gpus, threads, num_workers, amp, nproc)

    budget = Budget(budget_s, STAGES)
    tuner = _Tuner(dev, model=model, cores=cores, steps=steps, repeats=repeats, subset=subset, say=say,
                   threads=threads[0], batch_size=min(128, max_batch_size), num_workers=num_workers)
    chosen, feeds = tuner.chosen, tuner.feeds
    say(f"autotune on {dev} ({cores} cores{f', {gpus} GPU(s)' if gpus else ''}), budget {budget_s:.0f} s")
    stages = (("threads", threads, lambda t: tuner.measure(threads=t), 0.0),
              ("batch_size", _candidates_batch(max_batch_size), tuner.measure_batch, 0.0),
              ("loader", list(feeds), tuner.measure_feed, 0.0),
              ("amp", amp, tuner.measure_amp, 0.0),
              ("nproc", sorted(nproc), tuner.measure_nproc, launch_cost_s))
    picked = {}
    for stage, candidates, run, cost in stages:
        budget.start(stage)
        best = search_stage(stage, candidates, run, budget, tuner.record, cost_s=cost)
        picked[stage] = best
        if stage == "loader":
            chosen["loader"], chosen["num_workers"] = feeds[best["setting"]]
        elif stage != "nproc":
            chosen[stage] = best["setting"]
    evidence = tuner.evidence
    largest = max((r["setting"] for r in evidence if r["stage"] == "batch_size" and r["images_per_s"]), default=None)
    picked["batch_size"]["note"] = f"largest measured that fit: {largest}"
    n_best = picked["nproc"]["setting"]
    config = {"model": model, "batch_size": chosen["batch_size"], "loader": chosen["loader"],
              "num_workers": chosen["num_workers"],
              "pin_memory": dev.type == "cuda" and chosen["loader"] == "dataloader",
              "amp": chosen["amp"], "threads": chosen["threads"] if dev.type == "cpu" else None}
    if n_best > 1 and config["threads"]:
        config["threads"] = max(cores // n_best, 1)
    elapsed = budget.elapsed()
    say(f"chosen: {config}, nproc={n_best} ({elapsed:.0f} s of {budget_s:.0f} s)")
    return {"config": config, "nproc": n_best, "evidence": evidence, "elapsed_s": elapsed, "budget_s": budget_s,
            "device": str(dev)}


class _Tuner:
    """One autotune search: the settings chosen so far (each stage measures its candidates on top of them), the
    evidence rows, and the stages' measurements (``measure_*``: a result dict, or :class:`NotMeasured` with why)."""

    def __init__(self, dev, *, model, cores, steps, repeats, subset, say, threads, batch_size, num_workers):
        self.dev, self.model, self.cores, self.say = dev, model, cores, say
        self.steps, self.repeats, self.subset = steps, repeats, subset
        self.evidence: list[dict] = []
        self.chosen = {"threads": threads, "batch_size": batch_size, "loader": "tensor", "num_workers": 0,
                       "amp": "none"}
        self.feeds = {f"dataloader, {w} workers": ("dataloader", w) for w in sorted(num_workers, reverse=True)}
        # the article's feed first (the most workers), then fewer, then tensors
        self.feeds["tensor (in memory)"] = ("tensor", 0)
        self.too_big: list[int] = []  # batch sizes that ran out of memory
        self.X = self.y = None

    def record(self, stage, setting, status, result=None):
        extra = dict(zip(("loader", "num_workers"), self.feeds[setting])) if stage == "loader" else {}
        row = {"stage": stage, "setting": setting, "status": status,
               "images_per_s": result["images_per_s"] if result else None,
               "iqr_images_per_s": result["iqr_images_per_s"] if result else None, "chosen": False, **extra}
        self.evidence.append(row)
        self.say(f"  {stage} {setting}: " + (f"{row['images_per_s']:,.0f} img/s (IQR {row['iqr_images_per_s']:,.0f})"
                                             if result else status))
        return row

    def measure(self, batch_size=None, **kw):
        chosen = self.chosen
        args = dict(device=self.dev, amp=chosen["amp"], threads=chosen["threads"] if self.dev.type == "cpu" else None,
                    steps=self.steps, repeats=self.repeats)
        args.update(kw)
        return measure_steps(self.model, batch_size or chosen["batch_size"], **args)

    def measure_batch(self, b):
        if self.too_big and b >= min(self.too_big):
            raise NotMeasured("not tried (a smaller size ran out of memory)")
        try:
            return self.measure(batch_size=b)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is expected here
            if not is_oom(exc):
                raise
            self.too_big.append(b)
            raise NotMeasured("out of memory") from None

    def measure_feed(self, setting):
        kind, w = self.feeds[setting]
        if kind == "tensor":
            if self.X is None:
                self.X, self.y, _, _ = load_mnist(subset=(self.subset, 1))
            batches = TensorBatches(self.X, self.y, self.chosen["batch_size"], shuffle=True, drop_last=True)
        else:
            ds = Subset(mnist_datasets()[0], range(self.subset))
            batches = make_loader(ds, self.chosen["batch_size"], num_workers=w, pin_memory=self.dev.type == "cuda",
                                  persistent_workers=w > 0)
        return self.measure(batches=batches)

    def measure_amp(self, a):
        try:
            check_amp(a, self.dev)
        except ValueError as e:
            raise NotMeasured(f"unsupported: {e}") from None
        return self.measure(amp=a)

    def measure_nproc(self, n):
        if n == 1:  # what the amp stage measured in this process
            best = next(r for r in self.evidence if r["stage"] == "amp" and r["chosen"])
            return {"images_per_s": best["images_per_s"], "iqr_images_per_s": best["iqr_images_per_s"]}
        return measure_processes(n, model=self.model, batch_size=self.chosen["batch_size"],
                                 threads=max(self.cores // n, 1) if self.dev.type == "cpu" else None,
                                 active=max(self.steps * self.repeats, 3), device=self.dev.type)


def measure_processes(nproc: int, *, model: str = "net", batch_size: int = 128, threads: int | None = None,
                      active: int = 6, timeout: float = 180, device: str = "auto") -> dict:
    """Steady-state images/s of ``nproc`` data-parallel processes (DDP, profiled steps, launch excluded) on
    ``device`` (the launcher's: ``"cpu"``, ``"cuda"``, or ``"auto"``); autotune passes its own device, so that
    its process stage runs where its one-process stages did."""
    args = ["--model", model, "--batch-size", batch_size, "--subset", max(batch_size * nproc * 4, 512),
            "--wait", 1, "--warmup", 1, "--active", active, "--ddp"]
    if threads:
        args += ["--threads", threads]
    res = torchrun("mnist_helpers.workers.bench.profile_ddp", args, nproc=nproc, timeout=timeout,
                   threads_per_proc=threads, echo=False, device=device)
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


# --------------------------------------------------------------------------- 3. the article's tuning priority, measured

LEVERS = {1: "batch size & workers", 2: "LR & optimizer", 3: "AMP & accumulation", 4: "distribution"}
PRIORITY_TAG = "priority"
# the article's 5.1 recipe: the baseline every lever is applied to, alone
ARTICLE_BASELINE = {"model": "net", "batch_size": 128, "loader": "dataloader", "num_workers": 4, "pin_memory": True,
                    "optimizer": "adam", "lr": 1e-3, "amp": "none"}
EFFORT_NOTE = ("the article's order is also an order of effort (cheap knobs first, distribution last); a measurement "
               "of gains does not judge that")


def lever_plan(baseline: dict, levers: dict[int, dict], *, nproc_lever: int | None = 4, nproc: int = 2,
               extra: dict[str, dict] | None = None, device: str | None = None) -> list[dict]:
    """The runs of the side-by-side: the baseline, then each lever's change applied alone to it.

    ``levers`` maps a lever (1-4, :data:`LEVERS`) to the ``TrainConfig`` fields it changes; lever ``nproc_lever``
    changes the number of processes instead (``nproc``, the batch per process halved so the global batch is the
    baseline's). ``extra``: more named configurations (changes to the baseline) timed alongside, e.g. autotune's
    choice. Every run is on ``device`` (``"cpu"`` or ``"cuda"``; default ``distributed.comparison_device`` of the
    largest run: a 1-process GPU run is never timed against a 2-process CPU run). Returns ``[{"name", "lever" (0
    for the baseline, None for extras), "changes", "cfg", "nproc", "device"}]``.
    """
    base = TrainConfig(**baseline)
    plan = [{"name": "baseline", "lever": 0, "changes": {}, "cfg": base, "nproc": 1}]
    for lever, changes in sorted(levers.items()):
        if lever not in LEVERS:
            raise ValueError(f"lever {lever!r}: the article's levers are {', '.join(map(str, LEVERS))}")
        changes = dict(changes)
        n = 1
        if lever == nproc_lever:
            n = int(changes.pop("nproc", nproc))
            if n < 2:
                raise ValueError(f"the distribution lever needs nproc >= 2, got {n}")
            if base.batch_size % n:
                raise ValueError(f"batch_size {base.batch_size} must divide by nproc {n} (same global batch)")
            changes.setdefault("batch_size", base.batch_size // n)
        # named by what is measured (the article's category is LEVERS[lever]): e.g. lever 1 as measured here is
        # the feed only (in-memory tensors), not the batch size
        what = ", ".join(f"{k}={v}" for k, v in changes.items() if not (lever == nproc_lever and k == "batch_size"))
        what = f"{n} processes x {changes['batch_size']}" if lever == nproc_lever else what
        plan.append({"name": f"{lever}. {what or LEVERS[lever]}", "lever": lever, "changes": changes,
                     "cfg": base.replace(**changes), "nproc": n})
    for name, changes in (extra or {}).items():
        changes = dict(changes)
        n = int(changes.pop("nproc", 1))
        plan.append({"name": name, "lever": None, "changes": changes, "cfg": base.replace(**changes), "nproc": n})
    largest = max(run["nproc"] for run in plan)
    device = comparison_device(largest) if device is None else device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (one for every run), got {device!r}")
    if device == "cuda" and largest > distributed.cuda_gpus():
        raise ValueError(f"a {largest}-process run on cuda needs {largest} GPUs, this machine has "
                         f"{distributed.cuda_gpus()}: use device='cpu' for every run, or leave the distribution lever "
                         "out")
    for run in plan:
        run["cfg"] = run["cfg"].replace(device=device)
        run["device"] = device
    return plan


def _launch_args(cfg: TrainConfig, target: float, test_subset: int, eval_every_images: int, max_images: int) -> list:
    args = ["--time-to-accuracy", target, "--test-subset", test_subset, "--eval-every-images", eval_every_images,
            "--max-images", max_images, "--model", cfg.model, "--batch-size", cfg.batch_size, "--loader", cfg.loader,
            "--num-workers", cfg.num_workers, "--optimizer", cfg.optimizer, "--lr", cfg.lr, "--amp", cfg.amp,
            "--seed", cfg.seed, "--subset", cfg.subset or 60000]
    return args


def side_by_side(plan: list[dict], target: float, *, seeds=(0, 1, 2), test_subset: int = 2000,
                 eval_every_images: int = 2560, max_images: int = 180_000, timeout: float = 600,
                 progress: bool = True) -> list[dict]:
    """Time every run of ``plan`` (:func:`lever_plan`) to ``target`` test accuracy, once per seed.

    Interleaved: seed 0's runs one after the other, then seed 1's, ... so a slow patch of the machine hits every
    configuration alike. In-process runs call :func:`time_to_accuracy`; runs with ``nproc`` > 1 launch
    ``workers.bench.profile_ddp --time-to-accuracy`` under torchrun (the same function in each process; the
    launch is not on the clock). Every run is on the plan's one device (``lever_plan``'s ``device``), passed to
    the in-process run and to the launcher alike. Returns one row per (seed, run): name, lever, seed, nproc,
    device, seconds, reached, images, steps, final_acc, curve.
    """
    from tqdm.auto import tqdm

    if not plan:
        raise ValueError("the plan is empty: build it with lever_plan(baseline, levers)")
    if not seeds:
        raise ValueError("give at least one seed")
    devices = {run.get("device") for run in plan}
    if len(devices) > 1:
        raise ValueError(f"the runs of one comparison must share a device, got {sorted(map(str, devices))}")
    device = devices.pop() or comparison_device(max(run["nproc"] for run in plan))
    _, _, X_test, y_test = load_mnist(subset=(1, test_subset))
    rows = []
    jobs = [(seed, run) for seed in seeds for run in plan]
    for seed, run in tqdm(jobs, desc="time to accuracy", disable=not progress):
        cfg = run["cfg"].replace(seed=seed, device=device)
        if run["nproc"] > 1:
            res = torchrun("mnist_helpers.workers.bench.profile_ddp",
                           _launch_args(cfg, target, test_subset, eval_every_images, max_images),
                           nproc=run["nproc"], timeout=timeout, echo=False, device=device)["time_to_accuracy"]
        else:
            res = time_to_accuracy(cfg, X_test, y_test, target, eval_every_images=eval_every_images,
                                   max_images=max_images)
        rows.append({"name": run["name"], "lever": run["lever"], "seed": seed, "nproc": run["nproc"],
                     "device": device, **res})
    return rows


def runs_summary(rows: list[dict]) -> list[dict]:
    """Per configuration: median seconds to the target (and min-max over seeds), its gain over the baseline of the
    same seed (median, min-max), how many seeds reached the target."""
    base = {r["seed"]: r["seconds"] for r in rows if r["lever"] == 0}
    out, names = [], list(dict.fromkeys(r["name"] for r in rows))
    for name in names:
        rs = [r for r in rows if r["name"] == name]
        secs = [r["seconds"] for r in rs if r["seconds"]]
        gains = paired_gains(rows, name)
        row = {"name": name, "lever": rs[0]["lever"], "device": rs[0].get("device"),
               "reached": f"{len(secs)}/{len(rs)}",
               "median_s": statistics.median(secs) if secs else None, "min_s": min(secs) if secs else None,
               "max_s": max(secs) if secs else None,
               "median_images": statistics.median(r["images"] for r in rs),
               "gain": statistics.median(gains) if gains else None, "gain_min": min(gains) if gains else None,
               "gain_max": max(gains) if gains else None}
        if not base:
            row["gain"] = row["gain_min"] = row["gain_max"] = None
        out.append(row)
    return out


def paired_gains(rows: list[dict], name: str) -> list[float]:
    """The baseline's time over ``name``'s time, seed by seed (only seeds where both reached the target)."""
    base = {r["seed"]: r["seconds"] for r in rows if r["lever"] == 0}
    return [base[r["seed"]] / r["seconds"] for r in rows
            if r["name"] == name and r["seconds"] and base.get(r["seed"])]


def stand_in_levers(rows: list[dict]) -> list[int]:
    """The levers measured by a stand-in, not as the article means them: the distribution lever run as several
    processes on a CPU (gloo, the processes sharing its cores) is not several GPUs."""
    return sorted({r["lever"] for r in rows if r["lever"] and r.get("nproc", 1) > 1
                   and str(r.get("device") or "cpu").startswith("cpu")})


def priority_verdict(rows: list[dict], *, min_repeats: int = 3, exclude=()) -> dict:
    """Do the measured gains fall in the article's order 1 > 2 > 3 > 4?

    Each lever's gain is the baseline's time to the target over the lever's, paired by seed. ``"holds"`` when every
    lever's gains sit above the next lever's with no overlap (``claims.separated``); ``"does not hold here"`` when
    some lever ranked lower by the article beats a higher one with no overlap; otherwise (overlapping spreads,
    fewer than ``min_repeats`` seeds or fewer than two levers measured) ``"inconclusive"``. Levers in ``exclude``
    (stand-ins: ``stand_in_levers``) are reported in ``levers`` but take no part in the order.
    Returns ``{"verdict", "why", "levers": {lever: gains}, "pairs": [{a, b, relation}], "measured_order",
    "excluded"}``.
    """
    from mnist_helpers.course.claims import separated

    names = {r["lever"]: r["name"] for r in rows if r["lever"]}
    all_gains = {lev: paired_gains(rows, names[lev]) for lev in sorted(names)}
    all_gains = {lev: g for lev, g in all_gains.items() if g}
    gains = {lev: g for lev, g in all_gains.items() if lev not in exclude}
    levers = sorted(gains)
    pairs = []
    for i, a in enumerate(levers):
        for b in levers[i + 1:]:
            if separated(gains[a], gains[b]):
                rel = "in order" if min(gains[a]) > max(gains[b]) else "inverted"
            else:
                rel = "overlap"
            pairs.append({"a": a, "b": b, "relation": rel, "adjacent": levers.index(b) == i + 1})
    order = sorted(levers, key=lambda lev: -statistics.median(gains[lev]))
    fewest = min((len(g) for g in gains.values()), default=0)
    inverted = [p for p in pairs if p["relation"] == "inverted"]
    if len(levers) < 2:
        verdict, why = "inconclusive", "fewer than two levers reached the target"
    elif fewest < min_repeats:
        verdict, why = "inconclusive", f"{fewest} repeat(s) per lever; at least {min_repeats} are needed to separate"
    elif inverted:
        verdict = "does not hold here"
        why = "; ".join(f"lever {p['b']} beats lever {p['a']} in every repeat" for p in inverted)
    elif all(p["relation"] == "in order" for p in pairs if p["adjacent"]):
        verdict, why = "holds", "each lever's gains sit above the next lever's in every repeat"
    else:
        overl = [f"{p['a']} and {p['b']}" for p in pairs if p["adjacent"] and p["relation"] == "overlap"]
        verdict, why = "inconclusive", f"the spreads of levers {', '.join(overl)} overlap"
    return {"verdict": verdict, "why": why, "levers": all_gains, "pairs": pairs, "measured_order": order,
            "missing": [lev for lev in LEVERS if lev not in all_gains],
            "excluded": [lev for lev in all_gains if lev in exclude]}


def plot_gains(rows: list[dict], verdict: dict | None = None, ax=None):
    """Each lever's gain over the baseline (median bar, every seed a dot), in the article's order."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    levers = sorted({r["lever"] for r in rows if r["lever"]})
    if not levers:
        ax.text(0.5, 0.5, "no lever measured yet", ha="center", va="center")
        ax.set_axis_off()
        return ax
    names = {r["lever"]: r["name"] for r in rows if r["lever"]}
    for i, lev in enumerate(levers):
        g = paired_gains(rows, names[lev])
        if g:
            ax.bar(i, statistics.median(g), color="tab:blue", alpha=0.6)
            ax.plot([i] * len(g), g, "k.", ms=6)
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xticks(range(len(levers)), [names[lev] for lev in levers], fontsize=8)
    ax.set_ylabel("gain: baseline time / lever's time")
    ax.set_title("time to the target accuracy" + (f": {verdict['verdict']}" if verdict else ""))
    return ax


# --------------------------------------------------------------------------- 4. the experience library

THROUGHPUT_KEYS = ("images_per_s", "median_images_per_s")
ACCURACY_KEYS = ("final_test_acc", "test_acc")
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
    w = widgets(interactive, "the static view above is all there is")  # optional: without it, the static view
    if w is None:
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


# --------------------------------------------------------------------------- the claims notebook 09 records

def _busy(contention) -> bool:
    if contention is None:
        return False
    return bool(contention.get("busy")) if isinstance(contention, dict) else bool(contention.busy)


def _as_dict(contention):
    return contention.to_dict() if hasattr(contention, "to_dict") else contention


def lever_description(lever: int, changes: dict) -> str:
    """The article's lever and what was measured for it, in one phrase."""
    what = ", ".join(f"{k}={v}" for k, v in changes.items()) or "nothing changed"
    return f"{lever} ({LEVERS[lever]}; measured as {what})"


def priority_judgement(rows: list[dict], lever_changes: dict, load=None) -> dict:
    """The tuning-priority claim's result word and a sentence for the learner, from ``priority_verdict(rows)``
    (returned as ``priority``).
    A lever measured by a stand-in (``stand_in_levers``: the distribution lever as processes sharing one CPU) is
    reported but left out of the order, so no verdict rests on it; the order of the others is then at most *holds
    with nuance* (the article's lever 4 is not placed). The article's lever 1 is "batch size & workers": when the
    measured lever 1 leaves the batch size alone (the default: in-memory tensors instead of workers), the article's
    lever is only partly tested, so a clean order is at most *holds with nuance* too. A busy machine (``load``)
    gives ``claims.BUSY``."""
    from mnist_helpers.course.claims import BUSY

    stand_in = stand_in_levers(rows)
    priority = priority_verdict(rows, exclude=stand_in)
    word = priority["verdict"]
    partial = 1 in lever_changes and "batch_size" not in lever_changes[1]
    if word == "holds" and (partial or priority["excluded"]):
        word = "holds with nuance"
    if _busy(load):
        word = BUSY
    note = ("; lever 1 changed the feed only, not the batch size" if partial else "") + (
        f"; lever {', '.join(map(str, priority['excluded']))} left out of the order: a CPU stand-in (processes "
        "sharing one CPU's cores, not GPUs)" if priority["excluded"] else "")
    return {"word": word, "partial": partial, "stand_in": priority["excluded"], "priority": priority,
            "sentence": (f"measured order of the gains {priority['measured_order']} (the article's: [1, 2, 3, 4]): "
                         f"{priority['why']}{note}")}


@dataclass(frozen=True, kw_only=True)
class Measured09:
    """What notebook 09 measured, the one input of :func:`claims_09` (its closing cell builds it once).

    The tuning priority: ``rows`` (``side_by_side``'s runs), ``summary`` (``runs_summary(rows)``), ``lever_changes``
    (the levers as applied, the notebook's ``LEVER_CHANGES``), ``target`` accuracy on ``test_subset`` test images,
    ``n_seeds``, ``model``, ``dist_note`` (how the distribution lever ran), ``run_device``, ``priority_load`` (the
    ``claims.Contention`` of those runs, or its dict). The profiler and Timer: ``shares`` (the profiler's share per
    part, by feed: ``"DataLoader, 2 workers"``, ``"in-memory tensors"``), ``ddp`` (profile_ddp's result),
    ``timer_rows`` (the Timer table: ``comparison``, ``setting``, ``median_ms``, ``iqr_ms``) at ``timer_batch``,
    ``timer_load``, autotune's ``budget_s``, ``profile_steps``, the ``device`` profiled and the ``machine`` (one
    line)."""
    rows: list[dict]
    summary: list[dict]
    lever_changes: dict
    target: float
    test_subset: int
    n_seeds: int
    model: str
    dist_note: str
    run_device: str
    priority_load: object = None
    shares: dict
    ddp: dict
    timer_rows: list[dict]
    timer_batch: int
    timer_load: object = None
    budget_s: float
    profile_steps: int
    device: str
    machine: str


def claims_09(m: Measured09) -> list[dict]:
    """The claims of notebook 09, one dict per claim (the keyword arguments of ``claims.ResultFile.claim``), from
    what the notebook measured (:class:`Measured09`).

    - 09.tuning_priority: ``priority_judgement`` (``priority_verdict``'s order of gains, a CPU stand-in lever left
      out of the order; at most *holds with nuance* when lever 1 was measured without the batch size or a lever was
      left out; ``claims.BUSY`` on a busy machine); the evidence names each lever as measured.
    - 09.profiler_benchmark: *demonstrated* when the profiler gave a breakdown and the Timer a median for every
      setting; *does not hold here* otherwise.
    """
    by_name = {s["name"]: s for s in m.summary}
    return [_c09_tuning_priority(m, by_name), _c09_profiler_benchmark(m, by_name)]


def _c09_tuning_priority(m: Measured09, by_name: dict) -> dict:
    """09.tuning_priority: the gain of each lever alone in time to the target, ordered against the article's."""
    rows, summary, lever_changes, priority_load, target = m.rows, m.summary, m.lever_changes, m.priority_load, m.target
    n_seeds, model, test_subset, dist_note, run_device = m.n_seeds, m.model, m.test_subset, m.dist_note, m.run_device
    base = by_name["baseline"]
    judged = priority_judgement(rows, lever_changes, priority_load)
    priority = judged["priority"]
    pn = {"target": target, "baseline_s": base["median_s"] or float("nan")}
    # the values the levers' names quote (e.g. "2. lr=0.002", "4. 2 processes x 64")
    pn["lever_values"] = [v for ch in lever_changes.values() for v in ch.values()
                          if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if 4 in lever_changes:
        n = int(lever_changes[4].get("nproc", 2))
        pn["lever_values"].append(lever_changes[4].get("batch_size", ARTICLE_BASELINE["batch_size"] // n))
    parts = []
    names = {s.get("lever"): s["name"] for s in summary if s.get("lever")}
    for lever, gains in priority["levers"].items():
        sp = spread_of(gains)
        pn |= {f"gain{lever}": sp["median"], f"gain{lever}_min": sp["min"], f"gain{lever}_max": sp["max"]}
        parts.append(f"{names.get(lever, lever)} {sp['median']:.2f}x ({sp['min']:.2f}-{sp['max']:.2f})"
                     + (" (CPU stand-in, not ordered)" if lever in judged["stand_in"] else ""))
    missing = "; not measured: " + ", ".join(map(str, priority["missing"])) if priority["missing"] else ""
    base_text = f"{base['median_s']:.1f} s" if base["median_s"] else "target not reached"
    levers_text = "; ".join(lever_description(lev, ch) for lev, ch in sorted(lever_changes.items()))
    return dict(id="09.tuning_priority", verdict=judged["word"], contention=_as_dict(priority_load),
                evidence=(f"gain in time to {target:.0%} over the article's baseline ({base_text}), median (min-max) of "
                          f"{n_seeds} seed(s): " + ", ".join(parts) + missing
                          + f"; measured order {priority['measured_order']}"
                          + ("; lever 1 changed the feed only, not the batch size" if judged["partial"] else "")
                          + ("; lever " + ", ".join(map(str, judged["stand_in"])) + " left out of the order (a CPU "
                             "stand-in)" if judged["stand_in"] else "")),
                numbers=pn,
                regime=(f"{model}, time to {target:.0%} on {test_subset} test images; baseline DataLoader 4 workers, "
                        f"batch 128, Adam 1e-3, fp32, 1 process; levers alone: {levers_text} ({dist_note}); "
                        f"{n_seeds} seed(s) interleaved; every run on {run_device}; gains, not effort"))


def _c09_profiler_benchmark(m: Measured09, by_name: dict) -> dict:
    """09.profiler_benchmark: the profiler's breakdown, the Timer's medians and autotune's choice, as measured."""
    ddp, timer_rows, shares, target, budget_s = m.ddp, m.timer_rows, m.shares, m.target, m.budget_s
    timer_batch, timer_load, model, device, machine = m.timer_batch, m.timer_load, m.model, m.device, m.machine
    profile_steps = m.profile_steps
    ddp_shares = {b["part"]: b["share"] for b in ddp["ranks"][0]["breakdown"]}
    threads = [r for r in timer_rows if r["comparison"] == "threads"]
    best = max(threads, key=lambda r: r.get("images_per_s") or 0) if threads else None
    noisy = sum(r["iqr_ms"] > 0.2 * r["median_ms"] for r in timer_rows)
    loader, tensor = shares["DataLoader, 2 workers"], shares["in-memory tensors"]
    ok = bool(best) and all(r["median_ms"] > 0 for r in timer_rows) and "compute" in loader
    auto = by_name.get("autotune's choice", {})
    auto_text = ("did not reach the target" if auto.get("gain") is None else
                 f"{auto['gain']:.2f}x ({auto['gain_min']:.2f}-{auto['gain_max']:.2f}) the article's defaults' time "
                 f"to {target:.0%}")
    bn = {"data_share_loader": loader["data wait"], "compute_share_loader": loader["compute"],
          "data_share_tensor": tensor["data wait"], "ddp_data_share": ddp_shares["data wait"],
          "ddp_compute_share": ddp_shares["compute"], "ddp_comm_share": ddp_shares["communication"],
          "timer_noisy": noisy, "timer_settings": len(timer_rows), "autotune_budget_s": budget_s,
          "timer_batch": timer_batch}
    if best:
        bn |= {"timer_threads": best["setting"], "timer_median_ms": best["median_ms"], "timer_iqr_ms": best["iqr_ms"]}
    bn |= {k: auto.get(g) for k, g in (("autotune_gain", "gain"), ("autotune_gain_min", "gain_min"),
                                        ("autotune_gain_max", "gain_max")) if auto.get(g) is not None}
    timer_text = (f"Timer: {best['median_ms']:.1f} ms median (IQR {best['iqr_ms']:.1f} ms) at batch {timer_batch}, "
                  f"{best['setting']} thread(s)" if best else "Timer: no thread setting measured")
    return dict(id="09.profiler_benchmark", verdict="demonstrated" if ok else "does not hold here",
                contention=_as_dict(timer_load),
                evidence=(f"profiler: data wait {bn['data_share_loader']:.0%} of a step with a 2-worker DataLoader "
                          f"({bn['data_share_tensor']:.0%} from tensors), compute {bn['compute_share_loader']:.0%}; "
                          f"2 processes: data {bn['ddp_data_share']:.0%}, compute {bn['ddp_compute_share']:.0%}, "
                          f"communication {bn['ddp_comm_share']:.0%}; {timer_text}; autotune: {auto_text}"),
                numbers=bn,
                regime=(f"{model}, batch 128 profiled on {device} ({profile_steps} active steps), 2 "
                        f"{ddp.get('backend')} processes x 64 on {ddp.get('device')}; Timer on one training step; "
                        f"autotune budget {budget_s} s, its choice timed to {target:.0%} with the levers; "
                        f"{machine}"))


def spread_of(samples) -> dict:
    from mnist_helpers.course.claims import spread
    return spread(samples)

