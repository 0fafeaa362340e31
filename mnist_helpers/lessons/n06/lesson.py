"""Lesson 06, DDP fundamentals (06_ddp_fundamentals): what the notebook's kernel runs itself, and its claims.

The scripts the learner writes (``train_single.py``, ``train_ddp.py``, ``allreduce_by_hand.py``) live in the
notebook's ``%%writefile`` cells and run under torchrun through ``mnist_helpers.launch``; this module holds what the
kernel does around them:

**Launching from a notebook, with fork** (section 6). :func:`notebook_start_method` says how the notebook starts
workers here (fork where it is safe, else spawn from a file); :func:`fork_after_cuda` reproduces "Cannot
re-initialize CUDA in forked subprocess" in a fresh process where a GPU exists; :func:`find_cuda_initializer` finds
the import that started CUDA (or asked the driver) before a fork.

**The runs, summarised**: :func:`epochs_differ`, :func:`shards_disjoint` (a ``train_ddp.py`` run's first images per
rank and epoch), :func:`by_hand_summary` (``allreduce_by_hand.py``'s ranks).

**The claims**: :func:`claims_06` judges 06.allreduce_average, 06.ddp_hooks and 06.set_epoch from those runs (pure:
the entries ``claims.record`` writes to ``results/06_ddp_fundamentals.json``). The article's other DDP claims are
judged by the appendix, notebook 12 (``lessons.n12.lesson``).

    from mnist_helpers.lessons.n06.lesson import find_cuda_initializer
    find_cuda_initializer(["torchvision", "my_module"], path="work")  # who touched CUDA at import, and where
"""
from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

from mnist_helpers.course.claims import GLOO
from mnist_helpers.launch import child_env


# --------------------------------------------------------------------------- launching from a notebook, with fork

def notebook_start_method(platform: str | None = None, start_methods: list[str] | None = None) -> dict:
    """How section 6 starts workers from the notebook here: ``{"start_method", "from_file", "why"}``.

    ``fork`` where it exists and is safe (Linux): the child is a copy of the kernel, so a function defined in a cell
    runs there as it is. Python documents fork as unsafe on macOS (system frameworks may crash a forked child; spawn
    is the default there since Python 3.8), and native Windows has no fork. There the same function is imported
    from a file (``from_file``: a ``%%writefile`` module) and started with ``spawn``: spawn sends the function by
    module and name, and a fresh process cannot find a function defined in a notebook cell.
    ``platform`` and ``start_methods`` default to ``sys.platform`` and ``multiprocessing.get_all_start_methods()``."""
    platform = sys.platform if platform is None else platform
    start_methods = multiprocessing.get_all_start_methods() if start_methods is None else start_methods
    if platform == "darwin":
        why = ("macOS: Python documents fork as unsafe here (system frameworks may crash a forked child) and "
               "starts processes with spawn by default")
    elif "fork" not in start_methods:
        why = f"no fork on this platform ({platform}): processes start with spawn"
    else:
        return {"start_method": "fork", "from_file": False,
                "why": "fork is available and safe here: the children are copies of this kernel"}
    return {"start_method": "spawn", "from_file": True,
            "why": why + "; spawn finds the function by module and name, so it runs from a file"}


_FORK_AFTER_CUDA = r'''
import json, torch, torch.multiprocessing as mp

def child(rank):
    torch.zeros(1, device="cuda")  # the child's first CUDA call

torch.zeros(1, device="cuda")      # the parent (the notebook kernel) touched CUDA first
try:
    mp.start_processes(child, nprocs=1, start_method="fork")
    print(json.dumps({"failed": False, "error": None}))
except Exception as e:  # ProcessRaisedException carries the child's traceback
    lines = [ln for ln in str(e).splitlines() if "Error" in ln or "CUDA" in ln]
    print(json.dumps({"failed": True, "error": (lines or [str(e)])[-1].strip()}))
'''


def fork_after_cuda(timeout: float = 120) -> dict:
    """The error fork-based notebook launchers (``accelerate.notebook_launcher``,
    ``torch.multiprocessing.start_processes(..., start_method="fork")``) meet most: the kernel initialised CUDA,
    then forked; the child's first CUDA call raises "Cannot re-initialize CUDA in forked subprocess".

    Reproduced in a fresh Python process (so this kernel's CUDA stays untouched) when a CUDA GPU exists:
    ``{"reproduced": True, "failed": bool, "error": str}``. Without one: ``{"reproduced": False, "why": ...}``."""
    from mnist_helpers.distributed import cuda_gpus

    if cuda_gpus() == 0:
        return {"reproduced": False, "why": "no CUDA GPU here: the error needs CUDA initialised before the fork"}
    proc = subprocess.run([sys.executable, "-c", _FORK_AFTER_CUDA], capture_output=True, text=True, timeout=timeout)
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"reproduced": True, "failed": True, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return {"reproduced": True, **out}


_FIND_INITIALIZER = r"""
import importlib, json, os, sys, traceback
import torch
import torch.cuda

calls = []  # (door, the stack that knocked), every call
torch_dir = os.path.dirname(torch.__file__) + os.sep  # torch's own frames (not torchvision's)


def _spy(door, original):
    def spy(*args, **kwargs):
        calls.append((door, [f"{f.filename}:{f.lineno} ({f.name})" for f in traceback.extract_stack()[:-1]]))
        return original(*args, **kwargs)
    return spy


# 1. torch's lazy initialisation, which every CUDA tensor and call goes through
torch.cuda._lazy_init = _spy("torch.cuda._lazy_init", torch.cuda._lazy_init)
# 2. the driver's device count behind torch.cuda.is_available() (and behind device_count() where NVML cannot
#    answer): it starts the driver without running 1., so torch.cuda.is_initialized() stays False
if hasattr(torch._C, "_cuda_getDeviceCount"):
    torch._C._cuda_getDeviceCount = _spy("cudaGetDeviceCount", torch._C._cuda_getDeviceCount)
rows = []
for name in sys.argv[1:]:
    before, was_initialized = len(calls), torch.cuda.is_initialized()
    try:
        importlib.import_module(name)
        error = None
    except Exception as e:  # noqa: BLE001 - a module that fails to import is reported, not fatal
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    door, stack = calls[before] if len(calls) > before else (None, [])
    frames = [f for f in stack if "importlib" not in f and "<frozen" not in f
              and not f.startswith(torch_dir)]  # the caller outside torch
    initialized = torch.cuda.is_initialized()
    rows.append({"module": name, "touched_cuda": door is not None or (initialized and not was_initialized),
                 "via": door, "cuda_initialized": initialized, "where": frames[-1] if frames else None,
                 "import_error": error})
print(json.dumps(rows))
"""


def find_cuda_initializer(modules: list[str], *, path: str | Path | None = None, timeout: float = 120) -> list[dict]:
    """Import ``modules`` one after another in a fresh Python process and report, for each, whether its import
    reached CUDA, through which door, and the file and line that did it first. A module that touches CUDA at
    import time breaks fork-based launchers; import it inside the worker function instead.

    Two doors are watched: ``torch.cuda._lazy_init`` (every CUDA tensor and call goes through it; afterwards
    ``torch.cuda.is_initialized()`` is True) and ``torch._C._cuda_getDeviceCount``, the driver's device count behind
    ``torch.cuda.is_available()`` (unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set and NVML answers) and behind
    ``torch.cuda.device_count()`` where NVML cannot answer. The second starts the CUDA driver, which is what breaks
    a fork, while ``torch.cuda.is_initialized()`` stays False: a spy on ``_lazy_init`` alone misses it.
    Each row: ``{"module", "touched_cuda", "via" (the door, or None), "cuda_initialized" (torch's own flag after
    the import), "where", "import_error"}``; ``touched_cuda`` is also True when the module left CUDA initialised
    by a door not watched here.

    ``path``: a folder put first on the child's ``sys.path`` (a notebook's own modules). The child gets this
    process's environment (``PYTORCH_NVML_BASED_CUDA_CHECK`` included). On a machine without a GPU the calls are
    still made and caught (the first then fails with "no NVIDIA driver", which the module may swallow), so the
    table is the same; with torch built without CUDA, ``is_available()`` returns before any door."""
    env = child_env(path)
    proc = subprocess.run([sys.executable, "-c", _FIND_INITIALIZER, *modules], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the CUDA-initialiser probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])




def _distinct(ranks: list[dict], key: str) -> int:
    return len({r[key] for r in ranks})


def epochs_differ(run: dict) -> bool:
    """Every rank of a ``train_ddp.py`` run began each epoch with different images (``set_epoch`` worked)."""
    return all(len({tuple(e) for e in r["first_indices"]}) == len(r["first_indices"]) for r in run["ranks"])


def shards_disjoint(run: dict) -> bool:
    """In every epoch of a ``train_ddp.py`` run the ranks' first images were different ones."""
    epochs = len(run["ranks"][0]["first_indices"])
    for e in range(epochs):
        seen = [i for r in run["ranks"] for i in r["first_indices"][e]]
        if len(seen) != len(set(seen)):
            return False
    return True


def by_hand_summary(run: dict) -> dict:
    """The manual all-reduce script's ranks, summarised: distinct digests and largest differences."""
    ranks = run["ranks"]
    return {"processes": run["world_size"],
            "distinct_grads_before_reduce": _distinct(ranks, "grads_before_reduce"),
            "distinct_grads_after_reduce": _distinct(ranks, "grads_after_reduce"),
            "distinct_params_after_step": _distinct(ranks, "params_after_step"),
            "distinct_params_without_reduce": _distinct(ranks, "params_after_step_without_reduce"),
            "max_diff_vs_global_batch": max(r["max_diff_vs_global_batch"] for r in ranks),
            "ddp_max_diff_vs_manual": max(r["ddp_max_diff_vs_manual"] for r in ranks)}


# --------------------------------------------------------------------------- the notebook's claims, from its runs

def _same_share(run: dict) -> float:
    """The share of first-image positions that hold the same image in consecutive epochs, over a ``train_ddp.py``
    run's ranks (each rank records its first images of every epoch)."""
    same = total = 0
    for r in run["ranks"]:
        for prev, cur in zip(r["first_indices"], r["first_indices"][1:]):
            same += sum(a == b for a, b in zip(prev, cur))
            total += min(len(prev), len(cur))
    return same / total if total else float("nan")


def claims_06(*, by_hand: dict, ddp_run: dict, forgot_run: dict) -> list[dict]:
    """06's claims, judged from what the notebook ran; no I/O. One dict per claim (``claims.record``'s entries).

    ``by_hand``: ``{processes: allreduce_by_hand.py's result}``; ``ddp_run``/``forgot_run``: the learner's
    ``train_ddp.py`` and its copy with the ``set_epoch`` line commented out.

    - 06.allreduce_average: after ``all_reduce`` / world size every replica takes the same step (one set of weights
      after it, one per rank without it) and the averaged gradient is the global batch's (within 1e-5);
    - 06.ddp_hooks: DDP's gradients after a plain ``backward()`` equal the manual all-reduce's (within 1e-6);
    - 06.set_epoch: without ``set_epoch`` every rank's first images repeat at every position from one epoch to the
      next, with it every rank begins each epoch differently."""
    ma = {n: by_hand_summary(run) for n, run in by_hand.items()}
    ns = sorted(ma)
    allreduce_ok = all(ma[n]["distinct_params_after_step"] == 1 and ma[n]["max_diff_vs_global_batch"] < 1e-5
                       and ma[n]["distinct_params_without_reduce"] == n for n in ns)
    hooks_ok = all(ma[n]["ddp_max_diff_vs_manual"] < 1e-6 for n in ns)
    by_hand_regime = f"Net, 32 images per process, one step, {' and '.join(map(str, ns))} processes"
    same_with, same_without = _same_share(ddp_run), _same_share(forgot_run)
    set_epoch_ok = same_without == 1.0 and epochs_differ(ddp_run)
    ranks, shard = len(ddp_run["ranks"]), forgot_run["ranks"][0]["shard_size"]
    first = len(ddp_run["ranks"][0]["first_indices"][0])
    return [
        dict(id="06.allreduce_average", verdict="holds" if allreduce_ok else "does not hold here",
             evidence=(f"after all_reduce/world_size: {max(ma[n]['distinct_params_after_step'] for n in ns)} distinct "
                       f"replica(s) (without it: {ma[ns[0]]['distinct_params_without_reduce']} with {ns[0]} processes); "
                       f"largest difference from the global batch's gradient "
                       f"{max(ma[n]['max_diff_vs_global_batch'] for n in ns):.1e}"),
             numbers={f"{k}_{n}": ma[n][k] for n in ns for k in ("distinct_params_after_step",
                                                                  "distinct_params_without_reduce",
                                                                  "max_diff_vs_global_batch")},
             regime=f"{by_hand_regime}, the notebook's allreduce_by_hand.py; {GLOO}"),
        dict(id="06.ddp_hooks", verdict="holds" if hooks_ok else "does not hold here",
             evidence=f"DDP's gradients after a plain backward() vs the manual all-reduce: largest difference "
                      f"{max(ma[n]['ddp_max_diff_vs_manual'] for n in ns):.1e}",
             numbers={f"ddp_max_diff_vs_manual_{n}": ma[n]["ddp_max_diff_vs_manual"] for n in ns},
             regime=f"{by_hand_regime}; {GLOO}"),
        dict(id="06.set_epoch", verdict="holds" if set_epoch_ok else "does not hold here",
             evidence=(f"your train_ddp.py without its set_epoch line: {same_without:.0%} of each rank's first "
                       f"images repeated at the same position in the next epoch; with it {same_with:.0%}, and every "
                       f"rank began each epoch differently: {epochs_differ(ddp_run)}"),
             numbers={"same_position_without_set_epoch": same_without, "same_position_with_set_epoch": same_with,
                      "ranks": ranks, "first_images": first, "shard_size_without": shard},
             regime=(f"DistributedSampler(shuffle=True, seed=0) in the notebook's train_ddp.py, {ranks} processes, "
                     f"the first {first} images of each epoch per rank; without set_epoch: {shard:,} images per "
                     f"rank, {len(forgot_run['ranks'][0]['first_indices'])} epochs; {GLOO}")),
    ]
