"""Lesson 08 (notebooks/08_troubleshooting.ipynb): the article's troubleshooting section, every error
reproduced for real, and a batch-size finder for out-of-memory errors.

**Reproductions.** One function per problem: :func:`port_in_use`, :func:`backend_interface`,
:func:`unused_parameters`, :func:`collective_mismatch`, :func:`out_of_memory`, :func:`loss_accumulation`,
:func:`set_epoch_repro` and :func:`padding_repro` (from one :func:`sampler_pitfalls` launch of 12's demo
workers), :func:`download_race`, :func:`spawn_main`, :func:`cuda_fork`, :func:`loader_starvation` and
:func:`local_rank_argparse`. Each runs the broken program in a subprocess (through
``mnist_helpers.launch.torchrun`` where a process group is involved), catches the failure, reads the message,
applies the fix, runs again, and returns a :class:`Repro` record::

    Repro(name, error, diagnosis, fix, fixed_ok, details)

``error`` is the line of the real message that tells what happened; ``fixed_ok`` says whether the fixed run
passed (``None`` when the problem cannot be shown on this machine, e.g. CUDA-only ones); ``details`` holds the
measurements. ``Repro.show()`` displays one record, :func:`records_table` the summary of several. The bug
programs are ``mnist_helpers/workers/bugs/*.py``; each docstring gives the command that reproduces it in a
terminal. Each torchrun launch starts Python and imports torch in every process: several seconds on a small
CPU, so the functions keep process counts and timeouts small.

**The bugs as code.** Each bug worker marks its broken lines with the comments ``# [bug]`` ... ``# [/bug]`` and
each fix ``# [fix]`` ... ``# [/fix]`` (``fix:all``, ...); the fixed runs execute the fix lines. The notebook shows
them: :func:`bug_code` (the lines, with the file and line numbers), :func:`error_excerpt` (the real message
of the broken run, from its record), :func:`fix_diff` (the edit from the bug lines to a fix) and
:func:`command_diff` (where the fix is the launch command: a fixed port, ``OMP_NUM_THREADS``).

**The claims.** :func:`claims_08` turns one :class:`Measured08` record (the records and the launches' sizes) into
the claim entries ``claims.record`` writes (pure).

**The OOM checklist.** :func:`oom_checklist` measures each item of the article's list on this machine
(``mnist_helpers.memory.peak_memory``) and returns one row per item.

**The batch-size finder** (in the foundation, ``mnist_helpers.memory``, which the ``oom`` worker shares; import it from
there). ``memory.find_batch_size`` halves from a start until ``fits(batch_size)`` runs without
an out-of-memory error; ``memory.train_step_probe`` makes such a ``fits`` (one ``mnist_helpers.train.train_step``
on a random MNIST-shaped batch); ``memory.limit_memory`` makes the memory limit real:

- CUDA: the device's own memory, capped further with ``torch.cuda.set_per_process_memory_fraction`` so a big
  GPU shows the error too (``torch.OutOfMemoryError: CUDA out of memory``);
- CPU: there is no allocator cap, and a real out-of-memory on a shared machine would bring in the kernel's
  OOM killer, so ``resource.setrlimit(RLIMIT_AS)`` lets the process's *virtual address space* grow by the
  budget over what it maps now; then ``malloc`` fails and torch raises ``RuntimeError: DefaultCPUAllocator:
  can't allocate memory``. Address space is not resident memory: it also counts the allocator's slack and
  thread stacks created later, so treat the budget as approximate. The limit cannot be lifted inside the
  process, so :func:`find_batch_size_limited` runs the search in a fresh one (this module's command line),
  which is also how a notebook must use it; that process gets ``MALLOC_ENV``. Native Windows has no
  ``resource`` module: there the CPU cap raises a ``ConfigError`` that says so (WSL2 has it).

    python -m mnist_helpers.lessons.n08.lesson --model net --start 4096 --budget-mib 600
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import psutil
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from mnist_helpers.course import display
from mnist_helpers.data import (TensorBatches, check_file, dataset_tensors, make_loader, mnist_datasets, raw_dir,
                                time_loader)
from mnist_helpers.course.doctor import check_shm
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import MiB
from mnist_helpers.launch import LaunchError, build_command, run_guarded, torchrun
from mnist_helpers.lessons.n05.lesson import graph_nodes  # 05 counts the graph a kept loss holds
# the batch-size finder lives in the foundation (mnist_helpers.memory: the oom worker uses it too); main() below runs it
from mnist_helpers.memory import (MALLOC_ENV, current_bytes, find_batch_size, limit_memory, peak_memory, run_isolated,
                                  train_step_probe)
from mnist_helpers.models import build_model
from mnist_helpers.paths import PACKAGE_DIR
from mnist_helpers.ports import find_port_holders, free_port, hold_port, port_is_free
from mnist_helpers.resources import gpu_count
from mnist_helpers.train import select_device, train_step, train_with_loader

BUGS = PACKAGE_DIR / "workers" / "bugs"  # the bug programs, for the reproductions that run a file
STATUS = {True: "passes", False: "STILL FAILS", None: "not shown on this machine"}


@dataclass
class Repro:
    """One reproduced problem: the real error line, why it happens, what fixes it, whether the fix passed."""
    name: str
    error: str               # the telling line of the real message (empty if the bug is silent)
    diagnosis: str           # why it happens / how we found it
    fix: str                 # what we changed
    fixed_ok: bool | None    # the fixed run passed (None: cannot be shown on this machine)
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def show(self) -> None:
        """The record as a two-column table, captioned with its name."""
        display.show({"error": self.error or "(silent: no error is raised)", "diagnosis": self.diagnosis,
                      "fix": self.fix, "fixed run": STATUS[self.fixed_ok]}, caption=self.name)

    def confirm(self, *expected: str, checks: dict[str, bool] | None = None, fix_shown: bool = True) -> bool:
        """Say in one line whether this machine showed the problem as the lesson describes: every ``expected``
        text in the error line, every named ``checks`` true, and the fixed run passing (``fix_shown=False``: a
        fix this machine cannot show, ``fixed_ok`` None, is accepted). Records the answer in
        ``details["as_described"]`` and returns it; never raises: a notebook reports, it does not assert."""
        problems = [f"the error line lacks {e!r}" for e in expected if e not in self.error]
        problems += [f"not so: {label}" for label, ok in (checks or {}).items() if not ok]
        if not (self.fixed_ok is True or (self.fixed_ok is None and not fix_shown)):
            problems.append(f"fixed run: {STATUS[self.fixed_ok]}")
        self.details["as_described"] = not problems
        done = ("error reproduced, fix passes" if self.fixed_ok else f"as far as this machine can: fixed run "
                f"{STATUS[self.fixed_ok]}")
        print(f"{self.name}: " + (f"shown as described ({done})" if not problems else
                                  "NOT as described on this machine: " + "; ".join(problems)))
        return not problems


def records_table(records) -> pd.DataFrame:
    """One row per record: the problem, whether its error was reproduced here, whether the fixed run passed."""
    rows = []
    for rec in records:
        shown = "yes" if rec.error and not rec.error.startswith("(") else ("silent" if not rec.error else "needs a GPU")
        rows.append({"problem": rec.name, "error reproduced": shown, "fixed run": STATUS[rec.fixed_ok]})
    return display.table(rows)


def telling_line(text: str, pattern: str) -> str:
    """The first line of ``text`` matching the regex ``pattern`` (case-insensitive), stripped of prefixes."""
    for line in text.splitlines():
        if re.search(pattern, line, re.I):
            return re.sub(r"^(\[(torchrun|rank \d+)\] )?(\[rank\d+\]: ?)?", "", line).strip()
    return ""


def expect_launch_failure(module: str, args=(), nproc: int = 1, env: dict | None = None,
                          timeout: float = 120, device: str = "cpu") -> LaunchError:
    """Launch ``module`` under torchrun and return the LaunchError it must raise (AssertionError if it passes)."""
    try:
        torchrun(module, list(args), nproc=nproc, env=env, timeout=timeout, echo=False, provision=False,
                 device=device)
    except LaunchError as err:
        return err
    raise AssertionError(f"{module} {' '.join(map(str, args))} was expected to fail but passed")


def launch_ok(module: str, args=(), nproc: int = 1, env: dict | None = None, timeout: float = 120,
              capture: list | None = None, device: str = "cpu") -> dict:
    """Launch ``module`` under torchrun; return rank 0's JSON (``{}`` if none). LaunchError propagates.

    ``capture``: a list that receives the run's output lines (the launcher's echo, kept off the screen).
    """
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf) if capture is not None else contextlib.nullcontext():
        res = torchrun(module, list(args), nproc=nproc, env=env, timeout=timeout, echo=capture is not None,
                       provision=False, device=device) or {}
    if capture is not None:
        capture.extend(buf.getvalue().splitlines())
    return res


def evidence(err: LaunchError) -> dict:
    """What a record keeps of a failed launch: the command to paste into a terminal, the failing rank, its cause."""
    return {"bug_command": shlex.join(err.command), "failing_rank": err.rank, "root_cause": err.root_cause[:1200]}


def subprocess_env(**extra) -> dict:
    """The environment of a fresh interpreter that must import this package from the checkout."""
    return {**os.environ, "PYTHONPATH": str(PACKAGE_DIR.parent), **extra}


# --------------------------------------------------------------------------- the bugs as code, on screen

WORKERS = PACKAGE_DIR / "workers"
_MARK = re.compile(r"^\s*# \[(/?)([\w:]+)\]\s*$")  # a region's marker line: # [bug] ... # [/bug]


def region(worker: str, label: str = "bug") -> tuple[int, int, str]:
    """The lines between the marker comments ``# [label]`` and ``# [/label]`` of ``workers/<worker>`` (e.g.
    ``"bugs/collective_mismatch.py"``): their first and last line numbers in the file and their text, dedented,
    without any marker lines inside. ``label=None``: the file's code after its module docstring. The bug workers
    mark their broken lines ``bug`` and each fix ``fix`` (``fix:all``, ...)."""
    from mnist_helpers.course.worker_diffs import body_start

    lines = (WORKERS / worker).read_text().splitlines()
    if label is None:
        start = body_start("\n".join(lines))
        while start < len(lines) and not lines[start].strip():
            start += 1
        return start + 1, len(lines), "\n".join(lines[start:]) + "\n"
    marks = [(i, m[1], m[2]) for i, ln in enumerate(lines) if (m := _MARK.match(ln))]
    opens = [i for i, closing, name in marks if name == label and not closing]
    closes = [i for i, closing, name in marks if name == label and closing]
    if len(opens) != 1 or len(closes) != 1 or closes[0] < opens[0]:
        raise ValueError(f"workers/{worker} has no single '# [{label}]' ... '# [/{label}]' region")
    body = [ln for ln in lines[opens[0] + 1:closes[0]] if not _MARK.match(ln)]
    return opens[0] + 2, closes[0], textwrap.dedent("\n".join(body)).strip("\n") + "\n"


def _lines(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def bug_code(worker: str, *labels: str | None):
    """The marked lines of a bug worker (default: its ``bug`` region), highlighted, each headed by the file and
    line numbers it comes from (``IPython.display.Code``; in a terminal, ``print(bug_code(...).data)``)."""
    from IPython.display import Code

    parts = []
    for label in labels or ("bug",):
        first, last, text = region(worker, label)
        parts.append(f"# mnist_helpers/workers/{worker}, {_lines(first, last)}" + (f" [{label}]" if label else "")
                     + "\n" + text)
    return Code("\n".join(parts), language="python")


def fix_diff_text(worker: str, bug: str = "bug", fix: str = "fix") -> str:
    """The unified diff from a worker's ``bug`` region to its ``fix`` region: the edit that fixes it."""
    (b1, b2, before), (f1, f2, after) = region(worker, bug), region(worker, fix)
    name = Path(worker).name
    return "\n".join(difflib.unified_diff(before.splitlines(), after.splitlines(),
                                           f"{name} {_lines(b1, b2)} (broken)", f"{name} {_lines(f1, f2)} ({fix})",
                                           n=max(len(before), len(after)), lineterm="")) + "\n"


def fix_diff(worker: str, bug: str = "bug", fix: str = "fix"):
    """:func:`fix_diff_text`, highlighted as a diff (``IPython.display.Code``)."""
    from IPython.display import Code

    return Code(fix_diff_text(worker, bug, fix), language="diff")


def command_diff(before: str, after: str):
    """Two command lines as a diff: the launch that fails and the one that works."""
    from IPython.display import Code

    return Code(f"- {before}\n+ {after}\n", language="diff")


_MESSAGE = re.compile(r"(Error|Exception)\b[^:]*:|\berror: |did not receive grad|Timed out|EADDRINUSE")


def error_excerpt(rec: Repro, lines: int = 4) -> str:
    """The lines of the real message the broken run printed that say what went wrong (the exception lines of the
    failing rank's traceback, as the launcher caught it, or of a plain subprocess's stderr), at most ``lines`` of
    them, each once; the last lines of the output when none looks like a message."""
    d = rec.details
    text = d.get("root_cause") or d.get("bug_output") or ""
    found = [ln.strip() for ln in text.splitlines() if _MESSAGE.search(ln) and not ln.lstrip().startswith("File ")]
    picked = list(dict.fromkeys(re.sub(r"^(\[(torchrun|rank \d+)\] )?(\[rank\d+\]: ?)?", "", ln)[:240]
                                for ln in found))
    picked = picked[:lines] or [ln.strip()[:240] for ln in text.splitlines() if ln.strip()][-lines:]
    who = f"rank {d['failing_rank']}" if d.get("failing_rank") is not None else "the broken run"
    return f"the real message ({who}):\n" + "\n".join("    " + ln for ln in picked)


# --------------------------------------------------------------------------- 1. Address already in use

def port_in_use(nproc: int = 1, timeout: float = 120) -> Repro:
    """A fixed MASTER_PORT held by another process -> EADDRINUSE; find the holder; rerun without a fixed port."""
    module = "mnist_helpers.workers.bugs.port_in_use"
    with hold_port() as (port, holder):
        err = expect_launch_failure(module, ["--master-port", port, "--timeout", 15], nproc=nproc, timeout=timeout)
        holders = find_port_holders(port)
    freed = port_is_free(port)  # the holder (our own process) was stopped on leaving the block
    fixed = launch_ok(module, nproc=nproc, timeout=timeout)  # no --master-port: torchrun's rendezvous picked one
    error = telling_line(err.root_cause + "\n" + err.output, r"EADDRINUSE|address already in use")
    who = ", ".join(f"pid {h['pid']} ({h['name']}: {h['cmdline']})" for h in holders) or "nobody visible"
    return Repro(
        "Address already in use", error,
        f"rank 0 hosts the rendezvous store on MASTER_PORT={port}, but another process listens there: {who}",
        "stop the holder, or do not fix the port: torchrun --standalone binds port 0 and the OS picks a free one "
        f"(the fixed run used port {fixed.get('master_port')})",
        bool(fixed) and fixed.get("all_reduce") == nproc,
        {"port": port, "holders": holders, "port_free_after_stopping_holder": freed,
         "fixed_master_port": fixed.get("master_port"), "fixed_all_reduce": fixed.get("all_reduce"),
         "commands": {"bug": shlex.join(build_command(module, ["--master-port", port], nproc)),
                      "fixed": shlex.join(build_command(module, [], nproc))}, **evidence(err)})


# --------------------------------------------------------------------------- 2. backend errors

def loopback_interface() -> str:
    """The name of the interface that carries 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == "127.0.0.1" for a in addrs):
            return name
    return "lo"


DEBUG_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}


def backend_interface(nproc: int = 2, bad_ifname: str = "eth-typo9", timeout: float = 120) -> Repro:
    """gloo told to use a network interface that does not exist; read the error; name the right one.

    The fixed run also sets ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` and ``TORCH_CPP_LOG_LEVEL=INFO`` so
    the output shows what those add (the store's address, each collective's fingerprint).
    """
    module = "mnist_helpers.workers.bugs.collective_mismatch"
    healthy = ["--fix", "--where", "end"]  # the fix shown in section 4: this run is also its rerun
    err = expect_launch_failure(module, healthy, nproc=nproc, env={"GLOO_SOCKET_IFNAME": bad_ifname},
                                timeout=timeout)
    good = loopback_interface()
    env = {"GLOO_SOCKET_IFNAME": good, **DEBUG_ENV}
    lines: list[str] = []
    fixed_err = None
    try:
        fixed = launch_ok(module, healthy, nproc=nproc, env=env, timeout=timeout, capture=lines)
    except LaunchError as e:  # reported in the record, not hidden
        fixed, fixed_err = {}, e
    return Repro(
        "gloo: wrong network interface", telling_line(err.root_cause + "\n" + err.output, r"Unable to find address"),
        f"GLOO_SOCKET_IFNAME={bad_ifname} names no interface on this machine; it has "
        f"{', '.join(sorted(psutil.net_if_addrs()))}",
        f"GLOO_SOCKET_IFNAME={good} (or unset it: gloo picks the interface of the host name); on GPU read NCCL's "
        "choice with NCCL_DEBUG=INFO and set NCCL_SOCKET_IFNAME the same way",
        bool(fixed) and fixed_err is None,
        {"interfaces": sorted(psutil.net_if_addrs()), "fixed_env": env, "fixed_result": fixed,
         "fixed_error": str(fixed_err) if fixed_err else None, "debug_lines": debug_log_lines("\n".join(lines)),
         "fixed_output_lines": len(lines), **evidence(err)})


def debug_log_lines(output: str, limit: int = 6) -> list[str]:
    """The lines that TORCH_DISTRIBUTED_DEBUG=DETAIL / TORCH_CPP_LOG_LEVEL=INFO add, a few of each kind."""
    kinds = [r"debug level is set", r"server has started|TCP client connected", r"Running collective"]
    picked = []
    for pattern in kinds:
        picked += [ln[:200] for ln in output.splitlines() if re.search(pattern, ln)][:2]
    return picked[:limit]


# --------------------------------------------------------------------------- 3. unused parameters

def unused_parameters(nproc: int = 2, steps: int = 20, warmup: int = 3, timeout: float = 180) -> Repro:
    """DDP with a branch forward never calls -> "Expected to have finished reduction"; three fixes, timed."""
    module = "mnist_helpers.workers.bugs.unused_param"
    # INFO is enough to name the parameters (DETAIL crashed in this case with torch 2.14.1 on CPU)
    err = expect_launch_failure(module, ["--steps", 2, "--warmup", 0], nproc=nproc,
                                env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, timeout=timeout)
    text = err.root_cause + "\n" + err.output
    named = telling_line(text, r"Parameters which did not receive grad|did not receive grad")
    fixed = launch_ok(module, ["--fix", "all", "--steps", steps, "--warmup", warmup], nproc=nproc, timeout=timeout)
    rows = {r["fix"]: r["median_step_ms"] for r in fixed.get("rows", [])}
    cost = rows["find_unused"] / rows["freeze"] if rows.get("freeze") else None
    return Repro(
        "Expected to have finished reduction in the prior iteration",
        telling_line(text, r"Expected to have finished reduction"),
        "the auxiliary head is never called in forward, so its gradients never arrive and DDP's reduction of "
        f"their bucket never finishes; TORCH_DISTRIBUTED_DEBUG=INFO names them: {named or '(not shown)'}",
        "use the branch, or freeze it (requires_grad_(False)), or DDP(find_unused_parameters=True), which "
        "searches the autograd graph after every forward",
        set(rows) == {"freeze", "find_unused", "use"},
        {"median_step_ms": rows, "find_unused_over_freeze": cost, "steps": steps, "world_size": fixed.get("world_size"),
         **evidence(err)})


# --------------------------------------------------------------------------- 4. collective mismatch / hang

def collective_mismatch(nproc: int = 2, timeout_s: float = 5.0, fixed_result: dict | None = None,
                        launch_timeout: float = 120) -> Repro:
    """One rank skips an all_reduce: a hang that a short timeout turns into an error; DETAIL names it.

    ``fixed_result``: the JSON of a passing ``collective_mismatch --fix`` run made already (e.g.
    by :func:`backend_interface`), to save one launch.
    """
    module = "mnist_helpers.workers.bugs.collective_mismatch"
    t0 = time.perf_counter()
    hang = expect_launch_failure(module, ["--where", "end", "--timeout", timeout_s], nproc=nproc,
                                 timeout=launch_timeout)
    hang_s = time.perf_counter() - t0
    named = expect_launch_failure(module, ["--where", "loop", "--timeout", timeout_s], nproc=nproc,
                                  env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=launch_timeout)
    # INFO does not wrap the process group with the collective checks (only DETAIL does): the same bug, unnamed
    info = expect_launch_failure(module, ["--where", "loop", "--timeout", timeout_s], nproc=nproc,
                                 env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, timeout=launch_timeout)
    info_text = info.root_cause + "\n" + info.output
    if fixed_result is None:
        fixed_result = launch_ok(module, ["--fix", "--where", "end", "--timeout", timeout_s], nproc=nproc,
                                 timeout=launch_timeout)
    detail = telling_line(named.root_cause + "\n" + named.output, r"Detected mismatch between collectives")
    differ = telling_line(named.root_cause + "\n" + named.output, r"Collectives differ in the following")
    return Repro(
        "collective mismatch (hang)",
        telling_line(hang.root_cause + "\n" + hang.output, r"Timed out waiting|timed out|Timeout"),
        "rank 0 reduced the log values inside `if rank == 0`, so it waits in an all_reduce that rank 1 never "
        f"calls; with timeout={timeout_s:g} s the wait became an error (default: 30 min). DETAIL, run with the "
        f"bug inside the loop, names it: {re.sub(r'TensorDeviceTypes=TensorOptions[(].*?[)][)]', '...)', detail)[:300]}",
        "call every collective on every rank, in the same order, with the same shapes (here: all ranks reduce "
        "the log values)",
        bool(fixed_result) and fixed_result.get("world_size") == nproc,
        {"hang_launch_seconds": hang_s, "timeout_s": timeout_s, "detail_line": detail,
         "differ_line": re.sub(r"^.*(Collectives differ)", r"\1", differ), "detail_command": evidence(named)["bug_command"],
         "info_names_mismatch": "Detected mismatch" in info_text,
         "info_line": (telling_line(info_text, r"collective mismatch|Timed out|timeout|Error") or "(no error line)"),
         **evidence(hang)})


def eval_through_ddp(nproc: int = 2, timeout_s: float = 5.0, launch_timeout: float = 120) -> Repro:
    """Rank 0 alone evaluates a BatchNorm model through the DDP wrapper (the article's 6.4 evaluates on rank 0 only;
    it shows no barrier: the bug worker adds one so that the other ranks wait, as a real job would at its next
    collective). DDP's forward broadcasts the buffers, a collective only rank 0 enters; a short timeout turns the
    hang into an error.
    The fixes: ``model.module`` on rank 0, or every rank evaluates; a model without buffers never hangs."""
    module = "mnist_helpers.workers.bugs.eval_through_ddp"
    t0 = time.perf_counter()
    hang = expect_launch_failure(module, ["--timeout", timeout_s], nproc=nproc, timeout=launch_timeout)
    hang_s = time.perf_counter() - t0
    fixed = launch_ok(module, ["--fix", "module", "--timeout", timeout_s], nproc=nproc, timeout=launch_timeout)
    fixed_all = launch_ok(module, ["--fix", "all", "--timeout", timeout_s], nproc=nproc, timeout=launch_timeout)
    no_buffers = launch_ok(module, ["--model", "net", "--timeout", timeout_s], nproc=nproc, timeout=launch_timeout)
    return Repro(
        "rank-0 evaluation through the DDP wrapper (hang)",
        (telling_line(hang.root_cause + "\n" + hang.output, r"Timed out waiting")
         or telling_line(hang.root_cause + "\n" + hang.output, r"timed out|timeout")),
        "after a training step, DDP's forward starts with a broadcast of rank 0's buffers (BatchNorm's running "
        "statistics; broadcast_buffers=True by default), even under no_grad() and eval(); rank 0 evaluating "
        "alone through the wrapper waits in that broadcast, which rank 1 never joins (our worker has it wait in "
        "barrier(); any other collective, or the next training step, does the same): a hang until the "
        f"process-group timeout ({timeout_s:g} s here, 30 min by default)",
        "evaluate model.module (the bare model: no collective) on rank 0, or let every rank evaluate through the "
        "wrapper (its own shard, results all-reduced: 06's distributed validation)",
        bool(fixed) and bool(fixed_all) and fixed.get("world_size") == nproc,
        {"hang_launch_seconds": hang_s, "timeout_s": timeout_s, "buffers": fixed.get("buffers"),
         "no_buffer_model_passed": bool(no_buffers), "fixed_all_passed": bool(fixed_all), **evidence(hang)})


# --------------------------------------------------------------------------- 5. out of memory

def out_of_memory(batch_size: int = 2048, budget_mib: int = 600, steps: int = 1, model: str = "net",
                  timeout: float = 300, device: str = "auto") -> Repro:
    """One training step that does not fit a memory cap; the fix halves to a micro-batch and accumulates.

    ``device="auto"``: on a GPU the cap is ``set_per_process_memory_fraction`` and the error CUDA's own."""
    module = "mnist_helpers.workers.bugs.oom"
    args = ["--model", model, "--batch-size", batch_size, "--budget-mib", budget_mib]
    err = expect_launch_failure(module, args, nproc=1, env=MALLOC_ENV, timeout=timeout, device=device)
    fixed = launch_ok(module, [*args, "--fix", "find", "--steps", steps], nproc=1, env=MALLOC_ENV, timeout=timeout,
                      device=device)
    error = telling_line(err.root_cause + "\n" + err.output,
                         r"can't allocate memory|CUDA out of memory|OutOfMemoryError")
    cap = "set_per_process_memory_fraction" if "cuda" in fixed.get("device", "") else "RLIMIT_AS (address space)"
    return Repro(
        "out of memory", error,
        f"one step of {model} at batch {batch_size} needs more than the {budget_mib} MiB the process may add "
        f"(capped with {cap})",
        f"halve until it fits (find_batch_size): micro-batch {fixed.get('micro_batch_size')} x "
        f"{fixed.get('grad_accum')} accumulation steps = the same batch of {batch_size}",
        bool(fixed.get("losses")),
        {"tried": fixed.get("tried"), "micro_batch_size": fixed.get("micro_batch_size"),
         "grad_accum": fixed.get("grad_accum"), "limit": fixed.get("limit"), "losses": fixed.get("losses"),
         **evidence(err)})


def oom_checklist(model: str = "net", batch_size: int = 128, device: str = "cpu") -> list[dict]:
    """The article's OOM checklist as code: each item measured on this machine, with what to do.

    Items: who holds memory; the state (weights, grads, Adam) vs the batch's activations; halving the
    batch; gradient accumulation (memory for one micro-batch, not for the whole batch); losses kept
    as tensors; mixed precision (bf16 autocast on CPU, fp16/bf16 on CUDA).
    """
    dev = select_device(device)
    torch.manual_seed(0)
    net = build_model(model).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(bs: int, amp: bool = False, accum: int = 1):
        def fn():
            X = torch.randn(bs, 1, 28, 28, device=dev)
            y = torch.randint(0, 10, (bs,), device=dev)
            train_step(net, opt, X, y, amp="bf16" if amp else "none", grad_accum=accum)
        return fn

    step(8)()  # optimizer state exists before measuring
    full = peak_memory(step(batch_size), dev)
    half = peak_memory(step(batch_size // 2), dev)
    accum = peak_memory(step(batch_size, accum=4), dev)
    amp = peak_memory(step(batch_size, amp=True), dev)
    kept = 0.0
    for _ in range(3):  # the mistake being measured: summing loss tensors, no backward
        X = torch.randn(8, 1, 28, 28, device=dev)
        kept = kept + F.nll_loss(net(X), torch.zeros(8, dtype=torch.long, device=dev))
    vm = psutil.virtual_memory()
    top = max(psutil.process_iter(["pid", "name", "memory_info"]),
              key=lambda p: p.info["memory_info"].rss if p.info["memory_info"] else 0)
    holders = (f"{torch.cuda.memory_allocated(dev) / MiB:,.0f} MiB allocated by this process; nvidia-smi lists the "
               "others" if dev.type == "cuda" else
               f"{vm.available / 2**30:.1f} of {vm.total / 2**30:.1f} GiB available; largest process: "
               f"{top.info['name']} (pid {top.info['pid']}, {top.info['memory_info'].rss / MiB:,.0f} MiB)")

    def mib(r):
        return r.peak_bytes / MiB
    return [
        {"check": "who holds memory", "measured": holders,
         "do": "nvidia-smi (GPU) / free -h (CPU): stop stale runs before shrinking anything", "ratio": None},
        {"check": f"batch {batch_size}: peak vs state", "measured": f"peak {mib(full):,.0f} MiB, of which "
         f"{full.persistent_bytes / MiB:,.0f} MiB weights+grads+Adam+batch", "do": "activations scale with the batch",
         "ratio": 1.0, "peak_mib": mib(full)},
        {"check": "halve the batch", "measured": f"peak {mib(half):,.0f} MiB at {batch_size // 2} "
         f"({mib(half) / mib(full):.2f}x)", "do": "find_batch_size halves until it fits",
         "ratio": mib(half) / mib(full)},
        {"check": "gradient accumulation", "measured": f"peak {mib(accum):,.0f} MiB for batch {batch_size} as "
         f"4 x {batch_size // 4} ({mib(accum) / mib(full):.2f}x)",
         "do": "accumulate micro-batches to keep the effective batch in less memory", "ratio": mib(accum) / mib(full)},
        {"check": "losses kept as tensors", "measured": f"3 summed losses keep {graph_nodes(kept)} autograd nodes alive",
         "do": "accumulate loss.item() (a float), or loss.detach()", "ratio": None, "nodes": graph_nodes(kept)},
        {"check": "mixed precision", "measured": f"peak {mib(amp):,.0f} MiB with bf16 autocast "
         f"({mib(amp) / mib(full):.2f}x)", "do": "torch.autocast (+ torch.amp.GradScaler for fp16) on GPU",
         "ratio": mib(amp) / mib(full)},
    ]


# --------------------------------------------------------------------------- 6. loss kept as a tensor

def summed_loss_memory(num_steps: int = 8, accumulate: str = "tensor", batch_size: int = 64, model: str = "net",
                       seed: int = 0) -> dict:
    """An evaluation loop without ``torch.no_grad()`` that sums the loss for logging; memory in use after each batch.

    ``accumulate="tensor"`` (``total += loss``) keeps every batch's graph, and its saved activations,
    reachable from ``total``; ``"item"`` (``total += loss.item()``) keeps nothing. Run it in a fresh
    process (``run_isolated``): on CPU the process RSS is the meter.
    """
    if accumulate not in ("tensor", "item"):
        raise ValueError(f"accumulate must be 'tensor' or 'item', got {accumulate!r}")
    torch.manual_seed(seed)
    net = build_model(model)
    X = torch.randn(batch_size, 1, 28, 28)
    y = torch.randint(0, 10, (batch_size,))
    total, used = 0.0, []
    for _ in range(num_steps):
        loss = F.nll_loss(net(X), y)  # forward only, graph recorded: the leak needs no training step
        total = total + (loss.item() if accumulate == "item" else loss)
        del loss
        used.append(current_bytes("cpu"))
    return {"accumulate": accumulate, "bytes_after_step": used,
            "growth_per_step": (used[-1] - used[0]) / max(num_steps - 1, 1), "graph_nodes_kept": graph_nodes(total)}


def loss_accumulation(num_steps: int = 8, batch_size: int = 64) -> Repro:
    """``total += loss`` keeps every step's graph; ``total += loss.item()`` does not (each in a fresh process)."""
    bad = run_isolated(summed_loss_memory, accumulate="tensor", num_steps=num_steps, batch_size=batch_size)["result"]
    good = run_isolated(summed_loss_memory, accumulate="item", num_steps=num_steps, batch_size=batch_size)["result"]
    return Repro(
        "graphs kept alive by accumulating loss", "",
        f"memory grows {bad['growth_per_step'] / MiB:,.1f} MiB per step and {bad['graph_nodes_kept']} autograd nodes "
        "stay reachable: `total += loss` makes `total` a tensor whose graph reaches every step's graph and its saved "
        "activations (here an evaluation loop without torch.no_grad(); with backward() only the nodes pile up)",
        "`total += loss.item()` (and torch.no_grad() for evaluation)",
        good["growth_per_step"] < bad["growth_per_step"] / 4 and good["graph_nodes_kept"] == 0,
        {"tensor_growth_mib_per_step": bad["growth_per_step"] / MiB, "item_growth_mib_per_step":
         good["growth_per_step"] / MiB, "tensor_nodes": bad["graph_nodes_kept"], "item_nodes": good["graph_nodes_kept"]})


# --------------------------------------------------------------------------- 7. sampler pitfalls, download race

def sampler_pitfalls(nproc: int = 3, train_steps: int = 2, timeout: float = 300) -> dict:
    """The --local_rank, set_epoch and padding demos of 12 (``workers.demos``), in one launch; returns their summaries."""
    res = launch_ok("mnist_helpers.workers.demos",
                    ["--demos", "local_rank_bug,sampler,validation", "--train-steps", train_steps],
                    nproc=nproc, timeout=timeout)
    return {name: d["summary"] for name, d in res["demos"].items()}


def set_epoch_repro(summary: dict) -> Repro:
    same = summary["same_order_without_set_epoch"]
    return Repro(
        "forgetting set_epoch", "",
        f"without set_epoch, DistributedSampler reshuffles with the same seed every epoch: {same:.0%} of positions "
        "hold the same index in epochs 1, 2, 3 (the ranks see the same order every epoch)",
        f"sampler.set_epoch(epoch) at the start of every epoch: then {summary['same_order_with_set_epoch']:.1%} "
        "of positions repeat (chance level)",
        same == 1.0 and summary["same_order_with_set_epoch"] < 0.01, summary)


def padding_repro(summary: dict) -> Repro:
    return Repro(
        "evaluation padding", "",
        f"DistributedSampler pads the test set to a multiple of world_size={summary['world_size']}: "
        f"{summary['sampler_per_rank']} images per rank = {summary['sampler_count']:,} scored for "
        f"{summary['test_images']:,} images",
        "disjoint shards + all-reduced sums (mnist_helpers.distributed.evaluate_exact): "
        f"{summary['exact_count']:,} images, same correct count as one process: {summary['exact_equals_single']}",
        summary["exact_count"] == summary["test_images"] and summary["exact_equals_single"], summary)


_NAIVE_WRITER = r"""
import sys, time
src, dst = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
with open(dst, "wb") as f:            # "wb" truncates whatever another rank has written so far
    for i in range(0, len(data), 1 << 16):
        f.write(data[i:i + (1 << 16)]); f.flush(); time.sleep(0.003)
"""

_SAFE_WRITER = r"""
import sys, time
from pathlib import Path
from mnist_helpers.data import check_file, provision_lock
from mnist_helpers.io import atomic_write
root, src, dst = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
with provision_lock(root):                     # the lock ensure_mnist takes: one provisioner at a time
    if check_file(dst) is None:
        print("found valid", flush=True); sys.exit(0)
    time.sleep(0.3)                   # as slow as the naive writers
    atomic_write(dst, src.read_bytes())   # tmp + fsync + rename: readers never see a partial file
    print("wrote", flush=True)
"""


def _race(writer: str, argv_for, dst: Path, n_writers: int, poll_s: float = 0.01) -> dict:
    procs = [subprocess.Popen([sys.executable, "-c", writer, *argv_for(i)], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env()) for i in range(n_writers)]
    seen = {"missing": 0, "truncated": 0, "corrupt": 0, "valid": 0, "too long": 0}
    first_bad = ""
    while any(p.poll() is None for p in procs):
        reason = check_file(dst)
        key = "valid" if reason is None else next((k for k in seen if f" {k}" in reason), "corrupt")
        seen[key] += 1
        if key not in ("valid", "missing") and not first_bad:
            first_bad = reason
        time.sleep(poll_s)
    outs = [p.communicate()[0].strip() for p in procs]
    return {"reader_saw": seen, "final": check_file(dst) or "valid", "writers": outs, "first_bad": first_bad}


def download_race(n_writers: int = 2, name: str = "t10k-images-idx3-ubyte") -> Repro:
    """Two 'ranks' provision the same data file at once: naively, and with ensure_mnist's lock + atomic write.

    A reader polls the file meanwhile (a rank that starts loading as soon as the file exists).
    """
    src = raw_dir() / name
    with tempfile.TemporaryDirectory(prefix="mnist_race_") as tmp:
        naive_dst = Path(tmp) / "naive" / name
        naive_dst.parent.mkdir()
        naive = _race(_NAIVE_WRITER, lambda i: [str(src), str(naive_dst)], naive_dst, n_writers)
        root = Path(tmp) / "safe"
        safe_dst = raw_dir(root) / name
        safe_dst.parent.mkdir(parents=True)
        safe = _race(_SAFE_WRITER, lambda i: [str(root), str(src), str(safe_dst)], safe_dst, n_writers)
    torn = naive["reader_saw"]["truncated"] + naive["reader_saw"]["corrupt"]
    safe_torn = safe["reader_saw"]["truncated"] + safe["reader_saw"]["corrupt"]
    return Repro(
        "per-rank downloads racing on the data folder", naive["first_bad"].replace(str(naive_dst.parent) + "/", ""),
        f"each rank opens the same path with 'wb' (truncating the other's bytes) and a reader can open it mid-write: "
        f"a reader polling during the naive writes saw a partial or corrupt file {torn} times ({naive['reader_saw']})",
        "provision once, before the ranks start (the launcher calls ensure_mnist), under a file lock, writing "
        f"tmp + rename: the reader saw {safe['reader_saw']}; writers: {safe['writers']}",
        safe_torn == 0 and safe["final"] == "valid" and safe["writers"].count("wrote") == 1,
        {"naive": naive, "safe": safe})


# --------------------------------------------------------------------------- 8. spawn / fork

def _bug_then_fix(command, env: dict, timeout: float, telling: str) -> tuple:
    """A reproduction's two runs, ``command()`` (built afresh for each) as the bug has it and then with ``--fix``, and
    the bug's output line that matches ``telling``: (bad, good, that line)."""
    bad, good = (subprocess.run([*command(), *flags], capture_output=True, text=True, env=env, timeout=timeout)
                 for flags in ((), ("--fix",)))
    return bad, good, telling_line(bad.stderr + bad.stdout, telling)


def spawn_main(nprocs: int = 2, timeout: float = 180) -> Repro:
    """mp.spawn of a function defined in ``__main__`` without a file (what a notebook kernel is)."""
    src = (BUGS / "spawn_main.py").read_text()
    env = subprocess_env(PYTHONUNBUFFERED="1")
    # the script's text with -c: __main__ has no file, as in a Jupyter kernel
    bad, good, seen = _bug_then_fix(lambda: [sys.executable, "-c", src, "--nprocs", str(nprocs)], env, timeout,
                                    r"Can't get attribute")
    return Repro(
        "Can't get attribute ... on <module '__main__'>", seen,
        "spawn starts fresh interpreters that unpickle the target by module + name; a notebook's functions live in "
        "the kernel's __main__, which has no file the children can import",
        "put the function in an importable module (here mnist_helpers.workers.bugs.spawn_main) or launch a worker "
        "script with torchrun (mnist_helpers.launch)",
        good.returncode == 0 and good.stdout.count("hello from spawned rank") == nprocs,
        {"bug_returncode": bad.returncode, "fixed_returncode": good.returncode, "fixed_stdout": good.stdout[-500:],
         "bug_output": (bad.stderr + bad.stdout)[-1500:]})


_CUDA_FORK = r"""
import multiprocessing as mp, torch
torch.zeros(1, device="cuda")           # CUDA is initialised in the parent ...
def child(q):
    try:
        torch.zeros(1, device="cuda")   # ... and used again in a forked child
        q.put("ok")
    except Exception as e:
        q.put(f"{type(e).__name__}: {e}")
if __name__ == "__main__":
    method = __import__("sys").argv[1]
    ctx = mp.get_context(method); q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start()
    print(q.get(timeout=120)); p.join()
"""


def cuda_fork(timeout: float = 180) -> Repro:
    """'Cannot re-initialize CUDA in forked subprocess' (GPU only; on CPU the record explains it)."""
    diagnosis = ("fork copies the parent's memory but not its CUDA context: a child that touches CUDA after the "
                 "parent initialised it fails (DataLoader workers and mp with the default 'fork' start method)")
    fix = "start method 'spawn' (mp.set_start_method('spawn'), torchrun workers, DataLoader(multiprocessing_context='spawn')), or keep CUDA out of the parent before forking"
    if not gpu_count():  # not is_available(), which would start the CUDA driver in this kernel
        return Repro("Cannot re-initialize CUDA in forked subprocess",
                     "(not reproducible here: no CUDA device; on a GPU this record shows the real message)",
                     diagnosis, fix, None, {"cuda": False})
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "cuda_fork.py"
        script.write_text(_CUDA_FORK)
        bad = subprocess.run([sys.executable, str(script), "fork"], capture_output=True, text=True, timeout=timeout)
        good = subprocess.run([sys.executable, str(script), "spawn"], capture_output=True, text=True, timeout=timeout)
    return Repro("Cannot re-initialize CUDA in forked subprocess",
                 telling_line(bad.stdout + bad.stderr, r"re-initialize CUDA"), diagnosis, fix,
                 good.stdout.strip() == "ok", {"cuda": True, "fork": bad.stdout.strip(), "spawn": good.stdout.strip()})


# --------------------------------------------------------------------------- 9. loader starvation, /dev/shm

def loader_starvation(steps: int = 20, warmup_steps: int = 3, batch_size: int = 128, model: str = "fastnet",
                      num_workers: int = 0, subset: int = 4096, device: str = "cpu") -> Repro:
    """The fraction of each training step spent waiting for data: the article's per-sample PIL loader
    vs in-memory tensor batches (``mnist_helpers.train.train_with_loader`` does the timing, as in 03), training on
    ``device`` (a GPU where there is one: then the waiting share is what nvidia-smi's utilisation leaves idle)."""
    ds = Subset(mnist_datasets()[0], range(subset))  # the article's per-sample PIL route
    loader = make_loader(ds, batch_size, num_workers=num_workers, persistent_workers=num_workers > 0)
    alone = time_loader(loader, epochs=1, max_batches=steps)["images_per_s"]  # the loader with no model
    slow = train_with_loader(loader, model=model, steps=steps, warmup_steps=warmup_steps, device=device)
    del loader
    X, y = dataset_tensors(ds)
    fast = train_with_loader(TensorBatches(X, y, batch_size), model=model, steps=steps, warmup_steps=warmup_steps,
                             device=device)
    shm = check_shm(num_workers=max(num_workers, 2), batch_size=batch_size)
    bound = "the loader" if slow["wait_fraction"] > 0.3 else "the model's compute, not the loader,"
    return Repro(
        "loader starvation", "",
        f"with the per-sample transforms in {num_workers or 'the main'} process(es), {slow['wait_fraction']:.0%} of "
        f"each {model} step waits for data ({slow['images_per_s']:,.0f} img/s): {bound} limits this machine. The "
        f"loader alone delivers {alone:,.0f} img/s, so any device that trains faster than that waits (on a GPU: "
        "the 0-30% utilisation of nvidia-smi -l 1)",
        f"decode once, keep the tensors in memory (TensorBatches): {fast['wait_fraction']:.0%} waiting, "
        f"{fast['images_per_s']:,.0f} img/s; or DataLoader workers, which pass batches through /dev/shm "
        f"({shm.level}: {shm.message})",
        fast["wait_fraction"] < slow["wait_fraction"],
        {"dataloader": slow, "tensor_batches": fast, "loader_alone_images_per_s": alone, "shm": shm.__dict__,
         "device": str(device), "batch_size": batch_size, "model": model, "steps": steps})


# --------------------------------------------------------------------------- 10. --local_rank

def local_rank_argparse(nproc: int = 1, timeout: float = 120) -> Repro:
    """The article's ``--local_rank`` parser under the launchers: an argparse error, or a silent cuda:0 for all."""
    script = str(BUGS / "local_rank.py")
    env = subprocess_env(OMP_NUM_THREADS="1")
    # the deprecated launcher passes --local-rank=N (dashed since torch 2.0); a free port for each run
    bad, good, seen = _bug_then_fix(lambda: [sys.executable, "-m", "torch.distributed.launch", "--nproc-per-node",
                                             str(nproc), "--master-port", str(free_port()), script], env, timeout,
                                    r"unrecognized arguments")
    return Repro(
        "--local_rank argparse bug", seen,
        "torch.distributed.launch passes --local-rank=N (dashed since torch 2.0) and the article's parser only "
        "knows --local_rank; torchrun passes no argument at all, so the default 0 puts every process on cuda:0",
        "read int(os.environ['LOCAL_RANK']) (torchrun and launch both set it); accept both spellings if you must "
        "keep the flag",
        good.returncode == 0 and "local_rank from the environment" in good.stdout,
        {"bug_returncode": bad.returncode, "fixed_stdout": good.stdout.strip()[-400:],
         "bug_output": (bad.stderr + bad.stdout)[:3000], "fixed_returncode": good.returncode})  # argparse's first


def omp_threads(nproc: int = 2, timeout: float = 120) -> Repro:
    """torchrun sets ``OMP_NUM_THREADS=1`` in every worker when the variable is unset and ``--nproc-per-node`` > 1:
    shown with a plain torchrun (the variable removed from the environment), then handled by setting it to cores /
    processes (the launcher's way). On a 2-core machine with 2 processes both give 1 thread; the point is who
    decides: on 16 cores torchrun's 1 would leave 14 idle."""
    module = "mnist_helpers.workers.bugs.omp_threads"
    env = {k: v for k, v in subprocess_env().items() if k != "OMP_NUM_THREADS"}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    def run(extra_env: dict, *flags):
        with tempfile.TemporaryDirectory(prefix="mnist_omp_") as tmp:
            out = Path(tmp) / "out.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   "-m", module, "--out", str(out), *flags]
            p = run_guarded(cmd, timeout, env={**env, **extra_env})
            return p, (json.loads(out.read_text()) if out.is_file() else {}), cmd
    plain = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, env=env, timeout=timeout)
    plain_threads = int(re.search(r"torch uses (\d+)", plain.stdout).group(1)) if "torch uses" in plain.stdout else None
    bug, bug_res, bug_cmd = run({})
    want = max(1, cores // nproc)
    good, good_res, _ = run({"OMP_NUM_THREADS": str(want)})
    return Repro(
        "torchrun sets OMP_NUM_THREADS=1",
        telling_line(bug.stderr + bug.stdout, r"Setting OMP_NUM_THREADS"),
        f"plain python: torch uses {plain_threads} thread(s) on {cores} core(s); under torchrun without the variable "
        f"each of {nproc} processes gets {bug_res.get('torch_threads')} (torchrun sets OMP_NUM_THREADS=1 whenever "
        "--nproc-per-node > 1, and warns once): on a machine with more cores than processes a CPU job silently "
        "uses fewer cores than it has",
        f"set it yourself: OMP_NUM_THREADS={want} (cores / processes) in front of torchrun, as "
        "mnist_helpers.launch.torchrun does (and prints); or torch.set_num_threads in the worker",
        good.returncode == 0 and good_res.get("torch_threads") == want,
        {"cores": cores, "plain_threads": plain_threads, "torchrun_threads": bug_res.get("torch_threads"),
         "torchrun_env": bug_res.get("omp_num_threads_env"), "fixed_threads": good_res.get("torch_threads"),
         "bug_command": "env -u OMP_NUM_THREADS " + shlex.join(bug_cmd),
         "fixed_command": f"OMP_NUM_THREADS={want} " + shlex.join(bug_cmd)})


# --------------------------------------------------------------------------- the batch-size finder

def find_batch_size_limited(model: str = "net", start: int = 4096, budget_mib: int = 600,
                            min_batch_size: int = 1, timeout: float = 300) -> dict:
    """``find_batch_size`` for one training step of ``model`` under a memory budget, in a fresh process.

    CPU: the subprocess limits its own address space (``RLIMIT_AS``); CUDA: its memory fraction.
    Returns the search plus ``"limit"`` (what was set) and ``"device"``.
    """
    cmd = [sys.executable, "-m", "mnist_helpers.lessons.n08.lesson", "--model", model, "--start", str(start),
           "--budget-mib", str(budget_mib), "--min-batch-size", str(min_batch_size), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **MALLOC_ENV, "PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the batch-size search failed in its subprocess (exit code {proc.returncode}):\n"
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- the claims notebook 08 records

STARVED = 0.7   # waiting at least this share of each step: the GPU computes at most 30% of the time
FED = 0.3       # in-memory batches waiting less than this share: the loader was what starved it


def _rec(r) -> dict:
    return r.as_dict() if hasattr(r, "as_dict") else dict(r)


def _busy(contention) -> bool:
    if contention is None:
        return False
    return bool(contention.get("busy")) if isinstance(contention, dict) else bool(contention.busy)


@dataclass(frozen=True, kw_only=True)
class Measured08:
    """What notebook 08 measured, the one input of :func:`claims_08` (its closing cell builds it once).

    ``port``, ``unused``, ``starve``, ``evalhang``, ``omp``: the :class:`Repro` records (or their ``as_dict()``) of
    :func:`port_in_use`, :func:`unused_parameters`, :func:`loader_starvation`, :func:`eval_through_ddp` and
    :func:`omp_threads`. ``unused_nproc`` and ``unused_steps``: the processes and timed steps
    :func:`unused_parameters` ran; ``nproc``: the processes of the ``eval_through_ddp`` and ``omp_threads`` launches.
    ``loader_load``: the ``claims.Contention`` (or its dict) of the starvation timing, None if not measured."""
    port: Repro | dict
    unused: Repro | dict
    starve: Repro | dict
    evalhang: Repro | dict
    omp: Repro | dict
    unused_nproc: int
    unused_steps: int
    nproc: int
    loader_load: object = None


def claims_08(m: Measured08) -> list[dict]:
    """The claims of notebook 08, one dict per claim (the keyword arguments of ``claims.ResultFile.claim``), from
    what the notebook measured (:class:`Measured08`).

    - 08.port_in_use, 08.unused_parameters: *reproduced* when the real error appeared, was diagnosed and the fix ran.
    - 08.gpu_util_low: *not testable here* unless the starvation ran on a CUDA GPU; there *holds* when the article's
      loader left the GPU waiting at least ``STARVED`` of each step and in-memory batches less than ``FED``,
      *inconclusive* otherwise (the loader did not starve it, or removing it did not feed it); ``claims.BUSY`` on a
      busy machine.
    - 08.eval_through_ddp, 08.omp_threads (ours): as the records' ``confirm`` found them.
    """
    from mnist_helpers.course.claims import BUSY

    port, unused, starve, evalhang, omp = map(_rec, (m.port, m.unused, m.starve, m.evalhang, m.omp))
    unused_nproc, unused_steps, nproc, loader_load = m.unused_nproc, m.unused_steps, m.nproc, m.loader_load
    pd_, ud, sd, ed, od = (r["details"] for r in (port, unused, starve, evalhang, omp))
    out = []
    ok_port = bool(port["fixed_ok"] and pd_.get("holders") and pd_.get("port_free_after_stopping_holder"))
    out.append(dict(id="08.port_in_use", verdict="reproduced" if ok_port else "does not hold here",
                    evidence=(f"rank 0 failed with EADDRINUSE on port {pd_['port']} held by {len(pd_['holders'])} other "
                              "process(es); free again after stopping it; torchrun --standalone picked a free port"),
                    numbers={"port": pd_["port"], "holders": len(pd_["holders"]), "fixed_ok": int(bool(port["fixed_ok"]))},
                    regime="bug worker with a fixed MASTER_PORT (init_method env://), 1 process, gloo on CPU"))
    ok_unused = bool(unused["fixed_ok"] and "aux" in unused["diagnosis"]
                     and "Expected to have finished" in unused["error"])
    out.append(dict(id="08.unused_parameters", verdict="reproduced" if ok_unused else "does not hold here",
                    evidence=("'Expected to have finished reduction' raised; TORCH_DISTRIBUTED_DEBUG=INFO named the aux "
                              "head; using it, freezing it or find_unused_parameters=True all ran (find_unused at "
                              f"{ud['find_unused_over_freeze']:.3f}x the frozen step)"),
                    numbers={"find_unused_over_freeze": ud["find_unused_over_freeze"],
                             "world_size": ud.get("world_size") or unused_nproc, "steps": unused_steps},
                    regime=f"bug worker (a model with an unused head) under DDP, {unused_nproc} process(es), gloo on CPU"))
    wait, fed = sd["dataloader"]["wait_fraction"], sd["tensor_batches"]["wait_fraction"]
    device = sd.get("device", "cpu")
    if not device.startswith("cuda"):
        verdict = "not testable here"
        lead = f"no GPU to read nvidia-smi from; on this {device} "
    elif _busy(loader_load):
        verdict, lead = BUSY, "on the GPU "
    else:
        verdict = "holds" if wait >= STARVED and fed < FED else "inconclusive"
        lead = "on the GPU "
    out.append(dict(id="08.gpu_util_low", verdict=verdict,
                    evidence=(lead + f"the article's per-sample loader made each step wait {wait:.0%} for data vs "
                              f"{fed:.0%} with in-memory batches (starved: at least {STARVED:.0%} waiting, fed: under "
                              f"{FED:.0%})"),
                    numbers={"wait_fraction_dataloader": wait, "wait_fraction_tensor": fed, "starved": STARVED,
                             "fed": FED},
                    contention=loader_load.to_dict() if hasattr(loader_load, "to_dict") else loader_load,
                    regime=(f"{sd.get('model', 'fastnet')}, batch {sd.get('batch_size', 128)}, {sd.get('steps')} timed "
                            f"steps, DataLoader in the main process; training on {device}")))
    out.append(dict(id="08.eval_through_ddp", section="ours",
                    claim=("Evaluating a BatchNorm model on rank 0 through the DDP wrapper hangs the job; "
                           "model.module (or every rank evaluating) fixes it"),
                    verdict="reproduced" if ed.get("as_described") else "does not hold here",
                    evidence=(f"netbn, {nproc} ranks: rank 0's forward through DDP waited in a buffer broadcast no "
                              f"other rank joined, until the {ed['timeout_s']:g} s timeout; model.module and all-ranks "
                              "evaluation passed; Net (no buffers) passed"),
                    numbers={"timeout_s": ed["timeout_s"], "hang_launch_seconds": ed["hang_launch_seconds"],
                             "buffers": ed.get("buffers") or 0},
                    regime=f"bug worker eval_through_ddp, {nproc} processes, gloo on CPU, 3 training steps then evaluation"))
    out.append(dict(id="08.omp_threads", section="ours",
                    claim="torchrun sets OMP_NUM_THREADS=1 in every worker when it is unset",
                    verdict="demonstrated" if od.get("as_described") else "does not hold here",
                    evidence=(f"plain python {od['plain_threads']} thread(s), torchrun without the variable "
                              f"{od['torchrun_threads']}, with OMP_NUM_THREADS set {od['fixed_threads']} on "
                              f"{od['cores']} core(s)"),
                    numbers={k: od.get(k) or 0 for k in ("plain_threads", "torchrun_threads", "fixed_threads", "cores")},
                    regime=f"bug worker omp_threads, {nproc} processes under torchrun --standalone, CPU"))
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Largest training batch that fits in a memory budget (halving).")
    ap.add_argument("--model", default="net")
    ap.add_argument("--start", type=int, default=4096)
    ap.add_argument("--min-batch-size", type=int, default=1)
    ap.add_argument("--budget-mib", type=int, default=600, help="memory the step may add (MiB)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    args = ap.parse_args(argv)
    device = select_device(args.device)
    fits = train_step_probe(args.model, device)
    limit = limit_memory(args.budget_mib * MiB, device)
    result = {**find_batch_size(fits, args.start, args.min_batch_size), "limit": limit, "device": str(device),
              "model": args.model, "budget_mib": args.budget_mib}
    if args.json:
        print(json.dumps(result))
    else:
        display.show(result["tried"], columns=["batch_size", "ok", "error"])
        print(f"largest batch that fits in {args.budget_mib} MiB on {device}: {result['batch_size']}")
    return 0 if result["batch_size"] else 1


if __name__ == "__main__":
    sys.exit(main())
