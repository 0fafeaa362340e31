"""Every notebook of the series, top to bottom, in the quick profile: the run `make test` makes of each (issue 46).

Each runs once per session (the ``executed`` fixture, tests/conftest.py, with nbmake's runner: what
``pytest --nbmake notebooks/`` runs); tests that read a notebook's outputs take this execution instead of running
the notebook again. Each notebook is a class of its own, so that pytest-xdist (``--dist loadscope``) hands each to
whichever worker is free; a notebook whose results other tests read runs in their module instead (``RUN_BY``), on
their worker. ``make notebooks`` runs this file and those classes (the Makefile's ``NB_RUNS``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from notebook_runs import NOTEBOOKS, WHOLE_TIMEOUT, assert_ran_cleanly

# notebooks whose run lives beside the tests that read its results: stem -> (test file, class)
RUN_BY = {"08_troubleshooting": ("test_n08_troubleshoot.py", "TestNotebook08")}


def _class_for(stem: str):
    @pytest.mark.kernel
    @pytest.mark.timeout(WHOLE_TIMEOUT)
    def test_the_notebook_runs_top_to_bottom(self, executed):
        assert_ran_cleanly(stem, executed)
    return type(f"TestNotebook{stem[:2]}", (), {"__doc__": f"notebooks/{stem}.ipynb",
                                               test_the_notebook_runs_top_to_bottom.__name__:
                                                   test_the_notebook_runs_top_to_bottom})


for _path in NOTEBOOKS:
    if _path.stem not in RUN_BY:
        globals()[f"TestNotebook{_path.stem[:2]}"] = _class_for(_path.stem)


def test_the_notebooks_run_elsewhere_are_run_there():
    for stem, (file, cls) in RUN_BY.items():
        text = (Path(__file__).parent / file).read_text()
        assert f"class {cls}" in text and f'assert_ran_cleanly(NOTEBOOK, executed)' in text, (stem, file)
        assert f'NOTEBOOK = "{stem}"' in text, (stem, file)
