"""Shared fixtures: the provisioned MNIST root (make test provisions it first), small tensors."""
from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

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


@pytest.fixture(autouse=True)
def restore_environ():
    """Every test leaves os.environ as it found it. Code that joins a process group in this process (a world of one:
    device_check's sections, the accum_nosync hook tests) sets MASTER_ADDR/PORT, RANK and WORLD_SIZE; left behind, a
    later test's worker took itself for a torchrun worker (ddp_train.setup read RANK, then failed on LOCAL_RANK)."""
    with mock.patch.dict(os.environ):
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch.set_num_threads(1) for a module's tests (steadier on a shared 2-core machine), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
