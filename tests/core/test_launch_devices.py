"""Every launch the notebooks and lessons make, decided on machines with 0, 1, 2 and 4 GPUs (no GPU needed).

The launches are found in the sources (every ``torchrun(...)`` call in notebooks/*.ipynb and
mnist_helpers/lessons), so a new launch is covered the day it is written. ``device="auto"`` must pick cuda only
when every process gets a GPU of its own and gloo on the CPU otherwise, never refuse; an explicit
``device="cuda"`` with too few GPUs keeps its refusal, which names the command that would work.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mnist_helpers import launch
from mnist_helpers.launch import check_devices, device_note

REPO = Path(__file__).resolve().parents[2]
GPU_COUNTS = (0, 1, 2, 4)
GPU_NAMES = {"gpus", "N_GPUS"}  # launches that ask for one process per GPU (cells that run only with GPUs)


def _sources():
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                src = "".join(cell["source"])
                src = "\n".join("pass" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())
                yield f"{nb.name} cell {i}", src
    for py in sorted((REPO / "mnist_helpers" / "lessons").glob("n*/*.py")):
        yield py.relative_to(REPO).as_posix(), py.read_text()


def launches() -> list[tuple[str, object, object]]:
    """(where, nproc, device) of every torchrun(...) call: ints and strings when literal, else the expression."""
    found = []
    for where, src in _sources():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "torchrun":
                kw = {k.arg: k.value for k in node.keywords}
                nproc, device = kw.get("nproc"), kw.get("device")
                nproc = 1 if nproc is None else (nproc.value if isinstance(nproc, ast.Constant) else ast.unparse(nproc))
                device = "auto" if device is None else (
                    device.value if isinstance(device, ast.Constant) else ast.unparse(device))
                found.append((f"{where} line {node.lineno}", nproc, device))
    return found


LAUNCHES = launches()


@pytest.fixture(autouse=True)
def many_cores(monkeypatch):  # the core-count warning is not the subject here
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 64)


def suggest(n, dev):
    return f"torchrun --nproc-per-node {n} ({dev})"


def test_the_launches_are_found():
    # notebooks 00, 06 and 09 launch 2-process runs on the one device their comparison chose (a variable from
    # distributed.comparison_device, tests/core/test_device_choice.py), 12's demos with the default; 05 one on "cpu"
    chosen = [(w, n, d) for w, n, d in LAUNCHES if n == 2 and d not in ("auto", "cpu", "cuda")]
    assert {w.split(" ")[0][:2] for w, *_ in chosen} >= {"00", "06", "09"}, LAUNCHES
    assert any(w.startswith("12") and n == 2 and d == "auto" for w, n, d in LAUNCHES), LAUNCHES
    assert any(w.startswith("05") and d == "cpu" for w, _, d in LAUNCHES), LAUNCHES
    assert len(LAUNCHES) >= 12, LAUNCHES


@pytest.mark.parametrize("gpus", GPU_COUNTS)
@pytest.mark.parametrize("where,nproc,device", LAUNCHES, ids=[w for w, *_ in LAUNCHES])
def test_every_launch_runs_on_this_many_gpus(where, nproc, device, gpus):
    if isinstance(nproc, str) and nproc in GPU_NAMES:
        if gpus == 0:
            pytest.skip("this launch runs only where there is a GPU")
        counts = [gpus]
    else:
        counts = [nproc] if isinstance(nproc, int) else [1, 2, 3, 4]  # a parameter: every value a lesson uses
    devices = [device] if device in ("auto", "cpu", "cuda") else ["auto", "cpu"]  # a lesson's device parameter
    for n in counts:
        for dev in devices:
            got = check_devices(dev, n, gpus, suggest)
            if dev == "cpu":
                assert got == "cpu"
            else:
                assert got == ("cuda" if gpus >= n else "cpu"), (where, n, dev, gpus)
            note = device_note(dev, got, n, gpus)
            assert note.startswith(f"{n} process") and "\n" not in note and "#" not in note
            assert ("nccl" in note) == (got == "cuda") and ("gloo" in note) == (got == "cpu")


@pytest.mark.parametrize("gpus,nproc", [(0, 1), (0, 2), (1, 2), (2, 4), (4, 8)])
def test_explicit_cuda_with_too_few_gpus_is_refused_with_a_working_command(gpus, nproc):
    with pytest.raises(ValueError, match="asked for") as info:
        check_devices("cuda", nproc, gpus, suggest)
    msg = str(info.value)
    assert f"torchrun --nproc-per-node {nproc} (cpu)" in msg
    if gpus:
        assert f"torchrun --nproc-per-node {gpus} (cuda)" in msg


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_auto_uses_every_gpu_it_can(gpus):
    assert check_devices("auto", gpus, gpus, suggest) == "cuda"
    assert check_devices("cuda", gpus, gpus, suggest) == "cuda"
    assert check_devices("auto", gpus + 1, gpus, suggest) == "cpu"
