"""Widgets in a real kernel, executed the way nbmake runs a notebook (nbclient): a cell that shows controls finishes
when its code does, and what it shows at once is the cell's own output, never written into an ipywidgets Output
while the cell runs. 11's memory explorer did that (its starting estimate went into an Output) and in 3 of 5 runs of
notebook 11 here (nbclient 0.11, ipykernel 7.4) nbclient then waited out the whole cell timeout at that cell (900 s
under nbmake, and the notebook still passed). The stall is intermittent and this small notebook did not reproduce it;
the test holds the rule that removed it: every widget of the series writes into its Output only from callbacks."""
from __future__ import annotations

import time

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipywidgets")

TIMEOUT_S = 120

EXPLORER = '''
from mnist_helpers.lessons.n11.lesson import memory_explorer

calls = []
def estimate(width, blocks, batch_size, precision, world_size, stage, checkpointing):
    calls.append("estimate")
    return {"params": 1.0, "total": 2.0}
def measure(**settings):
    calls.append("measure")

memory_explorer(estimate, measure, width=256, blocks=2, batch_size=64, interactive=True)
print(calls)
'''
ANSWER_BOX = '''
from mnist_helpers.course.exercises import answer_box
answer_box("06-1", interactive=True)
print("answer box shown")
'''


@pytest.mark.kernel
@pytest.mark.parametrize("source, expect", [(EXPLORER, "['estimate']"), (ANSWER_BOX, "answer box shown")],
                         ids=["l11_memory_explorer", "answer_box"])
def test_a_cell_with_widgets_finishes_when_its_code_does(source, expect):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source), nbformat.v4.new_code_cell("print('next')")])
    start = time.monotonic()
    nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3").execute()
    elapsed = time.monotonic() - start
    text = "".join(o.get("text", "") for c in nb.cells for o in c.outputs)
    assert expect in text and "next" in text, text
    assert elapsed < TIMEOUT_S / 2, (f"the widget cell took {elapsed:.0f} s of a {TIMEOUT_S} s timeout: nbclient "
                                     "waited for a reply the widget's output capture kept from it")
    assert any(o.get("output_type") == "display_data" for o in nb.cells[0].outputs), "the widget was displayed"
    if "memory_explorer" in source:
        html = "".join(o.get("data", {}).get("text/html", "") for o in nb.cells[0].outputs)
        assert "estimate per rank" in html, "the starting estimate is the cell's own output, not in an Output widget"
