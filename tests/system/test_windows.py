"""Native Windows (issue 40): the package imports and notebooks 00-05's code paths run without POSIX-only APIs.

No Windows machine runs these tests. A fresh Python process plays one: it first imports every module under test as
usual (so torch, psutil, subprocess and the rest pick their code for the real platform), forgets this package,
then sets ``sys.platform = "win32"``, makes ``resource`` (and the rest of what Windows lacks) unimportable, deletes
``os.getloadavg``, ``os.sched_getaffinity``, ``os.fork`` ... and ``signal.SIGKILL`` ..., imports this package again
and calls the functions that read the load average, the RSS peak and the address-space limit, and runs notebook 01's
cell that prints the load average. A fresh process, not ``importlib.reload``: reloading in this process would leave
the other tests holding classes and functions of the pretend-Windows modules.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = [REPO / "notebooks" / name for name in sorted(p.name for p in (REPO / "notebooks").glob("0[0-5]_*.ipynb"))]
POSIX_MODULES = ("resource", "termios", "pwd", "grp")  # and fcntl: test_imports_without_fcntl
POSIX_OS = ("getloadavg", "sched_getaffinity", "sched_setaffinity", "fork", "forkpty", "getuid", "geteuid",
            "getpgid", "killpg", "setsid", "posix_fadvise", "nice")
POSIX_SIGNALS = ("SIGKILL", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGCHLD")
# the lesson modules the brief names beyond the notebooks' own imports
EXTRA = ("mnist_helpers.lessons.n08.lesson", "mnist_helpers.course.doctor")


def _sources(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def notebook_modules() -> list[str]:
    """Every ``mnist_helpers`` module notebooks 00-05 import, and the workers they launch with torchrun()."""
    found = set(EXTRA)
    for nb in NOTEBOOKS:
        for src in _sources(nb):
            for line in src.splitlines():
                m = re.match(r"\s*from (mnist_helpers[\w.]*) import ([\w, ]+)", line)
                if m:
                    found.add(m.group(1))
                    names = [n.split(" as ")[0].strip() for n in m.group(2).split(",")]
                    found.update(f"{m.group(1)}.{n}" for n in names  # submodules: from mnist_helpers import claims
                                 if (REPO / m.group(1).replace(".", "/") / f"{n}.py").is_file())
                m = re.match(r"\s*import (mnist_helpers[\w.]*)", line)
                if m:
                    found.add(m.group(1))
            found.update(re.findall(r"torchrun\(\s*\"(mnist_helpers\.workers\.[\w.]+)\"", src))
    return sorted(found)


def load_average_cell() -> str:
    """Notebook 01's cell that reads the machine with the plain calls (and prints the load average)."""
    nb = REPO / "notebooks" / "01_resource_inspection.ipynb"
    cells = [src for src in _sources(nb) if "os.getloadavg()" in src]
    assert len(cells) == 1, "notebook 01 should read os.getloadavg() in one cell"
    return cells[0]


PLAY_WINDOWS = r'''
import contextlib, importlib, io, json, os, signal, sys

spec = json.loads(sys.argv[1])
# 1. this machine's platform: every module the targets pull in (torch, psutil, subprocess, ...) loads as usual
for name in spec["modules"]:
    importlib.import_module(name)
for name in [m for m in sys.modules if m == "mnist_helpers" or m.startswith("mnist_helpers.")]:
    del sys.modules[name]
# 2. what native Windows lacks
for name in spec["posix_modules"]:
    sys.modules[name] = None  # `import resource` raises ImportError
for attr in spec["posix_os"]:
    if hasattr(os, attr):
        delattr(os, attr)
for attr in spec["posix_signals"]:
    if hasattr(signal, attr):
        delattr(signal, attr)
sys.platform = "win32"

out = {"imported": [], "failed": {}, "calls": {}}
for name in spec["modules"]:
    try:
        importlib.import_module(name)
        out["imported"].append(name)
    except Exception as e:
        out["failed"][name] = f"{type(e).__name__}: {e}"


def call(key, fn):
    try:
        out["calls"][key] = {"ok": True, "value": fn()}
    except Exception as e:
        out["calls"][key] = {"ok": False, "error": f"{type(e).__name__}: {e}"}


def run_cell():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(spec["cell"], {"os": os, "__name__": "__main__"})
    return buf.getvalue()


if "mnist_helpers.resources" in sys.modules:
    from mnist_helpers import resources
    call("machine_info", lambda: {k: resources.machine_info()[k] for k in ("load_avg_1min", "usable_cores")})
    call("describe", lambda: resources.describe())
    call("usable_cores", resources.usable_cores)
if "mnist_helpers.lessons.n01.lesson" in sys.modules:
    from mnist_helpers.lessons.n01 import lesson as l01_resources
    call("cpu_info", lambda: l01_resources.cpu_info()["load_avg_1min"])
if "mnist_helpers.course.claims" in sys.modules:
    from mnist_helpers.course import claims
    def contention():
        with claims.Contention() as c:
            pass
        return [str(c), c.as_dict() if hasattr(c, "as_dict") else None]
    call("contention", contention)
if "mnist_helpers.memory" in sys.modules:
    from mnist_helpers import memory
    call("rss_peak_bytes", memory.rss_peak_bytes)
    call("memory_summary", lambda: memory.memory_summary("cpu"))
if "mnist_helpers.paths" in sys.modules:
    call("notebook_01_cell", run_cell)
if "mnist_helpers.lessons.n08.lesson" in sys.modules:  # last: on a POSIX system it would cap this process
    from mnist_helpers.memory import limit_memory  # what lessons/n08/lesson.py's batch-size search caps with
    call("limit_memory", lambda: limit_memory(1 << 30, "cpu"))
print(json.dumps(out, default=str))
'''


def play_windows(tmp_path, posix_modules=POSIX_MODULES) -> dict:
    """Run PLAY_WINDOWS in a fresh process; its report."""
    (tmp_path / "data").mkdir(exist_ok=True)
    spec = {"modules": notebook_modules(), "posix_modules": list(posix_modules), "posix_os": list(POSIX_OS),
            "posix_signals": list(POSIX_SIGNALS), "cell": load_average_cell()}
    env = {**os.environ, "MNIST_DATA_ROOT": str(tmp_path / "data"),
           "MNIST_RESULTS_DIR": str(tmp_path / "results")}
    proc = subprocess.run([sys.executable, "-c", PLAY_WINDOWS, json.dumps(spec)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1])


def test_the_module_list_covers_notebooks_00_to_05():
    mods = notebook_modules()
    for name in ("mnist_helpers.data", "mnist_helpers.memory", "mnist_helpers.launch", "mnist_helpers.resources",
                 "mnist_helpers.lessons.n01.lesson", "mnist_helpers.lessons.n04.lesson", "mnist_helpers.lessons.n05.lesson",
                 "mnist_helpers.workers.progression.ddp_train", "mnist_helpers.lessons.n08.lesson"):
        assert name in mods


@pytest.mark.process
def test_package_imports_and_runs_as_on_windows(tmp_path):
    rep = play_windows(tmp_path)
    assert rep["failed"] == {}, f"modules that do not import on Windows: {rep['failed']}"
    calls = rep["calls"]
    assert all(c["ok"] for k, c in calls.items() if k != "limit_memory"), calls
    assert calls["machine_info"]["value"]["load_avg_1min"] is None
    assert calls["machine_info"]["value"]["usable_cores"] >= 1 and calls["usable_cores"]["value"] >= 1
    assert calls["cpu_info"]["value"] is None
    # no load average on Windows: notebook 01 says n/a instead of failing on a None with :.2f
    assert "os.getloadavg(): n/a" in calls["notebook_01_cell"]["value"]
    # no resource module: psutil's peak working set (Windows only) or n/a, never a crash
    assert calls["rss_peak_bytes"]["value"] is None and "n/a" in calls["memory_summary"]["value"]
    # the CPU memory cap (notebook 08) needs RLIMIT_AS: a clear error that says so
    assert not calls["limit_memory"]["ok"]
    assert "not available on Windows" in calls["limit_memory"]["error"]
    assert calls["limit_memory"]["error"].startswith("ConfigError")


@pytest.mark.process
def test_imports_without_fcntl(tmp_path):
    rep = play_windows(tmp_path, (*POSIX_MODULES, "fcntl"))
    assert rep["failed"] == {}, f"modules that do not import on Windows: {rep['failed']}"


# --------------------------------------------------------------------------- the launcher on Windows

def launched_env(monkeypatch, capsys, platform: str, env=None) -> tuple[dict, str]:
    """(the environment torchrun would get, the printed command) on ``platform``, torchrun itself not started."""
    from mnist_helpers import launch

    seen = {}

    def fake_run(command, child_env, timeout, echo, cleanup=None):
        seen.update(child_env)
        return [], 0

    monkeypatch.delenv("USE_LIBUV", raising=False)
    monkeypatch.setattr(launch, "_run", fake_run)
    monkeypatch.setattr(sys, "platform", platform)
    launch.torchrun("mnist_helpers.workers.progression.ddp_train", nproc=1, env=env, provision=False, device="cpu")
    return seen, capsys.readouterr().out


def test_torchrun_sets_use_libuv_0_on_windows_only(monkeypatch, capsys):
    env, printed = launched_env(monkeypatch, capsys, "win32")
    assert env["USE_LIBUV"] == "0" and "USE_LIBUV=0" in printed  # shown in the command to paste
    env, printed = launched_env(monkeypatch, capsys, "linux")
    assert "USE_LIBUV" not in env and "USE_LIBUV" not in printed
    env, printed = launched_env(monkeypatch, capsys, "win32", env={"USE_LIBUV": "1"})  # the caller's choice stands
    assert env["USE_LIBUV"] == "1" and "USE_LIBUV=0" not in printed


class WindowsPopen:
    """A real process behind Windows' Popen rules: send_signal takes SIGTERM (TerminateProcess), not SIGINT."""

    def __init__(self, proc: subprocess.Popen):
        self._proc, self.pid, self.sent = proc, proc.pid, []

    def send_signal(self, sig):
        if sig != signal.SIGTERM:
            raise ValueError(f"Unsupported signal: {sig}")
        self.sent.append(sig)
        self._proc.send_signal(sig)

    def poll(self):
        return self._proc.poll()

    def wait(self, timeout=None):
        return self._proc.wait(timeout)

    def kill(self):
        self._proc.kill()


@pytest.mark.process
def test_stopping_torchrun_on_windows_sends_no_sigint(monkeypatch):
    from mnist_helpers.launch import stop_tree

    proc = WindowsPopen(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    monkeypatch.setattr(sys, "platform", "win32")
    try:
        stop_tree(proc, grace=1.0)
    finally:
        proc.kill()
    assert proc.poll() is not None and proc.sent == [signal.SIGTERM]
