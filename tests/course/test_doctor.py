"""python -m mnist_helpers.course.doctor: findings with fixes, exit code 1 on errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mnist_helpers.course import doctor
from mnist_helpers.ports import hold_port
from mnist_helpers.resources import usable_cores


@pytest.mark.process
def test_cli_reports_every_check_as_json(mnist_root):
    proc = subprocess.run([sys.executable, "-m", "mnist_helpers.course.doctor", "--json"], capture_output=True, text=True,
                          timeout=120)
    findings = json.loads(proc.stdout)
    checks = {f["check"] for f in findings}
    assert {"gloo self-test", "shared memory", "GPUs", "gloo", "nccl", "threads", "MNIST data"} <= checks
    assert all(f["level"] in doctor.LEVELS for f in findings)
    assert proc.returncode == (1 if any(f["level"] == "error" for f in findings) else 0)


def test_wrong_interface_is_an_error_and_fails_the_exit_code(monkeypatch, capsys, mnist_root):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-if0")
    assert doctor.main(["--no-self-test"]) == 1
    out = capsys.readouterr().out
    assert "[ERROR] GLOO_SOCKET_IFNAME" in out and "fix:" in out


@pytest.mark.process
def test_held_port_is_named_with_its_process(monkeypatch):
    with hold_port() as (port, proc):
        monkeypatch.setenv("MASTER_PORT", str(port))
        found = {f.check: f for f in doctor.check_ports()}
        assert found[f"port {port}"].level == "warn" and f"pid {proc.pid}" in found[f"port {port}"].message
        assert "EADDRINUSE" in found[f"port {port}"].fix


def test_shm_need_and_check(tmp_path):
    assert doctor.shm_need_bytes(4, 128, sample_bytes=1000, prefetch_factor=2, nproc=2) == 2 * 4 * 2 * 128 * 1000
    assert doctor.check_shm(2, 128, path=str(tmp_path)).level in ("ok", "warn")
    huge = doctor.check_shm(64, 10**9, path=str(tmp_path))
    assert huge.level == "error" and "shm-size" in huge.fix
    with pytest.raises(ValueError):
        doctor.shm_need_bytes(-1, 128)


def test_threads_oversubscription_warns(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", str(usable_cores() * 2))
    assert doctor.check_threads(nproc=2).level == "warn"
    monkeypatch.setenv("OMP_NUM_THREADS", str(usable_cores()))
    assert doctor.check_threads(nproc=1).level == "ok"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert doctor.check_threads(nproc=1).level == "ok"  # a plain process uses every core


def test_bad_data_root_is_an_error_with_the_fix(tmp_path):
    finding = doctor.check_data(tmp_path)
    assert finding.level == "error" and "make data" in finding.fix
