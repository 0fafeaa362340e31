"""Pick a training configuration for *this* machine by measuring, under a time budget
(introduced in 09_profiling_and_autotune).

The article's tuning order, run as a search: threads, then batch size (the largest that fits, and the one
with the best throughput), then the data feed (in-memory tensors or a DataLoader with ``num_workers``),
then mixed precision, then processes per node. Every candidate is timed on real training steps (median of
repeats, after a warm-up); what the budget did not allow is recorded as skipped, never guessed.

    from mnist_helpers.autotune import autotune
    res = autotune(budget_s=60)
    res["config"]    # TrainConfig keyword arguments: batch_size, loader, num_workers, amp, threads
    res["nproc"]     # processes per node for torchrun
    res["evidence"]  # one row per candidate: stage, setting, images_per_s, iqr, status, chosen
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .models import build_model
from .train import AMP_DTYPES, check_amp, select_device

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
    device = torch.device(device)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        net = build_model(model).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        dtype = AMP_DTYPES[amp]
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
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = F.nll_loss(net(Xb).float(), yb)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
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


def _is_oom(exc: BaseException) -> bool:
    from .batch_finder import is_oom
    return is_oom(exc)


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
    dev = select_device("auto") if device is None else torch.device(device)
    say = log or (lambda s: None)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
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
            say(f"  {stage:<10} {str(setting):<22} {row['images_per_s']:>9,.0f} img/s  (IQR {row['iqr_images_per_s']:,.0f})")
        else:
            say(f"  {stage:<10} {str(setting):<22} {status}")
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
            if not _is_oom(exc):
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
    from .loader_bench import make_loader
    from .data import TensorBatches, load_mnist, mnist_datasets
    from torch.utils.data import Subset

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
    from .launch import torchrun

    args = ["--model", model, "--batch-size", batch_size, "--subset", max(batch_size * nproc * 4, 512),
            "--wait", 1, "--warmup", 1, "--active", active, "--ddp"]
    if threads:
        args += ["--threads", threads]
    res = torchrun("mnist_helpers.workers.profile_ddp", args, nproc=nproc, timeout=timeout,
                   threads_per_proc=threads, echo=False)
    per_step = [r["wall_s_per_step"] for r in res["ranks"]]
    slowest = max(per_step)  # a step ends when the slowest rank's all-reduce does
    return {"images_per_s": batch_size * nproc / slowest, "iqr_images_per_s": 0.0}


def evidence_table(evidence: list[dict]) -> str:
    """Fixed-width text of the evidence rows."""
    lines = [f"{'stage':<10}  {'setting':<22}  {'images/s':>9}  {'IQR':>7}  chosen  status"]
    for r in evidence:
        ips = f"{r['images_per_s']:>9,.0f}" if r["images_per_s"] else f"{'':>9}"
        iqr = f"{r['iqr_images_per_s']:>7,.0f}" if r["iqr_images_per_s"] is not None else f"{'':>7}"
        lines.append(f"{r['stage']:<10}  {str(r['setting']):<22}  {ips}  {iqr}  {'  *   ' if r['chosen'] else '      '}  "
                     f"{r['status']}{'; ' + r['note'] if r.get('note') else ''}")
    return "\n".join(lines)


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
    from .data import TensorBatches
    from .train import evaluate

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
                net.train()
                opt.zero_grad(set_to_none=True)
                F.nll_loss(net(Xb), yb).backward()
                opt.step()
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
