"""Where the series keeps its data and results (introduced in 00_setup_and_data).

Nothing here depends on the current working directory: notebooks, workers started by torchrun
and scripts all resolve the same folders.

- ``MNIST_DATA_ROOT`` / ``MNIST_RESULTS_DIR`` override the defaults.
- In a checkout we may write to (the package sits next to ``pyproject.toml``): ``<repo>/data`` and ``<repo>/results``.
- Otherwise: ``~/.cache/mnist-scale-lab/{data,results}``. A notebook's first cell (``hosted.prepare``) chooses
  writable places for a hosted kernel before anything runs (:func:`mnist_helpers.course.hosted.places`) and sets the two
  variables for the kernel and the processes it starts: nothing is ever written inside a read-only series (a Kaggle
  dataset).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout this package lives in, or None when installed as a plain package."""
    candidate = PACKAGE_DIR.parent
    return candidate if (candidate / "pyproject.toml").is_file() else None


def writable(path: Path) -> bool:
    """Whether we may create files in the folder ``path`` (False on a read-only mount, for root too)."""
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _default(sub: str) -> Path:
    root = repo_root()
    if root is not None and writable(root):
        return root / sub
    return Path.home() / ".cache" / "mnist-scale-lab" / sub


def series_folder() -> Path | None:
    """The series' own folder when ``MNIST_SERIES`` names one (a Kaggle dataset, an upload), else None."""
    value = os.environ.get("MNIST_SERIES", "")
    path = Path(value).expanduser() if value and "://" not in value else None
    return path.resolve() if path is not None and path.is_dir() else None


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
    go elsewhere; the references stay with the code). Outside a checkout: the series folder ``MNIST_SERIES`` names
    (read-only is fine), else ``results_dir() / "reference"``, empty until runs are copied there. Not created here:
    readers find nothing in a missing folder, writers create it.
    """
    root = repo_root()
    if root is not None:
        return root / "results" / "reference"
    series = series_folder()
    if series is not None and (series / "results" / "reference").is_dir():
        return series / "results" / "reference"
    return results_dir() / "reference"
