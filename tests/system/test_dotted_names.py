"""Every dotted name of the series that a learner reads resolves (issue 48): ``mnist_helpers.x.y`` in the notebooks
(code and prose), the exercises, the README and docs/. A stale one (``mnist_helpers.launch.free_port`` after
``free_port`` moved to ``ports``) sends a learner to an ImportError."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"(?<![\w/.])mnist_helpers(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"from (mnist_helpers(?:\.\w+)*) import (?:\(([^)]*)\)?|([\w ,]+))")


def _texts():
    for path in sorted((REPO / "notebooks").rglob("*.ipynb")):
        if "work" in path.relative_to(REPO / "notebooks").parts[:1]:
            continue
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            yield path, "".join(cell["source"])
    for path in [REPO / "README.md", REPO / "mnist_helpers" / "course" / "exercises.py", *sorted((REPO / "docs").rglob("*.md"))]:
        yield path, path.read_text(encoding="utf-8")


def imported(text: str) -> list[str]:
    """``module.name`` for each name of each ``from mnist_helpers... import ...`` in ``text``."""
    return [f"{module}.{item.split(' as ')[0].strip()}" for module, grouped, plain in FROM_IMPORT.findall(text)
            for item in (grouped or plain).split(",") if re.fullmatch(r"\w+(?: as \w+)?", item.strip())]


def mentioned() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path, text in _texts():
        names = NAME.findall(text) + imported(text)
        for name in names:
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def resolve(dotted: str) -> str | None:
    """None when ``dotted`` names a module, or an attribute reachable from the longest importable module prefix;
    else why not."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and not module_name.startswith(err.name):  # the module exists but its import failed
                return f"importing {module_name} failed: {err}"
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{module_name} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def test_the_pattern_finds_names_in_prose_and_code():
    text = "see `mnist_helpers.ports.free_port()`; from mnist_helpers/launch.py; mnist_helpers.data.ensure_mnist."
    assert NAME.findall(text) == ["mnist_helpers.ports.free_port", "mnist_helpers.data.ensure_mnist"]
    assert resolve("mnist_helpers.ports.free_port") is None
    assert resolve("mnist_helpers.launch.free_port") == "mnist_helpers.launch has no free_port"
    assert resolve("mnist_helpers.nosuch.thing") == "mnist_helpers has no nosuch.thing"
    code = "from mnist_helpers.launch import free_port\nfrom mnist_helpers.data import (RAW_MD5, ensure_mnist as e,\n"
    assert imported(code + "    check)\n") == ["mnist_helpers.launch.free_port", "mnist_helpers.data.RAW_MD5",
                                               "mnist_helpers.data.ensure_mnist", "mnist_helpers.data.check"]


def test_every_dotted_name_a_learner_reads_resolves():
    names = mentioned()
    assert len(names) > 20, "the scan found almost nothing: check the pattern"
    stale = {name: (why, sorted(where)) for name, where in names.items() if (why := resolve(name)) is not None}
    assert not stale, "stale names (fix the text, or the code it points to):\n" + "\n".join(
        f"  {name}: {why}; in {', '.join(where)}" for name, (why, where) in sorted(stale.items()))
