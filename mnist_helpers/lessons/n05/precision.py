"""The measurement harness of notebook 05 (mixed precision, gradient accumulation, the CUDA caching allocator),
shared by the lesson (``lessons/n05/lesson``), ``scripts/bench_amp.py`` and ``scripts/device_check.py``.

Every training step here is ``train.train_step`` (through ``train_one_epoch``); the notebook writes the autocast +
GradScaler step out once, which is the lesson; memory is measured with the core ``mnist_helpers.memory``
(``peak_memory``, ``run_isolated``). Functions return rows (a list of dicts) or a dict.

- ``deprecated_amp_warnings``: the warnings the article's spelling (``torch.cuda.amp.autocast()``,
  ``torch.cuda.amp.GradScaler()``) raises;
- ``compare_precisions``: fp32, bf16, fp16 with or without GradScaler, channels_last (``MODES``; on CUDA ``fp32`` is
  IEEE float32 with TF32 switched off and ``tf32`` its own mode, and timed blocks last >= 0.2 s); speed (median of
  interleaved repeats), peak memory split into persistent and transient, test accuracy;
- ``amp_gain`` (bf16 vs fp32 at one batch: ratios, halves, faster) and ``amp_verdict``: the article's AMP claim as
  code, for notebook 05 (this machine) and ``scripts/device_check.py`` (a GPU run);
- ``accumulated_gradients`` and ``accumulation_memory``: what k micro-batches do to the gradient (the big batch's)
  and to peak memory;
- ``allocator_fragmentation`` (CUDA only, run through ``memory.run_isolated`` for a fresh process): the caching
  allocator with and without ``expandable_segments``; ``empty_cache_cost`` (CUDA only): what
  ``torch.cuda.empty_cache()`` after every step costs.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import statistics
import time
import warnings

import torch

from mnist_helpers.course import claims
from mnist_helpers.data import TensorBatches
from mnist_helpers.io import MiB
from mnist_helpers.memory import peak_memory
from mnist_helpers.models import build_model
from mnist_helpers.train import TrainConfig, build_training, evaluate, train_one_epoch, train_step

# A mode is a TrainConfig.amp (a key of train.AMP_DTYPES, checked by train.check_amp) plus what that table
# does not say: whether fp16 keeps its GradScaler (off = what the scaler protects against) and channels_last.
# name -> (TrainConfig.amp, GradScaler, channels_last)
MODES = {
    "fp32": ("none", False, False),
    "bf16": ("bf16", False, False),
    "fp16+scaler": ("fp16", True, False),
    "fp16 no scaler": ("fp16", False, False),
    "fp32 channels_last": ("none", False, True),
    "bf16 channels_last": ("bf16", False, True),
    "tf32": ("none", False, False),  # fp32 storage, TF32 tensor-core math (CUDA only; on a CPU the same as fp32)
}
# On CUDA, float32 modes pin the TF32 switches: cuDNN convolutions default to TF32, so "fp32" alone would not be
# IEEE float32. Modes not named here (the autocast ones) keep torch's defaults.
CUDA_TF32 = {"fp32": False, "fp32 channels_last": False, "tf32": True}
# On CUDA a timed block lasts at least this long (a few 1-ms steps would time kernel launches, not training).
CUDA_MIN_BLOCK_S = 0.2


@contextlib.contextmanager
def cuda_math(mode: str, device: torch.device):
    """Set ``torch.backends.cudnn.allow_tf32`` and ``torch.backends.cuda.matmul.allow_tf32`` for ``mode`` on CUDA
    (see ``CUDA_TF32``), restored afterwards; nothing on a CPU."""
    if device.type != "cuda" or mode not in CUDA_TF32:
        yield
        return
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = CUDA_TF32[mode]
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


# --------------------------------------------------------------------------- the article's API

def deprecated_amp_warnings() -> list[dict]:
    """Run the article's spelling (``torch.cuda.amp.autocast()``, ``torch.cuda.amp.GradScaler()``)
    and return the deprecation warnings it raises: [{"call", "category", "message"}]."""
    def article_autocast():
        with torch.cuda.amp.autocast():  # the article's spelling (on a CPU-only machine it also disables itself)
            pass

    rows = []
    for call, run in {"torch.cuda.amp.autocast()": article_autocast,
                      "torch.cuda.amp.GradScaler()": torch.cuda.amp.GradScaler}.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        for w in caught:
            if issubclass(w.category, (FutureWarning, DeprecationWarning)):
                rows.append({"call": call, "category": w.category.__name__, "message": str(w.message)})
    return rows


# --------------------------------------------------------------------------- speed, memory, accuracy

def _stream(X, y, batch_size, seed):
    """Endless shuffled batches, the same order for every mode (same seed)."""
    batches = TensorBatches(X, y, batch_size, shuffle=True, drop_last=True, seed=seed)
    for epoch in itertools.count():
        batches.set_epoch(epoch)
        yield from batches


def _setup(mode: str, model: str, batch_size: int, lr: float, seed: int, device):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    amp, scaler, channels_last = MODES[mode]
    cfg = TrainConfig(model=model, batch_size=batch_size, amp=amp, channels_last=channels_last, lr=lr, seed=seed)
    tr = build_training(cfg, device, steps_per_epoch=1)
    if amp == "fp16" and not scaler:
        tr.scaler = None  # fp16 without loss scaling: what the GradScaler protects against
    return cfg, tr


def compare_precisions(modes=("fp32", "bf16"), *, X, y, X_test=None, y_test=None, model: str = "net",
                       batch_size: int = 512, warmup: int = 2, repeats: int = 3, chunk: int = 5,
                       memory: bool = True, lr: float = 1e-3, seed: int = 0, device="cpu",
                       models: dict | None = None) -> list[dict]:
    """Train one model per mode side by side on the same batches and measure them.

    Each mode: ``warmup`` steps, then ``repeats`` timed blocks of ``chunk`` steps, interleaved across
    modes (so a busy machine slows all modes alike); images/s is the median block. ``memory``: one
    extra step measured by ``peak_memory`` (persistent vs transient). Then test accuracy (if a test
    set is given) after the ``warmup + repeats * chunk`` steps every mode trained.
    Rows: mode, amp, scaler, channels_last, batch_size, steps, images_per_s (and every block's, for the spread:
    ``block_images_per_s``), speedup (vs the first
    mode), peak/persistent/transient MiB and the transient ratio vs the first mode, skipped steps,
    test_acc. Pass a dict as ``models`` to get the trained models back, by mode.
    """
    for name, v in (("warmup", warmup), ("chunk", chunk), ("repeats", repeats), ("batch_size", batch_size)):
        if not isinstance(v, int) or v < (0 if name == "warmup" else 1):
            raise ValueError(f"{name} must be a {'non-negative' if name == 'warmup' else 'positive'} integer, got {v!r}")
    if batch_size > len(X):
        raise ValueError(f"batch_size ({batch_size}) is larger than the training set ({len(X)}); use a smaller batch")
    device = torch.device(device)
    runs = {}
    for mode in modes:
        cfg, tr = _setup(mode, model, batch_size, lr, seed, device)
        runs[mode] = {"cfg": cfg, "tr": tr, "data": _stream(X.to(device), y.to(device), batch_size, seed),
                      "speeds": [], "skipped": 0, "mode": mode}

    def steps(run, n):
        scaler = run["tr"].scaler
        before = scaler.get_scale() if scaler else None
        with cuda_math(run["mode"], device):
            stats = train_one_epoch(run["tr"], itertools.islice(run["data"], n), run["cfg"])
        if scaler and scaler.get_scale() < before:  # GradScaler halves the scale when it skips a step
            run["skipped"] += 1
        return stats

    for run in runs.values():
        if warmup:
            steps(run, warmup)
    if device.type == "cuda":  # lengthen the blocks to CUDA_MIN_BLOCK_S, the same number of steps for every mode
        probe = min(steps(run, chunk)["seconds"] for run in runs.values())
        warmup += chunk  # the probe block trained every mode too
        if probe < CUDA_MIN_BLOCK_S:
            chunk = min(math.ceil(chunk * CUDA_MIN_BLOCK_S / max(probe, 1e-6)), 2000)
    for _ in range(repeats):
        for run in runs.values():
            run["speeds"].append(steps(run, chunk)["images_per_s"])
    rows = []
    for mode, run in runs.items():
        amp, scaler, channels_last = MODES[mode]
        row = {"mode": mode, "amp": amp, "scaler": scaler, "channels_last": channels_last, "batch_size": batch_size,
               "steps": warmup + repeats * chunk, "images_per_s": statistics.median(run["speeds"]),
               "block_images_per_s": list(run["speeds"])}
        if memory:
            batch = next(run["data"])  # a copy taken outside the measurement: the dataset is not counted
            with cuda_math(mode, device):
                rep = peak_memory(lambda: train_one_epoch(run["tr"], [batch], run["cfg"]), device)
            row.update(peak_mib=rep.mib("peak"), persistent_mib=rep.mib("persistent"),
                       transient_mib=rep.mib("transient"), memory_method=rep.method,
                       **{f"{k}_mib": v / MiB for k, v in rep.by_category.items()})
        row["skipped_steps"] = run["skipped"]
        if X_test is not None:
            with cuda_math(mode, device):
                ev = evaluate(run["tr"].model, X_test.to(device), y_test.to(device), 1000, amp, channels_last)
            row["test_acc"] = ev["acc"]
        if device.type == "cuda":
            row.update(block_steps=chunk, tf32=CUDA_TF32.get(mode, "torch default"))
        rows.append(row)
        if models is not None:
            models[mode] = run["tr"].model
    base = rows[0]
    for row in rows:
        row["speedup"] = row["images_per_s"] / base["images_per_s"]
        if memory:
            row["peak_ratio"] = row["peak_mib"] / base["peak_mib"]
            row["transient_ratio"] = row["transient_mib"] / base["transient_mib"]
    return rows


# --------------------------------------------------------------------------- the article's claim, judged

# "AMP roughly halves memory and speeds training", as code: bf16's peak at most AMP_HALVES of fp32's, and more
# than AMP_FASTER x fp32's images/s with the timed blocks apart (claims.separated). Notebook 05 (this machine) and
# scripts/device_check.py (a GPU run) judge 05.amp_memory_speed by these two functions, in the article's regime: one
# GPU at its recipe's batch, ARTICLE_AMP_BATCH (other batches are reported beside it, not judged).
AMP_HALVES = 0.6
AMP_FASTER = 1.1
ARTICLE_AMP_BATCH = 128


def amp_gain(fp32: dict, bf16: dict) -> dict:
    """bf16 against fp32 from two rows of ``compare_precisions`` at one batch size (keys ``peak_mib``,
    ``transient_mib``, ``images_per_s``, ``block_images_per_s``): the ratios and what each says of the claim."""
    peak, transient = bf16["peak_mib"] / fp32["peak_mib"], bf16["transient_mib"] / fp32["transient_mib"]
    speedup = bf16["images_per_s"] / fp32["images_per_s"]
    apart = claims.separated(bf16["block_images_per_s"], fp32["block_images_per_s"])
    return {"peak_ratio": peak, "transient_ratio": transient, "speedup": speedup,
            "halves": peak <= AMP_HALVES, "halves_activations": transient <= AMP_HALVES,
            "faster": apart and speedup > AMP_FASTER, "slower": apart and speedup < 1}


def amp_verdict(gains) -> str:
    """The claim's verdict over one or more ``amp_gain`` results (one per batch size judged): it holds where bf16
    halves the peak and is faster at every batch, holds with nuance where it does one of the two at one batch, and
    does not hold here otherwise. The activations alone do not count: autocast stores them in 16 bits, so they
    halve by construction; the claim is about the memory a step needs (its peak)."""
    gains = list(gains)
    if not gains:
        raise ValueError("amp_verdict needs at least one amp_gain() result (fp32 and bf16 rows at one batch size)")
    if all(g["halves"] and g["faster"] for g in gains):
        return "holds"
    if any(g["halves"] or g["faster"] for g in gains):
        return "holds with nuance"
    return "does not hold here"


# --------------------------------------------------------------------------- gradient accumulation

def flat_grads(model) -> torch.Tensor:
    """Every parameter's gradient, flattened into one float32 vector (parameters without one left out)."""
    return torch.cat([p.grad.detach().flatten().float() for p in model.parameters() if p.grad is not None])


def accumulated_gradients(model_name: str, X: torch.Tensor, y: torch.Tensor, grad_accum: int, seed: int = 0,
                          amp: str = "none") -> torch.Tensor:
    """The gradient ``train_one_epoch`` builds for one optimizer step over (X, y) in ``grad_accum``
    micro-batches (flattened, taken before the optimizer would use it: lr makes no difference here)."""
    cfg = TrainConfig(model=model_name, batch_size=len(X), grad_accum=grad_accum, optimizer="sgd", lr=1e-3,
                      seed=seed, amp=amp)
    tr = build_training(cfg, X.device, steps_per_epoch=1)
    tr.optimizer.step = lambda *a, **k: None  # keep the weights: we want the gradient of the same point
    train_one_epoch(tr, [(X, y)], cfg)
    return flat_grads(tr.model)


def accumulation_memory(k_values=(1, 2, 4, 8), *, X: torch.Tensor, y: torch.Tensor, model: str = "net",
                        amp: str = "none", seed: int = 0) -> list[dict]:
    """One optimizer step over the batch (X, y) split into k micro-batches, for each k: peak memory
    (persistent vs transient) and the gradient's largest difference from k=1's.
    Rows: k, micro_batch, peak_mib, persistent_mib, transient_mib, transient_ratio, max_grad_diff."""
    n = len(X)
    for k in k_values:
        if not isinstance(k, int) or k < 1 or n % k:
            raise ValueError(f"every k must be a positive integer dividing the batch ({n}); got {k!r}")
    rows, ref = [], None
    for k in k_values:
        cfg = TrainConfig(model=model, batch_size=n, grad_accum=k, amp=amp, seed=seed)
        tr = build_training(cfg, X.device, steps_per_epoch=1)
        train_one_epoch(tr, [(X, y)], cfg)  # warm-up: Adam's moments exist from here on
        rep = peak_memory(lambda: train_one_epoch(tr, [(X, y)], cfg), X.device)
        g = accumulated_gradients(model, X, y, k, seed, amp)
        ref = g if ref is None else ref
        rows.append({"k": k, "micro_batch": n // k, "peak_mib": rep.mib("peak"),
                     "persistent_mib": rep.mib("persistent"), "transient_mib": rep.mib("transient"),
                     "max_grad_diff": float((g - ref).abs().max())})
    for row in rows:
        row["transient_ratio"] = row["transient_mib"] / rows[0]["transient_mib"]
    return rows


# --------------------------------------------------------------------------- the CUDA caching allocator

def allocator_fragmentation(num_steps: int = 24, base_mib: int = 64) -> dict:
    """CUDA only: allocate a batch whose size changes every step (as with variable-length inputs)
    while small tensors that outlive the step (2 MiB each, allocated after the batch is freed: large-pool blocks
    that pin the batches' segments); report the caching allocator's reserved vs allocated peaks. Run it with and without ``expandable_segments:True`` via
    ``run_isolated(allocator_fragmentation, env=...)`` (the setting is read once, when CUDA initialises), as
    notebook 05, scripts/bench_amp.py and scripts/device_check.py do: keep it at module level."""
    if not torch.cuda.is_available():
        raise ValueError("allocator_fragmentation needs a CUDA device; on CPU read the reference results")
    dev = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats(dev)
    kept = []
    for i in range(num_steps):
        size = (base_mib + 9 * (i % 7) + i) * MiB  # irregular sizes, slowly growing
        batch = torch.empty(size, dtype=torch.uint8, device=dev)
        batch.fill_(1)
        del batch
        # outlives the step: 2 MiB, above the allocator's 1 MiB small-pool limit, so it is carved (best fit) out of
        # the batch's just-freed large-pool segment and pins it (a 0.5 MiB tensor would go to the small pool)
        kept.append(torch.empty(2 * MiB, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize(dev)
    stats = torch.cuda.memory_stats(dev)
    return {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "peak_allocated_mib": stats["allocated_bytes.all.peak"] / MiB,
            "peak_reserved_mib": stats["reserved_bytes.all.peak"] / MiB,
            "reserved_now_mib": torch.cuda.memory_reserved(dev) / MiB,
            "allocated_now_mib": torch.cuda.memory_allocated(dev) / MiB,
            "segments": stats.get("segment.all.current"), "gpu": torch.cuda.get_device_name(dev)}


def empty_cache_cost(num_steps: int = 50, batch_size: int = 512, model: str = "net") -> dict:
    """CUDA only: time training steps with and without ``torch.cuda.empty_cache()`` after each one
    (median ms per step, interleaved blocks so both see the same machine state)."""
    if not torch.cuda.is_available():
        raise ValueError("empty_cache_cost needs a CUDA device; on CPU read the reference results")
    dev = torch.device("cuda")
    net = build_model(model).to(dev)
    opt = torch.optim.Adam(net.parameters())
    X = torch.randn(batch_size, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch_size,), device=dev)

    def block(empty: bool, n: int) -> float:
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            train_step(net, opt, X, y)
            if empty:
                torch.cuda.empty_cache()
        torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) / n * 1e3

    block(False, 10)  # warm-up: cuDNN autotuning, allocator pool
    times = {False: [], True: []}
    for _ in range(5):
        for empty in (False, True):
            times[empty].append(block(empty, num_steps))
    plain, emptied = statistics.median(times[False]), statistics.median(times[True])
    return {"ms_per_step": plain, "ms_per_step_empty_cache": emptied, "slowdown": emptied / plain,
            "gpu": torch.cuda.get_device_name(dev)}
