"""The profiling harness notebook 09 and its 2-process worker share (introduced in 09_profiling_and_autotune).

The notebook writes the ``torch.profiler`` call out in its cells; this module holds the same labelled loop for
``mnist_helpers/workers/bench/profile_ddp.py`` (each rank profiles its own steps) and the time-to-accuracy clock
the tuning-priority runs share with that worker:

- :func:`profile_training` runs ``wait + warmup + active`` real training steps under ``torch.profiler``, each
  phase under its own ``record_function`` label (``data`` / ``forward`` / ``backward`` / ``all-reduce`` /
  ``optimizer``, :func:`labelled_step`); :func:`allreduce_gradients` is the explicit all-reduce a 2-process run
  puts between backward and the optimizer; :func:`make_batches` the training batches (tensors or a DataLoader);
- :func:`summarise_events` and :func:`time_breakdown` sum the labels into data wait, compute, communication and
  other (``lessons.n09.lesson.bottleneck`` reads the result);
- :func:`time_to_accuracy` trains a ``TrainConfig`` until the test accuracy reaches a target, the clock stopped
  while evaluating; with a ``distributed.init_distributed`` context every rank trains under DDP and they agree to
  stop.

    from mnist_helpers.lessons.n09.profiling import profile_training, time_breakdown
    res = profile_training("fastnet", batch_size=64, subset=512, wait=1, warmup=1, active=3)
    print(time_breakdown(res["events"], res["steps"]))
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, record_function

from mnist_helpers.data import release_workers
from mnist_helpers.models import build_model
from mnist_helpers.train import (TrainConfig, build_training, evaluate, make_train_batches, select_device,
                                 synchronize, train_step)

# --------------------------------------------------------------------------- labelled profiler steps

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


# --------------------------------------------------------------------------- time to accuracy

def time_to_accuracy(cfg: TrainConfig, X_test: torch.Tensor, y_test: torch.Tensor, target: float, *,
                     eval_every_images: int = 2560, max_images: int = 180_000, ctx=None) -> dict:
    """Train ``cfg`` until the test accuracy on ``(X_test, y_test)`` reaches ``target``; return how long it took.

    The clock runs while training (waiting for batches included) and stops while evaluating, every
    ``eval_every_images`` training images (counted over all processes, so a 2-process run evaluates at the same
    points as one process). ``ctx`` (``distributed.init_distributed``'s context) makes it a DDP run: the model is
    wrapped in DistributedDataParallel, every rank evaluates the same (identical) model and they agree to stop.

    Returns ``{"seconds" (None if the target was not reached within max_images), "reached", "images", "steps",
    "final_acc", "curve": [(images, seconds, acc)]}``.
    """
    if not 0 < target < 1:
        raise ValueError(f"target must be an accuracy between 0 and 1, got {target!r}")
    if not isinstance(eval_every_images, int) or eval_every_images < 1:
        raise ValueError(f"eval_every_images must be a positive integer, got {eval_every_images!r}")
    if max_images < eval_every_images:
        raise ValueError(f"max_images ({max_images}) must be at least eval_every_images ({eval_every_images})")
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    device = ctx.device if ctx is not None else select_device(cfg.device)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train_until(cfg, X_test, y_test, target, eval_every_images, max_images, ctx, device, rank, world)
    finally:
        torch.set_num_threads(threads_before)  # the next run starts from the same threads


def _train_until(cfg, X_test, y_test, target, eval_every_images, max_images, ctx, device, rank, world) -> dict:
    batches = make_train_batches(cfg, device, rank=rank, world_size=world)
    try:
        return _train_loop(cfg, batches, X_test, y_test, target, eval_every_images, max_images, ctx, device, world)
    finally:
        release_workers(batches)  # a run that stopped at its target leaves the loader mid-epoch


def _train_loop(cfg, batches, X_test, y_test, target, eval_every_images, max_images, ctx, device, world) -> dict:
    tr = build_training(cfg, device, steps_per_epoch=len(batches))
    model = tr.model
    if ctx is not None and ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    X_test, y_test = X_test.to(device), y_test.to(device)
    plain = getattr(model, "module", model)
    seen = steps = 0
    next_eval, clock, curve, reached, epoch = eval_every_images, 0.0, [], False, 0
    while not reached and seen < max_images:
        epoch += 1
        batches.set_epoch(epoch)
        model.train()
        synchronize(device)
        t0 = time.perf_counter()
        for X, y in batches:  # the wait for each batch is on the clock
            X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            train_step(model, tr.optimizer, X, y, amp=cfg.amp, scaler=tr.scaler)
            seen += len(X) * world
            steps += 1
            if seen >= next_eval or seen >= max_images:
                synchronize(device)
                clock += time.perf_counter() - t0  # the clock stops for the evaluation
                acc = evaluate(plain, X_test, y_test, 1024)["acc"]
                stop = acc >= target
                if ctx is not None and ctx.distributed:  # every rank stops at the same step
                    flag = torch.tensor([float(stop)], device=device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    stop = bool(flag.item())
                curve.append((seen, clock, acc))
                next_eval += eval_every_images
                if stop or seen >= max_images:
                    reached = stop
                    break
                model.train()
                t0 = time.perf_counter()
    return {"seconds": clock if reached else None, "reached": reached, "images": seen, "steps": steps,
            "final_acc": curve[-1][2] if curve else None, "curve": curve}
