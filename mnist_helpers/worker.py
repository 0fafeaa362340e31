"""The one scaffold of the series' workers: what every worker does before and after its own lesson, written once.

A worker is a module run by torchrun (or as plain ``python -m ...``, a world of one). Around its lesson it
always does the same four things, which this module names::

    from mnist_helpers.worker import entry, finish, parser, process_group

    def main(steps=10, out=None) -> dict:
        with process_group("gloo", always_group=True) as ctx:   # join torchrun's group (or a world of one)
            result = {...}                                       # the lesson: every rank computes
            return finish(ctx.is_main, result, out,              # rank 0 prints and writes the JSON
                          f"{steps} steps in {t:.1f} s")
                                                                 # leaving: all ranks meet, the group is destroyed

    @entry                                                       # torchrun's @record + the series' error boundary
    def cli(argv=None) -> int:
        ap = parser(__name__, __doc__)                           # prog "python -m <module>", the docstring as help
        ...

    if __name__ == "__main__":
        sys.exit(cli())

Every worker starts that way (bench, beyond, the bugs, ``ft_train``; 12's demos share ``demos/common``'s ``cli``)
but those whose lesson is the very lines this module hides: ``OWN_ENTRY`` in tests/system/test_layout.py names
each with its reason. The bugs join with ``process_group`` (a short ``timeout_s`` turns a hang into an error) unless
the bug lives in joining (``port_in_use``); their errors are torch's, which ``@entry`` passes through.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from torch.distributed.elastic.multiprocessing.errors import record

from mnist_helpers.distributed import DistContext, cleanup, init_distributed
from mnist_helpers.errors import cli_entry
from mnist_helpers.io import write_json


def world_of_one_env() -> None:
    """Outside torchrun (plain ``python -m ...``), set the environment of a one-process group on a free port.

    DDP, ZeRO, FSDP2 and DTensor need a process group even for a world of one; torchrun's own settings, when
    present, are left alone."""
    from mnist_helpers.ports import free_port

    if "MASTER_ADDR" not in os.environ and "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))


@contextmanager
def process_group(backend: str = "auto", timeout_s: float | None = None, *,
                  always_group: bool = False) -> Iterator[DistContext]:
    """Join the process group (``init_distributed``), yield this process's ``DistContext``, and leave the group
    however the body ends (``cleanup``: all ranks meet once more unless an exception is on its way).

    ``always_group``: make a one-process group outside torchrun too (``world_of_one_env``); without it a plain
    run has no group at all (``ctx.backend`` is None) and collectives must be skipped at world size 1."""
    if always_group:
        world_of_one_env()
    ctx = init_distributed(backend, timeout_s)
    try:
        yield ctx
    finally:
        cleanup()


def finish(is_main: bool, result: dict, out=None, *lines: str) -> dict:
    """A worker's ending: rank 0 prints each line as ``[rank 0] line`` and writes ``result`` to ``out`` (JSON,
    atomically) when a path is given; every rank returns ``result``."""
    if is_main:
        for line in lines:
            print(f"[rank 0] {line}", flush=True)
        if out:
            write_json(out, result)
    return result


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The worker's argument parser: ``prog`` is how it is run (``python -m <module>``), ``--help`` shows the
    module's docstring as written (its usage examples keep their lines). ``module`` may be ``__name__``: run as
    ``python -m`` that is ``"__main__"``, and the module's real name is read from its import spec (a package run
    with ``python -m pkg``, whose spec is ``pkg.__main__``, is named ``pkg``)."""
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name.removesuffix(".__main__") if spec else os.path.basename(sys.argv[0])
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def entry(fn):
    """Decorate a worker's ``cli(argv=None)``: ``cli_entry`` (an expected error is one message with its fix,
    exit code 2) inside torchrun's ``@record`` (any other error is written where torchrun reports it)."""
    return record(cli_entry(fn))
