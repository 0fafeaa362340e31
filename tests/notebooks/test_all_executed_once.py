"""Each notebook executes exactly once per `make test` (issue 46), and the other paths run only a few of its cells.

`make test` sets ``MNIST_EXEC_LOG`` (a fresh file) for every pytest run it makes, and every notebook execution of
the suite appends a line to it (tests/notebook_runs.py). Run last, with ``MNIST_EXEC_CHECK=1``, this test reads
the log: each of the series' notebooks ran whole exactly once; the hosted, browser, AVX2 and papermill paths ran a
proper subset of a notebook's cells, each path at least once (a path that silently stopped running fails too).
The log's own writer is tested below without `make test`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import notebook_runs
from notebook_runs import NOTEBOOKS

PARTIAL_RUNNERS = {"hosted", "browser", "avx2", "papermill"}


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def problems(entries: list[dict], expected_runners=PARTIAL_RUNNERS) -> list[str]:
    """What is wrong with a `make test` execution log (an empty list when each notebook ran whole once)."""
    found = []
    stems = {p.stem: len(notebook_runs.code_cells(p)) for p in NOTEBOOKS}
    whole = {}
    for e in entries:
        if e["notebook"] not in stems:
            found.append(f"{e['notebook']}: not a notebook of the series")
        elif e["cells"] == "all":
            whole.setdefault(e["notebook"], []).append(e["runner"])
        elif len(set(e["cells"])) >= stems[e["notebook"]]:
            found.append(f"{e['notebook']} ran whole again, by {e['runner']} ({len(e['cells'])} cells)")
    for stem in stems:
        runs = whole.get(stem, [])
        if len(runs) != 1:
            found.append(f"{stem} ran whole {len(runs)} times ({', '.join(runs) or 'never'})")
    ran = {e["runner"] for e in entries if e["cells"] != "all"}
    found += [f"the {r} path ran no cell" for r in sorted(set(expected_runners) - ran)]
    return found


@pytest.mark.skipif(os.environ.get("MNIST_EXEC_CHECK") != "1" or not os.environ.get("MNIST_EXEC_LOG"),
                    reason="the last step of `make test` (MNIST_EXEC_CHECK=1 and its MNIST_EXEC_LOG)")
def test_each_notebook_ran_whole_exactly_once_in_this_make_test():
    log = Path(os.environ["MNIST_EXEC_LOG"])
    assert log.is_file(), f"no execution was logged to {log}"
    entries = read_log(log)
    expected = set(PARTIAL_RUNNERS)
    if os.environ.get("MNIST_NO_SYSTEM_INSTALL") == "1":
        expected.discard("browser")  # the browser test skipped, with its reason
    wrong = problems(entries, expected)
    for e in entries:
        print(f"{e['at']} {e['notebook']:32} {e['runner']:8} {e['cells'] if e['cells'] != 'all' else 'all cells'}"
              f" {e['seconds']} s")
    assert not wrong, "\n".join(wrong)


def test_the_log_records_each_execution(tmp_path, monkeypatch):
    target = tmp_path / "log" / "exec.jsonl"
    monkeypatch.setenv("MNIST_EXEC_LOG", str(target))
    stems = [p.stem for p in NOTEBOOKS]
    for stem in stems:
        notebook_runs.log(stem, "nbmake", "all", 1.0)
    notebook_runs.log(stems[0], "hosted", [1, 2])
    notebook_runs.log(stems[0], "browser", [1, 2])
    notebook_runs.log(stems[5], "avx2", [1, 2, 4])
    notebook_runs.log(stems[4], "papermill", [1, 2, 3, 4])
    entries = read_log(target)
    assert len(entries) == len(stems) + 4 and not problems(entries)
    notebook_runs.log(stems[3], "nbmake", "all")
    assert problems(read_log(target)) == [f"{stems[3]} ran whole 2 times (nbmake, nbmake)"]
    monkeypatch.delenv("MNIST_EXEC_LOG")
    notebook_runs.log(stems[3], "nbmake", "all")  # unset: nothing is written
    assert len(read_log(target)) == len(stems) + 5


def test_a_missing_notebook_a_whole_subset_and_a_silent_path_are_named():
    stems = [p.stem for p in NOTEBOOKS]
    entries = [{"notebook": s, "runner": "nbmake", "cells": "all"} for s in stems[1:]]
    every_cell = [i for i, _ in notebook_runs.code_cells(NOTEBOOKS[0])]
    entries.append({"notebook": stems[0], "runner": "hosted", "cells": every_cell})
    found = problems(entries)
    assert f"{stems[0]} ran whole again, by hosted ({len(every_cell)} cells)" in found
    assert f"{stems[0]} ran whole 0 times (never)" in found
    assert "the avx2 path ran no cell" in found and "the browser path ran no cell" in found
    assert "the papermill path ran no cell" in found
