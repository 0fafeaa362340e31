"""Every notebook execution of the test suite goes through this module, so that each notebook runs once per
`make test` (issue 46) and a test can prove it.

- ``run_whole(path)``: the notebook top to bottom with nbmake's own runner (``nbmake.nb_run.NotebookRun``, what
  ``pytest --nbmake`` runs), in its folder, with the kernel ``python3``. ``tests/notebooks/test_all_run.py`` calls it once
  per notebook through the session fixture ``executed`` (tests/conftest.py); every test that reads a notebook's
  outputs takes them from there.
- ``run_cells(cells, runner=...)``: a few cells (the smallest set that proves what only that path can test: a
  hosted kernel, the AVX2 profile) in a kernel of the caller's choice.
- ``run_papermill(path, through, parameters, workdir)``: the notebook's first cells, up to a given one, run by
  papermill with injected parameters (tests/notebooks/test_all_papermill.py).
- ``log(...)``: the browser test runs its cells in JupyterLab, not here, and says so with this.

Each execution appends one JSON line to ``$MNIST_EXEC_LOG`` when that is set (`make test` sets it):
``{"notebook": stem, "runner": ..., "cells": "all" | [cell indices of the notebook], "pid": ...}``.
``tests/notebooks/test_all_executed_once.py`` reads it at the end of `make test`.
"""
from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NB_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = int(os.environ.get("MNIST_NB_TIMEOUT", "900"))   # per cell (nbmake's --nbmake-timeout)
WHOLE_TIMEOUT = int(os.environ.get("MNIST_NB_TOTAL", "1800"))   # per notebook run (pytest-timeout)


def log(stem: str, runner: str, cells, seconds: float | None = None) -> None:
    """Append one execution to ``$MNIST_EXEC_LOG`` (nothing when unset)."""
    target = os.environ.get("MNIST_EXEC_LOG")
    if not target:
        return
    entry = {"notebook": stem, "runner": runner, "cells": cells, "pid": os.getpid(),
             "seconds": None if seconds is None else round(seconds, 1), "at": time.strftime("%H:%M:%S")}
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def path_of(stem: str) -> Path:
    found = [p for p in NOTEBOOKS if p.stem == stem or p.name[:2] == stem]
    if len(found) != 1:
        raise KeyError(f"no single notebook {stem!r} in {NB_DIR}")
    return found[0]


def code_cells(path: Path) -> list[tuple[int, str]]:
    """(index in the notebook, source) of every code cell."""
    nb = nbformat.read(path, as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def run_whole(path: Path, timeout: int = CELL_TIMEOUT):
    """nbmake's run of the whole notebook: ``NotebookResult`` (``.nb`` executed, ``.error`` None or the failure)."""
    from nbmake.nb_run import NotebookRun

    t0 = time.monotonic()
    result = NotebookRun(path, timeout, verbose=False, kernel=None, find_import_errors=False).execute()
    log(path.stem, "nbmake", "all", time.monotonic() - t0)
    return result


def run_cells(path: Path, indices: list[int], runner: str, *, extra: list[str] = (), kernel_name: str = "python3",
              cwd: Path | None = None, timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """The notebook's cells ``indices`` (code cells, in order), then the sources ``extra``, in a fresh kernel;
    returns the executed notebook (nbclient raises CellExecutionError on the first failing cell)."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    chosen = [copy.deepcopy(nb.cells[i]) for i in indices]  # a cell listed twice runs, and shows its output, twice
    if any(c.cell_type != "code" for c in chosen):
        raise ValueError(f"{path.name}: cells {indices} are not all code cells")
    nb.cells = chosen + [nbformat.v4.new_code_cell(src) for src in extra]
    t0 = time.monotonic()
    try:
        NotebookClient(nb, kernel_name=kernel_name, timeout=timeout,
                       resources={"metadata": {"path": str(cwd or path.parent)}}).execute()
    finally:
        log(path.stem, runner, list(indices), time.monotonic() - t0)
    return nb


def run_papermill(path: Path, through: int, parameters: dict, workdir: Path,
                  timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """The notebook's cells 0..``through`` (a truncated copy written to ``workdir``) run by papermill's Python API,
    ``parameters`` injected after the parameters cell, in the notebook's own folder; returns the executed notebook
    (papermill raises PapermillExecutionError on the first failing cell). Logged as the ``papermill`` path with the
    notebook's code cells it ran."""
    import papermill

    nb = nbformat.read(path, as_version=4)
    nb.cells = nb.cells[:through + 1]
    ran = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    source, output = workdir / f"{path.stem}_through_{through}.ipynb", workdir / f"{path.stem}_papermill.ipynb"
    nbformat.write(nb, source)
    t0 = time.monotonic()
    try:
        return papermill.execute_notebook(source, output, parameters=parameters, cwd=path.parent,
                                          kernel_name="python3", progress_bar=False, execution_timeout=timeout)
    finally:
        log(path.stem, "papermill", ran, time.monotonic() - t0)


def stdout_of(nb) -> str:
    """Everything the cells printed (stream outputs), in order."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")


def errors_of(nb) -> list[str]:
    """The error outputs (ename: evalue) of an executed notebook."""
    return [f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def assert_ran_cleanly(stem: str, executed) -> None:
    """The one run of ``stem`` (the ``executed`` fixture) ended without an error."""
    result = executed(stem)
    if result.error is not None:
        pytest.fail(f"{stem}: {result.error.summary}\n{result.error.trace}", pytrace=False)
    assert not errors_of(result.nb), errors_of(result.nb)
