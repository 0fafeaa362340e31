"""The machine a result was measured on (introduced in 00_setup_and_data; 01_resource_inspection extends it).

``machine_info()`` is stored next to every result so that numbers are never quoted without their
machine: CPU model, cores, RAM, GPUs, torch version. ``describe()`` turns it into one line.

01_resource_inspection adds the article's first two levels of resources, read through Python APIs
(never by parsing another tool's text):

- hardware: ``cpu_info()`` (cores, affinity, cgroup quota), ``memory_info()``, ``disk_info(path)``,
  ``read_throughput(path)`` (a measured read of the data folder, cold and warm), ``gpu_info()``
  (torch.cuda, plus NVML through ``pynvml`` from ``nvidia-ml-py`` when it is importable);
- framework: ``framework_info()`` (versions, threads, MKL/oneDNN, matmul precision, TF32, cuDNN
  benchmark, the CUDA caching allocator's ``PYTORCH_CUDA_ALLOC_CONF``);
- ``shell_equivalent(cmd)``: the article's ``nvidia-smi`` / ``lscpu`` / ``free -h``, run when present,
  with a plain "not installed here" otherwise.

Every function returns plain dicts (JSON-ready) and never raises because a device or tool is missing.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import time
from pathlib import Path


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

    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_model": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                                 "capability": f"{p.major}.{p.minor}"})
    return info


def describe(info: dict | None = None) -> str:
    """One line for plots and tables: 'AMD EPYC ... (2 cores), no GPU, torch 2.14.1'."""
    info = info or machine_info()
    gpus = info.get("gpus") or []
    gpu = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU"
    return f"{info['cpu_model']} ({info['logical_cores']} cores), {gpu}, torch {info['torch']}"


# --------------------------------------------------------------------------- hardware

def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def usable_cores() -> int:
    """Cores this process may run on (affinity / cgroup-pinned), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


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
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
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
