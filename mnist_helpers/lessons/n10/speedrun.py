"""The speedrun's measurement harness: notebook 10's recipes, time to accuracy and verdicts, shared by the lesson
(``lessons/n10/lesson``) and the scripts ``scripts/bench_speedrun.py``, ``scripts/device_check.py``
(its speedrun sections) and ``scripts/make_claims.py`` (introduced in 10_speedrun).

A *recipe* is data (``Recipe``): what to train, on which data path, with which knobs. ``chain()`` is the
notebook's ladder, each step one change on top of the previous one, labelled with the resource level it
changes (the article's three levels: hardware, framework, task)::

    article   the article's recipe: DataLoader + per-sample transforms, Net, Adam 1e-3, batch 128
    tensors   in-memory tensors instead of a DataLoader                       (task: the data pipeline)
    device    the tensors live in device memory (GPU only; on a CPU it is `tensors`)  (hardware)
    onecycle  OneCycle learning-rate schedule (+ batch 512 on a GPU)           (task)
    smallnet  a smaller net (SpeedNet, ~10x fewer FLOPs than Net)             (task: the model)
    poolfirst each block pools before its BatchNorm and ReLU (a quarter of the activations)  (task: the model)
    stride2   the first layer convolves with stride 2 instead of conv + pool at 28x28  (task: the model)
    batch64   batch 64 and a 0.8-epoch OneCycle horizon (CPU only)             (task)
    bf16      channels_last memory format + bfloat16 autocast                 (framework + task)
    compile   torch.compile                                                   (framework)
    graphs    CUDA graphs: the whole training step captured once, replayed    (framework, GPU only)

The protocol (the field's: airbench, hlb-CIFAR10): ``fixed_schedule(recipe, seed)`` trains the recipe's whole
schedule, fixed before it runs, and scores the test set once, at the end (with test-time shifts, ``tta``, and a weight
average, ``ema``, when the recipe has them); it reports the *training* time (CUDA events on a GPU), and the warm-up
(compilation, CUDA-graph capture: ``setup_s``) and the evaluation (``eval_s``) apart. The phases it shares with the
first-crossing measurement are ``_prepare``, ``_warm_up`` (after which the weights and optimizer state are reset, so
the timed run starts from scratch) and ``_schedule``. ``protocol_rows`` turns many seeds' runs into one row per recipe
(mean final accuracy, share of seeds at each target, training time, speed-up over the article's recipe in the same
run, share of the measured peak), ``protocol_table``/``show_protocol`` display them, and ``judge_protocol`` gives the
verdict on the series' targets (claims 10.speedrun_99, 10.speedrun_995: a mean at the target, ``RATIO_TARGETS`` times
the article's speed, at least ``MIN_SEEDS`` seeds), ``protocol_evidence`` its sentence.

``first_crossing_run(recipe, targets, eval_every_steps, seed)`` is the earlier, *first-crossing* reading (optimistic:
the test set picks the stopping point): it evaluates every ``eval_every_steps`` steps, finer near a target
(``fine_every_steps`` within ``fine_margin``), and reports the training time to the first evaluation at or above each
target; ``summarize``, ``summary_table`` and ``show_summary`` show such runs (the kept references, the GPU ladder of
``scripts/device_check.sh``).

To 99.5%: ``ladder_995(fast)`` adds ``LADDER_995``'s three changes to the fast recipe, one at a time (a wider
SpeedNet, a longer OneCycle horizon, shifted images with ``random_translate``), ending in ``fast995``
(``HYP_995``). Notebook 10 writes both recipes in one cell as airbench-style ``hyp`` dicts and the shift as ``shift``,
marked ``#@save``: they are the source (``mnist_helpers.lessons.n10.saved``, `make saved`) of the CPU ladder's SpeedNet settings,
of ``HYP_995`` and ``LADDER_995``, and of ``random_translate``. ``earlier_recipe`` tells a kept result of an earlier
recipe from one of today's (``recipe_changes``); ``merge_contention`` sums the load rule over several runs.
``choose_settings`` measures which of bf16, channels_last and compile pays here (``choice_table`` shows it). The
physical limit: ``measure_peak_flops`` (the measured dense-GEMM peak) and ``training_flops_per_image``.

``scripts/bench_speedrun.py`` and ``scripts/device_check.sh`` are thin wrappers around these; the lesson
(``lessons/n10/lesson``) holds only the notebook's claims, ``claims_10``.

Built on the core: models from ``models.build_model`` (SpeedNet is registered there), ``train.select_device``,
``train.train_step`` (every step, compiled or captured ones included), ``train.evaluate``, ``data.TensorBatches``
and ``display`` for the tables.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import shutil
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from mnist_helpers.course.display import show, table
from mnist_helpers.data import TensorBatches, load_mnist, release_workers
from mnist_helpers.models import MODELS, build_model, flops_per_image
from mnist_helpers.resources import isolate_compile_cache
from mnist_helpers.lessons.n10.saved import hyp as HYP  # notebook 10's hyp cell (#@save): the source of the recipes below
from mnist_helpers.lessons.n10.saved import hyp_995 as _HYP_995_WHOLE
from mnist_helpers.lessons.n10.saved import shift as random_translate  # notebook 10's shift: images moved by up to s pixels
from mnist_helpers.train import (AMP_DTYPES, TrainConfig, evaluate, make_train_batches, seed_everything,
                                 select_device, synchronize, train_step)

LEVELS = ("hardware", "framework", "task")
PROTOCOL = "fixed-schedule"       # the field's: a schedule fixed in advance, the test set scored once at the end
FIRST_CROSSING = "first crossing (optimistic)"  # the earlier one: the first evaluation at or above a target
DATA_PATHS = ("dataloader", "tensors", "device")


# --------------------------------------------------------------------------- recipes

@dataclass(frozen=True)
class Recipe:
    """One training recipe, as data. Every field has one job; ``replace`` makes the next step of a chain."""

    name: str                               # short id, used in tables and JSON
    change: str                             # what this step changes, in words
    levels: tuple[str, ...] = ("task",)     # resource level(s) the change belongs to: hardware / framework / task
    model: str = "net"                      # net, netbn, fastnet, speednet
    width: int | None = None                # channel width for fastnet / speednet (None: the class default)
    data: str = "dataloader"                # dataloader (torchvision + transforms), tensors (host RAM), device (device RAM)
    num_workers: int = 4                    # DataLoader workers (data=dataloader only); the article's 4
    batch_size: int = 128                   # images per optimizer step
    drop_last: bool = False                 # drop the short last batch (static shapes: needed for CUDA graphs)
    optimizer: str = "adam"                 # adam or sgd (Nesterov momentum 0.9)
    lr: float = 1e-3                        # learning rate (the peak with the onecycle schedule)
    weight_decay: float = 0.0               # decoupled (AdamW-style for adam) weight decay
    scheduler: str = "none"                 # none or onecycle (cosine warm-up over 25% then cosine anneal, per step)
    num_epochs: float = 3.0                 # training horizon in epochs: the schedule's length and the budget
    label_smoothing: float = 0.0            # cross-entropy label smoothing
    channels_last: bool = False             # NHWC memory format for images and weights
    amp: str = "none"                       # autocast dtype: none, bf16, fp16
    compile: bool = False                   # torch.compile the model (compiled in the warm-up, time reported apart)
    cuda_graphs: bool = False               # capture the whole training step in a CUDA graph (GPU only)
    eval_every_steps: int = 50              # default evaluation interval in optimizer steps
    translate: int = 0                      # augmentation: shift each image by up to this many pixels (0: none)
    ema: float = 0.0                        # evaluate an exponential moving average of the weights (its decay; 0: no)
    tta: int = 0                            # test-time augmentation: also score each image shifted by this many pixels

    def __post_init__(self):
        self.validate()

    def validate(self) -> "Recipe":
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if not self.levels or bad:
            raise ValueError(f"levels must be a non-empty tuple from {LEVELS}; got {self.levels!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}; got {self.model!r}")
        if self.data not in DATA_PATHS:
            raise ValueError(f"data must be one of {', '.join(DATA_PATHS)}; got {self.data!r}")
        for name in ("batch_size", "eval_every_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (isinstance(self.num_epochs, (int, float)) and self.num_epochs > 0):
            raise ValueError(f"num_epochs must be a positive number, got {self.num_epochs!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.optimizer not in ("adam", "sgd") or self.scheduler not in ("none", "onecycle"):
            raise ValueError(f"optimizer must be adam or sgd and scheduler none or onecycle; "
                             f"got {self.optimizer!r}, {self.scheduler!r}")
        if self.amp not in AMP_DTYPES:
            raise ValueError(f"amp must be one of {', '.join(AMP_DTYPES)}; got {self.amp!r}")
        if not isinstance(self.translate, int) or isinstance(self.translate, bool) or not 0 <= self.translate <= 6:
            raise ValueError(f"translate must be an integer number of pixels in 0..6, got {self.translate!r}")
        if not isinstance(self.tta, int) or isinstance(self.tta, bool) or not 0 <= self.tta <= 3:
            raise ValueError(f"tta must be an integer number of pixels in 0..3 (0: none), got {self.tta!r}")
        if not (isinstance(self.ema, (int, float)) and 0 <= self.ema < 1):
            raise ValueError(f"ema must be a decay in [0, 1) (0: no average), e.g. 0.99; got {self.ema!r}")
        if self.translate and self.data == "dataloader":
            raise ValueError("translate augments in-memory tensors: use data='tensors' or 'device'")
        if self.cuda_graphs and not (self.data == "device" and self.drop_last):
            raise ValueError("cuda_graphs needs data='device' and drop_last=True (a captured graph has static "
                             "input shapes and addresses)")
        return self

    @property
    def requires_cuda(self) -> bool:
        return self.cuda_graphs

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["levels"] = list(self.levels)
        return d


ARTICLE = Recipe(
    name="article", change="the article's recipe: torchvision DataLoader (per-sample ToTensor + Normalize, "
    "4 workers, pin_memory), Net, Adam lr 1e-3, batch 128, its 5 epochs", levels=("task",), num_epochs=5.0,
    eval_every_steps=50)


def chain(device: str | torch.device = "cpu") -> list[Recipe]:
    """The notebook's ladder for ``device``: each recipe is the previous one with one change.

    One difference between devices, measured on the 2-core CPUs (2026-12-02/03): there a larger batch buys no
    throughput, only fewer updates per epoch (SpeedNet at batch 512 stalled at 98.6% after 1.5 epochs), so the
    CPU ladder keeps batch 128 for the OneCycle schedule, then halves it (``batch64``: twice the updates per epoch for
    little throughput, 99.0% in about half an epoch); a GPU takes batch 512.
    """
    gpu = torch.device(device).type == "cuda"
    big = 512 if gpu else 128
    steps = [ARTICLE]

    def add(**kw):
        steps.append(steps[-1].replace(**kw))

    add(name="tensors", change="in-memory tensors: the whole set normalised once, batches by indexing "
        "(no workers, no per-sample transforms)", levels=("task",), data="tensors")
    add(name="device", change="device-resident data: the tensors live in GPU memory, no host-to-device copy "
        "per batch (on a CPU this is the same as `tensors`)", levels=("hardware",), data="device")
    add(name="onecycle", change=f"batch {big} + OneCycle schedule (peak lr 3e-3, 2 epochs)", levels=("task",),
        batch_size=big, drop_last=True, lr=3e-3, scheduler="onecycle", num_epochs=2.0,
        eval_every_steps=max(1, 6000 // big))
    add(name="smallnet", change="a smaller net (SpeedNet: FastNet's blocks, narrower; ~10x fewer FLOPs than Net), "
        "SGD-Nesterov with label smoothing", levels=("task",), model="speednet_v1",
        width=16 if gpu else HYP["width"], optimizer="sgd", lr=0.2 if gpu else HYP["lr"],
        weight_decay=HYP["weight_decay"], label_smoothing=HYP["label_smoothing"],
        num_epochs=4.0 if gpu else 1.25)  # GPU settings not yet tuned on a GPU: device_check.sh measures them
    add(name="poolfirst", change="each block pools before its BatchNorm and ReLU (airbench's order: they touch a "
        "quarter of the activations; same parameters and FLOPs)", levels=("task",), model="speednet")
    add(name="stride2", change="a strided first layer: its 5x5 convolution steps by 2 (14x14 out) instead of "
        "convolving all 28x28 positions, then pooling (same parameters, 14% fewer FLOPs, no full-resolution pooling)",
        levels=("task",), model=HYP["model"])
    if not gpu:  # the step that makes notebook 10's hyp
        add(name=f"batch{HYP['batch_size']}", change=f"batch {HYP['batch_size']} (twice the updates per epoch) and a "
            f"{HYP['num_epochs']:g}-epoch OneCycle horizon", levels=("task",), batch_size=HYP["batch_size"],
            num_epochs=HYP["num_epochs"], eval_every_steps=6000 // HYP["batch_size"])
    add(name="tta", change=f"test-time shifts: each test image also scored moved {HYP['tta']} px up, down, left and "
        "right, the log-probabilities summed (evaluation only: no training time)", levels=("task",), tta=HYP["tta"])
    add(name="bf16", change="channels_last memory format + bfloat16 autocast", levels=("framework", "task"),
        channels_last=True, amp="bf16")
    add(name="compile", change="torch.compile (kernel fusion; compile time reported apart)",
        levels=("framework",), compile=True)
    add(name="graphs", change="CUDA graphs: the whole step (forward, backward, optimizer) replayed as one launch",
        levels=("framework",), cuda_graphs=True)
    return steps


def fastest(device: str | torch.device = "cpu", choice: dict | None = None, *, measure: bool = False,
            log: Callable[[str], None] | None = print) -> Recipe:
    """Our fastest recipe for the device, named ``fast``: the ladder's SpeedNet recipe with the precision, memory
    format and compilation that *this machine* trains fastest with (on a GPU, replayed as a CUDA graph).

    Which of those pays depends on the CPU, so it is measured, not assumed: on the lab's 2-core Xeon with AMX,
    compiled bf16 + channels_last trained SpeedNet at 1.42x the images/s of float32, while on a 2-core AMD EPYC with
    AVX2 only (no native bf16) the same bf16 recipe was 6.2x *slower* to 99.0% than its float32 twin.

    ``choice``: settings from :func:`choose_settings` (``{"amp", "channels_last", "compile"}``); when None, this
    machine's cached choice (``results/choices.json``), else a fresh measurement if ``measure`` (about 30-60 s on a
    2-core CPU, the compilations included), else float32 eager, said to be unmeasured. ``log`` prints
    the one line that says which and why (None: silent)."""
    device = _device(device)
    base = fast_base(device)
    why = None
    if choice is None:
        cached = cached_choice(device)
        if cached is not None:
            choice, why = cached["choice"], f"{cached['why']} (measured {cached['date_utc'][:10]}, cached)"
        elif measure:
            res = choose_settings(device, log=None)
            choice, why = res["choice"], res["why"]
    if choice is None:  # nothing measured: the plainest setting, which no CPU runs slower than its own twin
        choice = {"amp": "none", "channels_last": False, "compile": False}
        why = ("not measured on this machine, so the plainest setting; speedrun.choose_settings() (or "
               "fastest(measure=True)) chooses by measurement")
    unknown = set(choice) - set(SETTINGS)
    if unknown:
        raise ValueError(f"choice takes {', '.join(SETTINGS)}; got {sorted(unknown)}")
    picked = base.replace(**{k: choice[k] for k in SETTINGS if k in choice})
    if _simplicity({k: getattr(picked, k) for k in SETTINGS}):
        picked = picked.replace(levels=("task", "framework"))
    if device.type == "cuda":
        picked = picked.replace(data="device", drop_last=True, cuda_graphs=True)
    label = settings_label(picked)
    if log and why:
        log(f"fast recipe on {device.type}: {label}; {why}")
    return picked.replace(name="fast", change=f"our fastest here: SpeedNet recipe with {label} "
                          f"({why or 'chosen by the caller'})")


def fast_base(device: str | torch.device = "cpu") -> Recipe:
    """The ladder's last step before the per-machine settings (``bf16``): the recipe :func:`fastest` and
    :func:`choose_settings` start from."""
    steps = chain(device)
    return steps[[r.name for r in steps].index("bf16") - 1]


# The 99.5% recipe: what it changes on top of `fast` (notebook 10's `hyp` cell shows both recipes whole), in the
# order of LADDER_995, each step one change whose gain the notebook measures.
# Chosen under the fixed-schedule protocol on the 2-core AMD EPYC with AVX-512 (2026-12-07, bf16 + channels_last +
# compile, test-time shifts of 1 px; mean final accuracy of 3-4 seeds, the machine shared part of the time): width 16
# ran at the images/s of width 12 (the small convolutions cost per call, not per channel), 99.11% after 0.45 epoch;
# for 99.5%, width 16 stayed at 99.47-99.50% from 3 to 4 epochs (capacity), width 20 and 24 ran at about half of
# width 16's images/s, width 32 at the same rate as 24 and reached 99.51% in 2 epochs with 1-pixel shifts.
# HYP_995 and the three steps are read from notebook 10's hyp_995 (what it changes on top of hyp).
HYP_995 = {k: v for k, v in _HYP_995_WHOLE.items() if HYP.get(k) != v}
LADDER_995 = (
    ("wider", f"a wider SpeedNet (width {HYP_995['width']} instead of {HYP['width']})", ("task",),
     {"width": HYP_995["width"]}),
    ("longer", f"a longer OneCycle horizon ({HYP_995['num_epochs']:g} epochs)", ("task",),
     {"num_epochs": HYP_995["num_epochs"]}),
    ("translate", f"augmentation: every image shifted by up to {HYP_995['translate']} pixels (no flips: digits are "
     "not symmetric)", ("task",), {"translate": HYP_995["translate"]}),
)
if set(HYP_995) != {"width", "num_epochs", "translate"}:
    raise ImportError(f"notebook 10's hyp_995 changes {sorted(HYP_995)} on top of hyp; LADDER_995 measures width, "
                      "num_epochs and translate: give the new change a step here")


def ladder_995(fast: Recipe) -> list[Recipe]:
    """From ``fast`` (the 99.0% recipe) to ``fast995`` one change at a time (``LADDER_995``); the last step is
    ``fast995``, i.e. ``fast`` with ``HYP_995``."""
    steps = [fast]
    for name, change, levels, kw in LADDER_995:
        steps.append(steps[-1].replace(name=name, change=change, levels=levels, **kw))
    steps[-1] = steps[-1].replace(name="fast995", change=f"our 99.5% recipe: {settings_label(fast)}, "
                                  + ", ".join(c.split(" (")[0] for _, c, _, _ in LADDER_995))
    return steps


def recipes(device: str | torch.device = "cpu", choice: dict | None = None) -> dict[str, Recipe]:
    """The ladder's recipes by name, ``fast`` (:func:`fastest` with ``choice``, the cached choice or the
    ladder's last step; never a measurement, so this is instant) and ``fast995`` (:func:`ladder_995` of ``fast``)."""
    table = {r.name: r for r in chain(device)}
    table["fast"] = fastest(device, choice, log=None)
    table["fast995"] = ladder_995(table["fast"])[-1]
    return table


# What each speedrun claim times (the benchmark's recipe names), and the fields that make a recipe what it is: what it
# trains, on what data, how long. The per-machine settings (SETTINGS; CUDA graphs on a GPU), the evaluation interval,
# the DataLoader's workers and the wording are not among them.
CLAIM_RECIPES = {"10.speedrun_99": "fast", "10.speedrun_995": "fast995"}
# issue 50: the speed-up over the article's recipe (same run) at which each claim's mean target must be reached, and
# the seeds the protocol needs before a verdict can hold (the notebook and the benchmark judge with these)
RATIO_TARGETS = {"10.speedrun_99": 80.0, "10.speedrun_995": 10.0}
MIN_SEEDS = {"cpu": 10, "cuda": 25}
RECIPE_FIELDS = ("model", "width", "data", "batch_size", "drop_last", "optimizer", "lr", "weight_decay", "scheduler",
                 "num_epochs", "label_smoothing", "translate", "ema", "tta")


def recipe_changes(recorded: dict, device: str | torch.device = "cpu") -> list[str] | None:
    """How a recipe kept in a result file (a ``Recipe.to_dict()``, e.g. a benchmark's ``recipes["fast"]``) differs
    from the recipe of that name this code trains on ``device``, with the recorded per-machine settings: one
    ``"field then -> now"`` per field of RECIPE_FIELDS that changed; [] when it is today's recipe, None when no
    recipe has that name any more. A field an older file lacks counts as the Recipe default."""
    defaults = {f.name: f.default for f in dataclasses.fields(Recipe)}
    now = recipes(device, choice={k: recorded.get(k, defaults[k]) for k in SETTINGS}).get(recorded.get("name"))
    if now is None:
        return None
    return [f"{f} {recorded.get(f, defaults[f])} -> {getattr(now, f)}" for f in RECIPE_FIELDS
            if recorded.get(f, defaults[f]) != getattr(now, f)]


def earlier_recipe(doc: dict, claim_id: str) -> str | None:
    """For a kept first-crossing file (the earlier ``scripts/bench_time_to_accuracy.py``, ``scripts/device_check.sh``): None
    when the recipe the claim timed is the one this code trains under its name, else a phrase saying what changed
    since. ``make claims`` and notebook 10 label such an entry: its verdict is of an earlier recipe, not of today's."""
    name = CLAIM_RECIPES.get(claim_id)
    recorded = (doc.get("recipes") or {}).get(name) if name else None
    if not recorded:
        return None
    changes = recipe_changes(recorded, "cuda" if str(doc.get("device", "cpu")).startswith("cuda") else "cpu")
    if changes == []:
        return None
    return "an earlier recipe (" + ("; ".join(changes) if changes else f"{name!r} is no longer a recipe") + ")"


def get_recipe(name: str, device: str | torch.device = "cpu", choice: dict | None = None) -> Recipe:
    table = recipes(device, choice)
    if name not in table:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(table)}")
    return table[name]


def skip_reason(recipe: Recipe, device: torch.device | str) -> str | None:
    """Why a recipe is not measured on this device (None: it runs)."""
    device = torch.device(device)
    if recipe.requires_cuda and device.type != "cuda":
        return "CUDA graphs need an NVIDIA GPU"
    if recipe.data == "device" and device.type == "cpu" and recipe.name == "device":
        return "on a CPU the data already lives in device memory: identical to `tensors`"
    return None


# --------------------------------------------------------------------------- choosing per machine

SETTINGS = ("amp", "channels_last", "compile")


def _device(device: str | torch.device) -> torch.device:
    """``auto`` resolved on this machine; any other name taken as given (a ladder can be built for cuda anywhere)."""
    return select_device(device) if device == "auto" else torch.device(device)


NET_NAMES = {"net": ("Net", None), "netbn": ("NetBN", None), "fastnet": ("FastNet", None),
             "speednet": ("SpeedNet", None), "speednet_v1": ("SpeedNetV1", "conv-BN-ReLU-pool"),
             "speednet_s2": ("SpeedNet", "strided first layer")}


def net_label(model: "Recipe | str", width: int | None = None) -> str:
    """A recipe's net (or a model name and width) in words: ``SpeedNet(12)``, ``SpeedNet(12, strided first layer)``."""
    if isinstance(model, Recipe):
        model, width = model.model, model.width
    name, detail = NET_NAMES.get(model, (model, None))
    inside = ", ".join(str(x) for x in (width, detail) if x is not None)
    return f"{name}({inside})" if inside else name


def settings_label(r) -> str:
    """'bf16 + channels_last, compiled' for a Recipe or a settings dict."""
    get = (lambda k: r[k]) if isinstance(r, dict) else (lambda k: getattr(r, k))
    parts = ["float32" if get("amp") == "none" else get("amp")] + (["channels_last"] if get("channels_last") else [])
    return " + ".join(parts) + (", compiled" if get("compile") else ", eager")


def candidate_settings(device: str | torch.device = "cpu", compile: bool = True) -> list[dict]:
    """The settings :func:`choose_settings` measures: float32 and bf16 autocast, each with the default memory format
    and with channels_last, eager and (if ``compile`` and a C++ compiler is here) compiled; fp16 on a CUDA GPU.
    float32 eager, the plainest, comes first: the others must beat it to be chosen."""
    device = torch.device(device)
    amps = ["none", "bf16"] + (["fp16"] if device.type == "cuda" else [])
    compiles = [False] + ([True] if compile and (device.type == "cuda" or shutil.which("g++")
                                                  or shutil.which("c++") or shutil.which("clang++")) else [])
    return [{"amp": a, "channels_last": cl, "compile": c} for c in compiles for a in amps for cl in (False, True)]


def _simplicity(settings: dict) -> int:
    return (settings["amp"] != "none") + bool(settings["channels_last"]) + bool(settings["compile"])


def choose_settings(device: str | torch.device = "cpu", candidates: list[dict] | None = None, *,
                    block_s: float = 1.0, blocks: int = 5, margin: float = 0.05, cache: bool = True,
                    log: Callable[[str], None] | None = print) -> dict:
    """Measure the fast recipe's training step under each of ``candidates`` (default :func:`candidate_settings`) on
    this machine and choose the fastest; say why in one line.

    Every candidate gets its own model (same initial weights) and warm-up (compilation included, reported as
    ``setup_s``, not counted); then ``blocks`` rounds, each timing about ``block_s`` seconds of steps of every
    candidate in turn (interleaved, so a change of machine load hits all alike). Throughput is the median over blocks, with the
    inter-quartile range as spread. A candidate with more changes than the plainest one (float32, eager) is chosen
    only when its median beats every simpler one's by more than ``margin`` (5%) *and* by more than both spreads:
    a change that does not measurably pay is left out. A candidate that fails (no bf16 kernels, no compiler) is a
    row with its error, never the choice.

    Returns ``{"choice": {amp, channels_last, compile}, "why": str, "rows": [...], "machine_key", "date_utc"}``
    and, if ``cache``, stores it in ``results/choices.json`` under this machine's key (CPU model, ISA, torch
    version, threads) so that :func:`fastest` reuses it -- unless other processes kept the machine busy meanwhile
    (``claims.Contention``, recorded as ``contention``): a measurement drowned by their load is not kept.
    """
    from mnist_helpers.course.claims import Contention

    with Contention() as busy:
        result = _choose_settings(device, candidates, block_s=block_s, blocks=blocks, margin=margin)
    result["contention"] = busy.to_dict()
    if busy.busy:
        result["why"] += f"; measured while {busy}, so not cached"
    elif cache:
        _store_choice(result)
    if log:
        log(f"fast recipe on {result['device_type']}: {settings_label(result['choice'])}; {result['why']}")
    return result


def _choose_settings(device, candidates, *, block_s, blocks, margin) -> dict:
    import datetime

    device = _device(device)
    candidates = candidates or candidate_settings(device)
    if not isinstance(blocks, int) or blocks < 1 or not (isinstance(block_s, (int, float)) and block_s > 0):
        raise ValueError(f"blocks must be a positive integer and block_s a positive number of seconds, "
                         f"got {blocks!r} and {block_s!r}")
    base = fast_base(device)
    X = torch.randn(base.batch_size, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (base.batch_size,), device=device)
    runners, rows = [], []
    for settings in candidates:
        row = {**settings, "setting": settings_label(settings), "status": "measured", "error": None}
        rows.append(row)
        try:
            r = base.replace(**settings)
            seed_everything(0)
            model = build_model(r.model, r.width).to(device)
            if r.channels_last:
                model = model.to(memory_format=torch.channels_last)
            opt = _make_optimizer(r, model)
            forward = _compiled(model) if r.compile else model
            Xc = X.contiguous(memory_format=torch.channels_last) if r.channels_last else X

            def one(forward=forward, opt=opt, Xc=Xc, r=r):
                train_step(forward, opt, Xc, y, amp=r.amp, label_smoothing=r.label_smoothing)
            t0 = time.perf_counter()
            for _ in range(3):
                one()
            synchronize(device)
            row["setup_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(3):
                one()
            synchronize(device)
            step_s = (time.perf_counter() - t0) / 3
            row["steps_per_block"] = max(3, math.ceil(block_s / max(step_s, 1e-6)))
            runners.append((row, one, []))
        except Exception as e:  # a setting this machine cannot run is a result, not a crash
            row.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    for _ in range(blocks):
        for row, one, rates in runners:
            try:
                synchronize(device)
                t0 = time.perf_counter()
                for _ in range(row["steps_per_block"]):
                    one()
                synchronize(device)
                rates.append(row["steps_per_block"] * len(y) / (time.perf_counter() - t0))
            except Exception as e:
                row.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    for row, _, rates in runners:
        if row["status"] == "measured" and rates:
            q = statistics.quantiles(rates, n=4) if len(rates) > 1 else [rates[0]] * 3
            row.update(images_per_s=statistics.median(rates), iqr_images_per_s=q[2] - q[0], blocks=len(rates))
    ok = [r for r in rows if r["status"] == "measured" and r.get("images_per_s")]
    if not ok:
        raise RuntimeError("no candidate setting ran on this machine: " +
                           "; ".join(f"{r['setting']}: {r['error']}" for r in rows))
    choice, why = pick_setting(ok, margin)
    plain = next((r for r in ok if _simplicity(r) == 0), None)
    for r in rows:
        r["vs_float32_eager"] = (r["images_per_s"] / plain["images_per_s"]) if plain and r.get("images_per_s") else None
        r["chosen"] = r is choice
    result = {"choice": {k: choice[k] for k in SETTINGS}, "why": why, "rows": rows,
              "machine_key": machine_key(device),
              "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "block_s": block_s, "blocks": blocks, **_measured_on(base), "margin": margin,
              "device_type": device.type}
    return result


def choice_table(result: dict) -> pd.DataFrame:
    """:func:`choose_settings`'s rows as a DataFrame, fastest first."""
    cols = ["setting", "images_per_s", "iqr_images_per_s", "vs_float32_eager", "setup_s", "chosen", "status", "error"]
    rows = sorted(result["rows"], key=lambda r: -(r.get("images_per_s") or 0))
    return table([{c: r.get(c) for c in cols} for r in rows])


def pick_setting(rows: list[dict], margin: float = 0.05) -> tuple[dict, str]:
    """The chosen row among measured ``rows`` (``images_per_s``, ``iqr_images_per_s``, the settings) and why.

    Walk from the plainest setting up: a row with more changes replaces the current choice only if its median is
    more than ``margin`` above it and the gap exceeds both rows' spreads (inter-quartile ranges)."""
    if not rows:
        raise ValueError("pick_setting needs at least one measured row")
    order = sorted(rows, key=lambda r: (_simplicity(r), -r["images_per_s"]))
    best = order[0]
    for r in order[1:]:
        gap = r["images_per_s"] - best["images_per_s"]
        if gap > margin * best["images_per_s"] and gap > max(r.get("iqr_images_per_s", 0), best.get("iqr_images_per_s", 0)):
            best = r
    fastest_row = max(rows, key=lambda r: r["images_per_s"])
    plain = next((r for r in rows if _simplicity(r) == 0), None)
    ratio = f"{best['images_per_s'] / plain['images_per_s']:.2f}x float32 eager" if plain and best is not plain else ""
    why = (f"{best['images_per_s']:,.0f} img/s" + (f", {ratio}" if ratio else "") +
           f" (median of {best.get('blocks', 1)} interleaved blocks over {len(rows)} settings")
    if fastest_row is not best:
        why += (f"; {settings_label(fastest_row)} measured {fastest_row['images_per_s']:,.0f} img/s, within "
                f"{margin:.0%} or the spread, so the simpler setting is kept")
    return best, why + ")"


def machine_key(device: str | torch.device = "cpu") -> str:
    """What the choice depends on: device (GPU name), CPU model, the ISA torch uses, torch version, threads."""
    import os

    from mnist_helpers.resources import cpu_model

    device = torch.device(device)
    isa = torch.backends.cpu.get_cpu_capability()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    gpu = (torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cuda (unavailable)") \
        if device.type == "cuda" else device.type
    return (f"{gpu} | {cpu_model()} | {isa}{' onednn<=' + onednn if onednn else ''} | torch {torch.__version__} | "
            f"{torch.get_num_threads()} threads")


def _choices_path():
    from mnist_helpers.paths import results_dir
    return results_dir() / "choices.json"


def _measured_on(recipe: Recipe) -> dict:
    """What a :func:`choose_settings` measurement depends on besides the machine: the net and the batch it timed."""
    return {"model": recipe.model, "width": recipe.width, "batch_size": recipe.batch_size}


def cached_choice(device: str | torch.device = "cpu") -> dict | None:
    """This machine's stored :func:`choose_settings` result, or None (also when it timed another net or batch than
    today's :func:`fast_base`: a choice measured on an earlier recipe is not reused)."""
    import json

    try:
        doc = json.loads(_choices_path().read_text())
        hit = doc.get(machine_key(device))
    except (OSError, ValueError):
        return None
    if not (isinstance(hit, dict) and isinstance(hit.get("choice"), dict)):
        return None
    want = _measured_on(fast_base(_device(device)))
    return hit if {k: hit.get(k) for k in want} == want else None


def _store_choice(result: dict) -> None:
    import json

    from mnist_helpers.io import write_json

    path = _choices_path()
    try:
        doc = json.loads(path.read_text())
        doc = doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        doc = {}
    doc[result["machine_key"]] = result
    write_json(path, doc)


# --------------------------------------------------------------------------- timing and schedules

def onecycle_lr(step: int, total_steps: int, peak: float, pct_start: float = 0.25,
                div_factor: float = 25.0, final_div_factor: float = 1e4) -> float:
    """OneCycleLR's learning rate at ``step`` (cosine up over pct_start, cosine down), no momentum cycling."""
    total_steps = max(total_steps, 2)
    up = max(int(pct_start * total_steps), 1)
    start, end = peak / div_factor, peak / div_factor / final_div_factor
    if step < up:
        frac, lo, hi = step / up, start, peak
    else:
        frac, lo, hi = min((step - up) / max(total_steps - up - 1, 1), 1.0), peak, end
    return hi + (lo - hi) * (1 + math.cos(math.pi * frac)) / 2


class TrainTimer:
    """Sums training time over segments: CUDA events on a GPU (no host sync inside a segment), else perf_counter."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self._t0 = None

    def start(self):
        if self.cuda:
            self._t0 = torch.cuda.Event(enable_timing=True)
            self._t0.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        """End the segment; returns the total so far (synchronises on a GPU)."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            self.total += self._t0.elapsed_time(end) / 1000.0
        else:
            self.total += time.perf_counter() - self._t0
        self._t0 = None
        return self.total


# --------------------------------------------------------------------------- data

def _train_batches(recipe: Recipe, device: torch.device, seed: int, subset: int | None, data_root=None):
    """The recipe's data path: the article's DataLoader, or in-memory ``TensorBatches`` in host or device memory
    (shuffled per epoch from ``seed``; on a GPU only the epoch's index permutation crosses to the device)."""
    if recipe.data == "dataloader":
        cfg = TrainConfig(model="net", batch_size=recipe.batch_size, loader="dataloader", seed=seed,
                          num_workers=recipe.num_workers, pin_memory=True, subset=subset, data_root=data_root)
        return make_train_batches(cfg, device)
    where = device if recipe.data == "device" else "cpu"
    X, y, _, _ = load_mnist(data_root, device=where, subset=subset)
    return TensorBatches(X, y, recipe.batch_size, shuffle=True, drop_last=recipe.drop_last, seed=seed)


# --------------------------------------------------------------------------- one run

def _make_optimizer(recipe: Recipe, model: nn.Module, capturable: bool = False):
    lr = torch.tensor(recipe.lr, device=next(model.parameters()).device) if capturable else recipe.lr
    extra = {"capturable": True, "foreach": True} if capturable else {}
    if recipe.optimizer == "adam":
        if recipe.weight_decay:
            return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=recipe.weight_decay, **extra)
        return torch.optim.Adam(model.parameters(), lr=lr, **extra)
    if capturable:  # torch's SGD reads a tensor lr on the host (a sync: not capturable); ours stays on the device
        return GraphSGD(model.parameters(), lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=recipe.weight_decay)


class GraphSGD:
    """SGD with Nesterov momentum 0.9 and weight decay, as ``torch.optim.SGD`` computes it, with the learning rate
    a device tensor so the whole update can live inside a CUDA graph (no host reads). Duck-types the optimizer
    API the speedrun uses: ``step``, ``zero_grad``, ``param_groups``, ``state``."""

    def __init__(self, params, lr: torch.Tensor, weight_decay: float = 0.0, momentum: float = 0.9):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"lr": lr}]
        self.weight_decay, self.momentum = weight_decay, momentum
        self.state = {p: {"momentum_buffer": torch.zeros_like(p)} for p in self.params}

    def zero_grad(self, set_to_none: bool = False):
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self):
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad.clone() for p in params]
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        if self.weight_decay:
            torch._foreach_add_(grads, params, alpha=self.weight_decay)
        torch._foreach_mul_(bufs, self.momentum)
        torch._foreach_add_(bufs, grads)                        # buf = m * buf + g
        torch._foreach_add_(grads, bufs, alpha=self.momentum)   # Nesterov: g + m * buf
        torch._foreach_mul_(grads, self.param_groups[0]["lr"])  # a tensor lr: no host read
        torch._foreach_sub_(params, grads)


def _compiled(model: nn.Module):
    """``torch.compile(model)``, into a cache of its own when the CPU kernels are limited to a lower ISA."""
    isolate_compile_cache()
    return torch.compile(model)


def _set_lr(opt, value: float):
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)
        else:
            g["lr"] = value


def _reset(model, opt, init_state):
    """Back to the initial weights and an empty optimizer state, in place (a captured graph keeps its addresses)."""
    with torch.no_grad():
        model.load_state_dict(init_state)
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v.zero_()


@dataclass
class _Run:
    """One training run's state, shared by its phases: :func:`_prepare` builds it, :func:`_warm_up` compiles or
    captures and resets it, :func:`_schedule` walks its batches, :meth:`train_on` takes one step."""

    recipe: Recipe
    device: torch.device
    seed: int
    batches: object
    X_test: torch.Tensor
    y_test: torch.Tensor
    model: nn.Module
    opt: object
    forward: nn.Module
    total_steps: int
    init_state: dict
    wall0: float
    notes: list = dataclasses.field(default_factory=list)
    aug_gen: torch.Generator | None = None
    averaged: nn.Module | None = None   # the weight average (recipe.ema), evaluated instead of the model
    graph: object = None                 # a captured CUDA graph of the whole step (recipe.cuda_graphs)
    static: tuple | None = None          # its input tensors
    setup_s: float = 0.0

    @property
    def steps_per_epoch(self) -> int:
        return len(self.batches)

    def lr_at(self, step: int) -> float:
        r = self.recipe
        return onecycle_lr(step, self.total_steps, r.lr) if r.scheduler == "onecycle" else r.lr

    def prep(self, X, y):
        X = X.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        if self.recipe.translate:
            X = random_translate(X, self.recipe.translate, self.aug_gen)
        if self.recipe.channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        return X, y

    def do_step(self, X, y):  # the core's step on `forward` (compiled or not); a captured graph keeps grads in place
        r = self.recipe
        return train_step(self.forward, self.opt, X, y, amp=r.amp, label_smoothing=r.label_smoothing,
                          set_to_none=not r.cuda_graphs)

    def train_on(self, X, y, step: int) -> None:
        """One optimizer step at ``step`` of the schedule (its learning rate), then the weight average's update."""
        _set_lr(self.opt, self.lr_at(step))
        X, y = self.prep(X, y)
        if self.graph is not None:
            self.static[0].copy_(X, non_blocking=True)
            self.static[1].copy_(y, non_blocking=True)
            self.graph.replay()
        else:
            self.do_step(X, y)
        if self.averaged is not None:
            _update_average(self.averaged, self.model, self.recipe.ema, step)

    def evaluated_model(self) -> nn.Module:
        """The weights the test set scores: the average (its BatchNorm statistics the model's) or the model."""
        if self.averaged is None:
            return self.model
        with torch.no_grad():
            for a, b in zip(self.averaged.buffers(), self.model.buffers()):
                a.copy_(b)
        return self.averaged


def _update_average(averaged: nn.Module, model: nn.Module, decay: float, step: int) -> None:
    """An exponential moving average of the weights, with the usual warm-up (``min(decay, (1+t)/(10+t))``, as
    timm's ModelEmaV2 and Polyak averaging do), so that the first steps' weights do not dominate it."""
    d = min(decay, (1 + step) / (10 + step))
    with torch.no_grad():
        torch._foreach_lerp_(list(averaged.parameters()), list(model.parameters()), 1 - d)


def _check_toolchain(recipe: Recipe, device: torch.device) -> None:
    reason = skip_reason(recipe, device)
    if recipe.requires_cuda and reason:
        raise ValueError(f"recipe {recipe.name!r} cannot run on {device}: {reason}")
    if recipe.compile and device.type == "cpu":
        if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
            raise ValueError("torch.compile on a CPU needs a C++ compiler (g++ or clang++) on PATH; "
                             "install one or drop compile from the recipe")


def _prepare(recipe: Recipe, device: torch.device, seed: int, *, subset=None, test_subset=None, max_steps=None,
             data_root=None) -> _Run:
    """Set-up (wall time, not training time): the data, the test set, the model, the optimizer, the schedule's
    length (``recipe.num_epochs`` of the data, or ``max_steps`` if fewer)."""
    _check_toolchain(recipe, device)
    wall0 = time.perf_counter()
    batches = _train_batches(recipe, device, seed, subset, data_root)
    _, _, X_test, y_test = load_mnist(data_root, device=device, subset=(1, test_subset or 10000))
    total_steps = max(1, int(round(recipe.num_epochs * len(batches))))
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    seed_everything(seed)
    model = build_model(recipe.model, recipe.width).to(device)
    if recipe.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = _make_optimizer(recipe, model, capturable=recipe.cuda_graphs)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    run = _Run(recipe, device, seed, batches, X_test, y_test, model, opt,
               forward=_compiled(model) if recipe.compile else model, total_steps=total_steps,
               init_state=init_state, wall0=wall0)
    if recipe.translate:
        run.aug_gen = torch.Generator(device=device).manual_seed(seed)
    if recipe.ema:
        run.averaged = copy.deepcopy(model)
    return run


def _capture(run: _Run):
    """The whole training step captured once as a CUDA graph (three steps on a side stream first, then a reset)."""
    static_X, static_y = run.static
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run.do_step(static_X, static_y)
    torch.cuda.current_stream().wait_stream(side)
    _reset(run.model, run.opt, run.init_state)  # zero the state before capture so the graph sees the real tensors
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run.do_step(static_X, static_y)
    return g


def _warm_up(run: _Run) -> None:
    """oneDNN/cuDNN primitives, compilation, CUDA-graph capture on two batches, then back to the initial weights and
    an empty optimizer state; the time goes to ``run.setup_s``, never to training. A compiled step that fails (or
    will not capture) falls back to the eager one, said in ``run.notes``."""
    t0 = time.perf_counter()
    warm = [run.prep(X, y) for X, y in _take(run.batches, 2)]
    if run.recipe.cuda_graphs:
        run.static = (warm[0][0].clone(), warm[0][1].clone())
        try:
            run.graph = _capture(run)
        except Exception as e:  # a compiled model that will not capture: capture the eager one
            if not run.recipe.compile:
                raise
            run.notes.append(f"capturing the compiled step failed ({type(e).__name__}: {str(e)[:200]}); "
                             "captured the eager step instead")
            torch.cuda.synchronize(run.device)
            run.forward = run.model
            run.graph = _capture(run)
        _set_lr(run.opt, run.lr_at(0))
    else:
        try:  # evaluation runs the eager model, so only the training graph is compiled
            for X, y in warm + warm:
                run.do_step(X, y)
        except Exception as e:  # seen: compiled SpeedNet under ATEN_CPU_CAPABILITY=avx2 (torch 2.14.1), AVX-512 CPU
            if not run.recipe.compile:
                raise
            run.notes.append(f"the compiled step failed here ({type(e).__name__}: {str(e)[:200]}); trained the "
                             "eager model instead")
            run.forward = run.model
            _reset(run.model, run.opt, run.init_state)
            for X, y in warm + warm:
                run.do_step(X, y)
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    _reset(run.model, run.opt, run.init_state)
    if run.averaged is not None:
        run.averaged.load_state_dict(run.model.state_dict())
    run.setup_s = time.perf_counter() - t0


def _schedule(run: _Run):
    """The schedule's batches, epoch after epoch (each reshuffled), ``run.total_steps`` of them: yields (step, X,
    y). The DataLoader's workers are released when the walk ends (outside any timed segment: the caller's timer
    is stopped before it asks for the end)."""
    step, epoch, it = 0, 0, None
    try:
        while step < run.total_steps:
            epoch += 1
            if hasattr(run.batches, "set_epoch"):
                run.batches.set_epoch(epoch)
            it = iter(run.batches)  # a persistent DataLoader hands back its one iterator, reset
            for X, y in it:
                if step >= run.total_steps:
                    break
                yield step, X, y
                step += 1
    finally:
        if it is not None:
            release_workers(it)  # data.release_workers: why


def evaluate_tta(model: nn.Module, X: torch.Tensor, y: torch.Tensor, shift: int = 0, batch_size: int = 2000,
                 amp: str = "none", channels_last: bool = False) -> dict:
    """Test accuracy with test-time augmentation: the log-probabilities of each image and of its copies moved by
    ``shift`` pixels up, down, left and right (background fills in; no flips, digits are not symmetric), summed.
    ``shift=0`` is plain :func:`train.evaluate`. Returns ``{"correct", "count", "acc"}``."""
    if not shift:
        ev = evaluate(model, X, y, batch_size, amp, channels_last)
        return {"correct": ev["correct"], "count": ev["count"], "acc": ev["acc"]}
    model.eval()
    dtype = AMP_DTYPES[amp]
    background = float(X.min())
    moves = ((0, 0), (shift, 0), (-shift, 0), (0, shift), (0, -shift))
    correct = 0
    with torch.no_grad():
        for start in range(0, len(X), batch_size):
            Xb, yb = X[start:start + batch_size], y[start:start + batch_size]
            h, w = Xb.shape[-2:]
            padded = F.pad(Xb, (shift,) * 4, value=background)
            total = None
            for dy, dx in moves:
                view = padded[..., shift + dy:shift + dy + h, shift + dx:shift + dx + w]
                if channels_last:
                    view = view.contiguous(memory_format=torch.channels_last)
                with torch.autocast(X.device.type, dtype=dtype, enabled=dtype is not None):
                    out = model(view).float()
                total = out if total is None else total + out
            correct += int((total.argmax(1) == yb).sum())
    return {"correct": correct, "count": len(X), "acc": correct / max(len(X), 1)}


def fixed_schedule(recipe: Recipe, seed: int = 0, *, device: str | torch.device = "auto", subset: int | None = None,
                   test_subset: int | None = None, max_steps: int | None = None, data_root=None) -> dict:
    """The field's speedrun protocol, one run: train ``recipe`` for its whole schedule (``num_epochs``, fixed before
    it runs), *then* score the test set once (the first ``test_subset`` images; None: all 10,000), with the weight
    average (``recipe.ema``) and test-time shifts (``recipe.tta``) when the recipe has them. Nothing looks at the
    test set during training, so nothing can stop on it (airbench, hlb-CIFAR10: a recipe reaches a target when the
    *mean* final accuracy over many seeds does; see :func:`protocol_rows`).

    Returns ``recipe``, ``seed``, ``device``, ``protocol`` ("fixed-schedule"), ``final_acc``, ``train_s`` (the
    schedule's training time: CUDA events on a GPU, the average's updates included), ``setup_s`` (warm-up,
    compilation, capture: apart), ``eval_s`` (the one evaluation, test-time shifts included: apart), ``wall_s``,
    ``steps``, ``images``, ``images_per_s``, ``num_epochs``, ``test_count``, ``notes``."""
    device = select_device(device) if isinstance(device, str) else device
    run = _prepare(recipe, device, seed, subset=subset, test_subset=test_subset, max_steps=max_steps,
                   data_root=data_root)
    _warm_up(run)
    timer = TrainTimer(device)
    steps = images = 0
    run.model.train()
    timer.start()
    walk = _schedule(run)
    for step, X, y in walk:
        run.train_on(X, y, step)
        steps, images = step + 1, images + len(y)
        if steps >= run.total_steps:
            break
    train_s = timer.stop()
    walk.close()  # releases the DataLoader's workers, outside the training time
    t_eval = time.perf_counter()
    ev = evaluate_tta(run.evaluated_model(), run.X_test, run.y_test, recipe.tta, 2000, recipe.amp,
                      recipe.channels_last)
    eval_s = time.perf_counter() - t_eval
    return {"recipe": recipe.name, "seed": seed, "device": str(device), "protocol": PROTOCOL,
            "final_acc": ev["acc"], "train_s": train_s, "setup_s": run.setup_s, "eval_s": eval_s,
            "wall_s": time.perf_counter() - run.wall0, "steps": steps, "images": images,
            "images_per_s": images / train_s if train_s > 0 else float("nan"), "num_epochs": recipe.num_epochs,
            "compute_dtype": "bfloat16" if recipe.amp == "bf16" else "float16" if recipe.amp == "fp16" else "float32",
            "test_count": ev["count"], "notes": run.notes}


def first_crossing_run(recipe: Recipe, targets: Iterable[float] = (0.99, 0.995), eval_every_steps: int | None = None,
                       seed: int = 0, *, device: str | torch.device = "auto", subset: int | None = None,
                       test_subset: int | None = None, max_steps: int | None = None, stop_when: str = "all",
                       num_epochs: float | None = None, fine_every_steps: int | None = None,
                       fine_margin: float = 0.005,
                       data_root=None, on_eval: Callable[[dict], None] | None = None) -> dict:
    """The *first-crossing* measurement (optimistic: the test set picks the stopping point; :func:`fixed_schedule`
    is the field's protocol): train ``recipe`` once and report when each accuracy target was first reached.

    Evaluates on the test set (the first ``test_subset`` images; None: all 10,000) every ``eval_every_steps``
    optimizer steps (None: the recipe's default) and at the end. Stops when every target is reached
    (``stop_when="all"``), when the first is (``"first"``), or never early (``"never"``); in any case at the end of
    the recipe's ``num_epochs`` horizon (``num_epochs`` overrides it; it also sets the schedule's length) or after
    ``max_steps``. Near a target the interval is finer: once an evaluation comes within ``fine_margin`` (0.5
    points) of a target not reached yet (98.5% for 99.0%), evaluate every ``fine_every_steps`` steps (None: keep
    ``eval_every_steps``), so the reported time lies close to the crossing.

    Returns a dict: ``recipe``, ``seed``, ``device``, ``targets`` {"0.99": {train_s, wall_s, steps, images,
    epochs, acc} or None when not reached}, ``final_acc``, ``train_s`` (all training), ``wall_s`` (everything),
    ``setup_s`` (warm-up, compilation, graph capture), ``images_per_s``, ``steps``, ``evals`` (the curve),
    ``notes``. A target not reached within the budget is None, never a guess.
    """
    targets = sorted(float(t) for t in targets)
    if not targets or any(not 0 < t <= 1 for t in targets):
        raise ValueError(f"targets must be accuracies in (0, 1], e.g. (0.99, 0.995); got {targets!r}")
    if stop_when not in ("all", "first", "never"):
        raise ValueError(f"stop_when must be 'all', 'first' or 'never'; got {stop_when!r}")
    if num_epochs is not None:
        recipe = recipe.replace(num_epochs=num_epochs)
    every = eval_every_steps or recipe.eval_every_steps
    fine = fine_every_steps or every
    for name, v in (("eval_every_steps", every), ("fine_every_steps", fine)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 0 <= fine_margin < 1:
        raise ValueError(f"fine_margin must be an accuracy gap in [0, 1), e.g. 0.005; got {fine_margin!r}")
    device = select_device(device) if isinstance(device, str) else device
    run = _prepare(recipe, device, seed, subset=subset, test_subset=test_subset, max_steps=max_steps,
                   data_root=data_root)
    _warm_up(run)
    timer = TrainTimer(device)
    curve = _Curve(run, timer, targets, stop_when, on_eval)
    steps = images = since = 0
    run.model.train()
    timer.start()
    walk = _schedule(run)
    for step, X, y in walk:
        run.train_on(X, y, step)
        steps, images, since = step + 1, images + len(y), since + 1
        if since >= (fine if curve.near(fine_margin) else every) or steps >= run.total_steps:
            since = 0
            if curve.evaluate(steps, images):
                break
            timer.start()
    if timer._t0 is not None:
        timer.stop()
    walk.close()  # releases the DataLoader's workers, outside the training time
    if not curve.evals or curve.evals[-1]["step"] != steps:
        timer.start()
        curve.evaluate(steps, images)
    train_s = timer.total
    return {"recipe": recipe.name, "seed": seed, "device": str(device), "targets": curve.reached,
            "final_acc": curve.evals[-1]["acc"], "train_s": train_s, "wall_s": time.perf_counter() - run.wall0,
            "setup_s": run.setup_s, "steps": steps, "images": images,
            "images_per_s": images / train_s if train_s > 0 else float("nan"),
            "eval_every_steps": every, "fine_every_steps": fine, "fine_margin": fine_margin,
            "test_count": len(run.y_test), "stop_when": stop_when,
            "num_epochs": recipe.num_epochs, "evals": curve.evals, "notes": run.notes}


class _Curve:
    """first_crossing_run's evaluations: the accuracy curve and the first evaluation at or above each target."""

    def __init__(self, run: _Run, timer: TrainTimer, targets: list[float], stop_when: str, on_eval):
        self.run, self.timer, self.targets, self.stop_when, self.on_eval = run, timer, targets, stop_when, on_eval
        self.reached: dict[str, dict | None] = {f"{t:g}": None for t in targets}
        self.evals: list[dict] = []

    def near(self, margin: float) -> bool:
        """The last evaluation lies within ``margin`` of a target not reached yet."""
        return bool(self.evals) and any(self.reached[f"{t:g}"] is None and self.evals[-1]["acc"] >= t - margin
                                        for t in self.targets)

    def evaluate(self, step: int, images: int) -> bool:
        """Stop the training clock, score the test set, record; True when the run should stop."""
        run = self.run
        train_s = self.timer.stop()
        acc = evaluate_tta(run.evaluated_model(), run.X_test, run.y_test, run.recipe.tta, 2000, run.recipe.amp,
                           run.recipe.channels_last)["acc"]
        row = {"step": step, "images": images, "epochs": step / run.steps_per_epoch, "train_s": train_s,
               "wall_s": time.perf_counter() - run.wall0, "acc": acc}
        self.evals.append(row)
        for t in self.targets:
            if self.reached[f"{t:g}"] is None and acc >= t:
                self.reached[f"{t:g}"] = dict(row)
        if self.on_eval:
            self.on_eval(row)
        run.model.train()
        hits = [v is not None for v in self.reached.values()]
        return {"all": all(hits), "first": any(hits), "never": False}[self.stop_when]


def _take(batches, n):
    out = []
    for X, y in batches:
        out.append((X, y))
        if len(out) == n:
            break
    return out


# --------------------------------------------------------------------------- several runs

def run_line(run: dict) -> str:
    """One line of prose per finished run (printed while the next one trains): time to each target, final accuracy,
    training, wall and set-up time, throughput."""
    hits = "; ".join(f"{float(key):.1%} " + (f"in {hit['train_s']:.2f} s" if hit else "not reached")
                     for key, hit in run["targets"].items())
    return (f"{run['recipe']} seed {run['seed']}: {hits}; final {run['final_acc']:.2%}; {run['train_s']:.2f} s "
            f"training, {run['wall_s']:.1f} s wall, {run['setup_s']:.1f} s set-up; {run['images_per_s']:,.0f} img/s"
            + "".join(f" (note: {n})" for n in run.get("notes") or ()))


def _mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(runs: list[dict]) -> list[dict]:
    """One row per recipe (in first-seen order): runs, per target the mean/sd training time over the runs that
    reached it and how many did, mean/sd of wall time to it, final accuracy mean/sd/min, throughput, set-up."""
    order = list(dict.fromkeys(r["recipe"] for r in runs))
    rows = []
    for name in order:
        rs = [r for r in runs if r["recipe"] == name]
        row = {"recipe": name, "runs": len(rs)}
        for key in rs[0]["targets"]:
            hits = [r["targets"][key] for r in rs]
            m, sd = _mean_sd([h["train_s"] if h else None for h in hits])
            wm, _ = _mean_sd([h["wall_s"] if h else None for h in hits])
            em, _ = _mean_sd([h["epochs"] if h else None for h in hits])
            row[f"t{key}_mean"], row[f"t{key}_sd"], row[f"t{key}_wall_mean"] = m, sd, wm
            row[f"t{key}_epochs_mean"], row[f"t{key}_reached"] = em, sum(h is not None for h in hits)
        am, asd = _mean_sd([r["final_acc"] for r in rs])
        row.update(acc_mean=am, acc_sd=asd, acc_min=min(r["final_acc"] for r in rs),
                   images_per_s=statistics.median(r["images_per_s"] for r in rs),
                   setup_s=statistics.median(r["setup_s"] for r in rs),
                   wall_s=statistics.fmean(r["wall_s"] for r in rs))
        rows.append(row)
    return rows


def _target_keys(rows: list[dict]) -> list[str]:
    """Every target any row has (the article's recipe aims at the first only), in first-seen order."""
    keys = [k[1:-5] for r in rows for k in r if k.startswith("t") and k.endswith("_mean") and "wall" not in k
            and "epochs" not in k]
    return list(dict.fromkeys(keys))


def summary_table(rows: list[dict]) -> pd.DataFrame:
    """``summarize``'s rows as a DataFrame, one row per recipe: per target the mean and sd of the training time
    to it (over the runs that reached it) and how many runs did (``2/2``), final accuracy, img/s, set-up s."""
    out = []
    for r in rows:
        row = {"recipe": r["recipe"], "runs": r["runs"]}
        for k in _target_keys(rows):
            label = f"{float(k):.1%}"
            for col, v in ((f"to {label} s", r.get(f"t{k}_mean")), (f"to {label} sd", r.get(f"t{k}_sd"))):
                row[col] = math.nan if v is None else v  # not reached in any run: NaN, so the column stays numeric
            aimed = f"t{k}_reached" in r  # a recipe that did not aim at this target: no count
            row[f"reached {label}"] = f"{r[f't{k}_reached']}/{r['runs']}" if aimed else "not aimed at"
        row.update({"final acc": r["acc_mean"], "acc sd": r["acc_sd"], "img/s": r["images_per_s"],
                    "setup s": r["setup_s"]})
        out.append(row)
    return table(out)


def show_summary(rows: list[dict], caption: str | None = None) -> None:
    """Display ``summary_table(rows)`` with its number formats (a styled table in a notebook, text elsewhere)."""
    df = summary_table(rows)
    formats = {c: "{:.2f}" for c in df.columns if c.startswith("to ")}
    formats.update({"final acc": "{:.2%}", "acc sd": "{:.2%}", "img/s": "{:,.0f}", "setup s": "{:.1f}"})
    show(df, formats=formats, caption=caption)


# --------------------------------------------------------------------------- the physical limit

def training_flops_per_image(model: nn.Module) -> int:
    """Forward FLOPs x 3: the backward pass costs about twice the forward (gradients for inputs and weights); the
    approximation of Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (2N FLOPs per token forward,
    6N to train)."""
    return 3 * flops_per_image(model)


def _gemm_rate(run: Callable[[], object], flops: float, device: torch.device, repeats: int,
               min_time_s: float) -> float:
    """Median FLOP/s of ``run`` (``flops`` per call) over ``repeats`` timed blocks of at least ``min_time_s``."""
    for _ in range(3):
        run()
    rates = []
    for _ in range(repeats):
        synchronize(device)
        k, t0 = 0, time.perf_counter()
        while True:
            run()
            k += 1
            synchronize(device)
            dt = time.perf_counter() - t0
            if dt >= min_time_s:
                break
        rates.append(flops * k / dt)
    return statistics.median(rates)


def measure_peak_flops(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024,
                       repeats: int = 5, min_time_s: float = 0.2, detail: dict | None = None) -> float:
    """Measured dense-GEMM throughput (FLOP/s, median of ``repeats``): the practical peak of this device.

    On a CPU it is the better of two GEMMs of the same size: torch's ``n x n`` matmul and the same arithmetic as a
    1x1 convolution in channels_last, which goes through oneDNN like the convolutions of training do. They can differ
    by 2x: on a 2-core AMD EPYC with AVX-512 the fp32 matmul ran at ~220 GFLOP/s and the 1x1 convolution at ~490, so
    a matmul-only "peak" put the article's Net above 100% of it. ``detail`` (a dict) receives each GEMM's rate."""
    device = select_device(device) if isinstance(device, str) else device
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    rates = {"matmul": _gemm_rate(lambda: a @ b, 2 * n ** 3, device, repeats, min_time_s)}
    if device.type == "cpu":  # (n/64 images of 8x8 positions) x n channels in, n out: an n x n x n GEMM
        x = torch.randn(max(1, n // 64), n, 8, 8, dtype=dtype).contiguous(memory_format=torch.channels_last)
        w = torch.randn(n, n, 1, 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
        try:
            rates["conv1x1"] = _gemm_rate(lambda: F.conv2d(x, w), 2 * x.shape[0] * 64 * n * n, device, repeats,
                                          min_time_s)
        except RuntimeError as e:  # no kernel for this dtype: the matmul stands alone
            rates["conv1x1_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    if detail is not None:
        detail.update(rates)
    return max(v for v in rates.values() if isinstance(v, float))


# --------------------------------------------------------------------------- verdicts on the series' targets

def _bounds(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its ~95% interval (mean +- 2 standard errors; a single run has none)."""
    m = statistics.fmean(xs)
    half = 2 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return m, m - half, m + half


def merge_contention(items: list[dict]) -> dict | None:
    """One contention record for several runs' (``claims.Contention.to_dict()``): the wall-weighted mean share of
    the CPU other processes used, the worst run's, and ``busy`` by the mean (``claims.BUSY_SHARE``)."""
    from mnist_helpers.course.claims import BUSY_SHARE

    items = [c for c in items if c]
    known = [c for c in items if c.get("others_cpu_share") is not None]
    if not items:
        return None
    wall = sum(c["wall_s"] for c in known) or 1e-9
    share = sum(c["others_cpu_share"] * c["wall_s"] for c in known) / wall if known else None
    loads = [c[k] for c in items for k in ("load_avg_before", "load_avg_after") if c.get(k) is not None]
    return {"others_cpu_share": None if share is None else round(share, 3),
            "max_run_share": max((c["others_cpu_share"] for c in known), default=None),
            "load_avg_max": max(loads, default=None), "cores": items[0].get("cores"),
            "wall_s": round(sum(c["wall_s"] for c in items), 1), "runs": len(items),
            "busy": share > BUSY_SHARE if share is not None else any(c.get("busy") for c in items)}


# --------------------------------------------------------------------------- the fixed-schedule protocol

def protocol_rows(runs: list[dict], baseline: str = "article", targets: Iterable[float] = (0.99, 0.995),
                  peak_flops: dict | None = None, flops_per_image: dict | None = None) -> list[dict]:
    """One row per recipe (first-seen order) from :func:`fixed_schedule` runs: seeds; the mean, sd and minimum of
    the final accuracy; per target the share of seeds at or above it and whether the *mean* is (the protocol's
    "reaches"); the schedule's training time (mean, sd), set-up and evaluation apart (medians); images/s; the
    speed-up over ``baseline``'s mean training time (same run; None without it); and, given ``peak_flops``
    (``{"float32": FLOP/s, "bfloat16": ...}``, :func:`measure_peak_flops`) and ``flops_per_image`` (training FLOPs
    per image, by recipe name), the training FLOP/s as a share of the peak of the dtype the recipe computes in."""
    targets = sorted(float(t) for t in targets)
    order = list(dict.fromkeys(r["recipe"] for r in runs))
    base = [r["train_s"] for r in runs if r["recipe"] == baseline]
    base_mean = statistics.fmean(base) if base else None
    rows = []
    for name in order:
        rs = [r for r in runs if r["recipe"] == name]
        accs, times = [r["final_acc"] for r in rs], [r["train_s"] for r in rs]
        acc_m, acc_sd = _mean_sd(accs)
        t_m, t_sd = _mean_sd(times)
        row = {"recipe": name, "seeds": len(rs), "acc_mean": acc_m, "acc_sd": acc_sd, "acc_min": min(accs),
               "train_s_mean": t_m, "train_s_sd": t_sd,
               "setup_s": statistics.median(r["setup_s"] for r in rs),
               "eval_s": statistics.median(r["eval_s"] for r in rs),
               "images_per_s": statistics.median(r["images_per_s"] for r in rs),
               "speedup": base_mean / t_m if base_mean and t_m else None}
        for t in targets:
            row[f"share_{t:g}"] = sum(a >= t for a in accs) / len(accs)
            row[f"reaches_{t:g}"] = acc_m >= t
        dtype = rs[0].get("compute_dtype", "float32")
        if peak_flops and flops_per_image and name in flops_per_image and peak_flops.get(dtype):
            row["flops_share"] = flops_per_image[name] * row["images_per_s"] / peak_flops[dtype]
            row["flops_dtype"] = dtype
        rows.append(row)
    return rows


def judge_protocol(runs: list[dict], baseline_runs: list[dict], target_acc: float, ratio_target: float,
                   min_seeds: int = MIN_SEEDS["cpu"]) -> tuple[str, dict]:
    """The verdict on "``runs``' recipe reaches ``target_acc`` at ``ratio_target`` times the speed of the
    baseline" under the fixed-schedule protocol, both measured in the same run.

    *Reaches* means the mean final accuracy is at or above the target (airbench's rule). The speed-up is the ratio of
    the mean training times, with its interval from each mean's +- 2 standard errors. ``holds``: the mean reaches
    the target and even the interval's low end of the ratio meets ``ratio_target``; ``does not hold here``: the
    mean misses the target, or even the high end of the ratio falls short; else ``inconclusive`` (the ratio
    target lies inside its interval, or fewer than ``min_seeds`` seeds ran)."""
    if not runs or not baseline_runs:
        raise ValueError("judge_protocol needs runs of the recipe and of the baseline, from the same benchmark")
    accs = [r["final_acc"] for r in runs]
    acc_m, acc_sd = _mean_sd(accs)
    m, lo, hi = _bounds([r["train_s"] for r in runs])
    bm, blo, bhi = _bounds([r["train_s"] for r in baseline_runs])
    nums = {"target_acc": target_acc, "seeds": len(runs), "acc_mean": acc_m, "acc_sd": acc_sd, "acc_min": min(accs),
            "at_or_above": sum(a >= target_acc for a in accs), "train_s_mean": m,
            "train_s_sd": statistics.stdev([r["train_s"] for r in runs]) if len(runs) > 1 else 0.0,
            "baseline_seeds": len(baseline_runs), "baseline_s_mean": bm,
            "baseline_epochs": baseline_runs[0].get("num_epochs"),
            "baseline_acc_mean": statistics.fmean(r["final_acc"] for r in baseline_runs),
            "ratio": bm / m, "ratio_low": blo / hi if hi > 0 else math.inf,
            "ratio_high": bhi / lo if lo > 0 else math.inf, "ratio_target": ratio_target, "min_seeds": min_seeds}
    if acc_m < target_acc or nums["ratio_high"] < ratio_target:
        return "does not hold here", nums
    if len(runs) >= min_seeds and nums["ratio_low"] >= ratio_target:
        return "holds", nums
    return "inconclusive", nums


def protocol_evidence(nums: dict) -> str:
    """The evidence sentence of a :func:`judge_protocol` verdict."""
    t = nums["target_acc"]
    return (f"mean final accuracy {nums['acc_mean']:.2%} +- {nums['acc_sd']:.2%} over {nums['seeds']} seeds "
            f"({nums['at_or_above']}/{nums['seeds']} at or above {t:.1%}; the mean must be); "
            f"{nums['train_s_mean']:.2f} +- {nums['train_s_sd']:.2f} s of training, "
            f"{nums['ratio']:.1f}x the article's recipe ({nums['baseline_s_mean']:.1f} s for its "
            f"{nums.get('baseline_epochs') or 5:g} epochs, "
            f"{nums['baseline_acc_mean']:.2%}, {nums['baseline_seeds']} seeds, same run; interval "
            f"{nums['ratio_low']:.1f}-{nums['ratio_high']:.1f}x; target {nums['ratio_target']:g}x)")


def protocol_table(rows: list[dict]) -> pd.DataFrame:
    """:func:`protocol_rows` as a DataFrame: one row per recipe."""
    targets = [k[len("share_"):] for k in (rows[0] if rows else {}) if k.startswith("share_")]
    out = []
    for r in rows:
        row = {"recipe": r["recipe"], "seeds": r["seeds"], "final acc mean": r["acc_mean"], "acc sd": r["acc_sd"],
               "acc min": r["acc_min"]}
        row.update({f">= {float(t):.1%}": f"{round(r[f'share_{t}'] * r['seeds'])}/{r['seeds']}" for t in targets})
        row.update({"train s": r["train_s_mean"], "train sd": r["train_s_sd"], "setup s": r["setup_s"],
                    "eval s": r["eval_s"], "img/s": r["images_per_s"],
                    "speed-up": math.nan if r["speedup"] is None else r["speedup"],
                    "% peak": 100 * r["flops_share"] if r.get("flops_share") is not None else math.nan})
        out.append(row)
    return table(out)


def show_protocol(rows: list[dict], caption: str | None = None) -> None:
    """Display :func:`protocol_table` with its number formats (a styled table in a notebook, text elsewhere)."""
    formats = {"final acc mean": "{:.2%}", "acc sd": "{:.2%}", "acc min": "{:.2%}", "train s": "{:.2f}",
               "train sd": "{:.2f}", "setup s": "{:.1f}", "eval s": "{:.2f}", "img/s": "{:,.0f}",
               "speed-up": "{:.1f}x", "% peak": "{:.1f}%"}
    show(protocol_table(rows), formats=formats, caption=caption)
