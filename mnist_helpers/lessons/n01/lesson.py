"""Notebook 01_resource_inspection's lesson code: the task level's starting configuration, and the
framework level measured (the sweeps behind the "2x from configuration alone" claim).

This module holds:

0. **The hardware and framework levels, read through Python APIs** (never by parsing another tool's text):
   hardware: ``cpu_info()`` (cores, affinity, cgroup quota), ``memory_info()``, ``disk_info(path)``,
   ``read_throughput(path)`` (a measured read of the data folder, cold and warm), ``gpu_info()`` (torch.cuda,
   plus NVML through ``pynvml`` from ``nvidia-ml-py`` when it is importable), ``hardware_info()`` (all of
   them); framework: ``framework_info()`` (versions, threads, MKL/oneDNN, matmul precision, TF32, cuDNN
   benchmark, the CUDA caching allocator's ``PYTORCH_CUDA_ALLOC_CONF``); ``shell_equivalent(cmd)``: the
   article's ``nvidia-smi`` / ``lscpu`` / ``free -h``, run when present, with a plain "not installed here"
   otherwise. Each returns plain dicts (JSON-ready) and never raises because a device or tool is missing.

1. **A starting configuration for a machine, each choice with its reason.** The article's third level of
   resources is the *task* configuration: batch size, DataLoader workers, pinned memory, mixed precision,
   processes per node. ``recommend_config(machine)`` turns a machine description into those settings, one
   row ``{"setting", "value", "reason"}`` each, so a learner sees *why*; ``measured_threads()`` reads back
   the fastest thread count of this host's latest threads sweep (02 uses it)::

       from mnist_helpers.course.display import show
       from mnist_helpers.lessons.n01.lesson import as_kwargs, recommend_config
       rows = recommend_config()                 # this machine (resources.machine_info())
       show(rows, columns=["setting", "value", "reason"])
       TrainConfig(loader="dataloader", num_workers=as_kwargs(rows)["num_workers"])

   A machine description is a dict like ``resources.machine_info()`` returns; only these keys are read:
   ``logical_cores`` (int >= 1), ``ram_gib`` (> 0), ``gpus`` (list of ``{"name", "memory_gib", optional
   "capability": "8.6"}``), optional ``usable_cores`` (cores this process may use) and ``simd`` (CPU features
   such as ``"amx_bf16"``). These are rules of thumb, the article's and ours; notebooks 03 (workers), 04
   (batch size), 05 (precision) and 07 (processes) measure whether they hold.

2. **Training-step throughput under different framework settings.** The article claims that on the same
   hardware, framework configuration alone can change utilisation about 2x. ``threads_sweep()`` measures it:
   the series' training step (``train.train_step``: the model, Adam, one batch of synthetic MNIST-shaped data)
   at ``torch.set_num_threads(1..N)`` and beyond. ``framework_sweep(configs)`` does the same for any settings
   (on a GPU: TF32 on/off, ``cudnn.benchmark``, bf16 autocast). Each returns one row per setting (a list of
   dicts) for ``display.show``.

   Each point runs in a fresh subprocess, because thread pools are per process and a fresh process keeps one
   setting from leaking into the next; it prints one JSON line::

       python -m mnist_helpers.lessons.n01.lesson --threads 2 --model fastnet --batch-size 32 --steps 5

   Rounds are interleaved (1, 2, 4, 1, 2, 4, ...) so that a burst of load from other jobs on a shared machine
   hits every setting alike; each point is the median over every timed block. Reported per point:
   ``images_per_s`` and ``cpu_cores_busy`` (process CPU time / wall time during the timed blocks: the
   utilisation the claim is about).

3. **The claims, judged.** ``claims_01(Measured01(...))`` turns what the notebook measured into its three claims
   (verdict, evidence, numbers, regime), a pure function the notebook hands to ``claims.record``; ``thread_ratios(sweep)``
   gives the sweep's ratios for the cell that shows them.
"""
from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mnist_helpers.course import experiments
from mnist_helpers.memory import GPU_USABLE_GIB, MEM_FAILS, MEM_HOLDS, gpu_memory_verdict
from mnist_helpers.models import build_model
from mnist_helpers.resources import SIMD_FLAGS, cpu_flags, cpu_model, machine_info, usable_cores
from mnist_helpers.train import check_amp, select_device, train_step

# --------------------------------------------------------------------------- the hardware and framework levels

def cgroup_cpu_limit() -> float | None:
    """CPUs this container may use according to cgroup v2 ``cpu.max`` (None: no quota, or not Linux)."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else round(int(quota) / int(period), 2)
    except (OSError, ValueError):
        return None


def cpu_info() -> dict:
    """Model, physical/logical cores, the cores this process may run on, cgroup quota, SIMD features."""
    import psutil

    flags = cpu_flags()
    usable = usable_cores()
    simd = [f for f in SIMD_FLAGS if f in flags]
    return {"cpu_model": cpu_model(), "physical_cores": psutil.cpu_count(logical=False),
            "logical_cores": os.cpu_count(), "usable_cores": usable, "cgroup_cpu_limit": cgroup_cpu_limit(),
            "simd": simd, "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def memory_info() -> dict:
    """RAM total / available and swap, in GiB (``free -h`` in numbers)."""
    import psutil

    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    g = lambda b: round(b / 2**30, 2)  # noqa: E731
    return {"ram_total_gib": g(vm.total), "ram_available_gib": g(vm.available), "ram_used_pct": vm.percent,
            "swap_total_gib": g(sw.total)}


def disk_info(path: str | Path | None = None) -> dict:
    """Total and free space of the filesystem holding ``path`` (default: the data root)."""
    from mnist_helpers.paths import data_root

    p = Path(path) if path is not None else data_root()
    probe = p
    while not probe.exists() and probe != probe.parent:  # the folder may not exist yet
        probe = probe.parent
    du = shutil.disk_usage(probe)
    return {"path": str(p), "disk_total_gib": round(du.total / 2**30, 1), "disk_free_gib": round(du.free / 2**30, 1)}


def _drop_from_page_cache(path: Path) -> bool:
    """Ask the kernel to forget its cached copy of ``path`` (no root needed). False where unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def read_throughput(path: str | Path | None = None, *, max_bytes: int = 256 * 2**20, repeats: int = 3,
                    chunk: int = 1 << 20) -> dict:
    """Measured sequential read speed of the files under ``path`` (default: the data root), in MB/s.

    ``cold``: after asking the kernel to drop the files from its page cache (``posix_fadvise``), so the
    read comes from the disk (or the hypervisor's cache on a VM: we cannot see past it);
    ``warm``: read again at once, from RAM. Median of ``repeats`` each. Reads at most ``max_bytes``.
    """
    from mnist_helpers.paths import data_root

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    root = Path(path) if path is not None else data_root()
    if not root.exists():
        raise ValueError(f"{root} does not exist: nothing to read. Provision MNIST first (`make data`)")
    files = [root] if root.is_file() else sorted((p for p in root.rglob("*") if p.is_file()),
                                                 key=lambda p: -p.stat().st_size)
    chosen, total = [], 0
    for f in files:
        if total >= max_bytes:
            break
        chosen.append(f)
        total += min(f.stat().st_size, max_bytes - total)
    if total == 0:
        raise ValueError(f"{root} holds no data to read")

    def read_all() -> float:
        left = total
        t0 = time.perf_counter()
        for f in chosen:
            with open(f, "rb", buffering=0) as fh:
                while left > 0:
                    b = fh.read(min(chunk, left))
                    if not b:
                        break
                    left -= len(b)
        return time.perf_counter() - t0

    cold, warm, dropped = [], [], True
    for _ in range(repeats):
        dropped &= all(_drop_from_page_cache(f) for f in chosen)
        cold.append(read_all())
        warm.append(read_all())
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    mb = total / 1e6
    return {"path": str(root), "files": len(chosen), "megabytes": round(mb, 1),
            "cold_mb_per_s": round(mb / med(cold), 1), "warm_mb_per_s": round(mb / med(warm), 1),
            "cache_dropped": dropped, "repeats": repeats}


def nvml_info() -> dict:
    """GPU state through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

    Returns ``{"available": False, "reason": ...}`` when the module or the driver is missing, else
    ``{"available": True, "driver": ..., "gpus": [{index, name, memory_total_gib, memory_used_gib,
    utilization_gpu_pct, utilization_memory_pct, temperature_c, power_w}]}``.
    """
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "pynvml is not installed (pip install nvidia-ml-py)"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        return {"available": False, "reason": f"NVML could not start: {e}"}
    try:
        def text(v):
            return v.decode() if isinstance(v, bytes) else str(v)

        out = {"available": True, "driver": text(pynvml.nvmlSystemGetDriverVersion()), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            row = {"index": i, "name": text(pynvml.nvmlDeviceGetName(h)),
                   "memory_total_gib": round(mem.total / 2**30, 2), "memory_used_gib": round(mem.used / 2**30, 2),
                   "utilization_gpu_pct": util.gpu, "utilization_memory_pct": util.memory}
            for key, fn, scale in (("temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(h, 0), 1),
                                   ("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h), 1e-3)):
                try:
                    row[key] = round(fn() * scale, 1)
                except Exception:  # not every board reports every sensor
                    row[key] = None
            out["gpus"].append(row)
        return out
    finally:
        pynvml.nvmlShutdown()


def gpu_info() -> list[dict]:
    """One dict per visible GPU: torch's view (name, memory, compute capability, bf16) merged with
    NVML's live numbers (memory used, utilisation, driver) when NVML works. [] without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    nvml = nvml_info()
    rows = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        row = {"index": i, "name": p.name, "memory_total_gib": round(p.total_memory / 2**30, 2),
               "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
               "bf16": p.major >= 8}
        # Indices agree unless CUDA_VISIBLE_DEVICES reorders GPUs; NVML always sees every GPU.
        if nvml["available"] and not os.environ.get("CUDA_VISIBLE_DEVICES") and i < len(nvml["gpus"]):
            n = nvml["gpus"][i]
            row.update({k: n[k] for k in n if k not in ("index", "name", "memory_total_gib")},
                       driver=nvml["driver"])
        else:
            free, total = torch.cuda.mem_get_info(i)
            row["memory_used_gib"] = round((total - free) / 2**30, 2)
        rows.append(row)
    return rows


def hardware_info(data_dir: str | Path | None = None, *, measure_io: bool = True) -> dict:
    """The article's hardware level in one dict: cpu, memory, disk (+ measured read speed), gpus."""
    info = {"cpu": cpu_info(), "memory": memory_info(), "disk": disk_info(data_dir), "gpus": gpu_info()}
    if measure_io:
        info["disk_read"] = read_throughput(data_dir)
    return info


# --------------------------------------------------------------------------- framework

def framework_info() -> dict:
    """The framework level: versions, threads, math libraries, precision and allocator settings."""
    import torch

    cuda = torch.cuda.is_available()
    info = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "mkl": torch.backends.mkl.is_available(),
        "onednn_mkldnn": torch.backends.mkldnn.is_available(),
        "openmp": torch.backends.openmp.is_available(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "(unset: default caching allocator)",
        "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF") or "(unset; newer name, same settings)",
    }
    if cuda:
        info["cuda_memory_allocated_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        info["cuda_memory_reserved_mib"] = round(torch.cuda.memory_reserved() / 2**20, 1)
    return info


# --------------------------------------------------------------------------- shell equivalents

SHELL_EQUIVALENTS = {"lscpu": ["lscpu"], "free -h": ["free", "-h"], "nvidia-smi": ["nvidia-smi"]}


def shell_equivalent(name: str, *, max_lines: int = 25, timeout: float = 10.0) -> dict:
    """Run one of the article's inspection commands (``lscpu``, ``free -h``, ``nvidia-smi``) if it exists.

    Returns ``{"command", "present", "output"}``; ``output`` says plainly when the tool is absent or fails.
    """
    if name not in SHELL_EQUIVALENTS:
        raise ValueError(f"unknown command {name!r}; choose one of {', '.join(SHELL_EQUIVALENTS)}")
    argv = SHELL_EQUIVALENTS[name]
    if shutil.which(argv[0]) is None:
        why = " (no NVIDIA driver on this machine)" if argv[0] == "nvidia-smi" else ""
        return {"command": name, "present": False, "output": f"`{name}` is not installed here{why}"}
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"command": name, "present": True, "output": f"`{name}` failed: {e}"}
    text = res.stdout if res.returncode == 0 else f"`{name}` exited with {res.returncode}: {res.stderr.strip()}"
    lines = text.rstrip().splitlines()
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return {"command": name, "present": True, "output": "\n".join(lines)}


# --------------------------------------------------------------------------- 1. the task configuration

# Fake machines for the unit tests and for comparison tables in 01.
EXAMPLE_MACHINES = {
    "2-core CPU laptop": {"cpu_model": "laptop CPU", "logical_cores": 2, "ram_gib": 8, "gpus": []},
    "article's 8-core + 8 GB GPU": {
        "cpu_model": "8-core CPU", "logical_cores": 8, "ram_gib": 16,
        "gpus": [{"name": "NVIDIA GeForce RTX 3070", "memory_gib": 8, "capability": "8.6"}]},
    "8-GPU server": {
        "cpu_model": "64-core server CPU", "logical_cores": 64, "ram_gib": 512,
        "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_gib": 80, "capability": "8.0"}] * 8},
}

ARTICLE_BATCH = 128         # section 5.1; "64-256 is reasonable for MNIST"
MAX_USEFUL_WORKERS = 4      # MNIST decodes in microseconds; beyond this workers only add processes
CUDA_CONTEXT_GIB = 0.5      # what the CUDA context and kernels take before the first tensor


def _fail(msg: str):
    raise ValueError(f"{msg}. A machine description looks like "
                     "{'logical_cores': 8, 'ram_gib': 16, 'gpus': [{'name': 'RTX 3070', 'memory_gib': 8}]}; "
                     "resources.machine_info() makes one for this machine")


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def validate_machine(machine) -> dict:
    """Return a normalised copy of ``machine`` or raise ValueError saying which field is wrong."""
    if not isinstance(machine, dict):
        _fail(f"machine must be a dict, got {type(machine).__name__}")
    m = dict(machine)
    cores = m.get("logical_cores")
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        _fail(f"machine['logical_cores'] must be an integer >= 1, got {cores!r}")
    usable = m.get("usable_cores", cores)
    if not isinstance(usable, int) or isinstance(usable, bool) or not 1 <= usable <= cores:
        _fail(f"machine['usable_cores'] must be an integer between 1 and logical_cores ({cores}), got {usable!r}")
    m["usable_cores"] = usable
    ram = m.get("ram_gib")
    if not _is_num(ram) or ram <= 0:
        _fail(f"machine['ram_gib'] must be a positive number of GiB, got {ram!r}")
    gpus = m.get("gpus", [])
    if not isinstance(gpus, (list, tuple)):
        _fail(f"machine['gpus'] must be a list (empty for none), got {type(gpus).__name__}")
    clean = []
    for i, g in enumerate(gpus):
        if not isinstance(g, dict):
            _fail(f"machine['gpus'][{i}] must be a dict with 'name' and 'memory_gib', got {g!r}")
        if not isinstance(g.get("name"), str) or not g["name"]:
            _fail(f"machine['gpus'][{i}]['name'] must be a non-empty string, got {g.get('name')!r}")
        mem = g.get("memory_gib")
        if not _is_num(mem) or mem <= 0:
            _fail(f"machine['gpus'][{i}]['memory_gib'] must be a positive number, got {mem!r}")
        cap = g.get("capability")
        if cap is not None:
            try:
                major = int(str(cap).split(".")[0])
            except ValueError:
                major = -1
            if major < 1:
                _fail(f"machine['gpus'][{i}]['capability'] must look like '8.6', got {cap!r}")
        clean.append(dict(g))
    m["gpus"] = clean
    simd = m.get("simd", [])
    if not isinstance(simd, (list, tuple, set)):
        _fail(f"machine['simd'] must be a list of CPU feature names, got {type(simd).__name__}")
    m["simd"] = list(simd)
    return m


def train_memory_gib(batch_size: int, model: str = "net") -> float:
    """Estimated memory for one training step: activations kept for backward and their gradients
    (measured with forward hooks on one image), plus weights, gradients and Adam's two moments."""
    net = build_model(model)
    acts = []
    hooks = [mod.register_forward_hook(lambda _m, _i, out: acts.append(out.numel()))
             for mod in net.modules() if not list(mod.children())]
    with torch.no_grad():
        net(torch.zeros(1, 1, 28, 28))
    for h in hooks:
        h.remove()
    # functional ReLU/pool outputs are not module outputs: count the module outputs twice for them,
    # and twice again for their gradients in backward.
    per_image = 4 * sum(acts) * 2 * 2
    params = 4 * sum(p.numel() for p in net.parameters()) * 4
    return (per_image * batch_size + params) / 2**30


def _capability(gpu: dict) -> float | None:
    cap = gpu.get("capability")
    return None if cap is None else float(str(cap))


def recommend_config(machine: dict | None = None, *, model: str = "net") -> list[dict]:
    """Rows ``{"setting", "value", "reason"}`` for device, processes_per_node, batch_size, num_workers,
    threads_per_process, pin_memory and amp. ``machine`` defaults to this machine."""
    if machine is None:
        machine = machine_info()
        cpu = cpu_info()
        machine.update(usable_cores=cpu["usable_cores"], simd=cpu["simd"])
    m = validate_machine(machine)
    cores, gpus, rows = m["usable_cores"], m["gpus"], []

    def add(setting, value, reason):
        rows.append({"setting": setting, "value": value, "reason": reason})

    if gpus:
        add("device", "cuda", f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} found ({gpus[0]['name']}): train there; the CPU feeds it")
        nproc = len(gpus)
        add("processes_per_node", nproc,
            "one DDP process per GPU (torchrun --nproc_per_node=%d); " % nproc
            + ("a single GPU needs no DDP" if nproc == 1 else "each process owns one GPU and one shard of the data"))
    else:
        add("device", "cpu", "no GPU: the CPU trains, with one intra-op thread per core")
        nproc = 1
        add("processes_per_node", 1, "on CPU one process already uses every core through intra-op threads; "
            "several gloo processes would split the same cores and add all-reduce traffic (notebook 07 measures it)")

    # batch size: the article's 128, halved only if the estimate would not fit comfortably.
    budget = min(g["memory_gib"] for g in gpus) - CUDA_CONTEXT_GIB if gpus else m["ram_gib"] / 4
    where = "the smallest GPU's memory" if gpus else "a quarter of RAM"
    batch = ARTICLE_BATCH
    while batch > 8 and train_memory_gib(batch, model) > budget / 2:
        batch //= 2
    need = train_memory_gib(batch, model)
    fits = "fits easily" if need < budget / 10 else "fits"
    add("batch_size", batch,
        f"the article's {ARTICLE_BATCH} (64-256 is reasonable for MNIST)" if batch == ARTICLE_BATCH else
        f"halved from {ARTICLE_BATCH} until the step fits in half of {where}")
    rows[-1]["reason"] += (f"; a training step needs ~{need * 1024:.0f} MiB, {fits} in {where} "
                           f"({max(budget, 0):.1f} GiB)") + ("; it is per process, so the global batch is "
                                                             f"{batch} x {nproc} = {batch * nproc}" if nproc > 1 else "")

    cores_per_proc = max(1, cores // nproc)
    if gpus:
        workers = max(1, min(MAX_USEFUL_WORKERS, cores_per_proc // 2))
        add("num_workers", workers,
            f"{cores_per_proc} core(s) per process: the article's 1/4-1/2 of the cores, leaving the rest to "
            f"the process that drives the GPU; capped at {MAX_USEFUL_WORKERS} because MNIST decodes in "
            "microseconds (notebook 03 measures the curve)")
        threads = max(1, cores_per_proc - workers)
        add("threads_per_process", threads, "the cores left per process after its loader workers; "
            "a GPU process needs few CPU threads")
    else:
        workers = cores // 4
        add("num_workers", workers,
            f"{cores} core(s) and the CPU also trains: every loader worker takes a core from the compute "
            + ("threads, and MNIST decoding is cheap, so load in the main process (0)" if workers == 0 else
               f"threads; a quarter of the cores ({workers}) is enough to decode MNIST")
            + " (notebook 03 measures it)")
        add("threads_per_process", max(1, cores - workers),
            "torch.set_num_threads: one compute thread per core not used by a loader worker "
            "(notebook 01's threads sweep shows why not more)")
    add("pin_memory", bool(gpus),
        "page-locked host memory makes host-to-GPU copies faster and asynchronous" if gpus else
        "only speeds host-to-GPU copies; meaningless without a GPU")

    add("amp", *_amp_choice(gpus, m["simd"]))
    return rows


def _amp_choice(gpus: list[dict], simd) -> tuple[str, str]:
    """recommend_config's amp row: (value, reason) for these GPUs, or for the CPU's instruction sets."""
    if gpus:
        caps = [_capability(g) for g in gpus]
        if any(c is None for c in caps):
            return "fp16", ("compute capability unknown: fp16 autocast with GradScaler works on every CUDA GPU; use "
                            "bf16 (no scaler needed) if the GPU is Ampere (8.0) or newer")
        if min(caps) >= 8.0:
            return "bf16", (f"capability {min(caps):.1f} >= 8.0 supports bfloat16: fp32's range, so no GradScaler, "
                            "and tensor cores for the convolutions and fc layers")
        return "fp16", f"capability {min(caps):.1f} < 8.0 has no fast bfloat16: fp16 autocast with GradScaler"
    amx = "amx_bf16" in simd or "avx512_bf16" in simd
    return "none", "CPU training in float32" + (
        "; this CPU has bf16 instructions (AMX/AVX512-BF16), so amp='bf16' may be faster: measure it first "
        "(notebook 05)" if amx else "; without bf16 instructions (AMX/AVX512-BF16) autocast only adds casts")


def as_kwargs(rows: list[dict]) -> dict:
    """``{setting: value}`` from ``recommend_config`` rows."""
    return {r["setting"]: r["value"] for r in rows}


def measured_threads(hostname: str | None = None, *, path=None) -> tuple[int | None, str]:
    """The fastest ``torch.set_num_threads`` value in notebook 01's latest threads sweep on this host.

    Rules of thumb assume an idle machine; a measurement on *this* machine beats them. Prefers the
    latest full-profile sweep, else the latest sweep of any profile. Returns ``(threads, reason)``,
    or ``(None, reason)`` when the experiment log holds no sweep for this host (then leave torch's default).
    """
    host = hostname or socket.gethostname()
    rows = [r for r in experiments.query(path, notebook="01", name="threads-sweep", hostname=host)
            if isinstance(r.get("images_per_s"), dict) and r["images_per_s"]]
    if not rows:
        return None, f"no threads sweep from notebook 01 for host {host!r} in the experiment log: torch's default"
    full = [r for r in rows if "full" in r["tags"].split(",")]
    row = (full or rows)[-1]
    ips = {int(k): float(v) for k, v in row["images_per_s"].items()}
    best = max(ips, key=ips.get)
    others = ", ".join(f"{t}: {v:,.0f}" for t, v in sorted(ips.items()))
    return best, (f"fastest in notebook 01's sweep of {row['time']} ({'full' if full else 'quick'} profile; "
                  f"img/s by threads {others})")


# --------------------------------------------------------------------------- 2. framework settings, measured

SETTING_KEYS = ("threads", "device", "channels_last", "tf32", "cudnn_benchmark", "amp")
WORKLOAD_KEYS = ("model", "batch_size", "steps", "warmup", "repeats", "seed")


def step_throughput(*, model: str = "net", batch_size: int = 128, threads: int | None = None,
                    device: str = "cpu", channels_last: bool = False, tf32: bool | None = None,
                    cudnn_benchmark: bool | None = None, amp: str = "none", steps: int = 10,
                    warmup: int = 3, repeats: int = 3, seed: int = 0) -> dict:
    """Time ``repeats`` blocks of ``steps`` training steps (``train.train_step``) in this process, after
    ``warmup`` steps.

    Returns ``{"images_per_s": [per block], "cpu_cores_busy": [per block], ...settings}``.
    Changes this process's thread count and backend flags: run it in a subprocess (``measure``).
    """
    for name, v in (("batch_size", batch_size), ("steps", steps), ("repeats", repeats)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        torch.set_num_threads(threads)
    dev = select_device(device)
    check_amp(amp, dev)
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
    torch.manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = build_model(model).to(dev).to(memory_format=fmt)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    X = torch.randn(batch_size, 1, 28, 28, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (batch_size,), device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        train_step(net, opt, X, y, amp=amp)
    sync()
    ips, busy = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            train_step(net, opt, X, y, amp=amp)
        sync()
        wall = time.perf_counter() - t0
        ips.append(steps * batch_size / wall)
        busy.append((time.process_time() - c0) / wall)
    return {"model": model, "batch_size": batch_size, "threads": torch.get_num_threads(), "device": str(dev),
            "channels_last": channels_last, "tf32": tf32, "cudnn_benchmark": cudnn_benchmark, "amp": amp,
            "images_per_s": ips, "cpu_cores_busy": busy}


def command(settings: dict) -> list[str]:
    """The subprocess that measures ``settings``: ``python -m mnist_helpers.lessons.n01.lesson --threads 2 ...``
    (``--tf32`` / ``--no-tf32`` for the on/off settings)."""
    argv = [sys.executable, "-m", "mnist_helpers.lessons.n01.lesson"]
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def measure(settings: dict, *, timeout: float = 300.0) -> dict:
    """``step_throughput(**settings)`` in a fresh Python process (its own thread pool); returns its dict."""
    unknown = set(settings) - set(SETTING_KEYS) - set(WORKLOAD_KEYS)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; allowed: {', '.join(SETTING_KEYS + WORKLOAD_KEYS)}")
    env = dict(os.environ)
    if settings.get("threads"):  # the OpenMP/MKL pools read these before torch.set_num_threads runs
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(settings["threads"])
    res = subprocess.run(command(settings), capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"throughput measurement {settings} failed (exit {res.returncode}):\n{tail}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def framework_sweep(configs: list[dict], *, rounds: int = 3, common: dict | None = None,
                    timeout: float = 300.0, echo: bool = True) -> list[dict]:
    """Measure each settings dict in ``configs`` ``rounds`` times, interleaved, each in a subprocess.

    Returns one row per config (show it with ``display.show``): ``label``, its settings, ``images_per_s``
    (median over all timed blocks), ``spread`` ((max - min) / median), ``cpu_cores_busy`` (median),
    ``blocks``, ``vs_best`` (images_per_s / best), every block's value (``samples``), and the load each
    measurement ran under (``claims.Contention``): ``others_cpu_share`` (the largest share of the CPU other
    processes took during one of its measurements), ``load_avg`` (the highest 1-minute load average seen) and
    ``busy`` (any of its measurements busy). ``echo`` prints one line per measurement as it lands.
    """
    from mnist_helpers.course.claims import Contention

    if not configs or not all(isinstance(c, dict) for c in configs):
        raise ValueError("configs must be a non-empty list of settings dicts, e.g. [{'threads': 1}, {'threads': 2}]")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    common = dict(common or {})
    samples = [{"ips": [], "busy": [], "result": None, "load": []} for _ in configs]
    for r in range(rounds):
        for i, cfg in enumerate(configs):
            with Contention() as c:
                res = measure({**common, **cfg}, timeout=timeout)
            samples[i]["ips"] += res["images_per_s"]
            samples[i]["busy"] += res["cpu_cores_busy"]
            samples[i]["result"] = res
            samples[i]["load"].append(c)
            if echo:
                print(f"round {r + 1}/{rounds}, {label(cfg)}: {statistics.median(res['images_per_s']):,.0f} img/s "
                      f"({c})", flush=True)
    rows = []
    for cfg, s in zip(configs, samples):
        med = statistics.median(s["ips"])
        shares = [c.others_share for c in s["load"] if c.others_share is not None]
        loads = [x for c in s["load"] for x in (c.load_before, c.load_after) if x is not None]
        rows.append({"label": label(cfg), **{k: s["result"][k] for k in SETTING_KEYS},
                     "images_per_s": med, "spread": (max(s["ips"]) - min(s["ips"])) / med,
                     "cpu_cores_busy": statistics.median(s["busy"]), "blocks": len(s["ips"]),
                     "samples": list(s["ips"]), "others_cpu_share": max(shares) if shares else None,
                     "load_avg": max(loads) if loads else None, "busy": any(c.busy for c in s["load"])})
    best = max(r["images_per_s"] for r in rows)
    for r in rows:
        r["vs_best"] = r["images_per_s"] / best
    return rows


def label(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def thread_counts(max_threads: int | None = None, oversubscribe: bool = True) -> list[int]:
    """1, 2, 4, ... up to the usable cores (always including that number), plus twice it if ``oversubscribe``."""
    n = max_threads or usable_cores()
    counts = sorted({1, n} | {2**k for k in range(1, 8) if 2**k < n})
    return counts + [2 * n] if oversubscribe else counts


def threads_sweep(threads: list[int] | None = None, *, rounds: int = 3, echo: bool = True, **common) -> list[dict]:
    """``framework_sweep`` over ``torch.set_num_threads(n)`` for n in ``threads`` (default ``thread_counts()``)."""
    threads = threads or thread_counts()
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in threads):
        raise ValueError(f"threads must be positive integers, got {threads!r}")
    return framework_sweep([{"threads": t} for t in threads], rounds=rounds, common=common, echo=echo)


# --------------------------------------------------------------------------- the claims this lesson settles

CONFIG_TARGET = 1.8          # "~2x": best/worst images/s must reach this at the spreads' nearest ends
# 01.gpu_memory_enough: memory.gpu_memory_verdict, the one rule scripts/device_check.py applies to a GPU's step too
# (the peak against the article's 8 GB GPU, GPU_USABLE_GIB usable: holds under MEM_HOLDS, not over MEM_FAILS)


def thread_ratios(sweep: list[dict], default_threads: int) -> dict:
    """What the threads sweep measured, as numbers: best/worst images/s (median, and at the two spreads' nearest
    and farthest ends), the default's cores busy against the lowest, and which setting was best and worst."""
    best = max(sweep, key=lambda r: r["images_per_s"])
    worst = min(sweep, key=lambda r: r["images_per_s"])
    default = next(r for r in sweep if r["threads"] == default_threads)
    return {"best": best["threads"], "worst": worst["threads"], "blocks": min(r["blocks"] for r in sweep),
            "ratio": best["images_per_s"] / worst["images_per_s"],
            "ratio_low": min(best["samples"]) / max(worst["samples"]),
            "ratio_high": max(best["samples"]) / min(worst["samples"]),
            "cores_busy_ratio": default["cpu_cores_busy"] / min(r["cpu_cores_busy"] for r in sweep),
            "default_vs_best": default["vs_best"]}


def _busy(contention) -> bool:
    if contention is None:
        return False
    return bool(contention.get("busy") if isinstance(contention, dict) else contention.busy)


@dataclass(frozen=True, kw_only=True)
class Measured01:
    """What notebook 01 measured, the one input of :func:`claims_01` (its closing cell builds it once).

    ``sweep``: ``threads_sweep`` rows (``threads``, ``images_per_s``, ``samples``, ``blocks``, ``cpu_cores_busy``,
    ``vs_best``, ``others_cpu_share``); ``default_threads``: torch's default; ``cores``: the usable cores;
    ``readings``: ``logical_cores``, ``usable_cores``, ``ram_gib``, ``torch_threads``, ``gpus``; ``shells``:
    ``{"lscpu": True, ...}`` (present or not); ``memory``: ``step_peak_mib``, ``persistent_mib``, ``transient_mib``,
    ``device``, ``method``; ``contention``: the sweep's ``claims.Contention`` or its dict."""
    sweep: list[dict]
    default_threads: int
    cores: int
    readings: dict
    shells: dict
    memory: dict
    contention: object = None


def claims_01(m: Measured01) -> list[dict]:
    """Notebook 01's claims from :class:`Measured01`, each a dict of ``claims.ResultFile.claim``'s arguments.

    - ``01.config_2x``: one knob only, torch's intra-op thread count. Holds when best/worst images/s is at least
      ``CONFIG_TARGET`` even at the spreads' nearest ends; does not hold when it stays below it at their farthest
      ends; inconclusive in between or with one timed block; no verdict on a busy machine.
    - ``01.inspect_first``: demonstrated when every reading came back.
    - ``01.gpu_memory_enough``: ``memory.gpu_memory_verdict`` (device_check's rule too): holds under ``MEM_HOLDS``
      of an 8 GB GPU's usable memory, does not hold above ``MEM_FAILS``, holds with nuance in between.
    """
    from mnist_helpers.course.claims import BUSY

    sweep, default_threads, cores, contention = m.sweep, m.default_threads, m.cores, m.contention
    readings, shells, memory = m.readings, m.shells, m.memory
    t = thread_ratios(sweep, default_threads)
    by_t = {r["threads"]: r for r in sweep}
    if _busy(contention):
        verdict = BUSY
    elif t["blocks"] < 2:
        verdict = "inconclusive"
    elif t["ratio_low"] >= CONFIG_TARGET:
        verdict = "holds"
    elif t["ratio_high"] < CONFIG_TARGET:
        verdict = "does not hold here"
    else:
        verdict = "inconclusive"
    others = max((r.get("others_cpu_share") or 0) for r in sweep)
    n = {"ratio": t["ratio"], "ratio_low": t["ratio_low"], "ratio_high": t["ratio_high"], "target": CONFIG_TARGET,
         "cores_busy_ratio": t["cores_busy_ratio"], "default_threads": default_threads, "cores": cores,
         **{f"img_s_{k}_threads": r["images_per_s"] for k, r in by_t.items()},
         **{f"samples_{k}_threads": r["samples"] for k, r in by_t.items()}, "others_cpu_share_max": others}
    rounds_note = f"{t['blocks']} timed blocks per setting"
    out = [dict(
        id="01.config_2x", verdict=verdict, numbers=n, contention=contention,
        regime=(f"one knob: torch's intra-op threads (torch.set_num_threads {', '.join(map(str, sorted(by_t)))}: "
                f"1 as under OMP_NUM_THREADS=1, {default_threads} torch's default, {2 * cores} twice the cores); "
                f"nothing else changed (no TF32, cuDNN, allocator or AMP on a CPU); Net, Adam, batch 128, synthetic "
                f"batches, a fresh process per setting, {rounds_note}; {cores} cores"),
        evidence=("threads only: " + ", ".join(f"{k} threads {r['images_per_s']:,.0f}" for k, r in by_t.items())
                  + f" img/s; best/worst {t['ratio']:.2f}x (spread {t['ratio_low']:.2f}-{t['ratio_high']:.2f}x, "
                  f"threshold {CONFIG_TARGET}x); others used up to {others:.0%} of the CPU"))]
    ok = all(readings.get(k) is not None for k in ("logical_cores", "usable_cores", "ram_gib", "torch_threads"))
    n = {**{k: readings.get(k) for k in ("logical_cores", "usable_cores", "ram_gib", "torch_threads", "gpus")},
         **{f"{k.split()[0]}_present": bool(v) for k, v in shells.items()}}
    out.append(dict(
        id="01.inspect_first", verdict="demonstrated" if ok else "inconclusive", numbers=n,
        regime="Python readings (os, psutil, torch, torch.cuda) and the article's shell commands, run when present",
        evidence=(f"read from Python: {n['logical_cores']} cores ({n['usable_cores']} usable), "
                  + (f"{n['ram_gib']:.1f} GiB RAM, " if n["ram_gib"] is not None else "RAM unread, ")
                  + f"{n['torch_threads']} torch threads, {n['gpus']} GPU(s); shell: "
                  + ", ".join(f"{k} {'run' if v else 'absent'}" for k, v in shells.items()))))
    judged = gpu_memory_verdict(memory["step_peak_mib"])
    share, verdict = judged["share"], judged["verdict"]
    n = {"step_peak_mib": memory["step_peak_mib"], "gpu_usable_gib": GPU_USABLE_GIB, "share": share,
         "persistent_mib": memory["persistent_mib"], "transient_mib": memory["transient_mib"],
         "holds_below": MEM_HOLDS, "fails_above": MEM_FAILS}
    out.append(dict(
        id="01.gpu_memory_enough", verdict=verdict, numbers=n,
        regime=(f"Net, Adam, batch 128, one training step measured on {memory.get('device', 'cpu')} "
                f"({memory.get('method', 'peak memory')})"),
        evidence=(f"a Net training step at batch 128 peaks at {n['step_peak_mib']:.0f} MiB "
                  f"({n['persistent_mib']:.0f} persistent + {n['transient_mib']:.0f} transient), {share:.1%} of the "
                  f"{GPU_USABLE_GIB} GiB usable on an 8 GB GPU ({judged['why']})")))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Time training steps (train.train_step) under one framework setting; "
                                             "prints one JSON line (what measure() reads).")
    ap.add_argument("--model", default="net", help="model from the registry (default: net)")
    ap.add_argument("--batch-size", type=int, default=128, help="images per step (default: 128)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False,
                    help="NHWC memory format for images and weights")
    ap.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                    help="TF32 for float32 matmuls and convolutions on a GPU (default: leave as is)")
    ap.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=None,
                    help="cudnn.benchmark (default: leave as is)")
    ap.add_argument("--amp", default="none", help="autocast dtype: none, bf16, fp16 (default: none)")
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed block (default: 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks (default: 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed for weights and data (default: 0)")
    args = ap.parse_args(argv)
    print(json.dumps(step_throughput(**vars(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
