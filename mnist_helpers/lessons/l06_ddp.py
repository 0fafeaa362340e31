"""The kernel-side demos of 06_ddp_fundamentals: ``mp.spawn`` from a notebook, and what ``init_process_group`` needs.

Everything else 06 runs is a worker (``workers/progression``, ``workers/demos``) started by the launcher;
these two points are about the process that starts the workers, so they live here.

**mp.spawn from a notebook** (article section 5.2). ``torch.multiprocessing.spawn`` starts fresh Python
processes and sends each one the function to run *by reference*: its module and name, pickled. A child
finds the function by importing that module. A function defined in a script lives in ``__main__``, and
the child re-runs the script's file (under the name ``__mp_main__``) to find it. A function defined in a
notebook cell also lives in ``__main__``, but the kernel's ``__main__`` has no file to re-run, so every
child dies with ``AttributeError: Can't get attribute 'train' on <module '__main__' (built-in)>`` and the
parent raises ``ProcessExitedException``. ``python -c`` has a ``__main__`` without a file just like a
kernel, so :func:`spawn_like_a_notebook` runs the reproduction of notebook 08
(``workers/bugs/spawn_main.py``, its text passed with ``-c``) and reports what the children and the
parent said; :func:`spawn_from_a_file` runs the very same file as a script, where it works. Hence the
workers live in the package, and notebooks start them with torchrun through ``mnist_helpers.launch``.

**What init_process_group needs** (article sections 4 and 5.2). ``dist.init_process_group(backend)`` with
the default ``init_method="env://"`` reads four environment variables: ``RANK`` and ``WORLD_SIZE`` (who am
I, how many are we) and ``MASTER_ADDR`` and ``MASTER_PORT`` (where rank 0 hosts the rendezvous store).
``mp.spawn`` code sets them itself (the article's ``setup()``); torchrun sets them for every process (its
rendezvous picks the port). :func:`init_requirements` runs this module as a script in a fresh process (a
process group is made once per process), which adds the variables one at a time with gloo and records
each error, then asks for NCCL (GPUs only), and returns the JSON it prints.

    from mnist_helpers.lessons.l06_ddp import init_requirements, spawn_like_a_notebook
    spawn_like_a_notebook()["child_error"]   # AttributeError: Can't get attribute 'train' on <module '__main__' ...
    init_requirements()["env_steps"]         # {"nothing set": "ValueError: ... RANK expected", ...}
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import torch
import torch.distributed as dist

from mnist_helpers.ports import free_port

# 08's reproduction of the failure: the one copy of the code both notebooks run.
SPAWN_MAIN = Path(find_spec("mnist_helpers.workers.bugs.spawn_main").origin)
PACKAGE_ROOT = Path(find_spec("mnist_helpers").origin).parents[1]  # what the children need on sys.path


# --------------------------------------------------------------------------- mp.spawn from a notebook

def _run_spawn(command: list[str], nprocs: int, timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([*command, "--nprocs", str(nprocs)], capture_output=True, text=True, timeout=timeout,
                          env=env)
    text = proc.stdout + proc.stderr
    errors = [ln for ln in text.splitlines() if ln and not ln.startswith(" ") and "Error" in ln.split(":")[0]
              or ln.startswith("torch.multiprocessing")]
    child = next((ln for ln in errors if "Can't get attribute" in ln), None)
    parent = next((ln for ln in errors if "ProcessExitedException" in ln or "ProcessRaisedException" in ln), None)
    finished = proc.returncode == 0 and text.count("hello from spawned rank") == nprocs
    return {"returncode": proc.returncode, "child_error": child, "parent_error": parent,
            "finished": finished, "output": text[-3000:]}


def spawn_like_a_notebook(nprocs: int = 2, timeout: float = 120) -> dict:
    """``workers/bugs/spawn_main.py`` run as ``python -c``: ``__main__`` has no file, as in a Jupyter kernel.

    Returns ``{"returncode", "child_error", "parent_error", "finished", "output"}``."""
    return _run_spawn([sys.executable, "-c", SPAWN_MAIN.read_text()], nprocs, timeout)


def spawn_from_a_file(nprocs: int = 2, timeout: float = 120) -> dict:
    """The same file run as a script: the children re-import it and find ``train``."""
    return _run_spawn([sys.executable, str(SPAWN_MAIN)], nprocs, timeout)


# --------------------------------------------------------------------------- what init_process_group needs

def _attempt(backend: str, **kwargs) -> str:
    try:
        dist.init_process_group(backend, **kwargs)
    except Exception as e:  # noqa: BLE001 - the message is the measurement
        return f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"
    try:
        return f"ok: rank {dist.get_rank()} of {dist.get_world_size()}, backend {dist.get_backend()}"
    finally:
        dist.destroy_process_group()


def _probe() -> dict:
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
    """Run the probe in a fresh Python process and return ``{"env_steps", "nccl", "available", "cuda_devices"}``."""
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.lessons.l06_ddp"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the backend probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_probe()))
