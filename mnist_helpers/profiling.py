"""Where does a training step spend its time? (introduced in 09_profiling_and_autotune)

Two tools from the article's "automate" list, used on real training steps of the series' models:

- ``torch.profiler``: :func:`profile_training` runs labelled steps (``data`` / ``forward`` / ``backward``
  / ``all-reduce`` / ``optimizer`` via ``record_function``) under a wait / warm-up / active schedule,
  writes a Chrome/Perfetto trace (open it at https://ui.perfetto.dev or chrome://tracing) and returns the
  top-operator table; :func:`time_breakdown` sums the labels into data wait, compute and communication.
  The DDP worker ``mnist_helpers/workers/profile_ddp.py`` runs the same loop in 2 processes.
- ``torch.utils.benchmark.Timer``: :func:`timer_compare` times one training step under several settings
  (threads, channels_last, batch size) and reports median and IQR of many runs, never a single timing.

    from mnist_helpers.profiling import profile_training, time_breakdown
    res = profile_training(model="net", batch_size=128, trace_path="results/09_trace.json")
    print(res["table"]); print(time_breakdown(res["events"]))
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, record_function

from .models import build_model

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


def labelled_step(model, opt, batches_iter, device, *, allreduce: Callable[[], None] | None = None,
                  channels_last: bool = False) -> int:
    """One training step with every phase under its ``record_function`` label. Returns the batch size.

    ``allreduce`` (e.g. :func:`allreduce_gradients`) runs between backward and the optimizer, the way DDP
    does without overlap, so communication gets its own label.
    """
    with record_function("data"):
        X, y = next(batches_iter)
        X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
    with record_function("forward"):
        loss = F.nll_loss(model(X), y)
    opt.zero_grad(set_to_none=True)
    with record_function("backward"):
        loss.backward()
    if allreduce is not None:
        with record_function("all-reduce"):
            allreduce()
    with record_function("optimizer"):
        opt.step()
    return len(X)


def allreduce_gradients(model: torch.nn.Module) -> Callable[[], None]:
    """Average the gradients over all ranks in one flat bucket (what DDP does, minus the overlap)."""
    import torch.distributed as dist

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
    from .train import TrainConfig, make_train_batches

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
    from .train import select_device

    device = select_device("auto") if device is None else torch.device(device)
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

def _step_stmt_globals(model_name: str, batch_size: int, channels_last: bool, device) -> dict:
    torch.manual_seed(0)
    net = build_model(model_name).to(device)
    X = torch.randn(batch_size, 1, 28, 28, device=device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        X = X.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch_size,), device=device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.nll_loss(net(X), y).backward()
        opt.step()
    step()  # warm-up: first call allocates optimizer state and picks kernels
    return {"step": step}


def time_step(model: str = "net", *, batch_size: int = 128, threads: int | None = None, channels_last: bool = False,
              device=None, min_run_time: float = 1.0, min_runs: int = 5, label: str = "train step",
              sub_label: str = "", description: str = ""):
    """One ``torch.utils.benchmark.Measurement`` of a full training step (forward, backward, Adam), with at
    least ``min_runs`` timed runs so that its median and IQR mean something even when a step is slow."""
    from torch.utils import benchmark

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive seconds, got {min_run_time!r}")
    device = torch.device("cpu") if device is None else torch.device(device)
    g = _step_stmt_globals(model, batch_size, channels_last, device)
    timer = benchmark.Timer(stmt="step()", globals=g, num_threads=threads or torch.get_num_threads(),
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
    from torch.utils import benchmark

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

