"""How fast can data reach the model? The measurement harness of 03_dataloader_tuning: repeats, interleaving,
sweeps, verdict helpers and a widget.

The notebook writes the lesson itself in its cells: the ``DataLoader(...)`` construction and the in-memory batches.
Every sweep here takes them as arguments (``make=``: a function ``(dataset, batch_size, *, num_workers,
pin_memory, prefetch_factor, persistent_workers, multiprocessing_context) -> DataLoader``; ``in_memory=``: a class
``(X_uint8, y, batch_size)`` with ``set_epoch``) and falls back on the core's ``data.make_loader`` /
``feeding.Uint8Batches`` when called without them (``scripts/bench_loader.py``, the tests). The training loop that
times data waits (``train_with_loader``) is core. Each measurement returns rows (a list of flat dicts) that the notebook
shows as DataFrames and plots; rows measured with ``repeats`` keep every repeat's value (``repeats``) so verdicts
can compare spreads (``claims.separated``):

- datasets: ``make_dataset("torchvision" | "tensor" | "pylist")``: the article's per-sample PIL route, an
  in-memory ``TensorDataset``, and a list of small Python objects (to show refcount page-touching under fork);
  ``dataset_nbytes`` for their size.
- ``loader_sweep``: loader-only images/s over ``num_workers`` x ``pin_memory`` x ``prefetch_factor`` x
  ``persistent_workers`` (first-epoch start-up kept apart from the steady epoch).
- ``training_sweep``: training images/s and the fraction of each step spent *waiting for data* (the signal
  the article reads from ``nvidia-smi -l 1``: a GPU idling at 0-30% is a GPU waiting for its loader).
- ``worker_memory`` / ``memory_sweep``: per-worker USS/PSS/RSS (psutil) after a full pass, per start method, to
  test "each worker copies the dataset".
- ``disk_read_rate``: cold and warm reads of a file, for "the loader bottleneck is often disk I/O".
- ``feed_rates`` (from ``mnist_helpers.lessons.n03.feeding`` beside this module, which ``scripts/bench_loader.py`` runs too): in-memory
  tensor batches (float32, or ``Uint8Batches`` normalised per batch), GPU-resident batches and the DataLoader with
  per-sample transforms, measured side by side.
- ``drop_last_effect``: what the small last batch does (its gradient noise, BatchNorm with one sample).
- ``workers_verdict`` / ``too_many_verdict``: the article's num_workers claims judged from a sweep's repeats.
- ``claims_03(Measured03(...))``: the notebook's seven claims from one record of its measurements (pure), for
  ``claims.record``; ``workers_fraction_judgement`` and ``drop_last_judgement`` decide two of them from their recorded numbers, so
  ``rejudge(entry)`` can judge a kept result again by today's rule.
- ``loader_widget``: measure the loader once with given settings (a printed line: the static output nbmake
  keeps), and in JupyterLab sliders and a button to measure again.
"""
from __future__ import annotations

import gc
import itertools
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import psutil
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset, TensorDataset

from mnist_helpers.course.claims import BUSY, separated
from mnist_helpers.data import MEAN, STD, dataset_tensors, load_mnist, make_loader, mnist_datasets, time_loader
# what scripts/bench_loader.py measures too (feed_rates, raw_uint8) lives beside this module: mnist_helpers.lessons.n03.feeding
from mnist_helpers.course.live import widgets
from mnist_helpers.io import MiB
from mnist_helpers.lessons.n03.feeding import Uint8Batches, check_positive_int, first_batches, workers_list
from mnist_helpers.models import build_model
from mnist_helpers.resources import usable_cores
from mnist_helpers.train import select_device, train_with_loader

DATASET_KINDS = ("torchvision", "tensor", "pylist")


def default_worker_counts(cores: int | None = None) -> list[int]:
    """0, 1, then powers of two up to 2x the cores this process may use (the sweep the article's advice calls for)."""
    cores = cores or usable_cores()
    counts = [0, 1]
    w = 2
    while w <= 2 * cores:
        counts.append(w)
        w *= 2
    if counts[-1] != 2 * cores:
        counts.append(2 * cores)
    return counts


# --------------------------------------------------------------------------- datasets

class PyListDataset(Dataset):
    """MNIST as a Python list of ``(bytes, label)`` tuples, decoded per sample: many small Python objects.

    Under ``fork`` every read bumps an object's refcount, i.e. *writes* to the page holding it, so each worker
    ends up with private copies of the pages it touched. A single big tensor has no per-sample objects."""

    def __init__(self, X_uint8: torch.Tensor, y: torch.Tensor):
        self.items = [(X_uint8[i].numpy().tobytes(), int(y[i])) for i in range(len(y))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        raw, label = self.items[i]
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(1, 28, 28).float().div_(255.0)
        return x.sub_(MEAN).div_(STD), label


def make_dataset(kind: str, root=None, subset: int | None = None) -> Dataset:
    """``torchvision``: MNIST + ToTensor + Normalize per sample (the article's); ``tensor``: normalised float32
    ``TensorDataset`` in memory; ``pylist``: a list of small Python objects (``PyListDataset``)."""
    if kind not in DATASET_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DATASET_KINDS)}; got {kind!r}")
    if subset is not None:
        check_positive_int("subset", subset)
    if kind == "torchvision":
        ds, _ = mnist_datasets(root)
        return Subset(ds, range(subset)) if subset else ds
    if kind == "tensor":
        X, y, _, _ = load_mnist(root, subset=(subset or 60000, 1))
        return TensorDataset(X, y)
    X, y, _, _ = load_mnist(root, subset=(subset or 60000, 1), normalize=False)
    return PyListDataset((X * 255).round().to(torch.uint8).squeeze(1), y)


def dataset_nbytes(ds: Dataset) -> int:
    """Bytes the dataset's samples occupy in the parent process (approximate for ``pylist``)."""
    base = ds.dataset if isinstance(ds, Subset) else ds
    if isinstance(base, TensorDataset):
        return sum(t.numel() * t.element_size() for t in base.tensors)
    if isinstance(base, PyListDataset):
        return sum(sys.getsizeof(r) + sys.getsizeof(t) + 28 for t in base.items for r in t[:1])
    data = getattr(base, "data", None)
    return data.numel() * data.element_size() if isinstance(data, torch.Tensor) else 0


# --------------------------------------------------------------------------- loaders

def loader_sweep(dataset: Dataset, *, num_workers: Iterable[int] = (0, 1, 2, 4), batch_size: int = 128,
                 pin_memory: Iterable[bool] = (False,), prefetch_factor: Iterable[int] = (2,),
                 persistent_workers: Iterable[bool] = (False,), epochs: int = 2, max_batches: int | None = None,
                 repeats: int = 1, make=None) -> list[dict]:
    """Loader-only images/s for every combination (workers-only knobs collapse when num_workers == 0).
    ``repeats`` > 1 measures every setting once per round, round after round (so a burst of load from other
    jobs hits all settings alike), and reports the median; the rows keep every repeat's value too.
    ``make``: the function that builds the DataLoader (the notebook's own; default ``data.make_loader``)."""
    make = make or make_loader
    workers = workers_list(num_workers)
    check_positive_int("repeats", repeats)
    configs, seen = [], set()
    for w, pin, pf, pers in itertools.product(workers, pin_memory, prefetch_factor, persistent_workers):
        key = (w, pin) if w == 0 else (w, pin, pf, pers)
        if key not in seen:
            seen.add(key)
            configs.append((w, pin, pf, pers))
    runs = {c: [] for c in configs}
    for _ in range(repeats):
        for c in configs:
            w, pin, pf, pers = c
            loader = make(dataset, batch_size, num_workers=w, pin_memory=pin, prefetch_factor=pf,
                          persistent_workers=pers)
            runs[c].append(time_loader(loader, epochs=epochs, max_batches=max_batches))
            del loader
    rows = []
    for (w, pin, pf, pers), rs in runs.items():
        rows.append({"num_workers": w, "pin_memory": pin, "prefetch_factor": pf if w else None,
                     "persistent_workers": pers if w else False, "batch_size": batch_size,
                     # how the workers were started (the platform's default: fork up to Python 3.13 on Linux,
                     # forkserver from 3.14, spawn on macOS/Windows); start-up costs differ between them
                     "start_method": torch.multiprocessing.get_start_method() if w else None,
                     "images_per_s": statistics.median(r["images_per_s"] for r in rs),
                     "first_epoch_images_per_s": statistics.median(r["first_epoch_images_per_s"] for r in rs),
                     "first_batch_s": statistics.median(r["first_batch_s"] for r in rs),
                     "repeats": [r["images_per_s"] for r in rs]})
    return rows


# --------------------------------------------------------------------------- training with a loader

def training_sweep(dataset: Dataset, *, num_workers: Iterable[int] = (0, 1, 2), batch_size: int = 128,
                   model: str = "net", steps: int = 50, warmup_steps: int = 5, pin_memory: bool = False,
                   device: str | torch.device = "cpu", tensor_baseline: bool = True, repeats: int = 1,
                   make=None, in_memory=None) -> list[dict]:
    """Training images/s and data-wait fraction per ``num_workers`` (persistent workers, so worker start-up is
    paid once, in the warm-up). With ``tensor_baseline`` a last row trains from in-memory batches
    (``in_memory(X_uint8, y, batch_size)``, default ``Uint8Batches``) built from the same images.
    ``repeats`` rounds, interleaved; each row reports the median and keeps every round's value (``repeats``)."""
    check_positive_int("repeats", repeats)
    make = make or make_loader
    in_memory = in_memory or Uint8Batches
    dev = select_device(str(device))
    feeds = [(f"DataLoader, {w} workers", w) for w in workers_list(num_workers)]
    if tensor_baseline:
        X, y = dataset_tensors(dataset)
        X_u8 = (X.squeeze(1) * STD + MEAN).mul_(255).round_().clamp_(0, 255).to(torch.uint8)
        feeds.append((f"in-memory batches on {dev.type}", None))
    runs = {name: [] for name, _ in feeds}
    for _ in range(repeats):
        for name, w in feeds:
            if w is None:
                batches = in_memory(X_u8.to(dev), y.to(dev), batch_size)
            else:
                batches = make(dataset, batch_size, num_workers=w, pin_memory=pin_memory, persistent_workers=w > 0)
            runs[name].append(train_with_loader(batches, model=model, steps=steps, warmup_steps=warmup_steps,
                                                device=device))
            del batches
    rows = []
    for name, w in feeds:
        rs = runs[name]
        med = statistics.median(r["images_per_s"] for r in rs)
        mid = min(rs, key=lambda r: abs(r["images_per_s"] - med))  # the round closest to the median
        rows.append({"loader": name, "num_workers": w,
                     "start_method": torch.multiprocessing.get_start_method() if w else None, **mid,
                     "images_per_s": med, "wait_fraction": statistics.median(r["wait_fraction"] for r in rs),
                     "repeats": [r["images_per_s"] for r in rs]})
    return rows


# --------------------------------------------------------------------------- worker memory

def worker_memory(dataset: Dataset, *, num_workers: int = 2, batch_size: int = 256,
                  multiprocessing_context: str | None = None, max_batches: int | None = None, make=None) -> dict:
    """Run one full pass with ``num_workers`` persistent workers, then read every worker's memory with
    psutil: USS (pages only this worker holds: what it really added), PSS (shared pages split between their
    sharers) and RSS (every page it maps, shared ones counted again in each process: the misleading number).
    Returns per-worker means in MiB next to the dataset's own size in the parent."""
    check_positive_int("num_workers", num_workers)
    gc.collect()
    loader = (make or make_loader)(dataset, batch_size, num_workers=num_workers, persistent_workers=True,
                                   multiprocessing_context=multiprocessing_context)
    it = iter(loader)
    for _ in first_batches(it, max_batches):
        pass
    workers = getattr(it, "_workers", None) or []
    pids = [w.pid for w in workers if w.pid]
    if not pids:
        raise RuntimeError("could not find the DataLoader worker processes (torch internals changed?)")
    infos = [psutil.Process(pid).memory_full_info() for pid in pids]
    parent = psutil.Process().memory_full_info()
    it._shutdown_workers()
    del it, loader
    mean = lambda key: statistics.mean(getattr(i, key) / MiB for i in infos)  # noqa: E731
    return {"num_workers": num_workers, "start_method": multiprocessing_context or torch.multiprocessing.get_start_method(),
            "dataset_mib": dataset_nbytes(dataset) / MiB, "worker_uss_mib": mean("uss"), "worker_pss_mib": mean("pss"),
            "worker_rss_mib": mean("rss"), "parent_uss_mib": parent.uss / MiB, "parent_rss_mib": parent.rss / MiB}


def memory_sweep(datasets: dict[str, Dataset], *, num_workers: int = 2, batch_size: int = 256,
                 start_methods: Iterable[str | None] = (None,), max_batches: int | None = None,
                 make=None) -> list[dict]:
    """``worker_memory`` for each named dataset and start method (``None``: the platform default: ``fork`` on Linux
    up to Python 3.13, ``forkserver`` from 3.14, ``spawn`` on macOS and Windows; name it when the lesson needs one).

    A worker's USS is never zero: the interpreter pages it writes after the fork are its own. So every start
    method is also measured on a 256-image baseline dataset, and ``added_uss_mib`` = USS - baseline USS is what
    the dataset itself cost each worker; ``copied_fraction`` = added / dataset size: about 0 means shared,
    about 1 means a whole private copy per worker."""
    if not datasets:
        raise ValueError("datasets must map at least one name to a Dataset")
    rows = []
    tiny = TensorDataset(torch.zeros(256, 1, 28, 28), torch.zeros(256, dtype=torch.int64))
    for method in start_methods:
        base = worker_memory(tiny, num_workers=num_workers, batch_size=batch_size, multiprocessing_context=method,
                             make=make)
        for name, ds in datasets.items():
            r = worker_memory(ds, num_workers=num_workers, batch_size=batch_size, multiprocessing_context=method,
                              max_batches=max_batches, make=make)
            r["dataset"] = name
            r["baseline_uss_mib"] = base["worker_uss_mib"]
            r["added_uss_mib"] = max(0.0, r["worker_uss_mib"] - base["worker_uss_mib"])
            r["copied_fraction"] = r["added_uss_mib"] / r["dataset_mib"] if r["dataset_mib"] else float("nan")
            rows.append(r)
    return rows


def disk_read_rate(path, *, repeats: int = 3, chunk: int = 1 << 20) -> dict:
    """MB/s reading ``path`` cold (after asking the kernel to drop it from the page cache with
    ``posix_fadvise(DONTNEED)``, which needs no root but is only a request) and warm (from the page cache)."""
    path = Path(path)
    size = path.stat().st_size

    def read(cold: bool) -> float:
        fd = os.open(path, os.O_RDONLY)
        try:
            if cold and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, chunk):
                pass
            return size / MiB / (time.perf_counter() - t0)
        finally:
            os.close(fd)

    cold = statistics.median(read(True) for _ in range(repeats))
    warm = statistics.median(read(False) for _ in range(repeats))
    return {"file": path.name, "mib": size / MiB, "cold_mib_per_s": cold, "warm_mib_per_s": warm}


# --------------------------------------------------------------------------- drop_last

def drop_last_effect(X: torch.Tensor, y: torch.Tensor, *, batch_size: int = 128, model: str = "net",
                     trials: int = 8, seed: int = 0) -> dict:
    """The small last batch, measured. With ``len(X) % batch_size = r`` left over, an epoch without
    ``drop_last`` ends with an r-image batch that gets the same learning rate as the others. We measure the
    relative error of a mini-batch gradient against the full-data gradient (same fixed model) for batches of
    ``batch_size`` and of ``r``: sampling noise grows like sqrt(batch_size / r). Also: do BatchNorm layers
    (``netbn``'s 2-d ones, and a 1-d one) accept a last batch of one sample in training mode?"""
    check_positive_int("batch_size", batch_size)
    check_positive_int("trials", trials)
    n = len(X)
    if n <= batch_size:
        raise ValueError(f"need more than batch_size={batch_size} images to have a last batch, got {n}")
    r = n % batch_size
    torch.manual_seed(seed)
    net = build_model(model)
    net.train()
    params = list(net.parameters())

    def grad(idx):  # not a training step: the gradient at one fixed model is read, never applied
        return torch.cat([g.flatten() for g in torch.autograd.grad(F.nll_loss(net(X[idx]), y[idx]), params)])

    full = sum(grad(torch.arange(s, min(s + 1024, n))) * min(1024, n - s) for s in range(0, n, 1024)) / n
    g = torch.Generator().manual_seed(seed)

    def rel_errs(size):
        return [float((grad(torch.randperm(n, generator=g)[:size]) - full).norm() / full.norm()) for _ in range(trials)]

    errs_full = rel_errs(batch_size)
    errs_last = rel_errs(r) if r else []
    err_full = statistics.median(errs_full)
    err_last = statistics.median(errs_last) if r else float("nan")

    def one_image(module, x):
        try:
            module.train()(x)
            return "accepted"
        except ValueError as e:
            return "ValueError: " + str(e)[:60]

    # BatchNorm2d also averages over the 26x26 positions, so one image still gives many values per channel;
    # BatchNorm1d after a linear layer has exactly one value per feature and refuses.
    bn_one = one_image(build_model("netbn"), X[:1])
    bn1d_one = one_image(torch.nn.BatchNorm1d(16), torch.randn(1, 16))
    steps_keep = math.ceil(n / batch_size)
    return {"images": n, "batch_size": batch_size, "last_batch": r, "steps_keep": steps_keep,
            "steps_drop": n // batch_size, "dropped_images": r,
            "grad_error_full_batch": err_full, "grad_error_last_batch": err_last,
            "grad_errors_full_batch": errs_full, "grad_errors_last_batch": errs_last,
            "noise_ratio": err_last / err_full if r else float("nan"),
            "expected_ratio": math.sqrt(batch_size / r) if r else float("nan"),
            "batchnorm_with_one_image": bn_one, "batchnorm1d_with_one_sample": bn1d_one}


# --------------------------------------------------------------------------- verdicts

def _repeats(row: dict) -> list[float]:
    return list(row.get("repeats") or [row["images_per_s"]])


def workers_verdict(sweep: list[dict], cores: int) -> dict:
    """"num_workers = 1/4-1/2 of the CPU cores", judged from one sweep (``loader_sweep`` or ``training_sweep`` rows
    with ``num_workers``, ``images_per_s`` and their ``repeats``). *holds*: the best worker count inside the rule's
    range is the fastest setting or reaches ``RULE_HOLDS`` (90%) of its images/s; *does not hold here*: it reaches
    less than ``RULE_FAILS`` (75%) and every repeat of the fastest is above every repeat of the rule's;
    *inconclusive*: in between, or a single repeat (no spread to judge by)."""
    rows = [r for r in sweep if r.get("num_workers") is not None]
    if not rows:
        raise ValueError("the sweep has no rows with num_workers; run loader_sweep or training_sweep first")
    best = max(rows, key=lambda r: r["images_per_s"])
    lo, hi = max(1, cores // 4), max(1, cores // 2)
    in_rule = [r for r in rows if lo <= r["num_workers"] <= hi]
    out = {"best_workers": best["num_workers"], "best_images_per_s": best["images_per_s"], "rule_low": lo,
           "rule_high": hi, "cores": cores}
    if not in_rule:
        return {**out, "verdict": "not testable here", "ratio": float("nan")}
    rule = max(in_rule, key=lambda r: r["images_per_s"])
    a, b = _repeats(rule), _repeats(best)
    out.update(rule_workers=rule["num_workers"], rule_images_per_s=rule["images_per_s"],
               ratio=rule["images_per_s"] / best["images_per_s"], rule_min=min(a), rule_max=max(a),
               best_min=min(b), best_max=max(b), repeats=min(len(a), len(b)))
    ratio = out["ratio"]
    if rule is best:
        verdict = "holds"
    elif min(len(a), len(b)) < 2:
        verdict = "inconclusive"          # one repeat: no spread to judge by
    elif ratio >= RULE_HOLDS:
        verdict = "holds"
    elif ratio < RULE_FAILS and separated(a, b):
        verdict = "does not hold here"
    else:
        verdict = "inconclusive"
    return {**out, "verdict": verdict}


def too_many_verdict(sweep: list[dict], cores: int, *, margin: float = 0.9) -> dict:
    """"Too many workers slow things down", judged from one sweep: the slowest worker count above the core count
    against the fastest setting. *holds*: every repeat of the fastest is above every repeat of the over-subscribed
    one; *does not hold here*: their repeats overlap and the medians are within ``margin`` (10%);
    *inconclusive*: overlapping repeats with a larger gap, or a single repeat."""
    rows = [r for r in sweep if r.get("num_workers") is not None]
    if not rows:
        raise ValueError("the sweep has no rows with num_workers; run loader_sweep or training_sweep first")
    best = max(rows, key=lambda r: r["images_per_s"])
    many = [r for r in rows if r["num_workers"] > cores]
    out = {"best_workers": best["num_workers"], "best_images_per_s": best["images_per_s"], "cores": cores}
    if not many:
        return {**out, "verdict": "not testable here", "ratio": float("nan")}
    worst = min(many, key=lambda r: r["images_per_s"])
    a, b = _repeats(worst), _repeats(best)
    ratio = worst["images_per_s"] / best["images_per_s"]
    out.update(many_workers=worst["num_workers"], many_images_per_s=worst["images_per_s"], ratio=ratio,
               many_min=min(a), many_max=max(a), best_min=min(b), best_max=max(b), repeats=min(len(a), len(b)))
    if min(len(a), len(b)) < 2:
        verdict = "inconclusive"
    elif separated(a, b) and max(a) < min(b):
        verdict = "holds"
    elif not separated(a, b) and ratio >= margin:
        verdict = "does not hold here"
    else:
        verdict = "inconclusive"
    return {**out, "verdict": verdict}


# --------------------------------------------------------------------------- the claims this lesson settles

RULE_HOLDS, RULE_FAILS = 0.90, 0.75   # the rule's worker count reaches >= 90% of the best: holds; < 75%: does not
DROP_MATTERS = 2.0                    # a last batch at least this much noisier (ratio_bounds' low end): worth dropping
COPY_LINE = 0.5                       # extra memory per worker >= half the dataset: a copy


def _busy(*contentions) -> bool:
    return any(c is not None and bool(c.get("busy") if isinstance(c, dict) else c.busy) for c in contentions)


def _cdict(c):
    return c if c is None or isinstance(c, dict) else c.to_dict()


def _combine(loader_v: str, train_v: str) -> str:
    both = {loader_v, train_v}
    if both == {"holds"}:
        return "holds"
    if "holds" in both and both <= {"holds", "does not hold here"}:
        return "holds with nuance"
    if both == {"does not hold here"}:
        return "does not hold here"
    return "inconclusive"


@dataclass(frozen=True, kw_only=True)
class Measured03:
    """What notebook 03 measured, the one input of :func:`claims_03` (its closing cell builds it once).

    How it ran: ``cores``, ``repeats``, torch ``threads``, ``profile``, ``cuda`` (a GPU present). The loader-only and
    training sweeps' rows (``loader_rows`` without persistent workers; ``train_rows``: ``training_sweep`` rows, the
    in-memory row has ``num_workers`` None), the pin_memory rows (``num_workers``, ``pin off img/s``, ``pin on
    img/s``) and whether torch warned that it ignores the flag (``pin_warned``), the disk read (``disk_read_rate``),
    ``memory_sweep`` rows and their ``memory_images``, the per-sample / per-batched costs, ``feed_rates`` rows,
    ``drop_last_effect``'s dict (``drop_note``: how its image count relates to the article's 60,000) and ``busy``:
    the ``claims.Contention`` (or dict) of each timing, keys ``loader``, ``train``, ``pin``, ``disk``, ``feed``."""
    cores: int
    repeats: int
    threads: int
    profile: str
    cuda: bool
    loader_rows: list[dict]
    train_rows: list[dict]
    pin_rows: list[dict]
    pin_warned: bool
    disk: dict
    memory_rows: list[dict]
    memory_images: int
    per_sample_us: list[float]
    per_batched_us: list[float]
    feed_rows: list[dict]
    drop: dict
    drop_note: str = ""
    busy: dict = field(default_factory=dict)


def claims_03(m: Measured03) -> list[dict]:
    """The seven claims notebook 03 settles, one dict each (``claims.ResultFile.claim``'s keyword arguments), from
    what it measured (:class:`Measured03`).

    Rules: ``03.workers_fraction`` (``workers_fraction_judgement``): not testable below 4 cores, where the rule's
    range is one worker count; else it follows the *training* sweep (what the rule is for; the loader-only sweep is
    reported): holds when the rule's best count reaches ``RULE_HOLDS`` of the best setting, does not hold below
    ``RULE_FAILS`` (outside the spread), inconclusive in between or with one repeat. ``03.pin_memory_cpu``: on a
    machine without a GPU, *demonstrated* when torch warns that it ignores the flag (the timings are context);
    with a GPU the CPU sentence is not testable here. ``03.drop_last`` (``drop_last_judgement``): holds when the
    last batch's gradient is ``DROP_MATTERS`` x noisier at the low end of the draws' quartile bounds; holds with
    nuance ("negligible here") when below it at their high end; inconclusive when the bounds straddle it. The
    others as the notebook explains them. Each claim is judged by its own ``_c03_<claim>``."""
    busy, cores = m.busy or {}, m.cores
    loader_rows = [r for r in m.loader_rows if r.get("num_workers") is not None]
    dl_train = [r for r in m.train_rows if r.get("num_workers") is not None]
    regime = (f"article's Net and DataLoader (torchvision MNIST, ToTensor + Normalize), batch 128, torch threads "
              f"{m.threads}, {cores} cores, {m.repeats} interleaved repeat(s), {m.profile} profile")
    return [_c03_workers_fraction(loader_rows, dl_train, cores, busy, regime),
            _c03_too_many_workers(loader_rows, dl_train, cores, busy, regime),
            _c03_pin_memory_cpu(m.pin_rows, m.pin_warned, m.cuda, busy, regime),
            _c03_disk_io(loader_rows, m.disk, busy, regime),
            _c03_worker_copies(m.memory_rows, m.memory_images, regime),
            _c03_in_memory(m.feed_rows, m.train_rows, dl_train, m.per_sample_us, m.per_batched_us, m.repeats, busy,
                           regime),
            _c03_drop_last(m.drop, m.drop_note, regime)]


def _c03_workers_fraction(loader_rows, dl_train, cores, busy, regime) -> dict:
    """num_workers = 1/4-1/2 of the cores."""
    wl, wt = workers_verdict(loader_rows, cores), workers_verdict(dl_train, cores)
    n = {"loader_best_workers": wl["best_workers"], "loader_best_img_s": wl["best_images_per_s"],
         "loader_rule_img_s": wl.get("rule_images_per_s"), "loader_rule_ratio": wl["ratio"],
         "train_best_workers": wt["best_workers"], "train_best_img_s": wt["best_images_per_s"],
         "train_rule_img_s": wt.get("rule_images_per_s"), "train_rule_ratio": wt["ratio"],
         "rule_workers": wt.get("rule_workers"), "cores": cores, "holds_at": RULE_HOLDS, "fails_below": RULE_FAILS,
         "loader_repeats": {str(r["num_workers"]): _repeats(r) for r in loader_rows},
         "train_repeats": {str(r["num_workers"]): _repeats(r) for r in dl_train}}
    verdict, evidence = workers_fraction_judgement(n, _busy(busy.get("loader"), busy.get("train")))
    return dict(id="03.workers_fraction", verdict=verdict, numbers=n, regime=regime,
                contention=_cdict(busy.get("train")), evidence=evidence)


def rule_range(cores: int) -> tuple[int, int]:
    """The worker counts "1/4 to 1/2 of the CPU cores" names on ``cores`` cores (at least 1): (lowest, highest)."""
    return max(1, cores // 4), max(1, cores // 2)


def workers_fraction_judgement(n: dict, busy: bool) -> tuple[str, str]:
    """03.workers_fraction's verdict and evidence from its recorded numbers (``cores`` and the sweeps' repeats by
    worker count), so a kept result can be judged again. *not testable here* when the rule's range holds a single
    worker count (fewer than 4 cores: 1/4 and 1/2 of 2 cores both give 1 worker, so the fraction cannot be told from
    "one worker"); then no verdict on a busy machine; else ``workers_verdict`` of the training sweep."""
    lo, hi = rule_range(n["cores"])
    context = (f"training Net: best {n['train_best_img_s']:,.0f} img/s at {n['train_best_workers']} workers, the "
               f"rule's {n['rule_workers']} reaches {n['train_rule_ratio']:.0%}; loader only: best "
               f"{n['loader_best_img_s']:,.0f} img/s at {n['loader_best_workers']} workers, the rule's "
               f"{n['loader_rule_ratio']:.0%}")
    if hi == lo:
        return "not testable here", (f"on {n['cores']} cores 1/4 to 1/2 of the cores is {lo} worker only: the rule's "
                                     f"fraction cannot be told from 'one worker' at this core count (testable from 4 "
                                     f"cores); measured, for context: {context}")
    if busy:
        return BUSY, context
    rows = [{"num_workers": int(w), "images_per_s": statistics.median(v), "repeats": v}
            for w, v in n["train_repeats"].items()]
    return (workers_verdict(rows, n["cores"])["verdict"],
            context + f" (holds at >= {RULE_HOLDS:.0%}, not below {RULE_FAILS:.0%} outside the spread)")


def _c03_too_many_workers(loader_rows, dl_train, cores, busy, regime) -> dict:
    """Too many workers slow things down."""
    ml, mt = too_many_verdict(loader_rows, cores), too_many_verdict(dl_train, cores)
    verdict = BUSY if _busy(busy.get("loader"), busy.get("train")) else _combine(ml["verdict"], mt["verdict"])
    n = {"loader_many_workers": ml.get("many_workers"), "loader_many_ratio": ml["ratio"],
         "loader_many_min": ml.get("many_min"), "loader_many_max": ml.get("many_max"),
         "loader_best_min": ml.get("best_min"), "loader_best_max": ml.get("best_max"),
         "train_many_workers": mt.get("many_workers"), "train_many_ratio": mt["ratio"],
         "train_many_min": mt.get("many_min"), "train_many_max": mt.get("many_max"),
         "train_best_min": mt.get("best_min"), "train_best_max": mt.get("best_max"), "cores": cores}
    return dict(id="03.too_many_workers", verdict=verdict, numbers=n, regime=regime,
                contention=_cdict(busy.get("loader")),
                evidence=(f"{n['loader_many_workers']} workers on {cores} cores: loader only "
                          f"{n['loader_many_ratio']:.0%} of the best ({(n['loader_many_min'] or 0):,.0f}-"
                          f"{(n['loader_many_max'] or 0):,.0f} vs {(n['loader_best_min'] or 0):,.0f}-"
                          f"{(n['loader_best_max'] or 0):,.0f} img/s), training {n['train_many_ratio']:.0%} of the "
                          "best"))


def _c03_pin_memory_cpu(pin_rows, pin_warned, cuda, busy, regime) -> dict:
    """pin_memory is meaningless on CPU."""
    ratios = {r["num_workers"]: r["pin on img/s"] / r["pin off img/s"] for r in pin_rows}
    verdict = "not testable here" if cuda else "demonstrated" if pin_warned else "inconclusive"
    n = {"torch_warns": bool(pin_warned), "gpu": bool(cuda), **{f"on_off_ratio_{w}_workers": v for w, v in ratios.items()}}
    return dict(id="03.pin_memory_cpu", verdict=verdict, numbers=n, regime=regime,
                contention=_cdict(busy.get("pin")),
                evidence=(("a GPU is present, so torch pins: the CPU-only sentence cannot be tested here"
                           if cuda else "torch warns and ignores the flag" if pin_warned else
                           "no GPU, yet torch did not warn")
                          + "; on/off img/s (context, not judged) " + ", ".join(
                              f"{v:.2f} at {w} workers" for w, v in ratios.items())))


def _c03_disk_io(loader_rows, disk, busy, regime) -> dict:
    """The loader bottleneck is often disk I/O."""
    best_loader = max(r["images_per_s"] for r in loader_rows)
    need = best_loader * 784 / 2**20
    margin = disk["cold_mib_per_s"] / need
    verdict = BUSY if _busy(busy.get("disk"), busy.get("loader")) else (
        "does not hold here" if margin > 10 else "holds" if margin < 1 else "inconclusive")
    n = {"cold_mib_per_s": disk["cold_mib_per_s"], "warm_mib_per_s": disk["warm_mib_per_s"], "need_mib_per_s": need,
         "margin": margin, "best_loader_img_s": best_loader}
    return dict(id="03.disk_io", verdict=verdict, numbers=n, regime=regime, contention=_cdict(busy.get("disk")),
                evidence=(f"cold read {n['cold_mib_per_s']:,.0f} MiB/s against {need:.1f} MiB/s consumed by the "
                          f"fastest loader ({margin:,.0f}x headroom; under 1x: the disk, over 10x: not the disk)"))


def _c03_worker_copies(memory_rows, memory_images, regime) -> dict:
    """Each worker copies the whole dataset."""
    def copied(name, method):
        return next((r["copied_fraction"] for r in memory_rows if r["dataset"] == name
                     and r["start_method"] == method), None)
    fork_tv, fork_t, fork_py, spawn_tv = (copied("torchvision", "fork"), copied("tensor", "fork"),
                                          copied("pylist", "fork"), copied("torchvision", "spawn"))
    if fork_tv is None:
        verdict = "holds" if spawn_tv >= COPY_LINE else "wrong"
    elif max(fork_tv, fork_t) < COPY_LINE:
        verdict = "holds with nuance" if spawn_tv >= COPY_LINE or fork_py >= COPY_LINE else "wrong"
    else:
        verdict = "holds"
    n = {"fork_torchvision": fork_tv, "fork_tensor": fork_t, "fork_pylist": fork_py, "spawn_torchvision": spawn_tv,
         "images": memory_images, "rss_mib": statistics.median(r["worker_rss_mib"] for r in memory_rows)}
    return dict(id="03.worker_copies", verdict=verdict, numbers=n, regime=regime + f"; {memory_images:,} images, "
                "2 workers",
                evidence=("extra USS per worker as a share of the dataset: " + (
                    f"fork: torchvision {fork_tv:.0%}, tensor {fork_t:.0%}, list of Python objects {fork_py:.0%}; "
                    if fork_tv is not None else "") + f"spawn: torchvision {spawn_tv:.0%}; RSS ~{n['rss_mib']:,.0f} "
                    "MiB per worker in every case (what makes the claim look true)"))


def _c03_in_memory(feed_rows, train_rows, dl_train, per_sample_us, per_batched_us, repeats, busy, regime) -> dict:
    """Keep small datasets in memory."""
    best_feed = max((r for r in feed_rows if not r["feed"].startswith("DataLoader")), key=lambda r: r["images_per_s"])
    best_dl_feed = max((r for r in feed_rows if r["feed"].startswith("DataLoader")), key=lambda r: r["images_per_s"])
    feed_ratio = best_feed["images_per_s"] / best_dl_feed["images_per_s"]
    feed_apart = separated(_repeats(best_feed), _repeats(best_dl_feed)) and feed_ratio > 1
    mem_train = next(r for r in train_rows if r.get("num_workers") is None)
    best_dl = max(dl_train, key=lambda r: r["images_per_s"])
    train_ratio = mem_train["images_per_s"] / best_dl["images_per_s"]
    train_apart = separated(_repeats(mem_train), _repeats(best_dl)) and repeats > 1
    if _busy(busy.get("feed"), busy.get("train")):
        verdict = BUSY
    elif repeats < 2:
        verdict = "inconclusive"
    elif not feed_apart:
        verdict = "does not hold here"
    else:
        verdict = "holds" if train_apart and train_ratio > 1 else "holds with nuance"
    n = {"feed_ratio": feed_ratio, "train_ratio": train_ratio, "per_sample_us": statistics.median(per_sample_us),
         "per_image_batched_us": statistics.median(per_batched_us),
         "train_in_memory_img_s": mem_train["images_per_s"], "train_dataloader_img_s": best_dl["images_per_s"],
         "train_in_memory_repeats": _repeats(mem_train), "train_dataloader_repeats": _repeats(best_dl)}
    return dict(id="03.in_memory", verdict=verdict, numbers=n, regime=regime, contention=_cdict(busy.get("feed")),
                evidence=(f"feeding: in-memory batches {feed_ratio:,.0f}x the best DataLoader; per image "
                          f"{n['per_sample_us']:.1f} µs of PIL/ToTensor vs {n['per_image_batched_us']:.2f} µs "
                          f"batched (both from RAM, no disk reads); training Net: {train_ratio:.2f}x "
                          f"({n['train_in_memory_img_s']:,.0f} vs {n['train_dataloader_img_s']:,.0f} img/s)"))


def _c03_drop_last(drop, drop_note, regime) -> dict:
    """drop_last avoids a small last batch."""
    n = {"noise_ratio": drop["noise_ratio"], "expected_ratio": drop["expected_ratio"], "last_batch": drop["last_batch"],
         "images": drop["images"], "batch_size": drop["batch_size"], "steps_per_epoch": drop["steps_keep"],
         "matters_at": DROP_MATTERS, "errors_full_batch": drop["grad_errors_full_batch"],
         "errors_last_batch": drop["grad_errors_last_batch"]}
    verdict, evidence = drop_last_judgement(n)
    return dict(id="03.drop_last", verdict=verdict, numbers=n, evidence=evidence,
                regime=regime + f"; gradients at one fixed Net, {drop['images']:,} images" + (
                    f" ({drop_note})" if drop_note else ""))


def ratio_bounds(a: list[float], b: list[float]) -> tuple[float, float]:
    """How far the ratio a/b of two sets of draws can be trusted: (lowest, highest) from their interquartile ends,
    q1(a)/q3(b) and q3(a)/q1(b) (claims.spread's quartiles)."""
    from mnist_helpers.course.claims import spread
    sa, sb = spread(a), spread(b)
    return sa["q1"] / sb["q3"], sa["q3"] / sb["q1"]


def drop_last_judgement(n: dict) -> tuple[str, str]:
    """03.drop_last's verdict and evidence from its recorded numbers (a kept result can be judged again). The small
    last batch's gradient against a full batch's (relative error to the full-data gradient, ``trials`` draws each):
    *holds* (worth dropping) when the noise ratio is at least ``DROP_MATTERS`` even at the low end of
    ``ratio_bounds``; *holds with nuance* ("negligible here": drop_last does avoid the batch, which does no
    measurable harm) when even the high end stays below ``DROP_MATTERS``; *inconclusive* when the draws cannot tell
    (the bounds straddle it); *not testable here* without a last batch."""
    last = n["last_batch"]
    steps = n["steps_per_epoch"]
    batch = n.get("batch_size") or round((n["images"] - last) / max(steps - 1, 1))
    if not last:
        return "not testable here", (f"{n['images']:,} images at batch {batch} leave no last batch: nothing to drop")
    lo, hi = ratio_bounds(n["errors_last_batch"], n["errors_full_batch"])
    n.update(ratio_low=lo, ratio_high=hi)
    if lo >= DROP_MATTERS:
        verdict, word = "holds", f"at least {DROP_MATTERS:.0f}x noisier: worth dropping"
    elif hi < DROP_MATTERS:
        verdict, word = "holds with nuance", f"negligible here: under {DROP_MATTERS:.0f}x noisier, on 1 step in {steps}"
    else:
        verdict, word = "inconclusive", f"the draws cannot tell whether it reaches {DROP_MATTERS:.0f}x"
    return verdict, (f"{n['images']:,} images at batch {batch} leave a {last}-image last batch, 1 step of {steps} per "
                     f"epoch, whose gradient is {n['noise_ratio']:.2f}x noisier (theory {n['expected_ratio']:.2f}x; "
                     f"{lo:.2f}-{hi:.2f}x from the quartiles of {len(n['errors_last_batch'])} draws each): {word}")


def rejudge(entry: dict) -> dict:
    """A kept result's 03.workers_fraction or 03.drop_last entry judged again by today's rule from its own numbers
    (``workers_fraction_judgement``, ``drop_last_judgement``): the entry with its verdict, evidence, numbers and
    rule replaced; its regime and contention stay the measurement's."""
    from mnist_helpers.course.claims import rule
    n = dict(entry["numbers"])
    if entry["id"] == "03.workers_fraction":
        verdict, evidence = workers_fraction_judgement(n, bool((entry.get("contention") or {}).get("busy")))
        n.update(holds_at=RULE_HOLDS, fails_below=RULE_FAILS)
    elif entry["id"] == "03.drop_last":
        n.setdefault("batch_size", round((n["images"] - n["last_batch"]) / max(n["steps_per_epoch"] - 1, 1)))
        verdict, evidence = drop_last_judgement(n)
    else:
        raise ValueError(f"l03.rejudge judges 03.workers_fraction and 03.drop_last, not {entry['id']}")
    return {**entry, "verdict": verdict, "evidence": evidence, "numbers": n, "rule": rule(entry["id"])}


# --------------------------------------------------------------------------- the widget

def _line(r: dict) -> str:
    """One measurement as a sentence (settings, then rates): one line per press of *Measure*."""
    return (f"num_workers={r['num_workers']}, pin_memory={r['pin_memory']}, prefetch_factor={r['prefetch_factor']}, "
            f"persistent_workers={r['persistent_workers']}, batch_size={r['batch_size']}: "
            f"{r['images_per_s']:,.0f} img/s steady, {r['first_epoch_images_per_s']:,.0f} img/s first epoch, "
            f"first batch after {r['first_batch_s']:.2f} s")


def measure(dataset, *, num_workers: int, batch_size: int, pin_memory: bool = False, prefetch_factor: int = 2,
            persistent_workers: bool = False, max_batches: int | None = 20) -> list[dict]:
    """One ``loader_sweep`` row for these settings, printed as a sentence."""
    rows = loader_sweep(dataset, num_workers=(num_workers,), batch_size=batch_size, pin_memory=(pin_memory,),
                        prefetch_factor=(prefetch_factor,), persistent_workers=(persistent_workers,), epochs=2,
                        max_batches=max_batches)
    for r in rows:
        print(_line(r))
    return rows


def loader_widget(dataset, *, num_workers: int = 0, batch_size: int = 128, pin_memory: bool = False,
                  prefetch_factor: int = 2, persistent_workers: bool = False, max_batches: int | None = 20,
                  max_workers: int = 8, interactive: bool = True) -> list[dict]:
    """Measure once with these settings (printed: the static output), then, if ``interactive``, display
    controls to measure again. Returns the first measurement's rows."""
    rows = measure(dataset, num_workers=num_workers, batch_size=batch_size, pin_memory=pin_memory,
                   prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, max_batches=max_batches)
    w = widgets(interactive, "the static result above is all this cell shows")
    if w is None:
        return rows
    from IPython.display import display
    controls = {
        "num_workers": w.IntSlider(value=num_workers, min=0, max=max_workers, description="num_workers"),
        "batch_size": w.Dropdown(options=[32, 64, 128, 256, 512, 1024], value=batch_size, description="batch_size"),
        "pin_memory": w.Checkbox(value=pin_memory, description="pin_memory"),
        "prefetch_factor": w.IntSlider(value=prefetch_factor, min=1, max=8, description="prefetch"),
        "persistent_workers": w.Checkbox(value=persistent_workers, description="persistent"),
    }
    button = w.Button(description="Measure", button_style="primary")
    out = w.Output()

    def run(_):
        with out:
            measure(dataset, max_batches=max_batches, **{k: c.value for k, c in controls.items()})

    button.on_click(run)
    display(w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:] + [button]), out]))
    return rows
