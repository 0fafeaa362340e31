"""Find the largest batch that fits in memory by halving (introduced in 08_troubleshooting).

``find_batch_size(fits, start)`` tries ``start``, then ``start // 2``, ... until ``fits(batch_size)``
returns without an out-of-memory error, and returns what it tried. ``train_step_probe(model)`` makes
such a ``fits``: one forward + backward + optimizer step on a random MNIST-shaped batch.

How the memory limit is made real, per device:

- **CUDA**: the device's own memory; ``limit_memory(budget_bytes, device)`` caps it further with
  ``torch.cuda.set_per_process_memory_fraction`` so a big GPU can show the error too. The error is
  ``torch.OutOfMemoryError: CUDA out of memory``.
- **CPU**: there is no allocator cap, and a real out-of-memory on a shared machine would bring in the
  kernel's OOM killer. ``limit_memory`` sets ``resource.setrlimit(RLIMIT_AS)`` instead: the
  process's *virtual address space* may grow by ``budget_bytes`` over what it maps now, after which
  ``malloc`` fails and torch raises ``RuntimeError: DefaultCPUAllocator: can't allocate memory``.
  The limit is on address space, not on resident memory: it also counts the allocator's slack and
  any thread stacks created later, so treat the budget as approximate. It cannot be lifted again
  inside the process, so ``find_batch_size_limited`` runs the whole search in a fresh subprocess
  (``python -m mnist_helpers.batch_finder``), which is also how a notebook must use it; that process
  gets ``MALLOC_ENV`` (a fixed glibc mmap threshold, so freed tensors give their address space back).

    python -m mnist_helpers.batch_finder --model net --start 4096 --budget_mib 600
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Callable

MiB = 2**20
# glibc moves its mmap threshold up after large frees, so later big tensors land in the heap, which
# never shrinks: under RLIMIT_AS the address space then creeps up and the search becomes flaky. A fixed
# threshold keeps every tensor >= 1 MiB in its own mapping, returned to the OS when freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """True for CUDA's ``OutOfMemoryError`` and the CPU allocator's "can't allocate memory"."""
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


def find_batch_size(fits: Callable[[int], object], start: int, min_batch_size: int = 1, repeats: int = 2) -> dict:
    """Halve from ``start`` until ``fits(batch_size)`` runs ``repeats`` times without running out of memory.

    Two repeats by default: the first step at a new size can pass while the second (gradients and
    allocator state carried over) fails.

    Returns ``{"batch_size": largest that fit (None if even min_batch_size failed), "tried": [{batch_size, ok,
    error}]}``. Errors that are not out-of-memory are raised: a bug must not look like a big batch.
    """
    if not isinstance(start, int) or start < 1:
        raise ValueError(f"start must be a positive integer batch size, got {start!r}")
    if not isinstance(min_batch_size, int) or not 1 <= min_batch_size <= start:
        raise ValueError(f"min_batch_size must be an integer in 1..start ({start}), got {min_batch_size!r}")
    tried, batch_size = [], start
    while batch_size >= min_batch_size:
        try:
            for _ in range(repeats):
                fits(batch_size)
        except Exception as exc:  # noqa: BLE001 - sorted just below
            if not is_oom(exc):
                raise
            tried.append({"batch_size": batch_size, "ok": False, "error": str(exc).strip().splitlines()[0][:200]})
            _release_cached()
            batch_size //= 2
            continue
        tried.append({"batch_size": batch_size, "ok": True, "error": None})
        return {"batch_size": batch_size, "tried": tried}
    return {"batch_size": None, "tried": tried}


def _release_cached() -> None:
    import gc

    import torch

    gc.collect()  # the failed step's tensors are garbage now (the exception's frames held them)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_step_probe(model: str = "net", device: str = "cpu", lr: float = 1e-3, seed: int = 0) -> Callable[[int], float]:
    """A ``fits(batch_size)`` that runs one real training step (Adam, NLL loss) and returns the loss.

    ``fits.model`` and ``fits.optimizer`` are the model and optimizer it trains: keep training those
    after the search (under an address-space cap, memory freed by a failed try is not always returned
    to the OS, so a second model may not fit where the first did)."""
    import torch
    import torch.nn.functional as F

    from .models import build_model

    torch.manual_seed(seed)
    net = build_model(model).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def fits(batch_size: int) -> float:
        X = torch.randn(batch_size, 1, 28, 28, device=device)
        y = torch.randint(0, 10, (batch_size,), device=device)
        opt.zero_grad(set_to_none=True)
        loss = F.nll_loss(net(X), y)
        loss.backward()
        opt.step()
        return loss.item()

    fits(2)  # create the optimizer state and start the thread pools before any limit is set
    fits.model, fits.optimizer = net, opt  # so the caller can go on training the same model
    return fits


def address_space_bytes() -> int:
    """This process's virtual memory size now (what RLIMIT_AS counts)."""
    import psutil

    return psutil.Process().memory_info().vms


def limit_memory(budget_bytes: int, device: str = "cpu") -> dict:
    """Let this process allocate about ``budget_bytes`` more, then fail with an out-of-memory error.

    CPU: ``RLIMIT_AS`` = current address space + budget (cannot be raised again in this process).
    CUDA: ``set_per_process_memory_fraction`` so that the cap is (memory in use now + budget).
    Returns what was set, for the record.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        cap = torch.cuda.memory_reserved(dev) + budget_bytes
        fraction = min(1.0, cap / total)
        torch.cuda.set_per_process_memory_fraction(fraction, dev)
        return {"method": "set_per_process_memory_fraction", "fraction": fraction, "cap_bytes": cap}
    base = address_space_bytes()
    limit = base + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return {"method": "RLIMIT_AS", "base_vms_bytes": base, "limit_bytes": limit}


def find_batch_size_limited(model: str = "net", start: int = 4096, budget_mib: int = 600,
                            min_batch_size: int = 1, timeout: float = 300) -> dict:
    """``find_batch_size`` for one training step of ``model`` under a memory budget, in a fresh process.

    CPU: the subprocess limits its own address space (``RLIMIT_AS``); CUDA: its memory fraction.
    Returns the search plus ``"limit"`` (what was set) and ``"device"``.
    """
    cmd = [sys.executable, "-m", "mnist_helpers.batch_finder", "--model", model, "--start", str(start),
           "--budget_mib", str(budget_mib), "--min_batch_size", str(min_batch_size), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **MALLOC_ENV, "PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the batch-size search failed in its subprocess (exit code {proc.returncode}):\n"
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Largest training batch that fits in a memory budget (halving).")
    ap.add_argument("--model", default="net")
    ap.add_argument("--start", type=int, default=4096)
    ap.add_argument("--min_batch_size", type=int, default=1)
    ap.add_argument("--budget_mib", type=int, default=600, help="memory the step may add (MiB)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    args = ap.parse_args(argv)
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    fits = train_step_probe(args.model, device)
    limit = limit_memory(args.budget_mib * MiB, device)
    result = {**find_batch_size(fits, args.start, args.min_batch_size), "limit": limit, "device": device,
              "model": args.model, "budget_mib": args.budget_mib}
    if args.json:
        print(json.dumps(result))
    else:
        for row in result["tried"]:
            print(f"batch {row['batch_size']:>6}: {'fits' if row['ok'] else 'out of memory: ' + row['error']}")
        print(f"largest batch that fits in {args.budget_mib} MiB on {device}: {result['batch_size']}")
    return 0 if result["batch_size"] else 1


if __name__ == "__main__":
    sys.exit(main())
