"""The second half of every notebook's first cell: the profile this machine gets, and the data (introduced in 00).

Every notebook starts with the same short cell. On a hosted kernel (Colab, Kaggle: a fresh runtime per notebook,
nothing kept from the last one) the series is not installed; the cell then finds it (a folder or a ``.zip`` of this
repository, or a git URL, in ``MNIST_SERIES``; or a checkout above the notebook) and puts it on the path of the
kernel and of every process it launches. Then it calls :func:`prepare`, which

- picks the profile when ``MNIST_PROFILE`` is unset (:func:`choose_profile`: quick on a machine with at most
  ``QUICK_CORES`` cores and no GPU, where the full profile of some notebooks runs for many minutes; full otherwise),
  says why and how to override, and sets ``MNIST_PROFILE`` for the notebook and its workers;
- makes sure MNIST is in place (:func:`mnist_helpers.data.ensure_mnist`: md5-verified; from the internet only where
  the kernel has it), or says exactly what to copy where.

In a checkout with the package installed the cell's first half does nothing, and :func:`prepare` only prints the
profile line.
"""
from __future__ import annotations

import os

QUICK_CORES = 4  # at most this many usable cores and no GPU: the quick profile unless MNIST_PROFILE says otherwise


def choose_profile(env_value: str | None, cores: int, gpus: int) -> tuple[str, str]:
    """(profile, reason) for ``MNIST_PROFILE`` = ``env_value`` (None: unset) on a machine with ``cores`` usable
    cores and ``gpus`` CUDA GPUs."""
    if env_value:
        if env_value not in ("quick", "full"):
            raise ValueError(f"MNIST_PROFILE={env_value!r}: use 'quick' (small runs, every code path) or 'full' "
                             "(the real experiments), or unset it to let the machine choose")
        return env_value, "MNIST_PROFILE is set"
    if gpus == 0 and cores <= QUICK_CORES:
        return "quick", (f"{cores} usable cores and no GPU: the full profile runs for many minutes here; "
                         "for the real experiments set MNIST_PROFILE=full (e.g. `%env MNIST_PROFILE=full` before "
                         "this cell)")
    what = f"{gpus} GPU(s)" if gpus else f"{cores} usable cores"
    return "full", f"{what}: the real experiments; `%env MNIST_PROFILE=quick` before this cell for a fast pass"


def prepare(*, data: bool = True, quiet: bool = False) -> str:
    """Pick the profile (setting ``MNIST_PROFILE`` for this kernel and the processes it starts), make sure MNIST is
    in place, and return the profile."""
    import torch

    from mnist_helpers.resources import usable_cores

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    profile, reason = choose_profile(os.environ.get("MNIST_PROFILE"), usable_cores(), gpus)
    os.environ["MNIST_PROFILE"] = profile
    if not quiet:
        print(f"profile: {profile} ({reason})")
    if data:
        from mnist_helpers.data import ensure_mnist
        from mnist_helpers.paths import data_root

        ensure_mnist(data_root(), quiet=quiet)
    return profile
