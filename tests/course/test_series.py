"""The series registry (``mnist_helpers/course/series.py``) is the one list of notebooks: every notebook file, lesson
module, exercise, catalogued claim and kept result belongs to a registered notebook, and the README's and the
instructor guide's tables are generated from it (``make tables``)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mnist_helpers.course import claims, series
from mnist_helpers.course import exercises

ROOT = Path(__file__).resolve().parents[2]


def test_every_notebook_file_is_registered_in_order():
    files = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [nb.name for nb in series.NOTEBOOKS] == files
    assert [nb.nn for nb in series.NOTEBOOKS] == [f"{i:02d}" for i in range(len(series.NOTEBOOKS))]


def test_every_lesson_module_belongs_to_one_notebook():
    lessons = sorted(p.parent.name for p in (ROOT / "mnist_helpers" / "lessons").glob("n[0-9][0-9]/lesson.py"))
    assert sorted(nb.lesson for nb in series.NOTEBOOKS) == lessons
    for nb in series.NOTEBOOKS:
        assert nb.lesson == f"n{nb.nn}" and importlib.util.find_spec(nb.module), nb.name


def test_exercises_claims_and_kept_results_name_registered_notebooks():
    assert {e.notebook for e in exercises.EXERCISES} <= set(series.BY_ID)
    assert {c["id"].split(".")[0] for c in claims.CATALOG} <= set(series.BY_ID)
    kept = {p.stem for p in (ROOT / "results" / "reference").glob("*/[0-9][0-9]_*.json")}
    assert kept <= set(series.BY_NAME), kept - set(series.BY_NAME)


def test_the_core_path_comes_first():
    flags = [nb.core for nb in series.NOTEBOOKS]
    assert flags == sorted(flags, reverse=True) and flags[0] and not flags[-1]


def test_every_runtime_is_measured_or_says_it_is_not():
    for nb in series.NOTEBOOKS:
        for text in (nb.quick, nb.full):
            assert re.search(r"\d+(\.\d+)? (s|min)\b", text), (nb.name, text)
        assert nb.gpu == series.NOT_MEASURED or re.search(r"H100|H200|A100|T4|L4|GPU", nb.gpu), nb.gpu


def test_an_unknown_notebook_is_refused_with_the_registered_ids():
    assert series.notebook("07").slug == "scaling_and_multinode"
    with pytest.raises(KeyError, match="registered: 00, 01"):
        series.notebook("99")


@pytest.mark.process
def test_the_readme_and_instructor_tables_are_generated_from_the_registry():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tables.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, "run `make tables`:\n" + done.stdout + done.stderr
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for nb in series.NOTEBOOKS:
        assert f"| {nb.nn} | [{nb.name}](notebooks/{nb.name}.ipynb) |" in readme
