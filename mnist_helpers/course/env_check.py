"""Check that the installed environment can run the series (run by ``make install``).

``python -m mnist_helpers.course.env_check`` prints versions and devices; ``--quiet`` prints one line.
It fails with a message that says what to do, not with an ImportError from deep inside a package.
"""
from __future__ import annotations

import argparse
import importlib
import platform
import sys

REQUIRED = ["torch", "torchvision", "numpy", "pandas", "matplotlib", "ipywidgets", "psutil", "tqdm", "nbmake"]
MIN_TORCH = (2, 6)


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def versions() -> dict[str, str]:
    """Versions of Python and the packages the series needs; raises SystemExit naming a missing one."""
    out = {"python": platform.python_version()}
    missing = []
    for name in REQUIRED:
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # ImportError, or a broken binary wheel
            missing.append(f"{name} ({type(e).__name__}: {e})")
            continue
        out[name] = getattr(mod, "__version__", "?")
    if missing:
        raise SystemExit("missing or broken packages: " + "; ".join(missing)
                         + "\nfix: run `make install` (or `pip install -e '.[dev]'` in your environment)")
    if _version_tuple(out["torch"]) < MIN_TORCH:
        raise SystemExit(f"torch {out['torch']} is too old: the series needs torch >= 2.6 "
                         "(torch.load weights_only default, CVE-2025-32434). fix: make install")
    return out


def devices() -> dict[str, object]:
    import torch

    from mnist_helpers.resources import gpu_count, gpu_details

    count = gpu_count()  # through NVML: torch.cuda.is_available() would start the CUDA driver (and poison fork)
    info: dict[str, object] = {"cuda_available": count > 0, "cuda_device_count": count,
                               "torch_cuda_build": torch.version.cuda}
    if info["cuda_device_count"]:
        info["gpus"] = [g["name"] for g in gpu_details(count)]  # through NVML where it answers: no driver start
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quiet", action="store_true", help="one line only")
    args = ap.parse_args(argv)
    v = versions()
    d = devices()
    if args.quiet:
        dev = f"{d['cuda_device_count']} GPU(s)" if d["cuda_device_count"] else "CPU only (gloo backend)"
        print(f"environment ok: python {v['python']}, torch {v['torch']}, torchvision {v['torchvision']}, {dev}")
    else:
        for k, val in {**v, **d}.items():
            print(f"{k:>20}: {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
