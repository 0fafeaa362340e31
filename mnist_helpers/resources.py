"""The machine a result was measured on (introduced in 00_setup_and_data; 01 extends the inspection).

``machine_info()`` is stored next to every result so that numbers are never quoted without their
machine: CPU model, cores, RAM, GPUs, torch version.
"""
from __future__ import annotations

import os
import platform
import socket


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
            info["gpus"].append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
    return info


def describe(info: dict | None = None) -> str:
    """One line for plots and tables: 'AMD EPYC ... (2 cores), no GPU, torch 2.14.1'."""
    info = info or machine_info()
    gpus = info.get("gpus") or []
    gpu = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU"
    return f"{info['cpu_model']} ({info['logical_cores']} cores), {gpu}, torch {info['torch']}"
