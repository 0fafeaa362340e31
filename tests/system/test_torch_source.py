"""scripts/torch_source.py: which torch `make lab`/`make test` install (CPU-only without an NVIDIA GPU)."""
import importlib.util
import json
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("torch_source", REPO / "scripts" / "torch_source.py")
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)
PIN = ["torch==2.14.1", "torchvision==0.29.1"]


def never():
    raise AssertionError("probed although the answer was already known")


@pytest.mark.parametrize("gpu, local, online, cpu_index", [
    (True, None, None, False),     # an NVIDIA GPU: the CUDA build, as pinned
    (False, True, None, False),    # the pinned torch on this machine's disk (the lab and CI machines)
    (False, False, True, True),    # a laptop online: the CPU-only wheels
    (False, False, False, False),  # the CPU index unreachable: the pin, said so
])
def test_the_choice(gpu, local, online, cpu_index):
    args, reason = ts.choose(PIN, setting="", gpu=lambda: gpu, local=(lambda: local) if local is not None else never,
                             online=(lambda: online) if online is not None else never)
    assert args[-2:] == PIN and (ts.CPU_INDEX in args) == cpu_index
    assert "\n" not in reason and reason


def test_the_learner_can_turn_the_choice_off_or_force_it():
    assert ts.choose(PIN, setting="pinned", gpu=never, local=never, online=never)[0] == PIN
    assert ts.CPU_INDEX in ts.choose(PIN, setting="cpu", gpu=never, local=never, online=never)[0]
    with pytest.raises(SystemExit, match="'pinned', 'cpu'"):
        ts.choose(PIN, setting="gpu", gpu=never, local=never, online=never)


@pytest.mark.process
@pytest.mark.parametrize("url, expected", [("file:///opt/pypi/torch-2.14.1-cp311.whl", True),
                                           ("https://files.pythonhosted.org/torch-2.14.1-cp311.whl", False)])
def test_a_local_copy_is_read_from_pips_own_report(tmp_path, url, expected):
    fake = tmp_path / "python"
    report = {"install": [{"metadata": {"name": "torch"}, "download_info": {"url": url}},
                          {"metadata": {"name": "torchvision"}, "download_info": {"url": url}}]}
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(report)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert ts.local_copy(PIN, python=str(fake)) is expected


@pytest.mark.process
def test_a_broken_pip_counts_as_no_local_copy(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho not json; exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert ts.local_copy(PIN, python=str(fake)) is False


def test_the_makefile_installs_torch_through_the_choice():
    make = (REPO / "Makefile").read_text()
    assert "pip install $$($(PY) scripts/torch_source.py $(TORCH_SPEC))" in make
