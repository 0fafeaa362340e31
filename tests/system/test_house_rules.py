"""The house rules of docs/MAINTAINING.md ("House rules"), read from the source (no import, no process):

- no function outside the notebooks is over ``MAX_LINES`` lines;
- a lesson module re-exports nothing: no ``# noqa: F401``, no name it imports and does not use;
- nobody reaches a core name through a lesson (``from mnist_helpers.lessons.lNN import x`` where lNN only imported
  ``x``), in the package, the scripts, the tests and the notebooks;
- no module imports a private name (``_x``) from another module of the series;
- a ``claims_NN`` takes one measured record, not a keyword argument per measurement;
- ``launch.torchrun`` takes at most ``MAX_TORCHRUN_PARAMETERS`` parameters (rarely used ones travel in
  ``launch.LaunchOptions``).

Each allow-list names what is still over a rule and why; an entry that no longer breaks its rule fails
``test_the_allow_lists_name_only_what_still_breaks_a_rule``, so that it is removed as soon as it is fixed."""
from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for folder in ("mnist_helpers", "scripts", "tests") for p in (REPO / folder).rglob("*.py"))
LESSONS = sorted(p for p in (REPO / "mnist_helpers" / "lessons").glob("n[0-9][0-9]/*.py") if p.name != "__init__.py")
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_LINES = 80
MAX_CLAIMS_PARAMETERS = 4
MAX_TORCHRUN_PARAMETERS = 10

IN_CHANGE = "being changed by issue {} this stop"
# "path::function": why it is still over MAX_LINES
LONG_FUNCTIONS: dict[str, str] = {}
# lesson file name: why it still re-exports core names (its notebook and tests read them through it)
REEXPORTING_LESSONS: dict[str, str] = {}
# "path: module.name": why it imports a private name
PRIVATE_IMPORTS: dict[str, str] = {}
# lesson file name: why its claims function still takes a keyword argument per measurement
CLAIMS_WITH_MANY_PARAMETERS: dict[str, str] = {}


def lesson_key(path: Path) -> str:
    """``nNN/module`` of a file in a lesson package, as the allow-lists name it."""
    return f"{path.parent.name}/{path.stem}"


def rel(path: Path) -> str:
    """The path as the allow-lists name it: relative to the repository (a file elsewhere: its name)."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name


@functools.lru_cache(maxsize=None)
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def notebook_code(path: Path) -> str:
    """A notebook's code cells as one module (magics and shell lines left out, cells that do not parse skipped)."""
    cells = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code" or "".join(cell["source"]).lstrip().startswith("%%"):
            continue
        code = "\n".join(line for line in "".join(cell["source"]).splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        cells.append(code)
    return "\n\n".join(cells)


# --------------------------------------------------------------------------- what each rule finds

def long_functions(paths=SOURCES, limit=MAX_LINES) -> dict[str, int]:
    """``{"path::function": lines}`` for every function (nested ones too) longer than ``limit`` lines, from its
    ``def`` line to its last line."""
    out = {}
    for path in paths:
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{rel(path)}::{node.name}"] = lines
    return out


def module_imports(module: ast.Module) -> dict[str, tuple[str, int]]:
    """The names a module's top level imports (conditional imports included): ``{name: (what, line)}``."""
    out = {}
    for node in module.body:
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.ImportFrom) and sub.module != "__future__":
                out.update({a.asname or a.name: (f"{sub.module}.{a.name}", sub.lineno) for a in sub.names})
            elif isinstance(sub, ast.Import):
                out.update({a.asname or a.name.split(".")[0]: (a.name, sub.lineno) for a in sub.names})
    return out


def reexports(path: Path) -> list[str]:
    """A lesson's re-exports: lines marked ``noqa: F401`` and names it imports without using them."""
    text = path.read_text(encoding="utf-8")
    found = [f"line {i}: noqa: F401" for i, line in enumerate(text.splitlines(), 1) if "noqa: F401" in line]
    module = tree(path)
    used = {n.id for n in ast.walk(module) if isinstance(n, ast.Name)}
    found += [f"line {line}: {name} ({what}) imported, never used" for name, (what, line) in module_imports(module).items()
              if name not in used]
    return found


def lesson_names() -> dict[str, tuple[set[str], dict[str, str]]]:
    """``{lesson: (names it defines, {name it imports: from where})}``."""
    out = {}
    for path in LESSONS:
        module = tree(path)
        defined = set()
        for node in ast.walk(module):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in module.body:
                defined.add(node.name)
        for node in module.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign)) else []
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        imported = {k: v for k, (v, _) in module_imports(module).items() if k not in defined}
        out[lesson_key(path)] = (defined, imported)
    return out


def reached_through_lessons(module: ast.Module, where: str, lessons) -> list[str]:
    """Names ``module`` takes from a lesson package's module that it only imported: ``from
    mnist_helpers.lessons.nNN.lesson import x`` or ``lesson.x`` where the
    lesson only imported ``x`` from the package. Patching a lesson's name (``monkeypatch.setattr(l09, "torchrun",
    ...)``) is not reaching through it: the lesson uses that name."""
    aliases, found = {}, []
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.module:
            m = re.fullmatch(r"mnist_helpers\.lessons\.(n\d\d)\.(\w+)", node.module)
            if m and f"{m.group(1)}/{m.group(2)}" in lessons:
                imported = lessons[f"{m.group(1)}/{m.group(2)}"][1]
                found += [f"{where}:{node.lineno}: from {node.module} import {a.name} (defined in {imported[a.name]})"
                          for a in node.names if imported.get(a.name, "").startswith("mnist_helpers.")]
            m = re.fullmatch(r"mnist_helpers\.lessons\.(n\d\d)", node.module)
            if m:
                aliases.update({a.asname or a.name: f"{m.group(1)}/{a.name}" for a in node.names
                                if f"{m.group(1)}/{a.name}" in lessons})
        elif isinstance(node, ast.Import):
            for a in node.names:
                m = re.fullmatch(r"mnist_helpers\.lessons\.(n\d\d)\.(\w+)", a.name)
                if m and a.asname and f"{m.group(1)}/{m.group(2)}" in lessons:
                    aliases[a.asname] = f"{m.group(1)}/{m.group(2)}"
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            origin = lessons[aliases[node.value.id]][1].get(node.attr, "")
            if origin.startswith("mnist_helpers."):
                found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr} (defined in {origin})")
    return found


def private_imports(paths=SOURCES) -> dict[str, int]:
    """``{"path: module.name": line}`` for every ``from <series module> import _name`` (dunders aside)."""
    out = {}
    for path in paths:
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("mnist_helpers")):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out[f"{rel(path)}: {'.' * node.level}{node.module or ''}.{a.name}"] = node.lineno
    return out


def parameter_count(node: ast.FunctionDef) -> int:
    """How many parameters a function takes (``*args`` and ``**kwargs`` count one each)."""
    a = node.args
    return len(a.posonlyargs + a.args + a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)


def function_parameters(path: Path, name: str) -> int:
    """The parameters of the top-level function ``name`` of ``path``."""
    node = next(n for n in tree(path).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return parameter_count(node)


def claims_parameters() -> dict[str, int]:
    """``{lesson file: parameters}`` of each lesson's ``claims_NN`` function."""
    out = {}
    for path in LESSONS:
        for node in tree(path).body:
            if isinstance(node, ast.FunctionDef) and re.fullmatch(r"claims_\d\d", node.name):
                out[f"{lesson_key(path)}.py"] = parameter_count(node)
    return out


# --------------------------------------------------------------------------- the rules

def test_no_function_is_over_80_lines():
    over = {k: n for k, n in long_functions().items() if k not in LONG_FUNCTIONS}
    assert not over, (f"functions over {MAX_LINES} lines (split them into named phases: set-up, loop, report): "
                      + ", ".join(f"{k} ({n})" for k, n in sorted(over.items())))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: f"{lesson_key(p)}.py")
def test_no_lesson_reexports(path):
    if f"{lesson_key(path)}.py" in REEXPORTING_LESSONS:
        pytest.skip(f"{lesson_key(path)}.py: {REEXPORTING_LESSONS[lesson_key(path) + '.py']}")
    found = reexports(path)
    assert not found, (f"{lesson_key(path)}.py re-exports (import each name from the module that defines it, where it is "
                       "used): " + "; ".join(found))


def test_no_core_name_is_reached_through_a_lesson():
    lessons = {k: v for k, v in lesson_names().items() if f"{k}.py" not in REEXPORTING_LESSONS}
    found = [hit for path in SOURCES for hit in reached_through_lessons(tree(path), rel(path), lessons)]
    found += [hit for path in NOTEBOOKS for hit in reached_through_lessons(ast.parse(notebook_code(path)), rel(path),
                                                                            lessons)]
    assert not found, "import these from the module that defines them:\n" + "\n".join(found)


def test_no_private_name_is_imported_from_another_module():
    found = {k: line for k, line in private_imports().items() if k not in PRIVATE_IMPORTS}
    assert not found, ("private names imported across modules (make them public where they are defined, or move "
                       "them): " + ", ".join(f"{k} (line {line})" for k, line in sorted(found.items())))


def test_a_claims_function_takes_one_measured_record():
    found = {k: n for k, n in claims_parameters().items()
             if n > MAX_CLAIMS_PARAMETERS and k not in CLAIMS_WITH_MANY_PARAMETERS}
    assert not found, (f"claims functions with more than {MAX_CLAIMS_PARAMETERS} parameters (give them one "
                       f"MeasuredNN record, as lessons/n07/lesson.py's claims_07 takes): {found}")


def test_launch_torchrun_takes_at_most_10_parameters():
    n = function_parameters(REPO / "mnist_helpers" / "launch.py", "torchrun")
    assert n <= MAX_TORCHRUN_PARAMETERS, (f"launch.torchrun takes {n} parameters, more than {MAX_TORCHRUN_PARAMETERS}: "
                                          "move the rarely used ones into launch.LaunchOptions")


def lesson_aliases(module: ast.Module) -> list[tuple[str, str]]:
    """``(nNN, alias)`` for every ``from mnist_helpers.lessons.nNN import lesson as alias``."""
    return [(node.module.rsplit(".", 1)[1], a.asname or a.name) for node in ast.walk(module)
            if isinstance(node, ast.ImportFrom) and re.fullmatch(r"mnist_helpers\.lessons\.n\d\d", node.module or "")
            for a in node.names if a.name == "lesson"]


def test_a_notebook_names_its_lesson_after_it():
    """``from mnist_helpers.lessons.n07 import lesson as l07``: every notebook reads a lesson module as ``lNN``."""
    found = [f"{rel(path)}: lessons.{nn} imported as {alias!r}" for path in NOTEBOOKS
             for nn, alias in lesson_aliases(ast.parse(notebook_code(path))) if alias != f"l{nn[1:]}"]
    assert not found, "name a lesson module lNN (l07 for lessons.n07):\n" + "\n".join(found)


def test_the_allow_lists_name_only_what_still_breaks_a_rule():
    long = long_functions()
    private = private_imports()
    params = claims_parameters()
    stale = [k for k in LONG_FUNCTIONS if k not in long]
    stale += [k for k in REEXPORTING_LESSONS if not reexports(REPO / "mnist_helpers" / "lessons" / k)]
    stale += [k for k in PRIVATE_IMPORTS if k not in private]
    stale += [k for k in CLAIMS_WITH_MANY_PARAMETERS if params.get(k, 0) <= MAX_CLAIMS_PARAMETERS]
    assert not stale, f"fixed, so remove from the allow-lists in {Path(__file__).name}: {stale}"


def test_the_rules_see_what_they_are_about(tmp_path):
    """Each reader finds its kind of mistake in a small synthetic module, and leaves alone what is allowed."""
    bad = tmp_path / "bad.py"
    bad.write_text("from mnist_helpers.launch import _stop_tree  # noqa: F401\nimport os\nimport sys\n\n\n"
                   "def long():\n" + "    x = 1\n" * MAX_LINES + "    return sys.argv\n\n\n"
                   "def short():\n    return 1\n")
    assert long_functions([bad]) == {"bad.py::long": MAX_LINES + 2}
    assert list(private_imports([bad])) == ["bad.py: mnist_helpers.launch._stop_tree"]
    assert [r.split(": ", 1)[1] for r in reexports(bad)] == [
        "noqa: F401", "_stop_tree (mnist_helpers.launch._stop_tree) imported, never used", "os (os) imported, never used"]
    assert parameter_count(ast.parse("def f(a, /, b=1, *c, d, **e): pass").body[0]) == 5
    lessons = {"n99/lesson": ({"mine"}, {"core_fn": "mnist_helpers.core.core_fn", "np": "numpy"})}
    user = ast.parse("from mnist_helpers.lessons.n99.lesson import core_fn, mine\n"
                     "from mnist_helpers.lessons.n99 import lesson as lx\n"
                     "lx.core_fn(); lx.np.zeros(1); lx.mine()\nmonkeypatch.setattr(lx, 'core_fn', None)\n")
    assert lesson_aliases(ast.parse("from mnist_helpers.lessons.n07 import lesson as l07, scaling\n"
                                    "from mnist_helpers.lessons.n08 import lesson as ts\n")) == [("n07", "l07"),
                                                                                                ("n08", "ts")]
    assert [h.split(": ", 1)[1] for h in reached_through_lessons(user, "u.py", lessons)] == [
        "from mnist_helpers.lessons.n99.lesson import core_fn (defined in mnist_helpers.core.core_fn)",
        "lx.core_fn (defined in mnist_helpers.core.core_fn)"]
