"""How fast batches reach the model: DataLoader vs in-memory tensors, the measurement behind notebook 03's in-memory
claim and ``scripts/bench_loader.py``; shared by the lesson (``lessons/n03/lesson``) and that script.

- ``Uint8Batches``: shuffled batches from uint8 pixels held in memory (CPU or GPU), normalised per batch;
  ``raw_uint8``: the raw training pixels and labels from the verified IDX files;
- ``feed_rates``: in-memory tensor batches (float32, or ``Uint8Batches``), GPU-resident batches and the DataLoader
  with per-sample transforms, measured side by side (images/s delivered to the training device, every pass kept).
"""
from __future__ import annotations

import itertools
import statistics
import time
from typing import Iterable

import torch
from torch.utils.data import Subset

from mnist_helpers.data import MEAN, STD, TensorBatches, make_loader, mnist_datasets, read_idx, verify_mnist
from mnist_helpers.resources import gpu_count


def check_positive_int(name: str, value) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an integer >= 1 (a bool is not)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def workers_list(num_workers: Iterable[int]) -> list[int]:
    """``num_workers`` as a list of integers >= 0, at least one (ValueError otherwise)."""
    out = list(num_workers)
    if not out:
        raise ValueError("num_workers must list at least one value, e.g. (0, 1, 2)")
    for w in out:
        if not isinstance(w, int) or isinstance(w, bool) or w < 0:
            raise ValueError(f"num_workers values must be integers >= 0, got {w!r}")
    return out


def first_batches(iterable, max_batches):
    """The first ``max_batches`` items of ``iterable`` (all of them when None)."""
    return iterable if max_batches is None else itertools.islice(iterable, max_batches)


# --------------------------------------------------------------------------- tensor batches vs DataLoader

class Uint8Batches:
    """Shuffled batches from uint8 pixels held in memory (on CPU or GPU), normalised per *batch*, not per sample:
    a quarter of the float32 memory traffic, and the per-sample Python work of a Dataset disappears."""

    def __init__(self, X_uint8: torch.Tensor, y: torch.Tensor, batch_size: int, *, seed: int = 0):
        check_positive_int("batch_size", batch_size)
        if len(X_uint8) != len(y):
            raise ValueError(f"X and y must have the same length, got {len(X_uint8)} and {len(y)}")
        if X_uint8.dtype != torch.uint8:
            raise ValueError(f"X_uint8 must be a uint8 tensor of raw pixels, got {X_uint8.dtype}")
        self.X, self.y, self.batch_size, self.seed, self.epoch = X_uint8, y, batch_size, seed, 0
        self._scale = torch.tensor(1.0 / (255.0 * STD), device=X_uint8.device)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-len(self.X) // self.batch_size)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        idx = torch.randperm(len(self.X), generator=g).to(self.X.device)
        for start in range(0, len(idx), self.batch_size):
            b = idx[start:start + self.batch_size]
            x = self.X.index_select(0, b).float().mul_(self._scale).sub_(MEAN / STD)
            yield x.unsqueeze(1), self.y.index_select(0, b)


def raw_uint8(root=None, subset: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw training pixels as uint8 ``(N, 28, 28)`` and labels, straight from the verified IDX files."""
    rdir = verify_mnist(root)
    X = torch.from_numpy(read_idx(rdir / "train-images-idx3-ubyte")[:subset].copy())
    y = torch.from_numpy(read_idx(rdir / "train-labels-idx1-ubyte")[:subset].astype("int64"))
    return X, y


def _rate(make_batches, epochs: int, max_batches: int | None, device: torch.device) -> list[float]:
    """Images/s of each of ``epochs`` passes after one warm-up pass; each batch is touched on the device."""
    rates = []
    for epoch in range(epochs + 1):
        batches = make_batches(epoch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        n, t0 = 0, time.perf_counter()
        for X, _ in first_batches(batches, max_batches):
            X = X.to(device, non_blocking=True)
            n += len(X)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if epoch:  # epoch 0 is the warm-up
            rates.append(n / (time.perf_counter() - t0))
    return rates


def feed_rates(root=None, *, subset: int | None = None, batch_size: int = 128, num_workers: Iterable[int] = (0,),
               epochs: int = 3, dataloader_max_batches: int | None = None, make=None, in_memory=None) -> list[dict]:
    """Images/s delivered to the training device by each way of feeding it, measured side by side in this call.
    ``ratio_vs_dataloader`` divides by the DataLoader (per-sample transforms) with the *fastest* worker count
    measured here, so the ratio never flatters the in-memory loaders. GPU-resident rows appear only with CUDA.
    ``make`` builds the DataLoader, ``in_memory(X_uint8, y, batch_size)`` the uint8 batches normalised per batch
    (defaults: ``data.make_loader``, ``Uint8Batches``). Each row keeps every pass's rate (``repeats``)."""
    make = make or make_loader
    in_memory = in_memory or Uint8Batches
    check_positive_int("batch_size", batch_size)
    check_positive_int("epochs", epochs)
    workers = workers_list(num_workers)
    cpu = torch.device("cpu")
    X_u8, y = raw_uint8(root, subset)
    X_f32 = X_u8.unsqueeze(1).float().div_(255.0).sub_(MEAN).div_(STD)
    rows = []

    def add(name, device, make_batches, max_batches=None, note=""):
        rs = _rate(make_batches, epochs, max_batches, device)
        rows.append({"feed": name, "device": device.type, "images_per_s": statistics.median(rs), "note": note,
                     "repeats": rs})

    devices = [cpu] + ([torch.device("cuda")] if gpu_count() else [])  # counted without starting the driver
    for dev in devices:
        Xd, yd, Xu = X_f32.to(dev), y.to(dev), X_u8.to(dev)
        where = "GPU-resident" if dev.type == "cuda" else "in memory"
        add(f"TensorBatches float32 ({where})", dev,
            lambda e, Xd=Xd, yd=yd: _with_epoch(TensorBatches(Xd, yd, batch_size, seed=0), e))
        add(f"uint8, normalised per batch ({where})", dev,
            lambda e, Xu=Xu, yd=yd: _with_epoch(in_memory(Xu, yd, batch_size), e))
    ds, _ = mnist_datasets(root)
    if subset:
        ds = Subset(ds, range(subset))
    target = devices[-1]
    for w in workers:
        loaders = {}

        def dataloader(e, w=w, loaders=loaders):
            if "l" not in loaders:  # persistent workers: start-up paid in the warm-up pass
                loaders["l"] = make(ds, batch_size, num_workers=w, persistent_workers=w > 0,
                                    pin_memory=target.type == "cuda")
            return loaders["l"]
        add(f"DataLoader + per-sample transforms, {w} workers", target, dataloader, dataloader_max_batches,
            note="to GPU, pinned" if target.type == "cuda" else "")
        loaders.clear()
    best_dl = max(r["images_per_s"] for r in rows if r["feed"].startswith("DataLoader"))
    for r in rows:
        r["ratio_vs_dataloader"] = r["images_per_s"] / best_dl
    return rows


def _with_epoch(batches, epoch):
    batches.set_epoch(epoch)
    return batches
