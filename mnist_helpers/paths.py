"""Where the series keeps its data and results (introduced in 00_setup_and_data).

Nothing here depends on the current working directory: notebooks, workers started by torchrun
and scripts all resolve the same folders.

- ``MNIST_DATA_ROOT`` / ``MNIST_RESULTS_DIR`` override the defaults.
- In a checkout (the package sits next to ``pyproject.toml``): ``<repo>/data`` and ``<repo>/results``.
- Otherwise: ``~/.cache/mnist-scale-lab/{data,results}``.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout this package lives in, or None when installed as a plain package."""
    candidate = PACKAGE_DIR.parent
    return candidate if (candidate / "pyproject.toml").is_file() else None


def _default(sub: str) -> Path:
    root = repo_root()
    return root / sub if root is not None else Path.home() / ".cache" / "mnist-scale-lab" / sub


def data_root() -> Path:
    """The folder that holds ``MNIST/raw/`` (torchvision's ``root`` argument)."""
    env = os.environ.get("MNIST_DATA_ROOT")
    return Path(env).expanduser().resolve() if env else _default("data")


def results_dir() -> Path:
    """The folder where scripts and notebooks write kept results (JSON/CSV); created on demand."""
    env = os.environ.get("MNIST_RESULTS_DIR")
    path = Path(env).expanduser().resolve() if env else _default("results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def reference_dir() -> Path:
    """Where kept reference runs live: ``results/reference/<machine label>/<name>.json``.

    These are the committed runs the README's claims table is made from (``make claims``) and that notebooks show
    beside a live run, so they are found in the checkout whatever ``MNIST_RESULTS_DIR`` says (a run's own results may
    go elsewhere; the references stay with the code). Outside a checkout: ``results_dir() / "reference"``, empty
    until runs are copied there. Not created here: readers find nothing in a missing folder, writers create it.
    """
    root = repo_root()
    return root / "results" / "reference" if root is not None else results_dir() / "reference"
