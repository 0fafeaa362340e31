"""What ``init_process_group`` needs, and which backend runs where (06_ddp_fundamentals, article 4 and 5.2).

``dist.init_process_group(backend)`` with the default ``init_method="env://"`` reads four
environment variables: ``RANK`` and ``WORLD_SIZE`` (who am I, how many are we) and ``MASTER_ADDR``
and ``MASTER_PORT`` (where rank 0 hosts the rendezvous store). ``mp.spawn`` code sets them itself
(the article's ``setup()``); torchrun sets them for every process (its rendezvous picks the port).
This script adds them one at a time and records each error, then asks for NCCL (GPUs only) and
gloo. It runs in a fresh process (``python -m mnist_helpers.workers.demo_backends`` prints JSON);
``init_requirements()`` runs it and returns the dict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


def _attempt(backend: str, **kwargs) -> str:
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, **kwargs)
    except Exception as e:  # noqa: BLE001 - the message is the measurement
        return f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"
    try:
        return f"ok: rank {dist.get_rank()} of {dist.get_world_size()}, backend {dist.get_backend()}"
    finally:
        dist.destroy_process_group()


def _probe() -> dict:
    import torch
    import torch.distributed as dist

    from mnist_helpers.launch import free_port

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    steps = {}
    steps["nothing set"] = _attempt("gloo")
    os.environ.update(RANK="0", WORLD_SIZE="1")
    steps["RANK, WORLD_SIZE"] = _attempt("gloo")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    steps["+ MASTER_ADDR"] = _attempt("gloo")
    os.environ["MASTER_PORT"] = str(free_port())
    steps["+ MASTER_PORT"] = _attempt("gloo")
    return {"env_steps": steps, "nccl": _attempt("nccl"),
            "available": {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                          "mpi": dist.is_mpi_available()},
            "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def init_requirements(timeout: float = 120) -> dict:
    """Run the probe in a fresh Python process (a process group is made once per process) and return it."""
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.workers.demo_backends"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the backend probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_probe()))
