"""Expected errors and the one error boundary of every command (used by every worker, script and tool).

A command of the series fails like a good command-line tool: one short block that says what went wrong,
names the file or value concerned and gives the command that fixes it; exit code 2; no traceback::

    error: MNIST data not usable:
      /tmp/x/MNIST/raw/train-labels-idx1-ubyte is corrupt: md5 ..., expected ...
      fix: run `make data` (or `python -m mnist_helpers.data --root /tmp/x --force`)
      (rerun with --debug or MNIST_DEBUG=1 to see the traceback)

*Expected* errors are ``UsageError`` and its subclasses: ``ConfigError`` (an invalid setting; also a
``ValueError``), ``PathError`` (a path that cannot be read or written), ``SnapshotError`` (a snapshot
that does not belong to this run) and ``mnist_helpers.data.DataError``. Everything else is a bug and
keeps its traceback. ``--debug`` on any command (or ``MNIST_DEBUG=1``) prints the traceback of an
expected error too. Every command's entry point is decorated once::

    @cli_entry
    def cli(argv=None): ...

    if __name__ == "__main__":
        sys.exit(cli())

Under torchrun every rank usually meets the same error (the same data, the same flags): the first rank
to fail prints the block, with its rank; the others exit quietly, a moment later, so torchrun (and
``mnist_helpers.launch``, whose ``LaunchError`` then starts with this message) name the rank that printed.
Flag errors take the same route there (argparse would print its usage once per rank).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback
from pathlib import Path

DEBUG_FLAG = "--debug"
DEBUG_ENV = "MNIST_DEBUG"
EXIT_USAGE = 2  # argparse's code for a bad command line; ours for every expected error
_MARKER = "mnist_expected_error"  # in torchrun's per-attempt folder: who reported first


class UsageError(Exception):
    """An error the user can fix: ``str(err)`` is the problem, then ``fix: <command>`` when one is known."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem, self.fix = problem, fix
        super().__init__(problem + (f"\nfix: {fix}" if fix else ""))


class ConfigError(UsageError, ValueError):
    """An invalid setting (a flag out of range, a device or backend this machine lacks)."""


class PathError(UsageError):
    """A path that cannot be read or written (an output under a file, a folder where a file belongs)."""


class SnapshotError(UsageError):
    """A ``--snapshot`` file that this run must not load: not written by the series, by another configuration, or
    not the same file on every rank (nodes that share no filesystem)."""


class PortInUseError(UsageError):
    """The rendezvous port (``MASTER_PORT``) is held by another process."""


EXPECTED = (UsageError,)


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "0") not in ("", "0")


def _rank() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) otherwise."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def format_error(err: BaseException, rank: int = 0, world_size: int = 1, hint: bool = True) -> str:
    """The short block: ``error: <first line>``, the other lines indented, then how to see the traceback.
    With several processes every line starts with ``[rank N]``, as the workers' other lines do."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()] or [type(err).__name__]
    block = [f"error: {lines[0]}", *(f"  {ln}" for ln in lines[1:])]
    if hint:
        block.append(f"  (rerun with {DEBUG_FLAG} or {DEBUG_ENV}=1 to see the traceback)")
    if world_size > 1:
        block = [f"[rank {rank}] {ln}" for ln in block]
    return "\n".join(block)


def _first_to_report() -> bool:
    """True unless another process of this torchrun attempt, on this node, reported an expected error first.

    torchrun gives each worker an error file in a folder per attempt (``.../attempt_N/LOCAL_RANK/error.json``);
    the first worker to fail creates a marker next to those folders."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) <= 1:
        return True
    marker = Path(error_file).parent.parent / _MARKER
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return True
    os.write(fd, os.environ.get("RANK", "?").encode())
    os.close(fd)
    return True


def report(err: BaseException) -> int:
    """Print ``err`` as the short block on stderr (the traceback first when debugging); return exit code 2."""
    rank, world_size = _rank()
    if world_size > 1 and not _first_to_report():
        # Another rank printed the same story already. Leave a moment later, so that torchrun sees the
        # reporting rank fail first and names it as the root cause (it usually stops us before this ends).
        time.sleep(3)
        return EXIT_USAGE
    debug = debug_requested()
    if debug:
        traceback.print_exception(err)
    sys.stdout.flush()
    print(format_error(err, rank, world_size, hint=not debug), file=sys.stderr, flush=True)
    return EXIT_USAGE


def cli_entry(fn):
    """Decorate a command's entry point ``fn(argv=None, ...)``: the series' one error boundary.

    Strips ``--debug`` from the arguments (and sets ``MNIST_DEBUG=1`` for child processes), calls ``fn``,
    and turns an expected error into the short block and ``SystemExit(2)``. Any other exception passes
    through with its traceback, as does ``SystemExit`` (argparse's own errors exit 2 with their usage line).
    """
    @functools.wraps(fn)
    def wrapper(argv=None, *args, **kwargs):
        argv = list(sys.argv[1:] if argv is None else argv)
        if DEBUG_FLAG in argv:
            argv = [a for a in argv if a != DEBUG_FLAG]
            os.environ[DEBUG_ENV] = "1"
        several = _rank()[1] > 1
        if several:  # under torchrun: a flag error becomes an expected error, printed by one rank only
            argparse.ArgumentParser.error = _flag_error
        try:
            return fn(argv, *args, **kwargs)
        except EXPECTED as err:
            raise SystemExit(report(err)) from None
        finally:
            if several:
                argparse.ArgumentParser.error = _ARGPARSE_ERROR
    return wrapper


_ARGPARSE_ERROR = argparse.ArgumentParser.error


def _flag_error(parser: argparse.ArgumentParser, message: str):
    raise ConfigError(f"{parser.prog}: {message}", f"`{parser.prog} --help` lists the flags")
