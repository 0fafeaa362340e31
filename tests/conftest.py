"""Shared fixtures: the provisioned MNIST root (make test provisions it first), small tensors."""
from __future__ import annotations

from pathlib import Path

import pytest

from mnist_helpers.data import ensure_mnist
from mnist_helpers.paths import data_root

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """The project's data root with verified files (provisioned once if `make data` has not run)."""
    return ensure_mnist(data_root(), quiet=True)


@pytest.fixture(scope="session")
def small_mnist(mnist_root):
    from mnist_helpers.data import load_mnist
    return load_mnist(mnist_root, subset=(2048, 1000))
