"""``#@save``: the code a notebook marks is generated into its lesson package, ``mnist_helpers/lessons/nNN/saved.py``
(scripts/build_saved.py, `make saved`), never written twice: the modules are current, the lesson takes its names from
them, and the builder refuses code that could not stand in a module."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("build_saved", ROOT / "scripts" / "build_saved.py")
build_saved = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_saved)


def notebook(tmp_path: Path, *cells: str) -> Path:
    path = tmp_path / "99_demo.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [],
                                           "execution_count": None} for c in cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_generated_module_is_current():
    assert build_saved.main(["--check"]) == 0, "a mnist_helpers/lessons/nNN/saved.py is stale: run `make saved`"


def test_the_lesson_runs_the_notebooks_code():
    """The lesson and its measurement code (mnist_helpers/lessons/n04/batch_scaling.py, which
    scripts/bench_batch_scaling.py runs) both take the notebook's code from its saved.py."""
    from mnist_helpers.lessons.n04 import batch_scaling, saved

    for name in ("scaled_lr", "warmup_factor", "train_run", "BASE_LR", "BASE_BATCH"):
        assert getattr(batch_scaling, name) is getattr(saved, name), name
    # the lesson imports what it uses from there, and only that (tests/system/test_house_rules.py)
    assert "from mnist_helpers.lessons.n04.saved import BASE_BATCH\n" in (ROOT / "mnist_helpers/lessons/n04/lesson.py").read_text()
    for path in ("lessons/n04/lesson.py", "lessons/n04/batch_scaling.py"):
        assert "def scaled_lr" not in (ROOT / "mnist_helpers" / path).read_text(), path


def test_marked_code_and_the_imports_it_uses_make_a_module(tmp_path):
    nb = notebook(tmp_path, "import math\nimport os\n!echo shell lines are skipped",
                  "RADIUS = 3.0  #@save\nprint('not saved')",
                  "def area(r=RADIUS):  #@save\n    return math.pi * r * r\n\n\ndef helper():\n    return os.sep")
    (path, text), = build_saved.build([nb]).items()
    assert path.parts[-2:] == ("n99", "saved.py")
    assert "import math" in text and "import os" not in text and "not saved" not in text and "helper" not in text
    ns: dict = {}
    exec(compile(text, "saved", "exec"), ns)
    assert ns["area"]() == pytest.approx(28.274333882308138)


def test_a_name_the_notebook_never_defines_is_refused(tmp_path):
    nb = notebook(tmp_path, "SCALE = 2\n\ndef double(x):  #@save\n    return SCALE * x")
    with pytest.raises(build_saved.SaveError, match="'SCALE'"):
        build_saved.build([nb])


def test_only_definitions_can_be_marked(tmp_path):
    nb = notebook(tmp_path, "print('hello')  #@save")
    with pytest.raises(build_saved.SaveError, match="only a def, class or assignment"):
        build_saved.build([nb])


def test_every_registered_notebook_parses():
    """A cell the builder cannot read would hide its #@save marks: every code cell parses (IPython lines aside)."""
    from mnist_helpers.course.series import NOTEBOOKS

    bad = [(n.name, i) for n in NOTEBOOKS for i, src in enumerate(build_saved.code_cells(n.path))
           if build_saved.parse_cell(src) is None]
    assert not bad, f"cells that do not parse: {bad}"
