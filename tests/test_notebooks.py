"""Every notebook of the series, top to bottom, in the quick profile: the run `make test` makes of each (issue 46).

Each runs once per session (the ``executed`` fixture, tests/conftest.py, with nbmake's runner: what
``pytest --nbmake notebooks/`` runs); tests that read a notebook's outputs take this execution instead of running
the notebook again. ``make notebooks`` still runs them with the nbmake plugin itself."""
from __future__ import annotations

import pytest

from notebook_runs import NOTEBOOKS, errors_of

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(int(__import__("os").environ.get("MNIST_NB_TOTAL", "1800")))]


@pytest.mark.parametrize("stem", [p.stem for p in NOTEBOOKS])
def test_the_notebook_runs_top_to_bottom(stem, executed):
    result = executed(stem)
    if result.error is not None:
        pytest.fail(f"{stem}: {result.error.summary}\n{result.error.trace}", pytrace=False)
    assert not errors_of(result.nb), errors_of(result.nb)
