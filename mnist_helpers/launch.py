"""Launch torchrun from a notebook cell (introduced in 00_setup_and_data).

Why not the obvious ways?

- ``!torchrun ...`` in a cell never fails the cell: a crashed worker leaves a wall of text and the
  next cell runs on anyway.
- ``torch.multiprocessing.spawn`` pickles the function to run; a function defined in a notebook
  lives in ``__main__`` of the kernel, which the spawned processes cannot import.

So workers are scripts (``mnist_helpers/workers/``) and :func:`torchrun` runs
``python -m torch.distributed.run`` as a subprocess. It prints the exact command (paste it into a
terminal to get the same run), streams every line live with its rank in front (``[rank 1] ...``),
raises :class:`LaunchError` with the failing rank and its exception, stops every process on timeout
or interrupt, and returns the JSON that rank 0 wrote to ``--out``::

    from mnist_helpers.launch import torchrun
    result = torchrun("mnist_helpers.workers.progression.ddp_train", ["--epochs", "1"], nproc=2)
"""
from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["LaunchError", "LaunchOptions", "build_command", "torchrun"]

# torchrun tees each worker's stdout/stderr to the console behind this prefix; ${rank} is global.
RANK_PREFIX_TEMPLATE = "[rank ${rank}] "
_DOUBLE_PREFIX = re.compile(r"^(\[rank \d+\] )\1")  # workers print "[rank N]" themselves too
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(.*?)={20,}", re.S)
_TRACEBACK_START = "Traceback (most recent call last):"
# torch 2.14.1, measured by tests/workers/test_bugs_restart_kill.py (07_scaling_and_multinode shows the rates): after a killed
# worker, --max-restarts often fails while the workers reuse the agent's rendezvous TCP store (torch's default),
# under --standalone and at a c10d endpoint alike (a hang, or gloo's connectFullMesh against the old port); with
# this variable set every attempt gets a fresh store and the restarts succeeded in every trial. Elastic membership
# (--nnodes=1:2, a second agent joining) also needs it. So torchrun(options=LaunchOptions(max_restarts=N)) sets it
# unless the caller did.
_SHARE_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# torchrun's rendezvous store (TCPStore) uses its libuv backend by default, and Windows builds of torch have no
# libuv: there `--standalone` fails ("use_libuv was requested but PyTorch was build without libuv support")
# unless USE_LIBUV=0 is set. So on native Windows torchrun() sets it (shown in the printed command) unless the
# caller did.
_LIBUV = "USE_LIBUV"


class LaunchError(RuntimeError):
    """torchrun failed or timed out; ``str(err)`` names the failing rank and its exception.

    Attributes: ``command`` (list[str]), ``returncode`` (torchrun's exit code, None if unknown),
    ``rank`` (global rank of the first failing worker, None if unknown), ``root_cause`` (that
    worker's exception and the last lines of its traceback), ``output`` (everything printed).
    """

    def __init__(self, message, *, command, returncode=None, rank=None, root_cause="", output=""):
        super().__init__(message)
        self.command, self.returncode, self.rank = command, returncode, rank
        self.root_cause, self.output = root_cause, output


def build_command(module: str, args=(), nproc: int = 1, nnodes: int = 1, *, node_rank=None,
                  rdzv_endpoint=None, rdzv_id=None, max_restarts: int = 0, local_addr=None,
                  extra_torchrun_args=()) -> list[str]:
    """The ``python -m torch.distributed.run ...`` command line (a list) for a worker.

    ``module`` is a module name (``mnist_helpers.workers.progression.ddp_train``, run with ``-m``) or a path
    to a ``.py`` script. One node without an endpoint uses ``--standalone``: torchrun hosts the
    rendezvous on a port the OS picks, so a busy port 29500 never breaks a run. Several nodes
    meet at ``rdzv_endpoint`` (``HOST:PORT`` on node 0, same ``rdzv_id`` on every node).
    """
    if nproc < 1 or nnodes < 1:
        raise ValueError(f"nproc and nnodes must be positive integers, got {nproc} and {nnodes}")
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError(f"nnodes={nnodes} needs rdzv_endpoint='HOST:PORT' of node 0, "
                             "the same on every node")
        cmd += ["--nnodes", str(nnodes)]
        if node_rank is not None:  # torchrun only uses it with the static backend; a label here
            cmd += ["--node-rank", str(node_rank)]
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id or 'mnist-scale-lab'}"]
        if local_addr is not None:
            cmd += ["--local-addr", str(local_addr)]
    cmd += ["--nproc-per-node", str(nproc)]
    if max_restarts:
        cmd += ["--max-restarts", str(max_restarts)]
    # --tee 3 echoes both streams of every worker behind a rank prefix (see RANK_PREFIX_TEMPLATE).
    cmd += ["--tee", "3", "--log-line-prefix-template", RANK_PREFIX_TEMPLATE, *extra_torchrun_args]
    is_script = module.endswith(".py") or os.sep in module or "/" in module
    cmd += [str(Path(module).resolve())] if is_script else ["-m", module]
    return cmd + [str(a) for a in args]


def check_devices(device: str, nproc: int, gpus: int, suggest) -> str:
    """Resolve ``device`` and refuse (cuda) or warn (cpu) before launching more processes than fit."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "auto":  # cuda only when every process gets a GPU of its own (as distributed.py picks nccl)
        device = "cuda" if gpus and gpus >= nproc else "cpu"
    cpu = f"  {suggest(nproc, 'cpu')}\n(on CPU the workers use gloo; device='cpu' in a notebook)"
    if device == "cuda" and gpus == 0:
        raise ValueError(f"asked for {nproc} processes on cuda, but this machine has no usable "
                         f"CUDA device. Run on CPU instead:\n{cpu}")
    if device == "cuda" and nproc > gpus:
        raise ValueError(f"asked for {nproc} processes on cuda, but this machine has {gpus} CUDA "
                         f"device(s). Use one process per GPU (nproc={gpus}):\n"
                         f"  {suggest(gpus, 'cuda')}\nor run all {nproc} on CPU:\n{cpu}")
    if device == "cpu" and nproc > (os.cpu_count() or 1):
        warnings.warn(f"{nproc} processes on {os.cpu_count()} CPU cores: they will compete for "
                      "cores, so timings will not reflect a real cluster", stacklevel=3)
    return device


def device_note(asked: str, device: str, nproc: int, gpus: int) -> str:
    """Where the ``nproc`` processes run and why, in one line; :func:`torchrun` prints it as a shell comment
    at the end of the command it shows (so the line stays pasteable)."""
    where = ("cuda with nccl, one GPU per process" if device == "cuda"
             else "the CPU with gloo" + (f" (GPUs hidden: {gpus} GPU(s) for {nproc} processes)" if gpus else ""))
    return f"{nproc} process(es) on {where}" + (", chosen by device='auto'" if asked == "auto" else "")


def find_root_cause(output: str, error_file: Path) -> tuple[int | None, int | None, str]:
    """(global rank, exit code, exception + last traceback lines) of the first failing worker.

    torchrun copies the failing worker's ``@record`` error file to its own
    ``TORCHELASTIC_ERROR_FILE``; its "Root Cause" section gives rank and exit code. Without
    those (no ``@record``, killed by a signal, torchrun itself failed) we read the output.
    """
    section = (_ROOT_CAUSE.findall(output) or [""])[-1]
    fields = [re.search(p, section) for p in (r"rank\s*:\s*(\d+)", r"exitcode\s*:\s*(-?\d+)",
                                              r"traceback\s*:\s*(Signal .*)")]
    rank, exitcode, killed_by = (m.group(1).strip() if m else None for m in fields)
    rank, exitcode = (int(v) if v is not None else None for v in (rank, exitcode))
    try:
        msg = json.loads(error_file.read_text())["message"]
        stack = msg["extraInfo"]["py_callstack"].rstrip().splitlines()
        return rank, exitcode, _headline(msg["message"], stack[:-1])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    # The last traceback the failing worker printed (lines behind its prefix).
    prefix = f"[rank {rank}] "
    lines = [ln[len(prefix):] for ln in output.splitlines() if ln.startswith(prefix)]
    starts = [i for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK_START)]
    if rank is not None and starts:
        block = lines[starts[-1]:]
        end = next((i for i, ln in enumerate(block) if i and not ln.startswith(" ")), len(block) - 1)
        return rank, exitcode, _headline(block[end], block[1:end])
    if killed_by:  # killed by a signal, so no traceback; an unexplained SIGKILL is usually OOM
        found = _expected_error(output, rank)
        if found is not None:  # an expected error came first; the signal followed it (gloo's threads at teardown)
            other, block = found
            how = (f"rank {rank} then died at exit by {killed_by.rstrip('.')}: gloo's threads at teardown"
                   if other == rank else
                   f"rank {rank} was then stopped by {killed_by.rstrip('.')}: gloo aborts when a peer exits "
                   "mid-collective")
            return other, None, "\n".join(block) + f"\n({how})"
        last = [ln for ln in lines if ln.strip()][-5:]  # its last words, e.g. C++'s "terminate called ..."
        return rank, exitcode, killed_by + (" (often the out-of-memory killer)" if "SIGKILL" in killed_by else "") \
            + ("\nits last output lines:\n  " + "\n  ".join(last) if last else "")
    if rank is not None and lines:  # exited without a traceback (argparse or an expected error): its last words
        errors = [i for i, ln in enumerate(lines) if ": error:" in ln or ln.startswith("error:")]
        return rank, exitcode, "\n".join(lines[errors[-1]:] if errors else lines[-5:])  # the whole error block
    return rank, exitcode, "\n".join(output.splitlines()[-15:])


def _expected_error(output: str, killed: int | None) -> tuple[int, list[str]] | None:
    """(rank, its error block) of a rank that stopped with an expected error (``error: ...``, the message of
    ``mnist_helpers.errors``), when the first rank torchrun saw fail was killed by a signal: another rank's, or the
    killed rank's own when it printed one before the signal (gloo can abort a process at exit, after the error was
    reported); another rank's first. None when no rank printed one."""
    def block_of(r: int) -> list[str]:
        prefix = f"[rank {r}] "
        lines = [ln[len(prefix):] for ln in output.splitlines() if ln.startswith(prefix)]
        return lines[next(i for i, ln in enumerate(lines) if ln.startswith("error: ")):]

    ranks = []
    for line in output.splitlines():
        m = re.match(r"\[rank (\d+)\] (.*)", line)
        if m and m.group(2).startswith("error: ") and int(m.group(1)) not in ranks:
            ranks.append(int(m.group(1)))
    if not ranks:
        return None
    r = next((r for r in ranks if r != killed), ranks[0])
    return r, block_of(r)


def _headline(message: str, frames: list[str]) -> str:
    """The exception line, then the last two frames of its traceback (without ``^^^`` markers)."""
    kept, skip = [], False
    for line in frames:
        if line.lstrip().startswith("File "):
            skip = "elastic/multiprocessing/errors" in line  # @record's wrapper: in every traceback
        if not skip and line.strip().strip("^~") and not line.startswith(_TRACEBACK_START):
            kept.append(line)
    return "\n".join([message, *kept[-4:]])


def stop_tree(proc, interrupted: bool = False, grace: float = 5.0) -> None:
    """Stop torchrun and every process below it, politely first, then for certain.

    Unguarded (not Linux), after Ctrl-C in a terminal or Jupyter's interrupt, torchrun got the same
    SIGINT (same process group) and is already stopping its workers, so it gets a moment to finish.
    Then SIGINT (torchrun, or the reaper that passes it on, forwards it to the workers), SIGTERM,
    SIGKILL. Workers run in sessions of their own, so killing torchrun would orphan them: the tree
    is collected before any signal.
    """
    try:  # a second interrupt must not cut the clean-up short (only possible in the main thread)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        previous = None
    try:
        try:
            root = psutil.Process(proc.pid)
            tree = root.children(recursive=True)
        except psutil.NoSuchProcess:
            root, tree = None, []
        # (None, 2 s): after an interrupt torchrun may already be stopping; give it time first. Windows' Popen
        # cannot send SIGINT (ValueError) and its SIGTERM is TerminateProcess: there the tree is killed below.
        polite = () if sys.platform == "win32" else ((signal.SIGINT, grace),)
        for sig, wait in ((None, 2.0 if interrupted else 0), *polite, (signal.SIGTERM, 3.0)):
            if proc.poll() is None:
                if sig is not None:
                    proc.send_signal(sig)
                try:
                    proc.wait(wait)
                except subprocess.TimeoutExpired:
                    pass  # escalate
        # Processes started since the snapshot: DataLoader workers, workers of a restart, ...
        for p in [root, *tree] if root is not None else list(tree):
            try:
                tree += p.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        for p in tree:
            try:
                p.kill()  # psutil refuses if the pid now belongs to an unrelated process
            except psutil.NoSuchProcess:
                pass
        proc.kill()
        proc.wait()
        psutil.wait_procs(tree, timeout=2)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@dataclass(frozen=True)
class LaunchOptions:
    """The settings of :func:`torchrun` that few runs change: several nodes meeting at a rendezvous (``nnodes``,
    ``node_rank``, ``rdzv_endpoint`` ``HOST:PORT`` of node 0, ``rdzv_id``, ``local_addr``: :func:`build_command`
    says what each does), how often torchrun restarts the group after a worker fails (``max_restarts``; > 0 also
    sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: :func:`torchrun` says why), where rank 0 writes its JSON
    (``out``; default a temporary file, read and removed) and flags added to torchrun's own
    (``extra_torchrun_args``)::

        torchrun(worker, args, nproc=1, options=LaunchOptions(nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}"))
        torchrun(worker, args, nproc=2, options=LaunchOptions(max_restarts=2))
    """
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    local_addr: str | None = None
    max_restarts: int = 0
    out: str | Path | None = None
    extra_torchrun_args: tuple[str, ...] = ()


def torchrun(module: str, args=(), nproc: int = 1, timeout: float | None = None, env: dict | None = None, *,
             threads_per_proc: int | None = None, device: str = "auto", provision: bool = True, echo: bool = True,
             options: LaunchOptions | None = None) -> dict | None:
    """Run ``module`` under torchrun, stream its output, return the JSON rank 0 wrote to ``--out``.

    Raises LaunchError when a worker fails (naming its rank and exception) or after ``timeout``
    seconds; on KeyboardInterrupt every process is stopped and the interrupt re-raised.
    ``env`` adds environment variables; ``threads_per_proc`` sets OMP_NUM_THREADS (default: the
    cores shared out between the processes). ``device="cpu"`` hides GPUs from the workers.
    ``provision=False`` skips fetching MNIST first; ``echo=False`` prints neither the command nor the workers' lines.
    Several nodes, restarts, a results path of your own and extra torchrun flags: ``options`` (:class:`LaunchOptions`).
    ``options.max_restarts`` > 0 also sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (shown in the printed
    command) unless ``env`` or the environment sets it: without it restarts often fail on torch 2.14
    (tests/workers/test_bugs_restart_kill.py measures the rates). On native Windows it sets ``USE_LIBUV=0`` (also shown) unless
    ``env`` or the environment sets it: Windows builds of torch have no libuv for torchrun's rendezvous store.
    """
    from mnist_helpers.resources import gpu_count  # torch is imported there, so that importing this stays quick

    gpus = gpu_count()  # without starting the CUDA driver: a fork after this still works (resources.gpu_count)
    args = [str(a) for a in args]
    given = {**os.environ, **(env or {})}.get("OMP_NUM_THREADS")
    # Launcher plumbing lives in a temporary folder, passed by environment so that the printed
    # command stays pasteable: torchrun's log files (PET_LOG_DIR is --log-dir; without it torchrun
    # leaves a /tmp/torchelastic_* folder behind per run) and torchrun's own error file.
    options = options or LaunchOptions()
    results, args, auto = _results_path(args, options.out)
    tmp = tempfile.TemporaryDirectory(prefix="mnist_launch_")
    try:
        opts = dict(nnodes=options.nnodes, node_rank=options.node_rank, rdzv_endpoint=options.rdzv_endpoint,
                    rdzv_id=options.rdzv_id, max_restarts=options.max_restarts, local_addr=options.local_addr,
                    extra_torchrun_args=options.extra_torchrun_args)

        def shown_env(n: int, dev: str) -> dict:
            """The variables that change the run, so they belong in the printed command."""
            threads = threads_per_proc or given or max(1, (os.cpu_count() or 1) // n)
            shown = {**(env or {}), "OMP_NUM_THREADS": str(threads)}
            if options.max_restarts and _SHARE_STORE_OFF not in {**os.environ, **(env or {})}:
                shown[_SHARE_STORE_OFF] = "1"  # restarts under c10d rendezvous: see _SHARE_STORE_OFF
            if sys.platform == "win32" and _LIBUV not in {**os.environ, **(env or {})}:
                shown[_LIBUV] = "0"  # Windows builds of torch have no libuv: see _LIBUV
            if dev == "cpu" and gpus:
                shown["CUDA_VISIBLE_DEVICES"] = ""  # device="cpu" means the workers see no GPU
            return shown

        def as_shell(n: int, dev: str) -> str:
            envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown_env(n, dev).items())
            return f"{envs} {shlex.join(build_command(module, args, n, **opts))}"

        asked, device = device, check_devices(device, nproc, gpus, as_shell)
        if provision:  # workers never download: fetch and verify MNIST once, here
            from mnist_helpers.data import ensure_mnist
            from mnist_helpers.paths import data_root

            ensure_mnist(data_root())
        command = build_command(module, args, nproc, **opts)
        error_file = Path(tmp.name) / "error.json"  # torchrun's @record copies the root cause here
        child_env = {**os.environ, **shown_env(nproc, device), "PET_LOG_DIR": tmp.name,
                     "TORCHELASTIC_ERROR_FILE": str(error_file),
                     "PYTHONUNBUFFERED": "1"}  # torchrun echoes worker lines without flushing
        if echo:  # the command to paste, then where it runs (a shell comment: the line stays pasteable)
            print("$", as_shell(nproc, device), " #", device_note(asked, device, nproc, gpus), flush=True)
        results.unlink(missing_ok=True)  # a file left by an earlier run must not pass as this one's
        lines, status = _run(command, child_env, timeout, echo, cleanup=tmp.name)
        finished = finished_then_aborted(status, "".join(lines), results)
        if finished is not None:
            ranks, data = finished
            print(f"note: rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} aborted at interpreter "
                  "exit (SIGABRT, \"terminate called without an active exception\") after rank 0 had written the "
                  "run's results: gloo's threads at teardown (torch 2.14.1), not a failure of the run; the results "
                  "below are complete", flush=True)
            return data
        raise_on_failure(status, command, "".join(lines), error_file, timeout)
        return json.loads(results.read_text()) if results.is_file() else None
    finally:
        tmp.cleanup()
        if auto:
            results.unlink(missing_ok=True)


_EXIT_ABORT = "terminate called without an active exception"


def finished_then_aborted(status, output: str, results: Path) -> tuple[list[int], dict] | None:
    """(aborted ranks, results) when the run finished and its only failure is gloo's abort at interpreter exit.

    On torch 2.14.1 a gloo worker that has finished sometimes dies at interpreter shutdown with C++'s "terminate
    called without an active exception" (SIGABRT): about 1 launch in 20 on a busy 2-core machine (2 of 40 measured,
    two launchers at once), with or without ``dist.destroy_process_group()``; torchrun then stops the other ranks
    with SIGTERM. Rank 0 writes ``--out`` only after the last collective of the run, so a complete results file
    means every rank got that far. None (a real failure) unless: every failed worker either exited by SIGABRT
    having printed that line (its stdout and stderr interleave, so the line need not come last) and no other
    "terminate called", or was stopped by torchrun's SIGTERM after such an abort; no worker printed a traceback or
    an error; and the results file is complete JSON."""
    if status in (0, "timeout"):
        return None
    codes = [int(c) for c in re.findall(r"^(?:\[torchrun\])?\s+exitcode\s*:\s*(-?\d+)", output, re.M)]
    ranks = [int(r) for r in re.findall(r"^(?:\[torchrun\])?\s+rank\s*:\s*(\d+) \(local_rank", output, re.M)]
    if not codes or len(codes) != len(ranks) or any(c not in (-6, -15) for c in codes):
        return None
    aborted = sorted({rank for rank, code in zip(ranks, codes) if code == -6})
    if not aborted:
        return None  # SIGTERM alone: something else stopped the run
    for rank in aborted:
        said = [ln[len(f"[rank {rank}] "):].strip() for ln in output.splitlines() if ln.startswith(f"[rank {rank}] ")]
        if _EXIT_ABORT not in said or any(ln.startswith("terminate called") and ln != _EXIT_ABORT for ln in said):
            return None
    if re.search(r"^\[rank \d+\] (Traceback \(most recent call last\)|error: )", output, re.M):
        return None
    try:
        return aborted, json.loads(results.read_text())
    except (OSError, ValueError):
        return None


def raise_on_failure(status, command, output: str, error_file: Path, timeout) -> None:
    """Raise LaunchError after a timeout or a non-zero exit, naming the rank that failed first."""
    if status == "timeout":
        raise LaunchError(f"torchrun timed out after {timeout:g} s; all its processes were stopped."
                          f"\nCommand: {shlex.join(command)}", command=command, output=output,
                          root_cause=f"timed out after {timeout:g} s")
    if status != 0:
        rank, code, cause = find_root_cause(output, error_file)
        who = f"rank {rank}" if rank is not None else "torchrun"
        head = f"{who} failed (exit code {code if code is not None else status})"
        if cause.startswith("error: "):  # an expected error (mnist_helpers.errors): its message comes first
            first, _, rest = cause.partition("\n")
            text = f"{who}: {first[len('error: '):]}\n" + (f"{rest}\n" if rest else "") + f"({head})"
        else:
            text = f"{head}:\n{cause}"
        raise LaunchError(f"{text}\nCommand: {shlex.join(command)}", command=command,
                          returncode=status, rank=rank, root_cause=cause, output=output)


def _results_path(args: list[str], out) -> tuple[Path, list[str], bool]:
    """Where rank 0 writes its results JSON, the worker args that say so, and whether we chose it.

    Our own choice is a file in the system's temp folder (not in a folder we delete), so that
    the printed command still works when pasted into a terminal.
    """
    for i, a in enumerate(args):
        if a == "--out" or a.startswith("--out="):
            if out is not None:
                raise ValueError("give the results path as LaunchOptions(out=...) or as --out in args, not both")
            return Path(a.split("=", 1)[1] if "=" in a else args[i + 1]), args, False
    auto = out is None
    if auto:
        fd, out = tempfile.mkstemp(prefix="mnist_results_", suffix=".json")
        os.close(fd)
    return Path(out), [*args, "--out", str(out)], auto


GUARDED = sys.platform.startswith("linux")  # prctl: see mnist_helpers/reaper.py
# the folder that holds the package: a fresh ``python -c`` child finds it there even where it is not installed
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def child_env(*first) -> dict:
    """This process's environment for a fresh Python child (``python -c``, ``python -m``), with the folders ``first``
    at the front of its ``PYTHONPATH``, then the package's root, then the ``PYTHONPATH`` already set. The lessons that
    run a probe in a fresh interpreter (06's CUDA-initialiser search, 12's ``mp.spawn`` from a ``__main__`` without a
    file) start it with this."""
    path = (*first, PACKAGE_ROOT, os.environ.get("PYTHONPATH"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path if p)}


def popen_guarded(command: list[str], cleanup: str | None = None, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(command)`` of torchrun under ``mnist_helpers.reaper`` (Linux), in a session
    of its own: when the kernel dies (even with its whole process group killed) or torchrun is killed,
    the reaper stops torchrun and every worker, so nothing keeps training with no one to read it, and removes
    the folder ``cleanup`` (the launcher's temporary folder) if the kernel died.
    SIGINT/SIGTERM sent to the returned process are passed on to torchrun."""
    if not GUARDED:  # same process group as the caller: Jupyter's interrupt reaches torchrun directly
        return subprocess.Popen(command, **kwargs)
    wrapped = [sys.executable, "-m", "mnist_helpers.reaper", *(["--cleanup", cleanup] if cleanup else []),
               str(os.getpid()), "--", *command]
    return subprocess.Popen(wrapped, start_new_session=True, **kwargs)


def run_guarded(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=...)`` for a torchrun command, guarded
    (see popen_guarded); on timeout every process is stopped before ``subprocess.TimeoutExpired`` is raised."""
    proc = popen_guarded(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, errors="replace", **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_tree(proc)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _run(command, env, timeout, echo, cleanup=None):
    """Run torchrun, echo its lines live; return (lines, exit code or "timeout")."""
    proc = popen_guarded(command, cleanup, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
    lines_q: queue.Queue = queue.Queue()

    def pump():  # a thread, so the main thread can watch the clock and receive Ctrl-C
        for line in proc.stdout:
            lines_q.put(line)
        lines_q.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    lines, status = [], None
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                stop_tree(proc)
                status = "timeout"
                deadline = None  # keep draining the last lines until the pipe closes
            try:
                line = lines_q.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            line = _DOUBLE_PREFIX.sub(r"\1", line)
            if not line.startswith("[rank "):  # torchrun's own messages
                line = "[torchrun] " + line
            lines.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    except BaseException as exc:  # KeyboardInterrupt above all: no worker may outlive the cell
        # guarded, torchrun runs in another session and did not see the interrupt: no need to wait for it
        stop_tree(proc, interrupted=isinstance(exc, KeyboardInterrupt) and not GUARDED)
        raise
    proc.wait()
    reader.join(timeout=5)
    return lines, status if status == "timeout" else proc.returncode


def worker_pid(script: str, rank: int, attempt: int = 0, timeout: float = 120.0) -> int:
    """The process id of the worker torchrun started for ``rank`` of ``script`` in attempt ``attempt`` (0: before any
    restart), among this process's descendants (the launcher's torchrun and its workers). Waits up to ``timeout``
    seconds for it to appear; TimeoutError if it does not."""
    import os
    import time

    import psutil

    deadline = time.monotonic() + timeout
    want = {"RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": str(attempt)}
    while time.monotonic() < deadline:
        for p in psutil.Process(os.getpid()).children(recursive=True):
            try:
                if any(script in part for part in p.cmdline()) and all(
                        p.environ().get(k) == v for k, v in want.items()):
                    return p.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        time.sleep(0.05)
    raise TimeoutError(f"no worker of {script} with RANK={rank} (attempt {attempt}) appeared in {timeout:g} s")


def kill_rank_when(path, script: str, rank: int = 1, timeout: float = 300.0):
    """Start a thread that waits until ``path`` exists (the run's first snapshot), then sends SIGKILL (``kill -9``)
    to rank ``rank`` of ``script`` (first attempt). Returns ``(thread, info)``; ``info`` gets ``pid`` and ``seconds``
    (from the call to the kill), or ``error`` when no snapshot appeared or no such worker was found in ``timeout``."""
    import os
    import signal
    import threading
    import time
    from pathlib import Path

    path, info, t0 = Path(path), {}, time.perf_counter()

    def run():
        while not path.exists():
            if time.perf_counter() - t0 > timeout:
                info["error"] = f"no snapshot at {path} after {timeout:g} s: nothing killed"
                return
            time.sleep(0.01)
        try:
            pid = worker_pid(script, rank, timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            os.kill(pid, signal.SIGKILL)  # kill -9: no handler runs, no file is closed, the process is gone
            info.update(pid=pid, seconds=time.perf_counter() - t0)
        except (TimeoutError, ProcessLookupError) as e:
            info["error"] = f"{e} (the run may have ended before the kill)"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, info
