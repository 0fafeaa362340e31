"""Notebook cells teach; result bookkeeping (claims, verdicts, evidence strings) lives in the lesson modules.
course/bookkeeping counts the code lines that only record results: below 8% over the series (15.1% before the
third edition moved them into claims_NN functions), and no notebook above 8%."""
from pathlib import Path

import pytest

from mnist_helpers.course.bookkeeping import cell_counts, notebook_counts

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_counter_sees_bookkeeping_and_spares_teaching():
    assert cell_counts('res = claims.record("03_x", lb.claims_03(a, b), profile=PROFILE)\nshow(claims.summary(res))\n')[0] == 1
    assert cell_counts('VERDICT = "holds" if x > 1 else "does not hold here"\nprint(x)\n') == (1, 2)
    assert cell_counts("loader = DataLoader(ds, batch_size=128)\nfor X, y in loader:\n    pass\n") == (0, 3)
    assert cell_counts("%%writefile work/x.py\nimport torch\n# a comment\nprint(1)\n") == (0, 2)


def test_under_8_percent_over_the_series():
    bk, total = map(sum, zip(*(notebook_counts(p) for p in NOTEBOOKS)))
    assert bk / total < 0.08, f"{bk} of {total} notebook code lines record results ({bk / total:.1%})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_is_mostly_bookkeeping(path):
    bk, total = notebook_counts(path)
    assert bk / total <= 0.08, (f"{path.name}: {bk} of {total} code lines record results: move them into the lesson "
                                "module's claims function (python -m mnist_helpers.course.bookkeeping)")
