"""Committed notebooks carry no outputs, follow the series' shape, and import the package by name."""
import json
import re
from pathlib import Path

import pytest

from mnist_helpers.course.nbstrip import carries_outputs, ensure_ids, missing_ids

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped_and_well_formed(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert not carries_outputs(nb), f"{path.name} carries outputs: run `make strip`"
    ids = [c.get("id") for c in nb["cells"]]
    assert not missing_ids(nb) and len(set(ids)) == len(ids), f"{path.name}: a cell lacks a unique id: run `make strip`"
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids), f"{path.name}: ids nbformat refuses: {ids}"
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown"
    header = "".join(cells[0]["source"])
    assert re.search(r"[Rr]untime", header), "the first cell states the expected runtime"
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"  # literals only: tests/notebooks/test_all_papermill.py
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "import *" not in code and "mnist_helpers" in code
    assert not re.search(r"^\s*!torchrun", code, re.M), "launch through mnist_helpers.launch, not !torchrun"
    bare = re.findall(r"^\s*assert\s.*", code, re.M)
    assert not bare, f"no bare assert in a learner's cell (report, e.g. Repro.confirm): {bare}"


# a padded field in an f-string or .format ({name:<12}, {x:>8.1f}, {v:6.2f}) or str.ljust/rjust: a column lined up
# by hand. Tables are DataFrames (mnist_helpers.course.display.show); prose may format numbers ({x:.1f}, {n:,}).
SLICE = re.compile(r"\[[^\[\]\n]*\]")  # x[:8] inside a field is a slice, not a width
PADDED = re.compile(r"\{[^{}\n]*:(?:[^{}\n]?[<>^=])?[+-]?#?0?[1-9]\d*[^{}\n]*\}|\.[lr]just\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_hand_aligned_tables(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    bad = [line.strip() for c in nb["cells"] if c["cell_type"] == "code"
           for line in "".join(c["source"]).splitlines() if PADDED.search(SLICE.sub("", line))]
    assert not bad, f"{path.name}: columns padded by hand (show a DataFrame with display.show): {bad[:5]}"


def test_the_padding_rule_catches_padding_and_spares_prose():
    assert PADDED.search('print(f"{name:<12}{v:>8.1f}")') and PADDED.search('f"{acc:6.2f}%"')
    assert not PADDED.search('print(f"{x:.1f} s, {n:,} images, {share:.0%}")')
    assert not PADDED.search('d = {"batch_size": 128, "lr": {k: 2 for k in ks}}')
    assert not PADDED.search(SLICE.sub("", 'f"nb04-{uuid.uuid4().hex[:8]}"'))
    assert PADDED.search(SLICE.sub("", "f\"{r['x']:>8}\""))


def test_strip_gives_missing_cell_ids_stably():
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "id": "kept", "metadata": {}, "source": ["# t"]},
        {"cell_type": "code", "metadata": {}, "source": ["x = 1"], "outputs": [], "execution_count": None},
        {"cell_type": "code", "metadata": {}, "source": ["x = 1"], "outputs": [], "execution_count": None}]}
    assert missing_ids(nb) == [1, 2]
    first = [c["id"] for c in ensure_ids(json.loads(json.dumps(nb)))["cells"]]
    assert first[0] == "kept" and len(set(first)) == 3  # the same source twice still gets two ids
    assert first == [c["id"] for c in ensure_ids(json.loads(json.dumps(nb)))["cells"]]  # stable across runs
    assert missing_ids({**nb, "nbformat_minor": 4}) == []  # before 4.5 ids are not part of the format
