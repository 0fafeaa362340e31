"""Committed notebooks carry no outputs, follow the series' shape, and import the package by name."""
import json
import re
from pathlib import Path

import pytest

from mnist_helpers.tools.nbstrip import carries_outputs

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped_and_well_formed(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert not carries_outputs(nb), f"{path.name} carries outputs: run `make strip`"
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown"
    header = "".join(cells[0]["source"])
    assert re.search(r"[Rr]untime", header), "the first cell states the expected runtime"
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"
    assert 'os.environ.get("MNIST_PROFILE", "full")' in "".join(tagged[0]["source"])
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "import *" not in code and "mnist_helpers" in code
    assert not re.search(r"^\s*!torchrun", code, re.M), "launch through mnist_helpers.launch, not !torchrun"
