"""Where data, results and the kept reference runs are found: one answer for notebooks, scripts and workers."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from mnist_helpers import paths
from mnist_helpers.course import claims

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("make_claims", REPO / "scripts" / "make_claims.py")
MC = importlib.util.module_from_spec(spec)
spec.loader.exec_module(MC)

# a path to the reference folder built by hand: `... / "reference"` or `"results/reference"` in code
HAND_BUILT = re.compile(r"""/\s*["']reference["']|["']results/reference["']""")


def test_reference_dir_is_the_checkouts_whatever_results_dir_says(tmp_path, monkeypatch):
    monkeypatch.setenv("MNIST_RESULTS_DIR", str(tmp_path / "elsewhere"))
    assert paths.results_dir() == tmp_path / "elsewhere"
    assert paths.reference_dir() == REPO / "results" / "reference"
    assert any(paths.reference_dir().glob("*/bench_time_to_accuracy.json")), "the committed references are found"


def test_reference_dir_outside_a_checkout_sits_in_the_results_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "repo_root", lambda: None)
    monkeypatch.setenv("MNIST_RESULTS_DIR", str(tmp_path / "results"))
    assert paths.reference_dir() == tmp_path / "results" / "reference"
    assert not paths.reference_dir().exists(), "reading never creates it"


def test_keeping_a_run_writes_under_reference_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MNIST_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(claims, "reference_dir", lambda: tmp_path / "ref")
    monkeypatch.setattr(MC, "reference_dir", lambda: tmp_path / "ref")
    res = claims.ResultFile("04_batch_size_and_lr", profile="full")
    res.claim("04.double_batch_double_lr", verdict="holds", evidence="e", numbers={"a": 1}, regime="r")
    label = claims.machine_label()
    assert res.keep_as_reference() == tmp_path / "ref" / label / "04_batch_size_and_lr.json"
    res.write()
    kept = MC.keep("04_batch_size_and_lr")
    assert kept == tmp_path / "ref" / label / "04_batch_size_and_lr.json"
    assert json.loads(kept.read_text())["profile"] == "full"


def _code(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "code")
    return path.read_text()


def _without_docstrings_and_comments(code: str) -> str:
    code = re.sub(r'"""[\s\S]*?"""', "", code)
    return "\n".join(line.split("#", 1)[0] for line in code.splitlines())


@pytest.mark.parametrize("path", [
    *sorted((REPO / "mnist_helpers").rglob("*.py")), *sorted((REPO / "scripts").rglob("*.py")),
    *sorted((REPO / "notebooks").glob("*.ipynb"))], ids=lambda p: p.relative_to(REPO).as_posix())
def test_only_paths_names_the_reference_folder(path):
    """Copies of the expression, with three different fallbacks, made notebook 04 look in the wrong folder
    when MNIST_RESULTS_DIR was set and notebook 06 in one no run is kept in: readers and writers ask
    ``paths.reference_dir()``."""
    if path == REPO / "mnist_helpers" / "paths.py":
        return
    hits = [line.strip() for line in _without_docstrings_and_comments(_code(path)).splitlines()
            if HAND_BUILT.search(line)]
    assert not hits, f"{path.name} builds the reference folder's path itself: {hits}; use paths.reference_dir()"
