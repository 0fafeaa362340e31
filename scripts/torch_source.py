"""Where `make lab` / `make test` take torch from: prints pip's arguments for the torch packages, says why in one line.

    python scripts/torch_source.py torch==2.14.1 torchvision==0.29.1     # what the Makefile runs

- An NVIDIA GPU here (``nvidia-smi -L`` lists one): the given spec as is; pip picks the CUDA build.
- No NVIDIA GPU, and the pinned torch already lies on this machine (pip would take it from a ``file://`` source, as
  on the lab and CI machines): the given spec as is: nothing is downloaded.
- No NVIDIA GPU otherwise: the CPU-only build (about 200 MB instead of several GB of CUDA libraries), from PyTorch's
  CPU wheel index when it answers within a few seconds; when it does not, the spec as is, said in one line.

``MNIST_TORCH_SOURCE=pinned`` skips the choice (the spec as is); ``=cpu`` asks for the CPU index without probing.
Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def nvidia_gpu() -> bool:
    """True when ``nvidia-smi -L`` lists at least one GPU."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def local_copy(spec: list[str], python: str = sys.executable) -> bool:
    """True when pip, asked for ``spec`` without dependencies, would take torch from a file on this machine."""
    try:
        out = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps",
                              "--ignore-installed", "--report", "-", *spec],
                             capture_output=True, text=True, timeout=300)
        items = json.loads(out.stdout)["install"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError):
        return False
    urls = [i.get("download_info", {}).get("url", "") for i in items
            if i.get("metadata", {}).get("name", "").lower() == "torch"]
    return bool(urls) and all(u.startswith("file://") for u in urls)


def reachable(url: str = CPU_INDEX + "/torch/", timeout: float = 5) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as r:
            return r.status < 400
    except Exception:  # no network, a proxy refusing, a timeout: not reachable
        return False


def choose(spec: list[str], *, setting: str, gpu, local, online) -> tuple[list[str], str]:
    """(pip arguments, the reason in one line). ``gpu``, ``local`` and ``online`` are called only when needed."""
    if setting == "pinned":
        return spec, "MNIST_TORCH_SOURCE=pinned: torch as pinned"
    if setting == "cpu":
        return ["--extra-index-url", CPU_INDEX, *spec], f"MNIST_TORCH_SOURCE=cpu: the CPU-only torch from {CPU_INDEX}"
    if setting:
        raise SystemExit(f"MNIST_TORCH_SOURCE={setting!r}: use 'pinned', 'cpu', or leave it unset")
    if gpu():
        return spec, "an NVIDIA GPU is present: torch as pinned (pip picks the CUDA build)"
    if local():
        return spec, "no NVIDIA GPU; the pinned torch lies on this machine's disk: installed from there"
    if online():
        return (["--extra-index-url", CPU_INDEX, *spec],
                f"no NVIDIA GPU: the CPU-only torch from {CPU_INDEX} (no CUDA libraries to download)")
    return spec, (f"no NVIDIA GPU, but {CPU_INDEX} does not answer: torch as pinned from your package index (the "
                  "CUDA build: a larger download that also runs on the CPU)")


def main(argv: list[str] | None = None) -> int:
    spec = list(sys.argv[1:] if argv is None else argv) or ["torch==2.14.1", "torchvision==0.29.1"]
    args, reason = choose(spec, setting=os.environ.get("MNIST_TORCH_SOURCE", ""), gpu=nvidia_gpu,
                          local=lambda: local_copy(spec), online=reachable)
    print(f"torch: {reason}", file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
