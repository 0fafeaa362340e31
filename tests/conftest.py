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


# --------------------------------------------------------------------------- markers that mean something
# Every test that starts a process carries one of these (docs/TESTING.md). `make check` deselects them (and `slow`)
# and runs the rest in a few minutes; `make test` runs everything. The guard below enforces it: a test without one of
# them that starts a process (subprocess, fork, multiprocessing, a DataLoader with workers, a kernel) fails.
PROCESS_MARKERS = {
    "process": "starts processes of its own: python, torchrun worlds, fork, DataLoader workers, a JupyterLab server",
    "kernel": "starts a Jupyter kernel: executes notebook cells",
    "system": "needs software the Makefile installs as root (Chromium, Slurm, network namespaces); "
              "skips under MNIST_NO_SYSTEM_INSTALL=1",
}
SLOW = "slow: starts no process but trains or evaluates for more than 30 s on a 2-core CPU (`make check` leaves it out)"
_CURRENT: list = [None]  # the test being run (setup, call, teardown), None during collection


class UnmarkedProcess(RuntimeError):
    pass


def _refuse(what: str):
    def start(*args, **kwargs):
        item = _CURRENT[0]
        raise UnmarkedProcess(
            f"{item.nodeid} starts a process ({what}) but carries none of the markers "
            f"{', '.join(sorted(PROCESS_MARKERS))}: mark it (tests/conftest.py, docs/TESTING.md) so that "
            "`make check` leaves it out")
    return start


def _marked(item) -> bool:
    return any(item.get_closest_marker(m) for m in PROCESS_MARKERS)


def _guarded(original, what: str):
    refuse = _refuse(what)

    def start(*args, **kwargs):
        item = _CURRENT[0]
        if item is not None and not _marked(item):
            return refuse(*args, **kwargs)
        return original(*args, **kwargs)
    start.__wrapped__ = original
    return start


def pytest_configure(config):
    import _posixsubprocess
    import platform
    import subprocess

    platform.uname().processor  # cached for the session: the stdlib asks `uname -p` once, not inside a test

    for name, what in PROCESS_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", SLOW)
    subprocess.Popen._execute_child = _guarded(subprocess.Popen._execute_child, "subprocess")
    _posixsubprocess.fork_exec = _guarded(_posixsubprocess.fork_exec, "multiprocessing spawn or forkserver")
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _guarded(getattr(os, name), f"os.{name}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _CURRENT[0] = item
    try:
        yield
    finally:
        _CURRENT[0] = None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that reads a notebook's run (the ``executed`` fixture) starts a kernel: it is marked ``kernel`` here,
    before ``-m`` selects. The system tests skip, with the reason, where the learner opted out of root installs.

    `make test` runs on 2 cores with pytest-xdist, ``-n 2 --dist loadscope``: a module's tests go to one worker (its
    fixtures, a hosted venv, a Slurm cluster, a shared torchrun run, are made once), and so do a class's. Each
    notebook's run is a class of its own (tests/notebooks/test_all_run.py), in the module of the tests that read its
    results where there are any (``TestNotebook08`` in tests/notebooks/test_n08_troubleshoot.py), so it still executes once."""
    for item in items:
        if "executed" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("kernel"):
            item.add_marker(pytest.mark.kernel)
    items[:] = sorted(items, key=_longest_first(items))
    if os.environ.get("MNIST_NO_SYSTEM_INSTALL") == "1":
        skip = pytest.mark.skip(reason="MNIST_NO_SYSTEM_INSTALL=1: Chromium, Slurm and network namespaces "
                                       "are not installed or used (unset it to run these tests)")
        for item in items:
            if item.get_closest_marker("system"):
                item.add_marker(skip)


# The AVX2 profile's session (tests/system/test_avx2_profile.py): `make test-avx2` took 2.5 min on the 2-core AVX2 EPYC
# (docs/TESTING.md, 2026-12-07); only its place in the order depends on it.
AVX2_PROFILE_S = 150


def _scope(nodeid: str) -> str:
    """xdist's loadscope work unit: the class, or the module of a function."""
    return nodeid.rsplit("::", 1)[0]


def _quick_seconds(text: str) -> float:
    """The upper end of a registry runtime such as "22-46 s" or "2.0-4.1 min" (0 when there is none)."""
    import re

    m = re.search(r"([\d.]+)\s*(s|min)\b", text)
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1) if m else 0.0


def _longest_first(items):
    """A sort key that puts the longest work units first (each notebook's run, by the quick-profile runtime the
    series registry records; the AVX2 profile), then every other unit in collection order; a unit's tests stay
    together and in order. Two workers given the long units first finish close together: left to the end, one
    notebook's run (2-5 min) kept one worker busy while the other sat idle."""
    from mnist_helpers.course.series import NOTEBOOKS

    quick = {f"TestNotebook{nb.nn}": _quick_seconds(nb.quick) for nb in NOTEBOOKS}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(_scope(item.nodeid), i)

    def expected(scope: str) -> float:
        if scope.endswith("test_avx2_profile.py"):
            return AVX2_PROFILE_S
        return quick.get(scope.rsplit("::", 1)[-1], 0.0) if "::" in scope else 0.0

    return lambda item: (-expected(_scope(item.nodeid)), first_seen[_scope(item.nodeid)])


# --------------------------------------------------------------------------- each notebook, executed once
@pytest.fixture(scope="session")
def executed(tmp_path_factory):
    """``executed(stem)``: the notebook run top to bottom once per session with nbmake's runner, in the quick profile
    unless ``MNIST_PROFILE`` says otherwise (tests/notebook_runs.py). Returns ``.nb`` (executed), ``.error`` (None,
    or nbmake's NotebookError) and ``.results``: the folder its record steps wrote to (``MNIST_RESULTS_DIR``, one
    per notebook). Every test that reads a notebook's outputs or results takes them from here, so no notebook runs
    twice."""
    import types

    import notebook_runs

    cache: dict = {}

    def get(stem: str):
        path = notebook_runs.path_of(stem)
        if path.stem not in cache:
            results = tmp_path_factory.mktemp(f"results-{path.stem[:2]}")
            env = {"MNIST_PROFILE": os.environ.get("MNIST_PROFILE") or "quick", "MNIST_RESULTS_DIR": str(results)}
            with mock.patch.dict(os.environ, env):
                run = notebook_runs.run_whole(path)
            cache[path.stem] = types.SimpleNamespace(nb=run.nb, error=run.error, results=results)
        return cache[path.stem]
    return get
