"""`make lab` started the way the README says, for tests/system/test_make_lab.py and tests/system/test_jupyterlab.py (issue 24).

``readme_lab_line(flag)`` is the README's ``make lab LAB_ARGS="..."`` line that carries ``flag``;
``make_lab(line, workdir)`` runs that line in the checkout (a free port in place of the README's 8888), as the
user the tests run as (root in CI), in a session of its own, and yields a ``LabServer`` once JupyterLab has
printed its URL with the token and its port accepts connections (jupyter_server logs the URL before it
binds the port). On exit it sends SIGTERM to the session's process group (make and jupyter;
jupyter shuts its kernels down), then scans /proc until no process is left: none in the group, and none
carrying the environment marker that every child inherits (kernels run in sessions of their own, so the
group alone would miss them). Whatever is still there after a minute is killed and reported as a failure.

make's install and data steps are no-ops once ``make install`` has run (``.venv/.installed`` newer than
pyproject.toml; ``make data`` only re-verifies the files); where the stamp is stale the tests skip, saying so,
rather than let ``make lab`` reinstall.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from mnist_helpers.ports import free_port

REPO = Path(__file__).resolve().parents[1]
README_LAB = re.compile(r'^make lab LAB_ARGS="[^"\n]*"', re.M)
URL = re.compile(r"http://(?:127\.0\.0\.1|localhost):(\d+)/lab\?token=([0-9a-f]+)")
MARKER = "MNIST_LAB_TEST_MARKER"
# make's own settings from an enclosing `make unit` would reach this make as overrides: start it as a shell would
MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "LAB_ARGS", "LAB_DIR")


def readme_lab_line(flag: str) -> str:
    """The README's ``make lab LAB_ARGS="..."`` line whose flags include ``flag``."""
    lines = [m.group(0) for m in README_LAB.finditer((REPO / "README.md").read_text())]
    found = [line for line in lines if flag in line]
    assert found, f"README.md has no `make lab LAB_ARGS=\"... {flag} ...\"` line (found {lines})"
    return found[0]


def lab_argv(line: str, port: int, extra: list[str] | None = None) -> list[str]:
    """``line`` split as a shell splits it, with ``--port=port`` in LAB_ARGS and ``extra`` make arguments."""
    words = shlex.split(line)
    assert words[:2] == ["make", "lab"] and words[2].startswith("LAB_ARGS="), line
    lab_args = words[2][len("LAB_ARGS="):]
    if re.search(r"--port=\d+", lab_args):
        lab_args = re.sub(r"--port=\d+", f"--port={port}", lab_args)
    else:
        lab_args += f" --port={port}"
    return ["make", "lab", f"LAB_ARGS={lab_args}", *words[3:], *(extra or [])]


def require_installed() -> None:
    """Skip, saying why, where `make lab` would reinstall (its stamp is stale) instead of just starting."""
    stale = subprocess.run(["make", "-q", ".venv/.installed"], cwd=REPO, capture_output=True,
                           env=_env({})).returncode
    if stale:
        pytest.skip("`make lab` would (re)install first: .venv/.installed is missing or older than pyproject.toml; "
                    "run `make install` (make test does it), then this test starts JupyterLab in seconds")


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in MAKE_ENV}
    env.update(extra)
    return env


def leftovers(pgid: int, marker: str) -> list[str]:
    """Live processes (not zombies) in process group ``pgid`` or whose environment carries ``marker``."""
    found, needle = [], f"{MARKER}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
            if state in "ZX":
                continue
            in_group = int(pgrp) == pgid
            try:
                marked = needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except PermissionError:
                marked = False
            if in_group or marked:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"pid {entry} (pgid {pgrp}, {state}): {cmd.strip()[:150]}")
        except (OSError, ValueError):
            continue  # gone while we looked
    return found


@dataclass
class LabServer:
    argv: list[str]
    base: str
    token: str
    port: int
    log: Path
    proc: subprocess.Popen

    def get(self, path: str, timeout: float = 60) -> tuple[int, str, str]:
        """(status, content type, body) of GET ``path``, authenticated with the token."""
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()

    def api(self, path: str) -> dict | list:
        status, kind, body = self.get(path)
        assert status == 200 and "json" in kind, (path, status, kind)
        return json.loads(body)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _stop(proc: subprocess.Popen, marker: str, timeout: float = 60) -> list[str]:
    """SIGTERM to make's process group; wait until /proc shows nothing left; kill and return what stayed."""
    pgid = proc.pid  # start_new_session: make leads its own session and group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while (left := leftovers(pgid, marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for line in left:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[1]), signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return left


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, deadline: float) -> None:
    """Wait until 127.0.0.1:``port`` accepts a connection.

    jupyter_server 2.x logs its URL in ``start_app`` and binds the port later, in a callback of the io loop that
    starts after it (``init_httpserver`` -> ``io_loop.add_callback(_bind_http_server)``): on a loaded machine a
    request sent as soon as the URL shows is refused (seen once in a fresh-clone ``make test``)."""
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except OSError as err:
            if proc.poll() is not None:
                raise AssertionError(f"JupyterLab exited ({proc.returncode}) after printing its URL:\n"
                                     f"{log.read_text(errors='replace')[-3000:]}") from err
            if time.monotonic() > deadline:
                raise AssertionError(f"JupyterLab printed its URL but port {port} accepted no connection "
                                     f"({err}):\n{log.read_text(errors='replace')[-3000:]}") from err
            time.sleep(0.2)


@contextlib.contextmanager
def make_lab(line: str, workdir: Path, lab_dir: Path | None = None, env: dict | None = None,
             startup_s: float = 180):
    """Run README ``line`` (free port, plus ``LAB_DIR=lab_dir`` if given) and yield a ``LabServer``."""
    require_installed()
    port, marker = free_port(), secrets.token_hex(8)
    argv = lab_argv(line, port, [f"LAB_DIR={lab_dir}"] if lab_dir else None)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "make_lab.log"
    extra = {MARKER: marker, "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"), **(env or {})}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=_env(extra), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_s
        while not (m := URL.search(log.read_text(errors="replace"))):
            if proc.poll() is not None:
                raise AssertionError(f"`{shlex.join(argv)}` exited ({proc.returncode}) before JupyterLab printed "
                                     f"its URL:\n{log.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no JupyterLab URL within {startup_s:.0f} s of `{shlex.join(argv)}`:\n"
                                     f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)
        served = int(m.group(1))
        _wait_listening(served, proc, log, deadline)
        yield LabServer(argv, f"http://127.0.0.1:{served}", m.group(2), served, log, proc)
    finally:
        left = _stop(proc, marker)
        assert not left, ("processes left after stopping `make lab` (killed now):\n" + "\n".join(left)
                          + "\n--- log:\n" + log.read_text(errors="replace")[-2000:])
