"""The AVX2 profile as one item of `make test`'s session.

An AVX2-only CPU (most laptops) must be imitated from the first import of torch (``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2``), so its tests run in a pytest session of their own: ``make avx2-tests`` (the Makefile
holds its environment and its list of test files; ``make test-avx2`` installs first, then runs it). Run from here,
that session is one work unit of the 2-worker session, beside the other worker's tests, instead of a phase after
them (docs/TESTING.md)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.process
@pytest.mark.timeout(1500)
def test_the_avx2_profile_passes():
    if os.environ.get("MNIST_EXPECT_AVX2") == "1":
        pytest.skip("already inside the AVX2 profile")
    if shutil.which("make") is None:
        pytest.skip("no make on this machine: run the AVX2 files by hand (docs/TESTING.md)")
    data = os.environ.get("MNIST_DATA_ROOT", str(REPO / "data"))
    done = subprocess.run(["make", "--no-print-directory", "avx2-tests", f"PY={sys.executable}", f"DATA_ROOT={data}"],
                          cwd=REPO,
                          capture_output=True, text=True, timeout=1400)
    output = done.stdout + done.stderr
    print(output[-3000:])  # its summary; -rA shows it
    assert done.returncode == 0, f"make avx2-tests failed (rerun it alone to see every failure):\n{output[-6000:]}"
    assert " passed" in output.splitlines()[-1] or " passed" in output[-400:], output[-2000:]
