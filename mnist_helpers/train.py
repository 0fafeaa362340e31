"""The training core shared by notebooks and workers (introduced in 00_setup_and_data, used from 02 on).

``TrainConfig`` holds every knob with a one-line help; ``TrainConfig.from_args`` turns it into command
line flags (``--batch-size 64``), so workers and notebooks speak the same vocabulary.
``fit(cfg)`` trains one process and returns its per-epoch history; DDP workers compose the same
pieces (``build_training``, ``make_train_batches``, ``train_one_epoch``, ``evaluate``) around a
process group, so single-device and distributed runs share one training loop.

Snapshots (``save_snapshot``/``load_snapshot``) carry a format tag, a version and the settings that
define the run; loading validates all three (``torch.load(weights_only=True)`` only) and refuses, with
the difference named, a file that is not a snapshot of the series or one from another configuration.
``check_run`` checks before training what a run could fail on later (data, output paths, snapshot).

Conventions: ``batch_size`` is per process and per optimizer step; ``grad_accum`` splits it into that
many micro-batches (same optimisation, less activation memory); the global batch is
``batch_size * world_size``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mnist_helpers.errors import ConfigError, SnapshotError
from mnist_helpers.models import MODELS, build_model

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _f(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    """Everything one training run needs. Every field is a ``--flag`` of the workers."""

    model: str = _f("net", "model: net (the article's), netbn (with BatchNorm), fastnet (small, fast)")
    num_epochs: int = _f(1, "passes over the training set", flag="epochs")
    batch_size: int = _f(128, "images per optimizer step, per process (global batch = batch_size x world_size)")
    test_batch_size: int = _f(256, "images per evaluation batch")
    lr: float = _f(1e-3, "learning rate (peak rate with the onecycle scheduler)")
    optimizer: str = _f("adam", "adam (the article's) or sgd (momentum 0.9)")
    scheduler: str = _f("none", "none, or onecycle (warm-up then anneal, per step)")
    amp: str = _f("none", "mixed precision: none, bf16, or fp16 (with GradScaler)")
    grad_accum: int = _f(1, "micro-batches per optimizer step; batch_size must divide evenly")
    seed: int = _f(0, "seed for weights, shuffling and dropout")
    subset: int | None = _f(None, "train on the first N training images only (None: all 60,000)")
    max_steps: int | None = _f(None, "stop after this many optimizer steps in total (None: no limit)")
    loader: str = _f("tensor", "tensor (in-memory batches) or dataloader (torchvision Dataset + DataLoader)")
    num_workers: int = _f(0, "DataLoader worker processes (loader=dataloader only)")
    pin_memory: bool = _f(False, "pinned host memory for faster copies to a GPU (loader=dataloader only)")
    device: str = _f("auto", "auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    threads: int | None = _f(None, "torch.set_num_threads for this process (None: leave as is)")
    channels_last: bool = _f(False, "NHWC memory format for images and convolution weights")
    data_root: str | None = _f(None, "folder holding MNIST/raw (None: MNIST_DATA_ROOT or data/ in the checkout)")
    progress: bool = _f(False, "show a tqdm progress bar per epoch")

    def __post_init__(self):
        self.validate()

    def validate(self) -> "TrainConfig":
        """Raise ConfigError (a ValueError) with a message that says what is wrong and what is allowed."""
        def positive_int(name, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")

        for name in ("num_epochs", "batch_size", "test_batch_size", "grad_accum"):
            positive_int(name)
        for name in ("subset", "max_steps", "threads"):
            positive_int(name, allow_none=True)
        if self.subset is not None and self.subset > 60000:
            raise ConfigError(f"subset must be at most 60000 (the training set), got {self.subset}")
        if not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"lr must be a positive finite number, got {self.lr!r}")
        choices = {"model": tuple(MODELS), "optimizer": ("adam", "sgd"), "scheduler": ("none", "onecycle"),
                   "amp": tuple(AMP_DTYPES), "loader": ("tensor", "dataloader")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}): "
                             f"each optimizer step is split into grad_accum equal micro-batches")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if not (self.device in ("auto", "cpu", "cuda", "mps") or str(self.device).startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps; got {self.device!r}")
        return self

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def global_batch_size(self, world_size: int) -> int:
        """Images per optimizer step over all processes: ``batch_size`` is per process."""
        return self.batch_size * world_size

    def with_global_batch(self, global_batch: int, world_size: int) -> "TrainConfig":
        """This config with ``batch_size`` set so that ``world_size`` processes together take ``global_batch``
        images per step (the article's 5.4: 1 x 128 against 2 x 64); refuses a split that is not exact."""
        if world_size < 1 or global_batch % world_size:
            raise ConfigError(f"a global batch of {global_batch} does not split evenly over {world_size} "
                              f"process(es): choose a multiple of {world_size}")
        return self.replace(batch_size=global_batch // world_size)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one ``--flag`` per field (``--epochs`` for num_epochs), typed from the defaults."""
        for f in dataclasses.fields(cls):
            flag = "--" + f.metadata.get("flag", f.name).replace("_", "-")
            names = [flag] + ([f"--{f.name.replace('_', '-')}"] if "flag" in f.metadata else [])
            if isinstance(f.default, bool):
                parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction,
                                    default=f.default, help=f.metadata["help"])
                continue
            kind = {"int | None": _optional(int), "str | None": _optional(str), "int": int,
                    "float": float, "str": str}[str(f.type)]
            parser.add_argument(*names, dest=f.name, type=kind, default=f.default,
                                help=f"{f.metadata['help']} (default: {f.default})")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> "TrainConfig":
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> "TrainConfig":
        parser = argparse.ArgumentParser()
        cls.add_arguments(parser)
        return cls.from_namespace(parser.parse_args(argv))

    def to_args(self) -> list[str]:
        """The flags that reproduce this config (only those that differ from the defaults)."""
        args = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v == f.default:
                continue
            flag = "--" + f.metadata.get("flag", f.name).replace("_", "-")
            if isinstance(v, bool):
                args.append(flag if v else "--no-" + flag[2:])
            else:
                args += [flag, str(v)]
        return args


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)
    parse.__name__ = kind.__name__
    return parse


# --------------------------------------------------------------------------- set-up

def accelerator() -> str | None:
    """The type of this machine's accelerator ("cuda", "mps", "xpu", ...) or None: asked through
    ``torch.accelerator`` (torch >= 2.6), which knows Apple's MPS and Intel's XPU as well as CUDA. CUDA GPUs are
    counted through NVML (:func:`mnist_helpers.resources.gpu_count`): ``torch.accelerator.is_available()`` would
    call ``torch.cuda.is_available()``, which starts the CUDA driver, and a fork after that cannot use CUDA."""
    from mnist_helpers.resources import gpu_count

    acc = getattr(torch, "accelerator", None)
    if acc is None or not hasattr(acc, "current_accelerator"):
        return "cuda" if gpu_count() else None
    kind = acc.current_accelerator()  # the accelerator torch was built for; asks no driver
    if kind is None:
        return None
    if kind.type == "cuda":
        return "cuda" if gpu_count() else None
    return kind.type if acc.is_available() else None


def select_device(spec: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto``: this process's accelerator (``cuda:LOCAL_RANK``, or Apple's ``mps``, Intel's ``xpu``) when there
    is one, else the CPU. The DDP lessons use CUDA GPUs only (NCCL); elsewhere they run on the CPU with gloo."""
    if spec == "auto":
        kind = accelerator()
        if kind is None:
            return torch.device("cpu")
        count = torch.accelerator.device_count() if hasattr(torch, "accelerator") else torch.cuda.device_count()
        return torch.device(kind, local_rank % max(count, 1)) if kind in ("cuda", "xpu") else torch.device(kind)
    dev = torch.device(spec)
    if dev.type != "cpu" and accelerator() != dev.type:
        raise ConfigError(f"device {spec!r} was asked for but {dev.type} is not available here (this machine's "
                          f"accelerator: {accelerator() or 'none'})",
                          "use --device cpu (or auto, which picks the best device here)")
    return dev


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU): call it before reading a clock around GPU work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so a run can be repeated."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_amp(amp: str, device: torch.device) -> None:
    """Fail early, with a clear message, when this device cannot autocast to the requested dtype.

    Catches three cases: an unknown name; an exception from autocast; and the quiet one, where
    autocast warns "Disabling autocast" (or computes in another dtype) and training would silently
    run in fp32."""
    if amp not in AMP_DTYPES:
        raise ConfigError(f"amp must be one of {', '.join(AMP_DTYPES)}; got {amp!r}")
    dtype = AMP_DTYPES[amp]
    if dtype is None:
        return
    device = torch.device(device)
    if device.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"amp='bf16' needs a GPU with bfloat16 support ({torch.cuda.get_device_name(device)} "
                         "has none); use amp='fp16' (with GradScaler) or amp='none'")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device.type, dtype=dtype):
                conv = nn.Conv2d(1, 2, 3).to(device)
                out = conv(torch.zeros(1, 1, 5, 5, device=device))
    except Exception as e:
        raise ConfigError(f"amp={amp!r} is not supported on {device} with torch {torch.__version__} "
                         f"({type(e).__name__}: {e}); use amp='bf16' or amp='none'") from None
    disabled = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
    if disabled or out.dtype != dtype:
        why = disabled[0].splitlines()[0] if disabled else f"a convolution returned {out.dtype}"
        raise ConfigError(f"amp={amp!r} does not run on {device} with torch {torch.__version__}: {why}; "
                         "use amp='bf16' or amp='none'")


@dataclass
class Training:
    """The objects one run trains with (what a snapshot saves)."""
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    scaler: torch.amp.GradScaler | None
    device: torch.device


def build_training(cfg: TrainConfig, device: torch.device, steps_per_epoch: int) -> Training:
    """Model (seeded), optimizer, optional OneCycle scheduler and, for fp16, a GradScaler."""
    check_amp(cfg.amp, device)
    seed_everything(cfg.seed)
    model = build_model(cfg.model).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if cfg.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, nesterov=True)
    sched = None
    if cfg.scheduler == "onecycle":
        total = steps_per_epoch * cfg.num_epochs
        if cfg.max_steps:
            total = min(total, cfg.max_steps)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=max(total, 1), pct_start=0.25)
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    return Training(model, opt, sched, scaler, device)


def make_train_batches(cfg: TrainConfig, device: torch.device, rank: int = 0, world_size: int = 1):
    """The training batches for this process: in-memory ``TensorBatches`` or a torchvision DataLoader
    (with a DistributedSampler when world_size > 1). Both have ``set_epoch`` and ``len``."""
    from mnist_helpers.data import TensorBatches, load_mnist, mnist_datasets

    if cfg.loader == "tensor":
        X, y, _, _ = load_mnist(cfg.data_root, device=device, subset=cfg.subset)
        return TensorBatches(X, y, cfg.batch_size, shuffle=True, seed=cfg.seed, rank=rank, world_size=world_size)
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    train_ds, _ = mnist_datasets(cfg.data_root)
    if cfg.subset:
        train_ds = Subset(train_ds, range(cfg.subset))
    sampler = DistributedSampler(train_ds, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed) \
        if world_size > 1 else None
    generator = torch.Generator().manual_seed(cfg.seed)
    loader = DataLoader(train_ds, batch_size=cfg.batch_size, shuffle=sampler is None, sampler=sampler,
                        num_workers=cfg.num_workers, pin_memory=cfg.pin_memory and device.type == "cuda",
                        persistent_workers=cfg.num_workers > 0, generator=generator)
    # set_epoch must not refer to the loader itself: that cycle leaves a finished loader to the garbage collector
    # (data.release_workers says what that costs); this function holds the generator, not the loader
    loader.set_epoch = sampler.set_epoch if sampler else (lambda epoch: generator.manual_seed(cfg.seed + epoch))
    return loader


def load_test_set(cfg: TrainConfig, device: torch.device):
    from mnist_helpers.data import load_mnist

    _, _, X_test, y_test = load_mnist(cfg.data_root, device=device, subset=(1, 10000))
    return X_test, y_test


# --------------------------------------------------------------------------- snapshots and pre-flight

SNAPSHOT_FORMAT = "mnist-scale-lab snapshot"
SNAPSHOT_VERSION = 1
SNAPSHOT_KEYS = ("model", "optimizer", "epoch", "steps", "history", "rng")
# What a resumed run must share with the run that saved: the model and optimizer state's shapes, the
# batches it sees (batch size, processes, subset, seed) and the scaler. num_epochs may grow (train longer)...
RUN_KEYS = ("model", "optimizer", "scheduler", "amp", "batch_size", "grad_accum", "subset", "seed")
# ...unless the learning rate follows a schedule over the whole run: OneCycleLR's total_steps is fixed when the run
# starts (steps per epoch x num_epochs, at most max_steps), and its saved state keeps the old horizon.
HORIZON_KEYS = {"onecycle": ("num_epochs", "max_steps")}
_RUN_FLAGS = {"world_size": "processes"}


def _not_ours(path: Path, why: str) -> SnapshotError:
    return SnapshotError(f"--snapshot {path} is not a snapshot written by this series ({why})",
                         f"delete it (rm {path}) to start from scratch, or point --snapshot at another file")


def _run_settings(cfg: TrainConfig, world_size: int) -> dict:
    horizon = HORIZON_KEYS.get(cfg.scheduler, ())
    return {**{k: getattr(cfg, k) for k in (*RUN_KEYS, *horizon)}, "world_size": world_size}


def _flag(key: str, value) -> str:
    """The command-line spelling of one setting: ``--epochs 2``, ``--batch-size 64``, ``2 processes``."""
    if key == "world_size":
        return f"{value} processes"
    meta = next((f.metadata for f in dataclasses.fields(TrainConfig) if f.name == key), {})
    return f"--{meta.get('flag', key).replace('_', '-')} {value}"


def save_snapshot(snap: dict, path, cfg: TrainConfig, world_size: int = 1):
    """``snap`` (model, optimizer, ... as the workers build it) plus the format tag, its version and the run's
    settings, written atomically (``io.atomic_save``). ``load_snapshot`` checks all three."""
    from mnist_helpers.io import atomic_save

    return atomic_save({**snap, "format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
                        "run": _run_settings(cfg, world_size)}, path)


def load_snapshot(path, cfg: TrainConfig, world_size: int = 1) -> dict:
    """Load a snapshot with ``torch.load(weights_only=True)`` (never code) and validate it before use.

    Always onto the CPU, whatever device the run trains on: the RNG states must be CPU tensors
    (``torch.set_rng_state`` refuses any other), and ``load_state_dict`` of the model and the optimizer copies
    each value to the device of the parameter it belongs to.

    SnapshotError when the file is not a torch file, holds anything but tensors and plain values, lacks the
    series' format tag, version or keys, or was written by a run with other settings (each difference
    named, e.g. ``batch_size: snapshot 64, this run 128``), instead of a shape error deep in load_state_dict.
    With ``--scheduler onecycle`` the horizon (``num_epochs``, ``max_steps``) is such a setting: the schedule
    cannot be stretched, so "train N more epochs" works only with ``--scheduler none``.
    """
    path = Path(path)
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to read means: not ours (torch's own text suggests unsafe loading)
        text = str(e)
        why = ("it holds objects other than tensors and plain values" if "global" in text.lower()
               else "torch.save did not write it: torch.load fails with "
                    + ("an unreadable pickle" if type(e).__name__ == "UnpicklingError" else type(e).__name__))
        raise _not_ours(path, why) from None
    if not isinstance(snap, dict) or snap.get("format") != SNAPSHOT_FORMAT:
        raise _not_ours(path, f"no {SNAPSHOT_FORMAT!r} tag; it holds a {type(snap).__name__}")
    if snap.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"--snapshot {path} has snapshot format version {snap.get('version')!r}; this code "
                            f"reads version {SNAPSHOT_VERSION}",
                            f"delete it (rm {path}) to start from scratch, or point --snapshot at another file")
    missing = [k for k in SNAPSHOT_KEYS if k not in snap]
    if missing or not isinstance(snap.get("run"), dict):
        raise _not_ours(path, f"missing {', '.join(missing) or 'run'}")
    saved = snap["run"]
    horizon = HORIZON_KEYS.get(cfg.scheduler, ())
    # The horizon is compared when both runs use that scheduler (else the scheduler's own difference says it all) and
    # the snapshot recorded it (snapshots written before it was recorded: not compared).
    skip = [k for k in horizon if saved.get("scheduler") != cfg.scheduler or k not in saved]
    diffs = [(k, saved.get(k), v) for k, v in _run_settings(cfg, world_size).items()
             if k not in skip and saved.get(k) != v]
    if diffs:
        said = "; ".join(f"{_RUN_FLAGS.get(k, k)}: snapshot {a!r}, this run {b!r}" for k, a, b in diffs)
        flags = ", ".join(_flag(k, a) for k, a, _ in diffs)
        why = ""
        if any(k in horizon for k, _, _ in diffs):
            why = (f"; the {cfg.scheduler} learning-rate schedule spans the whole run (its length was fixed by "
                   "--epochs and --max-steps when the run started), so a snapshot cannot train on past it: only "
                   "--scheduler none trains more epochs from a snapshot")
        raise SnapshotError(f"--snapshot {path} was written by a run with other settings ({said}){why}",
                            f"resume with the snapshot's settings ({flags}), point --snapshot at another file, "
                            f"or delete it (rm {path}) to start from scratch")
    return snap


def snapshot_seen(path) -> tuple[int, str] | None:
    """What this process sees at ``path``: None when there is no file, else (the snapshot's optimizer steps, the
    sha256 of its bytes; steps -1 when the file is unreadable, which ``load_snapshot`` then explains).
    ``distributed.agree_on_snapshot`` compares it across ranks."""
    import hashlib
    import io

    path = Path(path)
    if not path.is_file():
        return None
    data = path.read_bytes()
    try:
        steps = int(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)["steps"])
    except Exception:  # noqa: BLE001 - not a snapshot of ours: load_snapshot names the problem
        steps = -1
    return steps, hashlib.sha256(data).hexdigest()[:16]


def check_run(cfg: TrainConfig, world_size: int = 1, out=None, snapshot=None) -> None:
    """Before any training, what would fail later: the MNIST files (md5), ``out`` and ``snapshot`` writable,
    an existing ``snapshot`` readable and from this configuration. Raises an expected error (exit 2)."""
    from mnist_helpers.data import verify_mnist
    from mnist_helpers.io import check_writable

    verify_mnist(cfg.data_root)
    if out:
        check_writable(out, "--out")
    if snapshot:
        check_writable(snapshot, "--snapshot")
        if Path(snapshot).exists():
            load_snapshot(snapshot, cfg, world_size)


# --------------------------------------------------------------------------- the loop

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, X: torch.Tensor, y: torch.Tensor, *,
               amp: str = "none", scaler: torch.amp.GradScaler | None = None,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, grad_accum: int = 1,
               no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
               label_smoothing: float = 0.0, set_to_none: bool = True) -> torch.Tensor:
    """One optimizer step on one batch: the series' training step, used by every lesson and worker.

    ``zero_grad``; forward under ``torch.autocast`` (``amp``: none, bf16, fp16); the loss (NLL of the
    models' log-probabilities, or cross-entropy with ``label_smoothing``); ``backward`` (through ``scaler``
    for fp16); ``optimizer.step`` and ``scheduler.step``. ``grad_accum`` splits the batch into that many
    micro-batches whose losses are weighted so the summed gradient equals the whole batch's; ``no_sync``
    (DDP's ``model.no_sync``) skips the all-reduce on all but the last micro-batch. Returns the batch's
    mean loss, detached and on the device (reading it with ``float()`` is the only host sync).
    """
    dtype = AMP_DTYPES[amp]
    device_type = X.device.type
    optimizer.zero_grad(set_to_none=set_to_none)
    n = len(X)
    total = torch.zeros((), device=X.device)
    chunks = list(zip(X.chunk(grad_accum), y.chunk(grad_accum)))
    for i, (Xc, yc) in enumerate(chunks):
        last = i == len(chunks) - 1
        ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with ctx:
            with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
                out = model(Xc)
                if label_smoothing:
                    loss = F.cross_entropy(out.float(), yc, reduction="sum", label_smoothing=label_smoothing) / n
                else:
                    loss = F.nll_loss(out.float(), yc, reduction="sum") / n
            (scaler.scale(loss) if scaler else loss).backward()
        total += loss.detach()
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler:
        scheduler.step()
    return total


def train_one_epoch(tr: Training, batches: Iterable, cfg: TrainConfig, *, max_steps: int | None = None,
                    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                    on_step: Callable[[int, float], None] | None = None) -> dict:
    """One pass over ``batches``, one ``train_step`` per batch. Returns ``{"loss", "images", "steps", "seconds",
    "images_per_s"}``. ``no_sync``: DDP's ``model.no_sync`` for gradient accumulation; ``on_step(step,
    running_mean_loss)`` after each step (live curves, profiling); ``max_steps`` stops early.
    """
    model, opt, device = tr.model, tr.optimizer, tr.device
    model.train()
    loss_sum = torch.zeros((), device=device)  # summed on device: no host sync per step
    images = steps = 0
    if cfg.progress:
        from tqdm.auto import tqdm
        batches = tqdm(batches, leave=False, desc="train")
    _sync(device)
    t0 = time.perf_counter()
    if max_steps is not None:
        batches = itertools.islice(batches, max_steps)  # stop before fetching a batch we won't use
    for X, y in batches:
        X = X.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if cfg.channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        n = len(X)
        loss_sum += train_step(model, opt, X, y, amp=cfg.amp, scaler=tr.scaler, scheduler=tr.scheduler,
                               grad_accum=cfg.grad_accum, no_sync=no_sync) * n
        images += n
        steps += 1
        if on_step:
            on_step(steps, float(loss_sum) / images)  # running mean loss (one host sync per step)
    _sync(device)
    seconds = time.perf_counter() - t0
    return {"loss": float(loss_sum) / max(images, 1), "images": images, "steps": steps,
            "seconds": seconds, "images_per_s": images / seconds if seconds > 0 else float("nan")}


def train_with_loader(batches, *, model: str = "net", steps: int = 50, warmup_steps: int = 5, lr: float = 1e-3,
                      device: str | torch.device = "cpu", seed: int = 0) -> dict:
    """Train for ``steps`` timed steps (after ``warmup_steps``) and split each step into *waiting for data*
    (time inside ``next(batches)``, plus the host-to-device copy) and *compute*. Returns images/s and
    ``wait_fraction``: near 0 means the model is the bottleneck, near 1 means the loader is (03, 08)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    device = torch.device(device)
    torch.manual_seed(seed)
    net = build_model(model).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    cuda = device.type == "cuda"
    it = iter(batches)
    wait = compute = 0.0
    images = done = 0
    while done < warmup_steps + steps:
        t0 = time.perf_counter()
        try:
            X, y = next(it)
        except StopIteration:
            it = iter(batches)
            X, y = next(it)
        X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if cuda:
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        train_step(net, opt, X, y)
        if cuda:
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        if done >= warmup_steps:
            wait += t1 - t0
            compute += t2 - t1
            images += len(X)
        done += 1
    total = wait + compute
    return {"images_per_s": images / total, "wait_fraction": wait / total, "wait_s": wait, "compute_s": compute,
            "steps": steps, "images": images}


@torch.no_grad()
def evaluate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
             amp: str = "none", channels_last: bool = False) -> dict:
    """Summed loss and correct count over (X, y), plus their means: ``{"loss_sum", "correct", "count",
    "loss", "acc"}``. Sums (not means) so distributed evaluation can add them across ranks exactly."""
    model.eval()
    dtype = AMP_DTYPES[amp]
    device = X.device
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    for start in range(0, len(X), batch_size):
        Xb, yb = X[start:start + batch_size], y[start:start + batch_size]
        if channels_last:
            Xb = Xb.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = model(Xb).float()
        loss_sum += F.nll_loss(out, yb, reduction="sum").double()
        correct += (out.argmax(1) == yb).sum()
    count = len(X)
    return {"loss_sum": float(loss_sum), "correct": int(correct), "count": count,
            "loss": float(loss_sum) / max(count, 1), "acc": int(correct) / max(count, 1)}


def epoch_line(epoch: int, stats: dict, ev: dict | None, rank: int = 0) -> str:
    """The series' fixed-width log line: ``[rank 0] epoch 1 | loss 0.1234 | acc 98.71% | 4.2 s | 14,230 img/s``."""
    acc = f"{100 * ev['acc']:6.2f}%" if ev else "   n/a "
    return (f"[rank {rank}] epoch {epoch:>2} | loss {stats['loss']:.4f} | acc {acc} | "
            f"{stats['seconds']:6.1f} s | {stats['images_per_s']:>9,.0f} img/s")


def fit(cfg: TrainConfig, *, on_epoch: Callable[[dict], None] | None = None,
        on_step: Callable[[int, float], None] | None = None, verbose: bool = True) -> dict:
    """Train one process on one device. Returns ``{"config", "device", "history", "final_test_acc", "model"}``;
    ``history`` has one dict per epoch: epoch, seconds, images, images_per_s, train_loss, test_loss, test_acc."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = select_device(cfg.device)
    batches = make_train_batches(cfg, device)
    X_test, y_test = load_test_set(cfg, device)
    tr = build_training(cfg, device, steps_per_epoch=len(batches))
    history, steps_done = [], 0
    for epoch in range(1, cfg.num_epochs + 1):
        batches.set_epoch(epoch)
        left = None if cfg.max_steps is None else cfg.max_steps - steps_done
        if left is not None and left <= 0:
            break
        stats = train_one_epoch(tr, batches, cfg, max_steps=left, on_step=on_step)
        steps_done += stats["steps"]
        ev = evaluate(tr.model, X_test, y_test, cfg.test_batch_size, cfg.amp, cfg.channels_last)
        row = {"epoch": epoch, "seconds": stats["seconds"], "images": stats["images"], "steps": stats["steps"],
               "images_per_s": stats["images_per_s"], "train_loss": stats["loss"],
               "test_loss": ev["loss"], "test_acc": ev["acc"]}
        history.append(row)
        if verbose:
            print(epoch_line(epoch, stats, ev), flush=True)
        if on_epoch:
            on_epoch(row)
    return {"config": cfg.to_dict(), "device": str(device), "history": history,
            "final_test_acc": history[-1]["test_acc"] if history else None, "model": tr.model}
