"""Peak memory on CPU, CUDA and Apple's MPS behind one call (introduced in 05_mixed_precision_and_memory; 08 uses
it too).

``peak_memory(fn, device)`` runs ``fn()`` once and returns a :class:`MemoryReport`:

- on CUDA it reads the caching allocator's counters (``reset_peak_memory_stats``,
  ``max_memory_allocated``; ``memory_summary(device)`` prints the allocator's own table);
- on CPU there are no such counters, so it runs ``fn`` under ``torch.profiler`` with
  ``profile_memory=True`` and replays every tensor allocation and free; the profiler also labels each
  tensor (parameter, gradient, optimizer state, input, activation, temporary), so on CPU the peak
  comes split by category;
- on MPS (Apple GPUs) it reads the device's own counter, ``torch.mps.current_allocated_memory()``: torch keeps
  no peak for MPS, so the counter is sampled after every operator ``fn`` runs (a ``TorchDispatchMode``): a lower
  bound that misses only memory an operator allocates and frees inside itself. ``memory_summary`` adds Metal's
  ``driver_allocated_memory()``. Neither the CPU profiler nor the process RSS is ever reported as MPS memory.

In every case the report separates **persistent** memory (what is still held after ``fn`` returns:
weights, gradients, optimizer state, the batch) from **transient** memory (peak minus persistent:
activations saved for backward and temporaries). Mixed precision and gradient accumulation act on the
transient part only; that is why they must be read separately.

``run_isolated(fn, **kwargs)`` runs a module-level package function in a fresh Python process and
adds that process's RSS high-water mark: a cross-check on CPU that counts everything (the allocator's
slack, libraries), and the only safe way to set ``PYTORCH_CUDA_ALLOC_CONF`` (it is read once, when
CUDA initialises). The notebook's experiments on leaks live in ``mnist_helpers.lessons.n05.lesson``, those
on the CUDA caching allocator in ``mnist_helpers.lessons.n05.precision``.

The batch-size finder (08; the ``oom`` worker runs it): :func:`find_batch_size` halves from a start until
``fits(batch_size)`` runs without an out-of-memory error, :func:`train_step_probe` makes such a ``fits`` (one
``train_step`` on a random MNIST-shaped batch) and :func:`limit_memory` makes a memory budget real
(``set_per_process_memory_fraction`` on CUDA, ``RLIMIT_AS`` on CPU: see ``lessons.n08.lesson``, whose
notebook teaches it). ``MALLOC_ENV`` keeps glibc's mmap threshold fixed for a process searching under that cap.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from mnist_helpers.errors import ConfigError
from mnist_helpers.io import MiB
from mnist_helpers.models import build_model
from mnist_helpers.train import select_device, train_step

METHODS = ("auto", "cuda", "profiler", "mps")
# How the report groups the profiler's categories (torch.profiler._memory_profiler.Category).
_GROUPS = {"PARAMETER": "weights", "GRADIENT": "gradients", "OPTIMIZER_STATE": "optimizer_state",
           "INPUT": "inputs", "ACTIVATION": "activations", "AUTOGRAD_DETAIL": "activations",
           "TEMPORARY": "activations", None: "activations"}
CATEGORIES = ("weights", "gradients", "optimizer_state", "inputs", "activations")


@dataclass
class MemoryReport:
    """What ``peak_memory`` measured. Sizes in bytes; ``mib(name)`` converts."""
    device: str             # cpu, cuda:0, mps
    method: str             # cuda (allocator counters), mps (the MPS counter, sampled) or profiler (allocation replay)
    peak_bytes: int         # most memory held by tensors at any moment while fn ran (incl. what existed before)
    before_bytes: int       # held by tensors when fn started
    persistent_bytes: int   # still held when fn returned: weights, grads, optimizer state, inputs
    seconds: float          # wall time of the measured call (profiling slows it down: not a speed number)
    by_category: dict = field(default_factory=dict)  # at the peak (profiler only): weights, gradients, ...

    @property
    def transient_bytes(self) -> int:
        """Peak minus persistent: activations and temporaries, the part batch size and AMP change."""
        return max(self.peak_bytes - self.persistent_bytes, 0)

    def mib(self, name: str) -> float:
        return getattr(self, name if name.endswith("bytes") else f"{name}_bytes") / MiB

    def to_dict(self) -> dict:
        return {**asdict(self), "transient_bytes": self.transient_bytes}

    def line(self) -> str:
        cats = ", ".join(f"{k} {v / MiB:.1f}" for k, v in self.by_category.items() if v)
        return (f"{self.device} ({self.method}): peak {self.mib('peak'):.1f} MiB = persistent "
                f"{self.mib('persistent'):.1f} + transient {self.mib('transient'):.1f}" + (f" | at peak: {cats}" if cats else ""))


def _as_device(device) -> torch.device:
    if device is None:
        return select_device("auto")
    return device if isinstance(device, torch.device) else torch.device(device)


def peak_memory(fn: Callable[[], object], device=None, method: str = "auto") -> MemoryReport:
    """Run ``fn()`` once and measure the peak tensor memory it caused on ``device``.

    ``method``: ``auto`` (cuda counters on a CUDA GPU, the sampled MPS counter on an Apple GPU, the profiler on
    CPU), ``cuda``, ``mps`` or ``profiler`` (CPU and CUDA; slower). Run one warm-up call first if ``fn`` creates
    state on its first call (Adam's moments appear on the first ``step()``), unless that is what you want to see.
    The profiler sees the tensors ``fn`` creates or uses; tensors it never touches are not counted
    (they do not change the peak ``fn`` causes, only the process total).
    """
    if not callable(fn):
        raise ValueError(f"fn must be a callable taking no arguments (e.g. lambda: step()), got {type(fn).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    device = _as_device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for but CUDA is not available here; use device='cpu'")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device} was asked for but MPS is not available here; use device='cpu'")
    if method == "auto":
        method = {"cuda": "cuda", "mps": "mps"}.get(device.type, "profiler")
    if method == "cuda":
        if device.type != "cuda":
            raise ValueError("method='cuda' reads the CUDA caching allocator and needs a CUDA device; "
                             "on CPU use method='profiler' (or 'auto')")
        return _cuda_peak(fn, device)
    if method == "mps" or device.type == "mps":
        if device.type != "mps":
            raise ValueError("method='mps' reads torch.mps's counter and needs an MPS device; "
                             "on CPU use method='profiler' (or 'auto')")
        if method != "mps":  # the CPU profiler's memory timeline would describe host memory, not the device's
            raise ValueError("MPS memory is not measured with the profiler on this device: use method='mps' "
                             "(or 'auto'), which reads torch.mps.current_allocated_memory()")
        return _mps_peak(fn, device)
    return _profiler_peak(fn, device)


def _cuda_peak(fn, device) -> MemoryReport:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    return MemoryReport(str(device), "cuda", torch.cuda.max_memory_allocated(device), before,
                        torch.cuda.memory_allocated(device), seconds)


def _mps_counters():
    """(current_allocated_memory, driver_allocated_memory) of ``torch.mps``; a ValueError saying memory is not
    measured on this device when this torch has no such counters."""
    mps = getattr(torch, "mps", None)
    counters = tuple(getattr(mps, name, None) for name in ("current_allocated_memory", "driver_allocated_memory"))
    if not all(callable(c) for c in counters):
        raise ValueError(f"memory is not measured on this device: torch {torch.__version__} has no "
                         "torch.mps.current_allocated_memory()/driver_allocated_memory()")
    return counters


def _mps_peak(fn, device) -> MemoryReport:
    """The MPS counter before and after ``fn``, and its highest value after any operator ``fn`` ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    allocated, _ = _mps_counters()

    class _SampleAfterEachOp(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            peak[0] = max(peak[0], allocated())
            return out

    torch.mps.synchronize()
    before = allocated()
    peak = [before]
    t0 = time.perf_counter()
    with _SampleAfterEachOp():
        fn()
    torch.mps.synchronize()
    seconds = time.perf_counter() - t0
    after = allocated()
    return MemoryReport(str(device), "mps", max(peak[0], after), before, after, seconds)


def _profiler_peak(fn, device) -> MemoryReport:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t0 = time.perf_counter()
    with warnings.catch_warnings(), _quiet_stderr():
        warnings.simplefilter("ignore")  # "memory block of unknown size ...": blocks from before profiling
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            fn()
        seconds = time.perf_counter() - t0
        names, before, sizes = _timeline(prof, device)
    if not sizes:
        return MemoryReport(str(device), "profiler", 0, 0, 0, seconds)
    totals = [sum(row) for row in sizes]
    i = max(range(len(totals)), key=totals.__getitem__)
    cats = dict.fromkeys(CATEGORIES, 0)
    for name, value in zip(names, sizes[i]):
        cats[_GROUPS.get(name, "activations")] += value
    return MemoryReport(str(device), "profiler", totals[i], before, totals[-1], seconds, cats)


def _timeline(prof, device):
    """(category names, bytes held before profiling, sizes per category at each time) of one device,
    from the profiler's memory timeline.

    ``MemoryProfileTimeline`` is what ``prof.export_memory_timeline`` uses; it is a private API, so
    this is the one place that touches it.
    """
    from torch.profiler import _memory_profiler as mp

    timeline = mp.MemoryProfileTimeline(prof._memory_profile())
    times, sizes = timeline._coalesce_timeline(str(device))
    order = sorted(mp._CATEGORY_TO_INDEX.items(), key=lambda kv: kv[1])
    names = ["unused"] + [c.name if c is not None else None for c, _ in order]
    before = sum(nbytes for _, action, (key, _), nbytes in timeline.timeline
                 if action == mp.Action.PREEXISTING and key.device == device)
    return names, before, sizes


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side prints start/stop lines to file descriptor 2 (also inside notebooks,
    whose kernels capture that descriptor); hide them. Python exceptions still propagate."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes held by the weights, their gradients and the optimizer state (Adam: two moments per weight)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    opt = 0
    if optimizer is not None:
        for st in optimizer.state.values():
            opt += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return {"weights": weights, "gradients": grads, "optimizer_state": opt}


def current_bytes(device=None) -> int:
    """Memory in use now: tensors on a CUDA device (``memory_allocated``) or on MPS
    (``torch.mps.current_allocated_memory``), the process RSS on CPU."""
    device = _as_device(device)
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    if device.type == "mps":
        return _mps_counters()[0]()
    import psutil

    return psutil.Process().memory_info().rss


def memory_summary(device=None) -> str:
    """The CUDA caching allocator's table (``torch.cuda.memory_summary``); on MPS the device's two counters; on
    CPU the RSS numbers."""
    device = _as_device(device)
    if device.type == "cuda":
        return torch.cuda.memory_summary(device, abbreviated=True)
    if device.type == "mps":
        allocated, driver = _mps_counters()
        return (f"MPS: {allocated() / MiB:,.1f} MiB held by tensors (torch.mps.current_allocated_memory), "
                f"{driver() / MiB:,.1f} MiB allocated by Metal's driver, cached blocks included "
                "(torch.mps.driver_allocated_memory); torch keeps no peak for MPS: use peak_memory()")
    peak = rss_peak_bytes()
    return (f"CPU: no caching-allocator counters; RSS now {current_bytes(device) / MiB:,.1f} MiB, "
            + (f"this process's RSS peak {peak / MiB:,.1f} MiB" if peak is not None else "RSS peak n/a here")
            + " (use peak_memory() for tensors)")


def rss_peak_bytes() -> int | None:
    """This process's RSS high-water mark: ``ru_maxrss`` (KiB on Linux, bytes on macOS); on Windows, which has
    no ``resource`` module, psutil's peak working set (``peak_wset``). None where neither exists."""
    try:
        import resource  # POSIX only: imported here so that this module imports on Windows too
    except ImportError:
        import psutil

        return getattr(psutil.Process().memory_info(), "peak_wset", None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# "GPU memory is no bottleneck for MNIST", one rule for notebook 01 (a step measured on this machine) and
# scripts/device_check.py (a step measured on a GPU): the step's peak as a share of the article's 8 GB GPU, of which
# about 0.5 GiB goes to the CUDA context and kernels, whatever GPU measured it. Under MEM_HOLDS: holds; over
# MEM_FAILS: does not hold here; in between: holds with nuance (it fits, but a batch a few times larger would not).
# A peak read from the allocator is a count, not a sample: no spread, so no "inconclusive" band.
ARTICLE_GPU_GIB = 8
GPU_USABLE_GIB = ARTICLE_GPU_GIB - 0.5
MEM_HOLDS, MEM_FAILS = 0.10, 0.50


def gpu_memory_verdict(peak_mib: float) -> dict:
    """A training step's peak (MiB) against the article's 8 GB GPU: ``{"verdict", "share", "why"}``."""
    share = peak_mib / (GPU_USABLE_GIB * 1024)
    verdict = "holds" if share < MEM_HOLDS else "does not hold here" if share > MEM_FAILS else "holds with nuance"
    why = (f"under {MEM_HOLDS:.0%}: no bottleneck" if verdict == "holds" else
           f"over {MEM_FAILS:.0%}: the batch cannot double" if share > MEM_FAILS else
           f"between {MEM_HOLDS:.0%} and {MEM_FAILS:.0%}: it fits, a batch a few times larger would not")
    return {"verdict": verdict, "share": share, "why": why}


OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """True for CUDA's ``OutOfMemoryError`` and the CPU allocator's "can't allocate memory"."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


# --------------------------------------------------------------------------- the batch-size finder

# glibc moves its mmap threshold up after large frees, so later big tensors land in the heap, which
# never shrinks: under RLIMIT_AS the address space then creeps up and the search becomes flaky. A fixed
# threshold keeps every tensor >= 1 MiB in its own mapping, returned to the OS when freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}


def find_batch_size(fits: Callable[[int], object], start: int, min_batch_size: int = 1, repeats: int = 2) -> dict:
    """Halve from ``start`` until ``fits(batch_size)`` runs ``repeats`` times without running out of memory.

    Two repeats by default: the first step at a new size can pass while the second (gradients and
    allocator state carried over) fails.

    Returns ``{"batch_size": largest that fit (None if even min_batch_size failed), "tried": [{batch_size, ok,
    error}]}``. Errors that are not out-of-memory are raised: a bug must not look like a big batch.
    """
    if not isinstance(start, int) or start < 1:
        raise ValueError(f"start must be a positive integer batch size, got {start!r}")
    if not isinstance(min_batch_size, int) or not 1 <= min_batch_size <= start:
        raise ValueError(f"min_batch_size must be an integer in 1..start ({start}), got {min_batch_size!r}")
    tried, batch_size = [], start
    while batch_size >= min_batch_size:
        try:
            for _ in range(repeats):
                fits(batch_size)
        except Exception as exc:  # noqa: BLE001 - sorted just below
            if not is_oom(exc):
                raise
            tried.append({"batch_size": batch_size, "ok": False, "error": str(exc).strip().splitlines()[0][:200]})
            release_cached()
            batch_size //= 2
            continue
        tried.append({"batch_size": batch_size, "ok": True, "error": None})
        return {"batch_size": batch_size, "tried": tried}
    return {"batch_size": None, "tried": tried}


def release_cached() -> None:
    """Free what a failed step left behind: its tensors (garbage once the exception's frames are gone), CUDA's cache."""
    gc.collect()
    if torch.cuda.is_initialized():  # not is_available(): a CPU search must not start the CUDA driver (fork)
        torch.cuda.empty_cache()


def train_step_probe(model: str = "net", device: str | torch.device = "cpu", lr: float = 1e-3,
                     seed: int = 0) -> Callable[[int], float]:
    """A ``fits(batch_size)`` that runs one real training step (``train_step``, Adam) and returns the loss.

    ``fits.model`` and ``fits.optimizer`` are the model and optimizer it trains: keep training those
    after the search (under an address-space cap, memory freed by a failed try is not always returned
    to the OS, so a second model may not fit where the first did)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    net = build_model(model).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def fits(batch_size: int) -> float:
        X = torch.randn(batch_size, 1, 28, 28, device=device)
        y = torch.randint(0, 10, (batch_size,), device=device)
        return float(train_step(net, opt, X, y))

    fits(2)  # create the optimizer state and start the thread pools before any limit is set
    fits.model, fits.optimizer = net, opt  # so the caller can go on training the same model
    return fits


def address_space_bytes() -> int:
    """This process's virtual memory size now (what RLIMIT_AS counts)."""
    import psutil

    return psutil.Process().memory_info().vms


def limit_memory(budget_bytes: int, device: str | torch.device = "cpu") -> dict:
    """Let this process allocate about ``budget_bytes`` more, then fail with an out-of-memory error.

    CPU: ``RLIMIT_AS`` = current address space + budget (cannot be raised again in this process).
    CUDA: ``set_per_process_memory_fraction`` so that the cap is (memory in use now + budget).
    Returns what was set, for the record.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    dev = torch.device(device)
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        cap = torch.cuda.memory_reserved(dev) + budget_bytes
        fraction = min(1.0, cap / total)
        torch.cuda.set_per_process_memory_fraction(fraction, dev)
        return {"method": "set_per_process_memory_fraction", "fraction": fraction, "cap_bytes": cap}
    try:
        import resource  # POSIX only: imported here so that this module imports on Windows too
    except ImportError:
        raise ConfigError("a CPU memory cap needs resource.setrlimit(RLIMIT_AS), which is not available on Windows "
                          "(Python has no `resource` module there)",
                          "run this lesson under WSL2 (or on Linux or macOS); on a CUDA GPU the cap is "
                          "torch.cuda.set_per_process_memory_fraction (--device cuda)") from None
    base = address_space_bytes()
    limit = base + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return {"method": "RLIMIT_AS", "base_vms_bytes": base, "limit_bytes": limit}


# --------------------------------------------------------------------------- a fresh process

def isolated_target(fn: Callable) -> str:
    """``"module:qualname"`` of a module-level function: how the fresh process of :func:`run_isolated` finds it.

    A lambda, a function defined inside another one or in ``__main__`` (a notebook cell) cannot be imported by a
    new process: a ``ConfigError`` says to pass a function defined at the top of a package module."""
    if isinstance(fn, str) or not callable(fn):
        raise ConfigError(f"run_isolated takes the function itself, got {type(fn).__name__} {fn!r}",
                          "import the function and pass it: run_isolated(l05.leak_demo, ...)")
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname or "." in qualname:
        where = f"{module}:{qualname}" if module and qualname else repr(fn)
        raise ConfigError(f"run_isolated needs a module-level function that a fresh process can import; {where} is "
                          "a lambda, a nested function, a method or defined in __main__ (a notebook cell or script)",
                          "define the function at the top of a package module (e.g. a lesson module) and pass it")
    return f"{module}:{qualname}"


def run_isolated(fn: Callable, env: dict | None = None, timeout: float = 300, **kwargs) -> dict:
    """Run the module-level function ``fn`` with ``kwargs`` (JSON-able) in a fresh Python process.

    Returns its JSON result under ``"result"`` plus ``rss_start_bytes`` (after importing torch and
    the function's module) and ``rss_peak_bytes`` (the process's high-water mark), so
    ``rss_peak_bytes - rss_start_bytes`` is what the call added at its worst moment. ``env``
    adds environment variables, read before anything initialises CUDA (PYTORCH_CUDA_ALLOC_CONF).
    The new process imports ``fn`` by its module and name (:func:`isolated_target`).
    """
    target = isolated_target(fn)
    cmd = [sys.executable, "-m", "mnist_helpers.memory", target, json.dumps(kwargs)]
    proc = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{target} failed in its subprocess (exit code {proc.returncode}):\n"
                           f"{proc.stderr[-2000:] or proc.stdout[-2000:]}")
    return json.loads(lines[-1])


def _child_main(target: str, kwargs_json: str) -> None:
    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name)
    import psutil

    start = psutil.Process().memory_info().rss
    result = fn(**json.loads(kwargs_json))
    print(json.dumps({"result": result, "rss_start_bytes": start, "rss_peak_bytes": rss_peak_bytes(),
                      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}))


if __name__ == "__main__":  # what run_isolated runs: python -m mnist_helpers.memory module:function '{"kwarg": 1}'
    if len(sys.argv) != 3:
        sys.exit("usage: python -m mnist_helpers.memory package.module:function '{json kwargs}' (what run_isolated runs)")
    _child_main(sys.argv[1], sys.argv[2])
