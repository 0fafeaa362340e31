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
