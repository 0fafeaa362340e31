"""The machine a result was measured on (introduced in 00_setup_and_data).

``machine_info()`` is stored next to every result so that numbers are never quoted without their
machine: CPU model, cores, the ISA torch uses, RAM, GPUs, torch version, load average. ``describe()`` turns it into one line.
``usable_cores()`` is the number of cores this process may run on (affinity, not the machine's total);
``cpu_flags()`` the CPU's feature flags (avx2, avx512_bf16, amx_bf16, ...); ``gpu_count()`` the CUDA GPUs, counted
without initialising the CUDA driver (so that a fork-based launcher still works after it).

The article's first two levels of resources in full (hardware and framework, read through Python APIs)
are lesson 01's: ``mnist_helpers.lessons.n01.lesson``.
"""
from __future__ import annotations

import os
import platform
import socket


# the x86 vector features that decide which CPU kernels (and which bf16 speed) torch gets
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """A small, JSON-ready description of this machine and software."""
    import psutil
    import torch

    gpus = gpu_count()  # through NVML: asking torch.cuda.is_available() would initialise the CUDA driver
    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_model": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": os.cpu_count(),
        # the cores this process may run on (taskset, a container's cpuset): fewer than logical_cores when pinned
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "torch_threads": torch.get_num_threads(),
        # the ISA torch's CPU kernels use (AVX2, AVX512, ...) and what oneDNN was limited to, if anything:
        # `make test-avx2` runs with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 on a bigger CPU
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_flags": sorted(cpu_flags() & {*SIMD_FLAGS, "asimd", "sve"}),  # + ARM's NEON and SVE
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cuda_available": gpus > 0,
        "gpus": [],
    }
    try:
        info["gpus"] = gpu_details(gpus)
    except RuntimeError as e:  # NVML sees GPUs the driver cannot use (e.g. a driver too old for this torch)
        info.update(cuda_available=False, gpus=[], cuda_error=str(e).splitlines()[0][:200])
    return info


def gpu_details(count: int) -> list[dict]:
    """Name, memory (GiB) and compute capability of the first ``count`` GPUs: through NVML where it answers
    (:func:`gpus_through_nvml`: the CUDA driver is left alone), else through torch, which initialises CUDA and raises
    RuntimeError where the driver cannot use the GPUs NVML counted."""
    if not count:
        return []
    named = gpus_through_nvml(count)
    if named is not None:
        return named
    import torch

    found = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        found.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                      "capability": f"{p.major}.{p.minor}"})
    return found


def gpus_through_nvml(count: int) -> list[dict] | None:
    """Name, memory and compute capability of the first ``count`` GPUs through NVML (``pynvml``, from
    ``nvidia-ml-py``), which leaves the CUDA driver alone (:func:`gpu_count`); None where NVML cannot answer for
    the GPUs this process sees: no ``pynvml``, NVML failing, or ``CUDA_VISIBLE_DEVICES`` set (NVML numbers every GPU
    of the machine, CUDA only the visible ones)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found = []
            for i in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                found.append({"name": name.decode() if isinstance(name, bytes) else name,
                              "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 1),
                              "capability": f"{major}.{minor}"})
            return found
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, pynvml.NVMLError (no library, no driver): let torch answer
        return None


def describe(info: dict | None = None) -> str:
    """One line for plots and tables: 'AMD EPYC ... (2 cores), no GPU, torch 2.14.1'."""
    info = info or machine_info()
    gpus = info.get("gpus") or []
    gpu = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU"
    limited = f", kernels limited to {info['cpu_capability']}" if info.get("onednn_max_cpu_isa") else ""
    usable, cores = info.get("usable_cores"), info["logical_cores"]
    cores = f"{usable} of {cores} cores" if usable and cores and usable < cores else f"{cores} cores"
    return f"{info['cpu_model']} ({cores}{limited}), {gpu}, torch {info['torch']}"


# --------------------------------------------------------------------------- hardware

def gpu_count() -> int:
    """The CUDA GPUs this process can see (0 without CUDA), counted without initialising the CUDA driver.

    Count GPUs with this, not ``torch.cuda.is_available()``, wherever the answer only decides what to do next
    (a profile, a device, a backend, a number of processes). ``torch.cuda.is_available()`` asks the driver
    (``cudaGetDeviceCount``, torch 2.14.1) unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set when it is called;
    from then on a forked child's first CUDA call fails ("Cannot re-initialize CUDA in forked subprocess":
    ``accelerate.notebook_launcher``, ``start_method="fork"``), although ``torch.cuda.is_initialized()`` still
    says False. ``torch.cuda.device_count()``, which this returns, asks NVML first (the library behind
    ``nvidia-smi``; ``CUDA_VISIBLE_DEVICES`` is honoured) and leaves the driver alone.

    Where NVML cannot answer, torch falls back to the driver and this call initialises it after all: no
    ``libnvidia-ml.so.1`` to load (native Windows; a container without it), NVML failing to initialise, or MIG
    UUIDs in ``CUDA_VISIBLE_DEVICES``. NVML's count is also a weaker check than the driver's: a driver too old for
    this torch's CUDA still shows its GPUs here, and the first CUDA call then fails with the driver's message.
    A torch built without CUDA returns 0 without asking anyone (ROCm builds ask AMD's amdsmi the same way)."""
    import torch

    return torch.cuda.device_count()


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isolate_compile_cache() -> str | None:
    """Give torch.compile an on-disk cache of its own when torch's CPU kernels are limited to a lower ISA.

    Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``, default ``<tmp>/torchinductor_<user>``) is not keyed by
    ``ATEN_CPU_CAPABILITY``: code compiled by a native run and replayed with ``ATEN_CPU_CAPABILITY=avx2`` computed
    out-of-bounds indices in SpeedNet's max-pool (torch 2.14.1, 2-core EPYC, 2 threads; in four probes a fresh cache
    compiled and ran). A precaution, not a cure: in one benchmark run the compiled candidates failed under avx2 with
    a fresh cache too, so ``speedrun.first_crossing_run`` falls back to the eager model and says so.
    With ``ATEN_CPU_CAPABILITY`` or ``ONEDNN_MAX_CPU_ISA`` set and no cache folder chosen, this sets
    ``TORCHINDUCTOR_CACHE_DIR`` to ``<tmp>/torchinductor_<user>_<isa>``. Call it before the first torch.compile.
    Returns the folder it chose, or None when it left the setting alone."""
    import getpass
    import re
    import tempfile

    isa = os.environ.get("ATEN_CPU_CAPABILITY") or os.environ.get("ONEDNN_MAX_CPU_ISA")
    if not isa or os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "user"
    path = os.path.join(tempfile.gettempdir(), re.sub(r"[^\w.-]", "_", f"torchinductor_{user}_{isa.lower()}"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def usable_cores() -> int:
    """Cores this process may run on (affinity / cgroup-pinned), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1
