"""papermill runs the notebooks with parameters (issue 47): `papermill notebooks/04_batch_size_and_lr.ipynb
out.ipynb -p PROFILE quick` runs the quick profile, whatever ``MNIST_PROFILE`` says.

papermill injects its values in a new cell right after the cell tagged ``parameters``. A value computed inside that
cell from another one (``QUICK = PROFILE == "quick"``) keeps what it was computed from before the injection, so the
parameters cell holds literal assignments only (``None``: the profile decides), and the next cell, untagged, derives
the rest (``QUICK = PROFILE == "quick"``, ``TRAIN_IMAGES = TRAIN_IMAGES or (4_000 if QUICK else 12_000)``).

- Every notebook, without a kernel (`make check` runs these): the parameters cell is ``NAME = literal`` lines only,
  papermill's own reading of it finds every parameter, and the next cell derives the rest without overwriting a value
  papermill injected.
- Three notebooks through papermill's Python API (marker ``kernel``), each only up to the first cell that prints the
  configuration it resolved: each notebook runs whole once per `make test` (tests/notebooks/test_all_run.py), and these runs
  are logged as the ``papermill`` path (tests/notebook_runs.py, tests/notebooks/test_all_executed_once.py). The injected values
  contradict the environment's profile or its sizes, and the printed configuration must show them.
"""
from __future__ import annotations

import ast
import json

import pytest

import notebook_runs
from notebook_runs import NOTEBOOKS


def parameters_and_next(path) -> tuple[str, dict]:
    """The source of the cell tagged ``parameters`` and the cell after it."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    tagged = [i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged `parameters`, papermill needs one"
    return "".join(cells[tagged[0]]["source"]), cells[tagged[0] + 1]


def not_literal(source: str) -> list[str]:
    """What in a parameters cell is not ``NAME = literal`` (an empty list when nothing is)."""
    found = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            found.append(f"line {node.lineno}: `{ast.unparse(node).splitlines()[0]}` is not NAME = literal")
            continue
        try:
            ast.literal_eval(node.value)
        except ValueError:
            found.append(f"line {node.lineno}: {node.targets[0].id} = `{ast.unparse(node.value)}` is computed")
    return found


def overwritten(code: str, params) -> list[str]:
    """Assignments in ``code`` to a name of ``params`` that do not read it: they would undo an injected value
    (``X = X or ...`` keeps it, ``X = 4_000 if QUICK else 12_000`` does not)."""
    return [f"line {n.lineno}: {ast.unparse(n).splitlines()[0]}" for n in ast.parse(code).body
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id in params
            and n.targets[0].id not in {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)}]


def test_the_literal_check_names_each_line_papermill_could_not_override():
    assert not_literal('PROFILE = None  # "quick" or "full"\nSIZES = (1, -2.5)\nLEVERS = {1: {"lr": 2e-3}}\n') == []
    found = not_literal('import os\nPROFILE = os.environ.get("MNIST_PROFILE", "full")\nQUICK = PROFILE == "quick"\n'
                        "A, B = 1, 2\nN = 4_000 if QUICK else 12_000\nM = [1, N]\n")
    assert [f.split(":")[0] for f in found] == [f"line {n}" for n in range(1, 7)]
    assert "`import os` is not NAME = literal" in found[0] and "QUICK = `PROFILE == 'quick'` is computed" in found[2]
    derived = "QUICK = PROFILE == 'quick'\nN = N or (4_000 if QUICK else 12_000)\nM = 8 if QUICK else 16\n"
    assert overwritten(derived, {"PROFILE": None, "N": None, "M": None}) == ["line 3: M = 8 if QUICK else 16"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_parameters_cell_holds_literals_only_and_the_next_cell_derives_the_rest(path):
    source, derived = parameters_and_next(path)
    wrong = not_literal(source)
    assert not wrong, (f"{path.name}, parameters cell: " + "; ".join(wrong) +
                       ". Assign a literal there (None: decided by the profile) and compute it in the next cell")
    params = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(source).body}
    assert "PROFILE" in params and params["PROFILE"] is None, "PROFILE = None: MNIST_PROFILE decides unless injected"

    code = "".join(derived["source"])
    assert derived["cell_type"] == "code" and not derived["metadata"].get("tags"), \
        f"{path.name}: the cell after the parameters is the untagged code cell that derives the rest"
    assert 'PROFILE = PROFILE or os.environ.get("MNIST_PROFILE", "full")' in code
    assert 'QUICK = PROFILE == "quick"' in code
    undone = overwritten(code, params)
    assert not undone, f"{path.name}: the derived cell overwrites a parameter an injection would set: {undone}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter(path):
    """`papermill --help-notebook` lists what papermill itself parses (a line with two `=` is skipped, with a
    warning: no `=` in a parameter's comment)."""
    import papermill

    source, _ = parameters_and_next(path)
    assert list(papermill.inspect_notebook(str(path))) == [n.targets[0].id for n in ast.parse(source).body]


def _plan_note(profile: str) -> str:
    """The world-size note notebook 07 prints for ``profile`` on this machine (its own function, same inputs)."""
    from mnist_helpers.distributed import cuda_gpus
    from mnist_helpers.lessons.n07 import lesson as l07
    from mnist_helpers.resources import usable_cores

    return l07.plan(cuda_gpus(), usable_cores(), profile == "quick")["note"]


# stem: (MNIST_PROFILE in the environment, the values papermill injects, the cell that prints the resolved
# configuration (the run stops after it), what it must print)
CASES = {
    "04_batch_size_and_lr": ("full", {"PROFILE": "quick", "TRAIN_IMAGES": 1000}, '"{PROFILE} profile: {MODEL}',
                             lambda: ["quick profile: mlp, 1,000 training / 2,000 test images, 2 epoch(s) per run, "
                                      "batches (128, 256, 512), seeds (0,)"]),
    "02_single_device_baseline": ("full", {"PROFILE": "quick", "NUM_EPOCHS": 2}, "deviations from the article",
                                  lambda: ["quick profile: 1,000 training images, 2 epoch(s)"]),
    "07_scaling_and_multinode": ("quick", {"PROFILE": "full"}, 'print(PLAN["note"])',
                                 lambda: ["| profile full |", _plan_note("full")]),
}


@pytest.mark.kernel
@pytest.mark.parametrize("stem", sorted(CASES))
def test_injected_parameters_take_effect(stem, tmp_path, monkeypatch):
    env_profile, parameters, needle, expected = CASES[stem]
    path = notebook_runs.path_of(stem)
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    through = next(i for i, c in enumerate(cells) if c["cell_type"] == "code" and needle in "".join(c["source"]))
    tagged = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
    assert "find_spec" in "".join(cells[1]["source"]) and tagged < through, f"{stem}: the cells moved: update CASES"
    monkeypatch.setenv("MNIST_PROFILE", env_profile)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's scratch folders (07 makes one) end with the test
    nb = notebook_runs.run_papermill(path, through, parameters, tmp_path)
    assert "injected-parameters" in nb.cells[tagged + 1].metadata.get("tags", []), "papermill injects after the tag"
    out = notebook_runs.stdout_of(nb)
    missing = [line for line in expected() if line not in out]
    assert not missing, f"{stem} with MNIST_PROFILE={env_profile} and {parameters} did not print {missing}:\n{out}"
    assert not notebook_runs.errors_of(nb)
