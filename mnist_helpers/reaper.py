"""Run torchrun so that nothing it starts outlives the notebook kernel that launched it (Linux).

    python -m mnist_helpers.reaper [--cleanup <folder>] <the launcher's pid> -- <the torchrun command>

Two ways a notebook leaves orphans behind, both seen in this series:

- the kernel dies (Jupyter's "Restart kernel", nbmake's or nbconvert's timeout kill the kernel's whole
  process group with SIGKILL): torchrun dies with it, but its workers run in sessions of their own
  (torchrun starts them so) and go on training, holding cores and ports;
- torchrun itself is killed with SIGKILL: it cannot stop its workers.

This wrapper sits between the launcher and torchrun, in a session of its own (a kill of the kernel's
process group does not reach it). It asks Linux for two things: a signal when its parent (the kernel)
dies (``PR_SET_PDEATHSIG``), and to become the "subreaper" of everything below it
(``PR_SET_CHILD_SUBREAPER``): a worker orphaned by a killed torchrun is re-parented to the wrapper,
not to init, so the wrapper still finds it. SIGINT and SIGTERM are passed on to torchrun (which stops
its workers); when torchrun has exited, or 10 s after a stop signal, every process left below the
wrapper is stopped (SIGTERM, then SIGKILL). The exit code is torchrun's. With ``--cleanup``, a folder the
launcher would have removed (its temporary folder: torchrun's logs and error file) is removed too, when the
launcher died first.

``mnist_helpers.launch`` uses it for every torchrun it starts; the printed command stays the torchrun
command a learner would type.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_GRACE_S = 10.0  # torchrun's own shutdown of its workers, after a stop signal, before the kill


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_descendants(grace: float = 3.0) -> int:
    """SIGTERM to every process below this one, ``grace`` seconds, then SIGKILL; reap. Returns how many."""
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=2)
    return len(procs)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name if __spec__ else 'reaper'}",
                                 description="run a torchrun command; stop everything below it when it or the "
                                             "launcher dies")
    ap.add_argument("--cleanup", metavar="DIR", default=None,
                    help="a folder to remove at the end if the launcher died (it can no longer remove it)")
    ap.add_argument("parent_pid", type=int, help="the launcher's pid (the notebook kernel)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the torchrun command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --, e.g. -- python -m torch.distributed.run --standalone ...")
    parent = args.parent_pid
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    stops: list[float] = []
    child: subprocess.Popen | None = None

    def on_stop(signum, _frame):
        stops.append(time.monotonic())
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_stop)
    child = subprocess.Popen(command)
    while True:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            # the launcher died before PR_SET_PDEATHSIG was in place, or without it (no prctl): poll
            if os.getppid() != parent and not stops:
                on_stop(signal.SIGTERM, None)
            if stops and time.monotonic() - stops[0] > STOP_GRACE_S:
                stop_descendants(grace=0)  # torchrun too
    left = stop_descendants()
    if left and not stops:
        print(f"[reaper] torchrun exited ({code}) leaving {left} process(es) behind; stopped them", file=sys.stderr)
    if args.cleanup and os.getppid() != parent:  # a live launcher still reads its error file, then removes it
        shutil.rmtree(args.cleanup, ignore_errors=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
