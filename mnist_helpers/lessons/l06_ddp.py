"""Why a notebook cannot ``mp.spawn`` a function it defines (06_ddp_fundamentals, article section 5.2).

``torch.multiprocessing.spawn`` starts fresh Python processes and sends each one the function to
run *by reference*: its module and name, pickled. A child finds the function by importing that
module. A function defined in a script lives in ``__main__``, and the child re-runs the script's
file (under the name ``__mp_main__``) to find it. A function defined in a notebook cell also lives
in ``__main__``, but the kernel's ``__main__`` has no file to re-run, so every child dies with
``AttributeError: Can't get attribute 'train' on <module '__main__' (built-in)>`` and the parent
raises ``ProcessExitedException``. ``python -c`` has a ``__main__`` without a file just like a
kernel, so ``spawn_like_a_notebook()`` reproduces the failure for real in a subprocess;
``spawn_from_a_file()`` runs the very same code from a file, where it works. Hence the workers live
in the package, and notebooks start them with torchrun through ``mnist_helpers.launch``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SPAWN_CODE = '''\
import torch.multiprocessing as mp

def train(rank, world_size):
    print(f"rank {rank} of {world_size}: running", flush=True)

if __name__ == "__main__":
    mp.spawn(train, args=(2,), nprocs=2)
    print("all ranks finished", flush=True)
'''


def _run(command: list[str], timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    text = proc.stdout + proc.stderr
    errors = [ln for ln in text.splitlines() if ln and not ln.startswith(" ") and "Error" in ln.split(":")[0]
              or ln.startswith("torch.multiprocessing")]
    child = next((ln for ln in errors if "Can't get attribute" in ln), None)
    parent = next((ln for ln in errors if "ProcessExitedException" in ln or "ProcessRaisedException" in ln), None)
    return {"returncode": proc.returncode, "child_error": child, "parent_error": parent,
            "finished": "all ranks finished" in text, "output": text[-3000:]}


def spawn_like_a_notebook(timeout: float = 120) -> dict:
    """SPAWN_CODE run as ``python -c``: ``__main__`` has no file, as in a Jupyter kernel."""
    return _run([sys.executable, "-c", SPAWN_CODE], timeout)


def spawn_from_a_file(timeout: float = 120) -> dict:
    """The same code saved as a script and run: the children re-import it and find ``train``."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "spawn_demo.py"
        script.write_text(SPAWN_CODE)
        return _run([sys.executable, str(script)], timeout)


# ==================================================================================================
# Part from demo_backends.py
# What ``init_process_group`` needs, and which backend runs where (06_ddp_fundamentals, article 4 and 5.2).
#
# ``dist.init_process_group(backend)`` with the default ``init_method="env://"`` reads four
# environment variables: ``RANK`` and ``WORLD_SIZE`` (who am I, how many are we) and ``MASTER_ADDR``
# and ``MASTER_PORT`` (where rank 0 hosts the rendezvous store). ``mp.spawn`` code sets them itself
# (the article's ``setup()``); torchrun sets them for every process (its rendezvous picks the port).
# This script adds them one at a time and records each error, then asks for NCCL (GPUs only) and
# gloo. It runs in a fresh process (``python -m mnist_helpers.lessons.l06_ddp`` prints JSON);
# ``init_requirements()`` runs it and returns the dict.
# ==================================================================================================


import json


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

    from mnist_helpers.ports import free_port

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
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.lessons.l06_ddp"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the backend probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_probe()))
